//! The lab VM this test runs in (tests/lab/run): its disks and targets,
//! its iSCSI sessions in sysfs, and a shell.

use std::process::Command;
use std::time::Duration;
use storprototrace::iscsi::topology::Topology;

pub struct Lab {
    pub disks: Vec<String>,
    pub targets: Vec<String>,
}

/// The lab this test runs in. Outside the VM there is none: the lab tests
/// are #[ignore]d and only run through tests/all.
pub fn lab() -> Lab {
    let disks: Vec<String> = std::env::var("LAB_DISKS")
        .expect("LAB_DISKS unset: run through tests/all")
        .split_whitespace()
        .map(String::from)
        .collect();
    let targets = std::env::var("LAB_TARGETS").unwrap_or_default().split_whitespace().map(String::from).collect();
    assert!(!disks.is_empty(), "the lab has no disks");
    Lab { disks, targets }
}

pub fn topology() -> Topology {
    Topology::read(std::path::Path::new("/sys")).expect("read sysfs")
}

pub fn sid_of(disk: &str) -> u32 {
    let t = topology();
    t.disk(disk).unwrap_or_else(|| panic!("{disk} is not an iSCSI disk: {}", t.describe())).0.sid
}

pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("run sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Make counts exact: no merging of adjacent I/Os, and no udev probing the
/// disks after fio closes them. Stopping udev's exec queue is not enough:
/// udevd's inotify watch itself re-reads the partition table (BLKRRPART) of
/// a disk closed after writing, 18 SCSI commands here. So udevd is stopped.
pub fn quiet_disks(lab: &Lab) {
    for d in &lab.disks {
        sh(&format!("echo 2 > /sys/block/{d}/queue/nomerges"));
    }
    sh("udevadm settle -t 10 || true; udevadm control --exit || true; pkill -x systemd-udevd || true; sleep 1");
}

/// After a login to `target`: wait (30 s at most) until its session has a
/// disk on its first LUN, then set that disk up like quiet_disks does.
pub fn session_disk_after_login(target: &str) -> (storprototrace::iscsi::topology::Session, String) {
    for _ in 0..60 {
        let topo = topology();
        if let Some(s) = topo.sessions.iter().find(|s| s.target == target) {
            if let Some(d) = s.luns.first().and_then(|l| l.disk.clone()) {
                sh(&format!("echo 2 > /sys/block/{d}/queue/nomerges"));
                return (s.clone(), d);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("no disk for {target} 30 s after login");
}

/// After a login: open-iscsi 2.1.10+ (trixie's iscsid) rescans every LUN
/// of a session that logged in again, freezing each disk's queue for a
/// while: fio latencies taken then are not the path's own. Waits that out.
pub fn settle_after_login() {
    std::thread::sleep(Duration::from_secs(4));
}
