//! NET follows the network while a session stays up: a netem delay added
//! and removed mid-session, one direction at a time, and a delay inside the
//! target changed mid-session, each against fio's own latencies and the
//! dm-delay device's. Runs only inside the lab VM, through `tests/all`.

pub mod support {
    pub mod faults;
    pub mod fio;
    pub mod json;
    pub mod lab;
    pub mod tools;
}

use serde_json::Value;
use support::{faults::*, fio::*, json::*, lab::*, tools::*};

/// The network's delay added mid-session, ms (each direction).
const D_MS: u32 = 5;
/// What dm-delay is told mid-session, ms.
const DM_MS: u32 = 8;
/// Writes of 256 KiB: an R2T each (more than the 8 KiB of immediate data
/// LIO takes by default).
const BIG: &str = "--bs=256k";

/// Milliseconds since local midnight: isclatency -T prints completion times
/// as local HH:MM:SS.mmm.
fn now_ms() -> i64 {
    use chrono::Timelike;
    let t = chrono::Local::now();
    t.num_seconds_from_midnight() as i64 * 1000 + (t.nanosecond() / 1_000_000) as i64 % 1000
}

fn time_ms(c: &Value) -> i64 {
    let t = c.str("time");
    let (hms, frac) = t.split_once('.').unwrap_or_else(|| panic!("time {t:?}"));
    let p: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    (p[0] * 3600 + p[1] * 60 + p[2]) * 1000 + frac.parse::<i64>().unwrap()
}

/// One fio job, and when it ran.
struct Job {
    step: &'static str,
    what: &'static str,
    disk: String,
    fio: Fio,
    from_ms: i64,
    to_ms: i64,
}

#[derive(Default)]
struct Jobs(Vec<Job>);

impl Jobs {
    fn run(
        &mut self,
        (step, what): (&'static str, &'static str),
        disk: &str,
        rw: &str,
        n: u64,
        qd: u32,
        extra: &[&str],
    ) {
        println!("{step}: {what} on {disk}");
        let from_ms = now_ms();
        let fio = fio(disk, rw, n, qd, extra);
        self.0.push(Job { step, what, disk: disk.into(), fio, from_ms, to_ms: now_ms() });
    }
    /// The workloads measured in each step.
    fn workloads(&mut self, step: &'static str, disk: &str, qd8: bool) {
        self.run((step, "4 KiB reads, iodepth 1"), disk, "randread", 200, 1, &[]);
        if qd8 {
            self.run((step, "4 KiB reads, iodepth 8"), disk, "randread", 400, 8, &[]);
        }
        self.run((step, "4 KiB writes"), disk, "randwrite", 150, 1, &[]);
        self.run((step, "256 KiB writes"), disk, "randwrite", 60, 1, &[BIG]);
    }
    /// 10 s of reads after a change, so that what follows is measured from
    /// 10 s after it, with the connection busy all the while.
    fn settle(&mut self, step: &'static str, disk: &str) {
        self.run((step, "settling"), disk, "randread", 1_000_000, 1, &["--time_based", "--runtime=10"]);
    }
    fn get(&self, step: &str, what: &str) -> &Job {
        self.0.iter().find(|j| j.step == step && j.what == what).unwrap_or_else(|| panic!("no {what} in {step}"))
    }
}

/// The commands of `job` (its disk, completed while it ran): as many as
/// fio's I/Os, but for those the tools say they could not time.
fn commands<'a>(cmds: &'a [Value], job: &Job, untimed: u64) -> Vec<&'a Value> {
    let c: Vec<&Value> = cmds
        .iter()
        .filter(|c| c.str("disk") == job.disk && c.str("dir") != "-")
        .filter(|c| (job.from_ms - 1..=job.to_ms + 1).contains(&time_ms(c)))
        .collect();
    let n = c.len() as u64;
    assert!(
        n <= job.fio.ios() && job.fio.ios() - n <= untimed,
        "{} / {}: isclatency shows {n} commands, fio did {} ({untimed} not timed)",
        job.step,
        job.what,
        job.fio.ios()
    );
    c
}

fn median(mut v: Vec<u64>) -> f64 {
    assert!(!v.is_empty(), "no values");
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// Medians of NET and TARGET of a job's commands (ns), all but a few split.
fn split(cmds: &[Value], job: &Job, untimed: u64) -> (f64, f64) {
    let c = commands(cmds, job, untimed);
    let s: Vec<&Value> = c.iter().copied().filter(|c| !c["net_ns"].is_null()).collect();
    assert!(
        (c.len() - s.len()) * 20 <= c.len(),
        "{} / {}: {} of {} not split",
        job.step,
        job.what,
        c.len() - s.len(),
        c.len()
    );
    let from = |f: &str| s.iter().filter(|c| c.str("net_from") == f).count();
    let (net, target) =
        (median(s.iter().map(|c| c.u64("net_ns")).collect()), median(s.iter().map(|c| c.u64("target_ns")).collect()));
    println!(
        "{} / {}: {} commands, fio clat mean {:.3} ms; NET median {:.3} ms, TARGET median {:.3} ms; NET from round trips {}, reverse delay {}, TCP's minimum RTT {}",
        job.step, job.what, c.len(), job.fio.clat_mean_ns() / 1e6, net / 1e6, target / 1e6,
        from("round-trip"), from("reverse-delay"), from("tcp-min-rtt")
    );
    (net, target)
}

struct Change {
    fio: f64,
    net: f64,
    target: f64,
}

/// From step `a` to step `b` for workload `what`: fio's mean latency, NET
/// and TARGET medians.
fn change(cmds: &[Value], jobs: &Jobs, a: &str, b: &str, what: &'static str, untimed: u64) -> Change {
    let (ja, jb) = (jobs.get(a, what), jobs.get(b, what));
    let ((na, ta), (nb, tb)) = (split(cmds, ja, untimed), split(cmds, jb, untimed));
    let c = Change { fio: jb.fio.clat_mean_ns() - ja.fio.clat_mean_ns(), net: nb - na, target: tb - ta };
    println!(
        "{a} -> {b}, {what}: fio {:+.3} ms, NET {:+.3} ms, TARGET {:+.3} ms",
        c.fio / 1e6,
        c.net / 1e6,
        c.target / 1e6
    );
    c
}

/// What netem adds to a round trip in this boot (UDP echoes over lo without
/// it and with it): (the minimum's growth, the median's), ns. NET counts a
/// round trip from minima, fio's latency holds the typical one: the network's
/// true change lies between the two.
fn netem_adds(plain: &[u64], delayed: &[u64]) -> (f64, f64) {
    let q = |v: &[u64], p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64;
    let adds = (q(delayed, 0.0) - q(plain, 0.0), q(delayed, 0.5) - q(plain, 0.5));
    println!(
        "UDP round trips over lo: without netem min {:.3} median {:.3} ms; with delay {D_MS} ms each way min {:.3} median {:.3} ms: netem adds {:.3} (min) to {:.3} ms (median)",
        q(plain, 0.0) / 1e6, q(plain, 0.5) / 1e6, q(delayed, 0.0) / 1e6, q(delayed, 0.5) / 1e6, adds.0 / 1e6, adds.1 / 1e6
    );
    assert!(
        adds.0 > 1.9 * D_MS as f64 * 1e6,
        "netem delay {D_MS} ms added only {:.3} ms to a round trip",
        adds.0 / 1e6
    );
    adds
}

/// NET's change against `trips` of what netem adds to a round trip: from
/// 20% below the minimum's growth to 15% above the median's. Below, 20%:
/// the anchor of the symmetric estimate is a clean round trip taken under
/// netem's jitter (emulated: 1-2 ms), so after the delay is removed NET
/// stays up to 2 ms high until the next clean round trip (measured on 6.1,
/// docs/measurements.md).
fn within_trips(net: f64, (min, median): (f64, f64), trips: f64) -> bool {
    let (lo, hi) = ((trips * min).abs(), (trips * median).abs());
    let n = net * trips.signum();
    n >= 0.8 * lo && n <= 1.15 * hi
}

/// Everything with one start of isclatency, on one session of the plain
/// LUN that never logs in again, and on a LUN on dm-delay:
/// 1. netem delay on lo (both ways) added mid-session: NET's median moves
///    by what netem adds to a round trip in this boot (UDP echoes: from 20%
///    below its minimum's growth to 15% above its median's) from 10 s
///    after it, once per round trip, TARGET's by at most 1 ms plus a fifth
///    of the change (what a delayed exchange takes beyond the round trip
///    under emulation); the same when it is removed; reads at iodepth 1
///    and 8, writes of 4 and 256 KiB. fio's change is printed beside it.
/// 2. The delay one way only (to the target's port, then from it, with the
///    delay removed and a clean round trip between): reads have no clean
///    round trip and follow the reverse delay assuming a symmetric path,
///    so NET misses a forward delay (moves less than 1 ms) and counts a
///    reverse one twice, up to what the exchange took; writes with an R2T
///    follow the true change (half a round trip's worth each way, twice).
///    The errors against fio are printed for the README.
/// 3. dm-delay's delay changed mid-session (suspend, reload, resume):
///    TARGET moves by what the device added (15% of the range spanned by
///    what dm-delay is told, the device's time per I/O and fio's change), NET by less than
///    1 ms for reads and 2 ms for writes.
#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn net_follows_network_changes_mid_session() {
    let lab = lab();
    quiet_disks(&lab);
    let disk = lab.disks[0].clone();
    let slow = SlowLun::create(&lab, 0);
    let lat = start("isclatency", &["-u", "0", "--json", "-T"]);
    let mut jobs = Jobs::default();
    // Anchors the estimate and fills its window before the first step.
    jobs.settle("start", &disk);
    jobs.workloads("plain", &disk, true);
    let rt_plain = udp_round_trips(100);
    let rt_delayed;
    {
        let _delay = Netem::add(&format!("delay {D_MS}ms"));
        jobs.settle("netem", &disk);
        jobs.workloads("netem", &disk, true);
        rt_delayed = udp_round_trips(100);
    }
    jobs.settle("removed", &disk);
    jobs.workloads("removed", &disk, true);
    for (step, port) in [("to the target", "dport"), ("from the target", "sport")] {
        {
            let _one_way = Netem::one_way(port, 3260, &format!("delay {D_MS}ms"));
            jobs.settle(step, &disk);
            jobs.run((step, "4 KiB reads, iodepth 1"), &disk, "randread", 200, 1, &[]);
            jobs.run((step, "256 KiB writes"), &disk, "randwrite", 60, 1, &[BIG]);
        }
        // A clean round trip without the delay: the symmetric estimate's
        // anchor again.
        jobs.run(("back", "256 KiB writes"), &disk, "randwrite", 60, 1, &[BIG]);
    }
    // Writes with an R2T first: each step's reads then count from the same
    // clean round trips (R2Ts come before storage).
    let slow_works = ["256 KiB writes", "4 KiB reads, iodepth 1", "4 KiB writes"];
    jobs.settle("slow, plain", &slow.disk);
    let t0 = DiskTime::read(&slow.dm);
    jobs.run(("slow, plain", slow_works[0]), &slow.disk, "randwrite", 60, 1, &[BIG]);
    jobs.run(("slow, plain", slow_works[1]), &slow.disk, "randread", 200, 1, &[]);
    jobs.run(("slow, plain", slow_works[2]), &slow.disk, "randwrite", 150, 1, &[]);
    let t1 = DiskTime::read(&slow.dm);
    slow.set_delay(DM_MS);
    jobs.run(("slow, delayed", slow_works[0]), &slow.disk, "randwrite", 60, 1, &[BIG]);
    jobs.run(("slow, delayed", slow_works[1]), &slow.disk, "randread", 200, 1, &[]);
    jobs.run(("slow, delayed", slow_works[2]), &slow.disk, "randwrite", 150, 1, &[]);
    let t2 = DiskTime::read(&slow.dm);
    let out = lat.stop();
    drop(slow);
    assert!(out.status.success(), "{}", out.stderr);
    let cmds = out.json();
    let untimed = out.untimed();
    println!("isclatency: {}", out.stderr.lines().rfind(|l| l.contains("commands shown")).unwrap_or(""));
    for c in &cmds {
        if !c["net_ns"].is_null() {
            assert_eq!(c.u64("net_ns") + c.u64("target_ns"), c.u64("resp_ns"), "NET + TARGET != RESP: {c}");
        }
    }
    let adds = netem_adds(&rt_plain, &rt_delayed);

    // Every measure is printed before any is judged.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, why: String| {
        if !ok {
            println!("FAILED: {why}");
            failed.push(why);
        }
    };

    // 1. Both ways, added and removed.
    let works = ["4 KiB reads, iodepth 1", "4 KiB reads, iodepth 8", "4 KiB writes", "256 KiB writes"];
    for (a, b, sign) in [("plain", "netem", 1.0), ("netem", "removed", -1.0)] {
        for what in works {
            let c = change(&cmds, &jobs, a, b, what, untimed);
            let trips = if what == works[3] { 2.0 } else { 1.0 } * sign;
            println!(
                "{a} -> {b}, {what}: NET {:+.3} ms for fio's {:+.3} ms ({:.0}%)",
                c.net / 1e6,
                c.fio / 1e6,
                100.0 * c.net / c.fio
            );
            check(
                within_trips(c.net, adds, trips),
                format!(
                    "{a} -> {b}, {what}: NET moved {:.3} ms, netem {:.3}..{:.3} ms",
                    c.net / 1e6,
                    trips * adds.0 / 1e6,
                    trips * adds.1 / 1e6
                ),
            );
            check(
                c.target.abs() <= 1e6 + 0.2 * (trips * adds.1).abs(),
                format!("{a} -> {b}, {what}: TARGET moved {:.3} ms with the network", c.target / 1e6),
            );
        }
    }

    // 2. One way.
    for step in ["to the target", "from the target"] {
        for what in ["4 KiB reads, iodepth 1", "256 KiB writes"] {
            let c = change(&cmds, &jobs, "removed", step, what, untimed);
            println!(
                "one way ({step}), {what}: NET {:+.3} ms for fio's {:+.3} ms: error {:+.3} ms",
                c.net / 1e6,
                c.fio / 1e6,
                (c.net - c.fio) / 1e6
            );
            let ok = match (what, step) {
                // No forward delay is seen without a clean round trip.
                ("4 KiB reads, iodepth 1", "to the target") => c.net.abs() < 1e6,
                // A reverse delay counted twice, capped by what each
                // exchange took: between the true change and twice it.
                ("4 KiB reads, iodepth 1", _) => c.net >= 0.85 * adds.0 / 2.0 && c.net <= 1.15 * adds.1,
                // Two round trips, each crossing the delay once; a reverse
                // delay also slows the Data-Out, whose ACKs it holds (NET's
                // transfer time): fio's change is the upper measure.
                _ => c.net >= 0.85 * adds.0.min(c.fio) && c.net <= 1.15 * adds.1.max(c.fio),
            };
            check(ok, format!("one way ({step}), {what}: NET moved {:.3} ms", c.net / 1e6));
        }
    }

    // 3. Inside the target.
    let (before, after) = (t1.mean_since(&t0), t2.mean_since(&t1));
    for what in slow_works {
        let c = change(&cmds, &jobs, "slow, plain", "slow, delayed", what, untimed);
        let dm = if what.contains("reads") { after.0 - before.0 } else { after.1 - before.1 };
        println!(
            "dm-delay {DM_MS} ms, {what}: the device's time per I/O {:+.3} ms, fio {:+.3} ms; TARGET {:+.3} ms, NET {:+.3} ms",
            dm / 1e6,
            c.fio / 1e6,
            c.target / 1e6,
            c.net / 1e6
        );
        check(dm > 2e6, format!("{what}: dm-delay added only {:.3} ms", dm / 1e6));
        // What dm-delay adds, three ways, each off in its own way under
        // emulation: what it is told (5.10 and 6.1 end each wait on a timer
        // tick, 4 ms at HZ=250, so they add more), the device's diskstats
        // (whole ticks there), fio's change (time outside RESP; on 7.3 it
        // was below the device's: 7.12 ms for 8.02). TARGET within 15% of
        // the range they span, but for what NET took of it (bounded below):
        // the R2T round trip that anchors NET here includes LIO's
        // turnaround, which grows with its backend's delay under emulation
        // (+0.3 to +1.2 ms seen).
        let told = DM_MS as f64 * 1e6;
        check(
            c.target + c.net.max(0.0) >= 0.85 * told.min(dm).min(c.fio) && c.target <= 1.15 * dm.max(c.fio),
            format!(
                "{what}: TARGET moved {:.3} ms; dm-delay told {DM_MS} ms, the device {:.3} ms, fio {:.3} ms",
                c.target / 1e6,
                dm / 1e6,
                c.fio / 1e6
            ),
        );
        // Writes: NET counts R2T -> last Data-Out handed to TCP, which
        // moves with the target's load under emulation.
        let bound = if what.contains("reads") { 1e6 } else { 2e6 };
        check(c.net.abs() < bound, format!("{what}: NET moved {:.3} ms with a delay inside the target", c.net / 1e6));
    }
    assert!(failed.is_empty(), "{} failed:\n{}", failed.len(), failed.join("\n"));
}
