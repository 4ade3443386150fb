//! What happened to a session over time: its state in sysfs, polled, and
//! the kernel log's lines.

use super::lab::sh;
use std::time::Duration;

/// `[  123.456789] text` lines of the kernel log containing `what`: (ns
/// since boot, the line).
pub fn kernel_log_lines(what: &str) -> Vec<(u64, String)> {
    sh("dmesg")
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            let ts = l.strip_prefix('[')?.split(']').next()?.trim();
            let (s, frac) = ts.split_once('.')?;
            Some((s.parse::<u64>().ok()? * 1_000_000_000 + frac.parse::<u64>().ok()? * 1000, l.to_string()))
        })
        .collect()
}

/// The times (ns since boot) of the kernel log's lines containing `what`.
pub fn kernel_log(what: &str) -> Vec<u64> {
    kernel_log_lines(what).into_iter().map(|(t, _)| t).collect()
}

/// A session's state as sysfs gives it ("" when the session is gone).
pub fn session_state(sid: u32) -> String {
    std::fs::read_to_string(format!("/sys/class/iscsi_session/session{sid}/state"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// (CLOCK_MONOTONIC time, state) at each change of a session's state.
pub type StateLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>;

/// Poll a session's sysfs state every 50 ms until `stop`.
pub fn poll_state(
    sid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (std::thread::JoinHandle<()>, StateLog) {
    use std::sync::{atomic::Ordering, Arc, Mutex};
    let log = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let l = log.clone();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let s = session_state(sid);
            let mut v = l.lock().unwrap();
            if v.last().map(|(_, x)| x != &s).unwrap_or(true) {
                v.push((storprototrace::cli::output::monotonic_ns(), s));
            }
            drop(v);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (h, log)
}
