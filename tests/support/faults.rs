//! Faults on the path, each removed when its value is dropped: a netem
//! qdisc on loopback (the network's knob) and a LUN on dm-delay (the
//! target's); and the measures of what each really adds.

use super::lab::{session_disk_after_login, settle_after_login, sh, Lab};
use std::process::Command;
use std::time::{Duration, Instant};

/// A netem qdisc on loopback for as long as the value lives (removed even
/// when a test fails).
pub struct Netem;
impl Netem {
    pub fn add(spec: &str) -> Netem {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
        sh(&format!("tc qdisc add dev lo root netem {spec}"));
        Netem
    }
}
impl Netem {
    /// netem on one direction only: the segments whose TCP `field`
    /// ("sport" or "dport") is `port` (a prio qdisc whose fourth band holds
    /// netem, a u32 filter sending them there).
    pub fn one_way(field: &str, port: u16, spec: &str) -> Netem {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
        sh("modprobe -a sch_prio sch_netem cls_u32");
        sh("tc qdisc add dev lo root handle 1: prio bands 4 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1");
        sh(&format!("tc qdisc add dev lo parent 1:4 handle 40: netem {spec}"));
        sh(&format!("tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip {field} {port} 0xffff flowid 1:4"));
        Netem
    }
}
impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
    }
}

/// Round trips over loopback, the lab's ping (the guest has none): `n` UDP
/// echoes of one byte, one at a time, the echo on its own thread; each
/// round trip in ns, sorted. Under netem this is what a configured delay
/// really adds to a round trip in this guest (timer slack under emulation:
/// 2 x 5 ms added 10.5-11.1 ms to the minimum on 6.1).
pub fn udp_round_trips(n: usize) -> Vec<u64> {
    use std::net::UdpSocket;
    let echo = UdpSocket::bind("127.0.0.1:0").expect("bind the echo socket");
    let addr = echo.local_addr().unwrap();
    echo.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        while let Ok((len, from)) = echo.recv_from(&mut buf) {
            if buf[..len] == *b"q" {
                break;
            }
            let _ = echo.send_to(&buf[..len], from);
        }
    });
    let c = UdpSocket::bind("127.0.0.1:0").expect("bind the client socket");
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 16];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.send_to(b"x", addr).unwrap();
        c.recv_from(&mut buf).expect("a UDP echo over lo within 2 s");
        out.push(t.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(2));
    }
    c.send_to(b"q", addr).unwrap();
    server.join().unwrap();
    out.sort_unstable();
    out
}

/// What a netem delay of `d_ms` each way adds to a round trip in this boot,
/// from UDP echoes without it and with it (`udp_round_trips`): (the growth
/// of the minimum, the growth of the median), ns. NET counts a round trip
/// from minima, fio's latency holds the typical one: the network's true
/// change lies between the two. Asserts that the delay took: the minimum
/// grew by 95% of 2 x `d_ms` at least, 5 ms more than that at most.
pub fn netem_adds(d_ms: f64, plain: &[u64], delayed: &[u64]) -> (f64, f64) {
    let q = |v: &[u64], p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64;
    let (by_min, by_median) = (q(delayed, 0.0) - q(plain, 0.0), q(delayed, 0.5) - q(plain, 0.5));
    println!(
        "UDP round trips over lo, {} each: without netem min {:.3} median {:.3} ms; with delay {d_ms} ms each way min {:.3} median {:.3} ms: netem adds {:.3} (min) to {:.3} ms (median)",
        plain.len(),
        q(plain, 0.0) / 1e6,
        q(plain, 0.5) / 1e6,
        q(delayed, 0.0) / 1e6,
        q(delayed, 0.5) / 1e6,
        by_min / 1e6,
        by_median / 1e6
    );
    let configured = 2.0 * d_ms * 1e6;
    assert!(
        (0.95 * configured..=configured + 5e6).contains(&by_min),
        "netem delay {d_ms} ms each way added {:.3} ms to a UDP round trip",
        by_min / 1e6
    );
    (by_min, by_median)
}

/// A LUN whose backing store waits: a RAM disk (brd) under dm-delay,
/// exported by LIO (iblock) as the only LUN of a target of its own, and
/// logged in. The knob inside the target for tests that must tell the
/// target's time from the network's. Removed again when dropped.
pub struct SlowLun {
    pub target: String,
    pub sid: u32,
    pub disk: String,
    /// The dm-delay device in the target (`dm-N`).
    pub dm: String,
    tpg: String,
}

/// I/Os completed and the time they took on one block device, per
/// direction, from its `/sys/block/<dev>/stat` (the kernel's own sums).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskTime {
    pub reads: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
}
impl DiskTime {
    pub fn read(dev: &str) -> DiskTime {
        let text = sh(&format!("cat /sys/block/{dev}/stat"));
        let f: Vec<u64> = text.split_whitespace().map(|w| w.parse().unwrap()).collect();
        DiskTime { reads: f[0], read_ms: f[3], writes: f[4], write_sectors: f[6], write_ms: f[7] }
    }
    /// Mean time per I/O in ns since `before`: (reads, writes).
    pub fn mean_since(&self, before: &DiskTime) -> (f64, f64) {
        let mean = |ms: u64, n: u64| ms as f64 * 1e6 / n.max(1) as f64;
        (
            mean(self.read_ms - before.read_ms, self.reads - before.reads),
            mean(self.write_ms - before.write_ms, self.writes - before.writes),
        )
    }
}

const CFG: &str = "/sys/kernel/config/target";

impl SlowLun {
    /// `delay_ms`: what dm-delay is told; what it really adds is measured
    /// by the caller (it waits in timer ticks).
    pub fn create(lab: &Lab, delay_ms: u32) -> SlowLun {
        let prefix = lab.targets[0].rsplit_once(':').expect("lab target IQN").0.to_string();
        let target = format!("{prefix}:slow");
        sh("modprobe brd rd_nr=1 rd_size=65536 && modprobe dm_delay && modprobe target_core_iblock");
        // udevd is stopped (quiet_disks): dmsetup must not wait for it, and
        // the device node to use is devtmpfs' /dev/dm-N.
        sh(&format!("dmsetup create --noudevsync lab_slow --table \"0 $(blockdev --getsz /dev/ram0) delay /dev/ram0 0 {delay_ms}\""));
        let dm = sh("dmsetup info -c --noheadings -o blkdevname lab_slow").trim().to_string();
        // brd allocates a page at its first write: written once now, so
        // that no phase pays for it (256 KiB writes to fresh pages took 20
        // ms each on 5.10).
        sh("dd if=/dev/zero of=/dev/ram0 bs=1M count=$(($(blockdev --getsize64 /dev/ram0) / 1048576)) oflag=direct status=none");
        let bs = format!("{CFG}/core/iblock_90/lab_slow");
        let tpg = format!("{CFG}/iscsi/{target}/tpgt_1");
        sh(&format!(
            "mkdir -p {bs} && echo udev_path=/dev/{dm} > {bs}/control && echo 1 > {bs}/enable && \
             mkdir -p {tpg}/lun/lun_0 && ln -s {bs} {tpg}/lun/lun_0/lab_slow && mkdir {tpg}/np/127.0.0.1:3260 && \
             echo 1 > {tpg}/attrib/generate_node_acls && echo 0 > {tpg}/attrib/authentication && \
             echo 0 > {tpg}/attrib/demo_mode_write_protect && echo 1 > {tpg}/attrib/cache_dynamic_acls && echo 1 > {tpg}/enable"
        ));
        sh("iscsiadm -m discovery -t st -p 127.0.0.1 >/dev/null");
        sh(&format!("iscsiadm -m node -T {target} -p 127.0.0.1 -l >/dev/null"));
        let (s, disk) = session_disk_after_login(&target);
        settle_after_login();
        SlowLun { target, sid: s.sid, disk, dm, tpg }
    }
}

impl SlowLun {
    /// Tell dm-delay to wait `delay_ms` from now on, with the LUN in use:
    /// the table is swapped between suspend and resume.
    pub fn set_delay(&self, delay_ms: u32) {
        sh(&format!(
            "dmsetup suspend --noudevsync lab_slow && \
             dmsetup reload --noudevsync lab_slow --table \"0 $(blockdev --getsz /dev/ram0) delay /dev/ram0 0 {delay_ms}\" && \
             dmsetup resume --noudevsync lab_slow"
        ));
    }

    /// Log out and in again: a new connection, with a floor RTT of its own.
    pub fn relogin(&mut self) {
        sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -u >/dev/null", self.target));
        sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -l >/dev/null", self.target));
        let (s, disk) = session_disk_after_login(&self.target);
        (self.sid, self.disk) = (s.sid, disk);
        settle_after_login();
    }
}

impl Drop for SlowLun {
    fn drop(&mut self) {
        let t = &self.target;
        let tpg = &self.tpg;
        let _ = Command::new("sh").arg("-c").arg(format!(
            "iscsiadm -m node -T {t} -p 127.0.0.1 -u; iscsiadm -m node -T {t} -o delete; \
             echo 0 > {tpg}/enable; rm -f {tpg}/lun/lun_0/lab_slow; rmdir {tpg}/lun/lun_0 {tpg}/np/127.0.0.1:3260 {tpg} {CFG}/iscsi/{t}; \
             rmdir {CFG}/core/iblock_90/lab_slow {CFG}/core/iblock_90; dmsetup remove --noudevsync lab_slow; rmmod brd"
        )).output();
    }
}

/// How far NET may move when the only change is a delay inside the target
/// (a [`SlowLun`], 8 ms told, 8-12 ms added), ns. Reads between writes take
/// NET from the anchor, the writes' R2T round trip (LIO's turnaround
/// included, which grows with its backend's delay under emulation), and a
/// write's NET also counts R2T -> Data-Out handed to TCP, which moves with
/// the target's load (most likely the target reading its socket later
/// while its backend is slow; not traced). Seen (NET's change, 6.1, 5.10,
/// 7.3, 6.12): reads -0.25 to +2.07 ms, writes -2.19 to +3.89 ms (the
/// largest: 256 KiB writes with the host loaded, 2.48 on 6.1, 2.86 and 3.89
/// on 5.10), against 8-12 ms for NET taking the delay: 5 ms
/// (docs/measurements.md, "Timing bounds and their spread").
pub const NET_MOVE_INSIDE_TARGET_NS: f64 = 5e6;

/// Where TARGET (with what NET took of it) must lie when the only change is
/// a delay inside the target: from this share of the least measure of the
/// delay (what dm-delay is told, where the test uses it, the device's own
/// time per I/O, fio's change) to this share of the greatest. TARGET was
/// 0.83-0.97 of the lesser of the device's and fio's (fio's change also
/// holds 1-2 ms outside RESP), 0.86-0.88 of the least with what dm-delay is
/// told on 7.3, and up to 1.12 of the greater (both knobs, writes, 6.1).
pub const TARGET_RANGE: (f64, f64) = (0.75, 1.25);
