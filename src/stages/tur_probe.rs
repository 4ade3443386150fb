//! The active probe behind `--tur SECS`: a TEST UNIT READY to each traced
//! disk every SECS seconds, on a thread of its own. The target answers it
//! from memory, so each one is a clean round trip of its connection, and
//! NET is known from the first interval on, even when the tool starts
//! while the network is already slow (isclatency(8), NET).

use crate::error::{Error, Result};
use crate::iscsi::topology::Topology;
use crate::stages::filters::{device_key, Filters, KernelFilter};
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long one TEST UNIT READY may take before it counts as failed.
const TUR_TIMEOUT_MS: u32 = 10_000;

/// `--tur SECS`.
#[derive(Args, Debug, Clone, Default)]
pub struct TurFlag {
    /// Send a TEST UNIT READY to each traced disk every SECS seconds, so NET
    /// is known from the first (off by default; see NET in the man page)
    #[arg(long, value_name = "SECS")]
    pub tur: Option<u64>,
}

impl TurFlag {
    /// The interval, checked against the filters: the commands it sends
    /// have no direction and are the tool's own, so a direction or process
    /// filter would drop them in the kernel before they tell anything.
    pub fn interval(&self, f: &Filters) -> Result<Option<Duration>> {
        let Some(secs) = self.tur else { return Ok(None) };
        if secs == 0 || secs > 3600 {
            return Err(Error::usage("--tur must be 1 to 3600 seconds"));
        }
        if f.reads || f.writes || f.pid.is_some() || f.cgroup.is_some() {
            return Err(Error::usage(
                "--tur cannot be used with -r, -w, -p or --cgroup: they drop its TEST UNIT READYs in the kernel",
            ));
        }
        Ok(Some(Duration::from_secs(secs)))
    }
}

/// The disks the filter traces, as named under /dev.
pub fn traced_disks(topo: &Topology, f: &KernelFilter) -> Vec<String> {
    let mut disks = Vec::new();
    for s in &topo.sessions {
        if f.hosts.as_ref().is_some_and(|h| !h.contains(&s.host)) {
            continue;
        }
        for l in &s.luns {
            let wanted = f.lun.is_none_or(|lun| lun == l.lun)
                && f.devices.as_ref().is_none_or(|d| d.contains(&device_key(s.host, l.lun)));
            if let (true, Some(disk)) = (wanted, &l.disk) {
                disks.push(disk.clone());
            }
        }
    }
    disks
}

/// The disks `filter` traces in the topology read from `sysfs` now (None:
/// it could not be read).
fn disks_now(sysfs: &std::path::Path, filter: &KernelFilter) -> Option<Vec<String>> {
    Topology::read(sysfs).ok().map(|t| traced_disks(&t, filter))
}

/// One round: a TEST UNIT READY to each disk through `send` (true:
/// answered), counted in `answered` or `failed`. The stop flag is read
/// before each one, so once told to stop the thread sends nothing more and
/// at most the one in flight goes uncounted in the summary.
fn round(
    disks: &[String],
    stop: &AtomicBool,
    mut send: impl FnMut(&str) -> bool,
    answered: &AtomicU64,
    failed: &AtomicU64,
) {
    for d in disks {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let counter = if send(d) { answered } else { failed };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The probe thread, told to stop when dropped. It is never joined: a TEST
/// UNIT READY to a session in recovery blocks until the kernel fails it
/// (the replacement timeout, 120 s by default), and the tool's exit must
/// not wait for that.
pub struct TurProbe {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl TurProbe {
    /// Start sending, the first round at once, to the disks of `topo` that
    /// `filter` traces. Each later round reads the topology again from
    /// `sysfs`, so a disk that appears while the tool runs (a session
    /// logged in again, a LUN added) is probed from the next round on; if
    /// the read fails, the round probes the disks of the one before.
    pub fn start(topo: &Topology, filter: KernelFilter, sysfs: PathBuf, every: Duration) -> TurProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, n, e) = (stop.clone(), sent.clone(), failed.clone());
        let mut disks = traced_disks(topo, &filter);
        std::thread::spawn(move || {
            let mut first = true;
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                if !first {
                    if let Some(now) = disks_now(&sysfs, &filter) {
                        disks = now;
                    }
                }
                first = false;
                round(&disks, &s, |d| crate::iscsi::tur::test_unit_ready(d, TUR_TIMEOUT_MS).is_ok(), &n, &e);
                while t.elapsed() < every && !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50).min(every));
                }
            }
        });
        TurProbe { stop, sent, failed }
    }

    /// Stop, and say what was sent, for the exit summary.
    pub fn finish(self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let (n, e) = (self.sent.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed));
        format!("{n} TEST UNIT READYs answered, {e} failed")
    }
}

impl Drop for TurProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The disks each filter traces, on the two-session, two-LUN fixture.
    #[test]
    fn traced_disks_follow_the_filters() {
        let t =
            Topology::read(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let disks = |f: Filters| traced_disks(&t, &f.resolve(&t).unwrap());
        let all: Vec<String> = t.sessions.iter().flat_map(|s| s.luns.iter().filter_map(|l| l.disk.clone())).collect();
        assert_eq!(all.len(), 4);
        assert_eq!(disks(Filters::default()), all);
        let s2 = t.session(2).unwrap();
        let of_s2: Vec<String> = s2.luns.iter().filter_map(|l| l.disk.clone()).collect();
        assert_eq!(disks(Filters { sid: Some(2), ..Default::default() }), of_s2);
        let d = s2.luns[1].disk.clone().unwrap();
        assert_eq!(disks(Filters { disk: Some(d.clone()), ..Default::default() }), vec![d]);
        let lun1: Vec<String> = t.sessions.iter().filter_map(|s| s.luns[1].disk.clone()).collect();
        assert_eq!(disks(Filters { lun: Some(1), ..Default::default() }), lun1);
    }

    /// A session logged in again names its disk anew: the next round's
    /// disks are read from sysfs then, the filter as resolved at start.
    #[test]
    fn each_round_reads_the_disks_again() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2");
        let tmp = std::env::temp_dir().join(format!("tur-probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let cp = std::process::Command::new("cp").arg("-a").arg(&fixture).arg(&tmp).status().unwrap();
        assert!(cp.success());
        let t = Topology::read(&tmp).unwrap();
        let s1 = t.session(1).unwrap();
        let filter = Filters { sid: Some(1), ..Default::default() }.resolve(&t).unwrap();
        let before: Vec<String> = s1.luns.iter().filter_map(|l| l.disk.clone()).collect();
        assert_eq!(disks_now(&tmp, &filter).unwrap(), before);
        // sdb (6:0:0:1) comes back as sdx.
        let lun1 = tmp.join("devices/platform/host6/session1/target6:0:0/6:0:0:1/block");
        std::fs::rename(lun1.join("sdb"), lun1.join("sdx")).unwrap();
        let after = disks_now(&tmp, &filter).unwrap();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(after, vec![before[0].clone(), "sdx".to_string()]);
    }

    /// Told to stop during a round, the probe sends nothing more: the
    /// summary's count is short by at most the one in flight.
    #[test]
    fn a_round_stops_before_the_next_disk() {
        let disks: Vec<String> = ["sda", "sdb", "sdc", "sdd"].map(String::from).to_vec();
        let (stop, answered, failed) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
        let mut sent = Vec::new();
        round(
            &disks,
            &stop,
            |d| {
                sent.push(d.to_string());
                if d == "sdb" {
                    stop.store(true, Ordering::Relaxed);
                }
                d != "sda"
            },
            &answered,
            &failed,
        );
        assert_eq!(sent, ["sda", "sdb"]);
        assert_eq!((answered.load(Ordering::Relaxed), failed.load(Ordering::Relaxed)), (1, 1));
        stop.store(false, Ordering::Relaxed);
        let mut n = 0;
        round(
            &disks,
            &stop,
            |_| {
                n += 1;
                true
            },
            &answered,
            &failed,
        );
        assert_eq!((n, answered.load(Ordering::Relaxed)), (4, 5));
    }

    #[test]
    fn interval_is_checked_against_the_filters() {
        let all = Filters::default();
        assert_eq!(TurFlag { tur: None }.interval(&all).unwrap(), None);
        assert_eq!(TurFlag { tur: Some(2) }.interval(&all).unwrap(), Some(Duration::from_secs(2)));
        assert!(TurFlag { tur: Some(0) }.interval(&all).is_err());
        assert!(TurFlag { tur: Some(3601) }.interval(&all).is_err());
        let reads = Filters { reads: true, ..Default::default() };
        assert!(TurFlag { tur: Some(2) }.interval(&reads).is_err());
        let pid = Filters { pid: Some(1), ..Default::default() };
        assert!(TurFlag { tur: Some(2) }.interval(&pid).is_err());
    }
}
