//! End-to-end tests of iscfreeze and submitslower against a real iSCSI
//! session, inside the lab VM (run with --ignored through tests/lab/run; see
//! the report in tools/iscfreeze_example.txt). Outside the VM they are ignored.

// The tests/support modules this binary uses: public, so what it leaves unused
// of one is not dead code; a module it does not use at all is an unused import.
pub mod support {
    pub mod fio;
    pub mod json;
    pub mod lab;
    pub mod margin;
    pub mod sessions;
    pub mod tools;
}

use serde_json::Value;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use storprototrace::cli::output::monotonic_ns;
use support::margin::{ms, timing};
use support::{fio::*, json::*, lab::*, sessions::*, tools::*};

fn scheduler(disk: &str) -> String {
    let text = std::fs::read_to_string(format!("/sys/block/{disk}/queue/scheduler")).unwrap();
    text.split_whitespace().find(|s| s.starts_with('[')).unwrap().trim_matches(|c| c == '[' || c == ']').to_string()
}

/// Switch the scheduler from a shell of its own: (pid of that shell, start, end).
fn switch(disk: &str, to: &str) -> (u32, u64, u64) {
    let t0 = monotonic_ns();
    let child =
        Command::new("sh").arg("-c").arg(format!("echo {to} > /sys/block/{disk}/queue/scheduler")).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    (pid, t0, monotonic_ns())
}

struct Run {
    freezes: Vec<Value>,
    quiesces: Vec<Value>,
    slow: Vec<Value>,
    /// The stretch before the first switch, fio running: (start, end).
    unswitched: (u64, u64),
    switches: Vec<(u32, u64, u64)>,
    fio: Fio,
    fio_pid: u32,
    /// What iscfreeze said at start about this kernel.
    said: String,
}

/// fio writing to `disk` with iscfreeze and submitslower running (one start
/// of each): first `unswitched` without any switch, then `k` scheduler
/// switches (none <-> mq-deadline); fio runs until the last switch is done,
/// however long the switches take, and is then stopped.
fn run_with_switches(disk: &str, unswitched: Duration, k: usize) -> Run {
    let [fz, ss]: [Traced; 2] =
        start_together(&[("iscfreeze", &["--json", "-u", "0"]), ("submitslower", &["--json", "-m", "1", "--iscsi"])])
            .try_into()
            .ok()
            .unwrap();
    let job = fio_cmd(disk, "randwrite", 10_000_000, 8, &["--time_based", "--runtime=3600"]).spawn().unwrap();
    let fio_pid = job.id();
    let t0 = monotonic_ns();
    std::thread::sleep(unswitched);
    let unswitched = (t0, monotonic_ns());
    let mut switches = Vec::new();
    for _ in 0..k {
        let to = if scheduler(disk) == "none" { "mq-deadline" } else { "none" };
        switches.push(switch(disk, to));
        // fio's submissions between switches, and after the last one
        std::thread::sleep(Duration::from_millis(600));
    }
    let f = fio_stop(job);
    let (fz, ss) = (fz.stop(), ss.stop());
    assert!(fz.status.success(), "iscfreeze: {}", fz.stderr);
    assert!(ss.status.success(), "submitslower: {}", ss.stderr);
    let events = fz.json();
    let on = |kind: &str| {
        events.iter().filter(|e| e.str("kind") == kind && e.str("disk") == disk).cloned().collect::<Vec<_>>()
    };
    let others: Vec<&Value> = events.iter().filter(|e| e.str("disk") != disk).collect();
    assert!(others.is_empty(), "freezes/quiesces on other disks: {others:?}");
    println!(
        "iscfreeze summary:\n{}",
        fz.stderr.lines().filter(|l| !l.starts_with("Tracing")).collect::<Vec<_>>().join("\n")
    );
    let said = fz.stderr.lines().filter(|l| l.contains("note:")).collect::<Vec<_>>().join("\n");
    Run { freezes: on("freeze"), quiesces: on("quiesce"), slow: ss.json(), unswitched, switches, fio: f, fio_pid, said }
}

/// The `k` switches' run on `d`: fio's rate, then each freeze.
fn print_freezes(r: &Run, k: usize, d: &str) {
    println!(
        "{k} switches on {d} during fio ({} I/Os, {:.0} IOPS): {} freezes, {} quiesces",
        r.fio.ios(),
        r.fio.ios() as f64 * 1000.0 / r.fio.runtime_ms,
        r.freezes.len(),
        r.quiesces.len()
    );
    for f in &r.freezes {
        println!(
            "  freeze by {} {}: frozen {:.3} ms, waiters {} (max {:.3} ms, total {:.3} ms); stack {}",
            f.str("comm"),
            f.u64("pid"),
            ms(f.u64("frozen_ns")),
            f.u64("waiters"),
            ms(f.u64("wait_max_ns")),
            ms(f.u64("wait_total_ns")),
            f.str("stack")
        );
    }
}

/// One freeze per switch, in switch order, each by the shell that wrote the
/// scheduler file, inside that write, in the switch's stack; quiesces in
/// the switch too. The submissions delayed behind the freezes.
fn check_freezes(r: &Run, k: usize) -> u64 {
    // 6.1: elevator_switch() freezes once per switch (and quiesces inside the freeze).
    assert_eq!(r.freezes.len(), k, "one freeze per scheduler switch");
    let pids: Vec<u64> = r.switches.iter().map(|s| s.0 as u64).collect();
    for (f, (pid, t0, t1)) in r.freezes.iter().zip(&r.switches) {
        assert_eq!(f.str("comm"), "sh", "started by the writing shell: {f}");
        assert_eq!(f.u64("pid"), *pid as u64, "freezes in switch order, each by its writer: {f} (writers {pids:?})");
        let stack = f.str("stack");
        // The freeze is taken in the elevator switch (5.10, 6.1) or, from
        // 6.12, by the queue's sysfs store itself before it switches.
        assert!(
            ["elevator_switch", "elevator_change", "elv_iosched_store", "queue_attr_store"]
                .iter()
                .any(|f| stack.contains(f)),
            "stack shows the scheduler switch: {stack}"
        );
        let (s, e) = (f.u64("start_ns"), f.u64("end_ns"));
        assert!(e > s && f.u64("frozen_ns") == e - s, "{f}");
        assert!(s >= *t0 && e <= *t1, "the freeze lies inside the write to the scheduler file: {f} vs {t0}..{t1}");
        assert_eq!(f.u64("waits_seen"), f.u64("waiters"), "every waiter's wait arrived");
    }
    let delayed: u64 = r.freezes.iter().map(|f| f.u64("waiters")).sum();
    println!("I/O delayed behind the {k} freezes: {delayed} submissions");
    for q in &r.quiesces {
        let qs = q.str("stack");
        assert!(
            ["elevator_switch", "elevator_change", "elv_iosched_store", "queue_attr_store"]
                .iter()
                .any(|f| qs.contains(f)),
            "{q}"
        );
        assert!(q["waiters"].is_null(), "{q}");
    }
    delayed
}

/// submitslower: fio's slow submissions, those during a switch and the
/// others; fio held by the freezes (`delayed` submissions, where the kernel
/// lets them be counted).
fn check_fio_held(r: &Run, d: &str, delayed: u64) {
    let fio_slow: Vec<&Value> = r.slow.iter().filter(|s| s.str("disk") == d && s.str("comm") == "fio").collect();
    assert!(r.slow.iter().all(|s| s.u64("lat_ns") >= 1_000_000));
    let during = |s: &Value| {
        let end = s.u64("end_ns");
        let begin = end - s.u64("lat_ns");
        r.freezes.iter().any(|f| begin <= f.u64("end_ns") && end >= f.u64("start_ns"))
    };
    let in_switch: Vec<&Value> = fio_slow.iter().copied().filter(|s| during(s)).collect();
    let max_in = in_switch.iter().map(|s| s.u64("lat_ns")).max().unwrap_or(0);
    let max_out = fio_slow.iter().copied().filter(|s| !during(s)).map(|s| s.u64("lat_ns")).max().unwrap_or(0);
    println!(
        "submitslower -m 1 --iscsi: {} slow submissions by fio (pid {}), {} overlapping a freeze (max {:.3} ms), max elsewhere {:.3} ms",
        fio_slow.len(), r.fio_pid, in_switch.len(), ms(max_in), ms(max_out)
    );
    // Seen once in the lab (6.1, nomerges=2, udevd stopped): each switch held
    // fio once in __bio_queue_enter; a run without quiet_disks saw no waiter.
    // Where bio_queue_enter is inline (before 6.1) the bios waiting for an
    // unfreeze cannot be counted: the tool says so at start, and the test
    // checks that line instead of the number.
    if r.said.contains("__bio_queue_enter is not traceable") {
        println!("this kernel cannot count bios waiting for an unfreeze; iscfreeze said: {}", r.said);
    } else {
        // A coincidence of scheduling (about one switch in three holds fio):
        // statistical, rerun once.
        timing(delayed > 0, "fio waited behind at least one freeze");
    }
    // Under emulation 1-4 ms submissions happen anyway, so the check is that
    // fio's submissions were held by the freezes, not that there are none
    // elsewhere.
    timing(!in_switch.is_empty(), "fio's submissions were held during the freezes");
}

#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn freeze_per_scheduler_switch_by_the_writer_and_none_without() {
    let lab = lab();
    quiet_disks(&lab);
    let d = lab.disks[0].clone();
    // fio is held by a given switch only about one time in three on 5.10
    // (4 of 12 in three runs; one CI run saw 0 of 4): 12 switches make a
    // run where none holds it unlikely (under 1%).
    let k = 12;
    let before = scheduler(&d);
    let r = run_with_switches(&d, Duration::from_secs(8), k);
    assert_eq!(scheduler(&d), before, "an even number of switches ends where it began");

    // Before the first switch, fio writing: no freeze and no quiesce at all.
    let (u0, u1) = r.unswitched;
    let first = r.switches[0].1;
    let early: Vec<&Value> = r.freezes.iter().chain(&r.quiesces).filter(|e| e.u64("start_ns") < first).collect();
    println!(
        "no switching for {:.1} s with fio writing: {} freezes or quiesces before the first switch",
        (u1 - u0) as f64 / 1e9,
        early.len()
    );
    assert!(early.is_empty(), "a freeze or quiesce without a switch: {early:?}");

    print_freezes(&r, k, &d);
    let delayed = check_freezes(&r, k);
    // submitslower: fio's slow submissions, those during a switch and the others.
    check_fio_held(&r, &d, delayed);
}

/// Cut all traffic on lo for 30 s (netem loss 100%): when the loss began
/// and ended.
fn cut_the_link_30s() -> (u64, u64) {
    let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
    sh("tc qdisc add dev lo root netem loss 100%");
    let loss_on = monotonic_ns();
    std::thread::sleep(Duration::from_secs(30));
    sh("tc qdisc del dev lo root");
    let loss_off = monotonic_ns();
    (loss_on, loss_off)
}

/// Wait for the session to be LOGGED_IN again: 120 s at most (a hang, not
/// slowness: it takes seconds), then fail saying so.
fn wait_logged_in(states: &StateLog) {
    for _ in 0..1200 {
        if states.lock().unwrap().last().map(|(_, s)| s == "LOGGED_IN").unwrap_or(false) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the session was not LOGGED_IN again 120 s after the link came back: {:?}", states.lock().unwrap());
}

/// Every event iscfreeze printed.
fn print_events(events: &[Value]) {
    for e in events {
        println!(
            "  {} {} by {} {}: {:.3} s .. {:.3} s = {:.3} s; stack {}",
            e.str("kind"),
            e.str("disk"),
            e.str("comm"),
            e.u64("pid"),
            e.u64("start_ns") as f64 / 1e9,
            e.u64("end_ns") as f64 / 1e9,
            e.u64("frozen_ns") as f64 / 1e9,
            e.str("stack")
        );
    }
}

/// The freezes of a connection loss are iscsid's rescans after the
/// re-login, each after the quiesce of its disk ended.
fn check_rescan_freezes(quiesces: &[&Value], freezes: &[&Value]) {
    for f in freezes {
        assert!(
            f.str("comm") == "iscsid" && f.str("stack").contains("scsi_rescan_device"),
            "a connection loss freezes nothing but through iscsid's rescan after the re-login: {f}"
        );
        let q_end = quiesces.iter().filter(|q| q.str("disk") == f.str("disk")).map(|q| q.u64("end_ns")).max();
        assert!(
            q_end.is_some_and(|e| f.u64("start_ns") >= e),
            "the rescan's freeze of {} comes after the outage's quiesce of it: {f}",
            f.str("disk")
        );
    }
    println!(
        "{} freezes by iscsid's rescan after the re-login (open-iscsi 2.1.10 and later rescan on re-login)",
        freezes.len()
    );
}

#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn connection_loss_is_a_quiesce_from_failure_to_relogin() {
    let lab = lab();
    quiet_disks(&lab);
    let d = lab.disks[0].clone();
    let sid = sid_of(&d);
    let fz = start("iscfreeze", &["--json"]);
    let stop = Arc::new(AtomicBool::new(false));
    let (poller, states) = poll_state(sid, stop.clone());
    let job = fio_cmd(&d, "randread", 10_000_000, 4, &["--time_based", "--runtime=55"]).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let (loss_on, loss_off) = cut_the_link_30s();
    let f = fio_result(job.wait_with_output().unwrap());
    // Wait for the session to be back before stopping the tracer.
    wait_logged_in(&states);
    std::thread::sleep(Duration::from_secs(2));
    let out = fz.stop();
    stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    let events = out.json();
    let states = states.lock().unwrap().clone();
    let conn_err = kernel_log(&format!("connection{sid}:0: detected conn error"));
    println!(
        "fio through the outage: {} I/Os; loss on {:.3} s, off {:.3} s (monotonic)",
        f.ios(),
        loss_on as f64 / 1e9,
        loss_off as f64 / 1e9
    );
    println!(
        "session {sid} states: {:?}",
        states.iter().map(|(t, s)| format!("{s}@{:.3}", *t as f64 / 1e9)).collect::<Vec<_>>()
    );
    println!(
        "kernel log 'detected conn error' on connection{sid}:0 at {:?} s",
        conn_err.iter().map(|t| *t as f64 / 1e9).collect::<Vec<_>>()
    );
    print_events(&events);
    // The outage itself only quiesces. open-iscsi 2.1.10 and later (trixie's
    // 2.1.11, not bookworm's 2.1.8) rescan every LUN after a re-login
    // ("iscsid: Rescan devices on relogin"): the rescan revalidates the disk,
    // which on 7.x commits its queue limits with the queue frozen. Those
    // freezes are iscsid's, through the sysfs rescan, after the quiesce of
    // the same disk ended; any other freeze fails the test.
    let (quiesces, freezes): (Vec<&Value>, Vec<&Value>) = events.iter().partition(|e| e.str("kind") == "quiesce");
    check_rescan_freezes(&quiesces, &freezes);
    let lab_disks: Vec<&str> = lab.disks.iter().map(String::as_str).collect();
    assert!(events.iter().all(|e| lab_disks.contains(&e.str("disk"))), "only iSCSI disks");
    let q: Vec<&Value> = quiesces.iter().copied().filter(|e| e.str("disk") == d).collect();
    assert_eq!(q.len(), 1, "one quiesce of {d} for the outage: {q:?}");
    let q = q[0];
    let (qs, qe) = (q.u64("start_ns"), q.u64("end_ns"));
    let err = *conn_err.last().expect("the kernel logged the connection error");
    let relogin = states.iter().rev().find(|(_, s)| s == "LOGGED_IN").map(|(t, _)| *t).unwrap();
    let failed = states.iter().find(|(_, s)| s == "FAILED").map(|(t, _)| *t).expect("the session went FAILED");
    println!(
        "quiesce of {d}: starts {:+.3} s after the conn error (session FAILED at {:+.3} s), ends {:+.3} s after the session is LOGGED_IN again",
        (qs as f64 - err as f64) / 1e9, (failed as f64 - err as f64) / 1e9, (qe as f64 - relogin as f64) / 1e9
    );
    assert!(qs > loss_on && qe > loss_off, "the quiesce is the outage's");
    assert!(qs + 1_000_000_000 >= err && qs <= err + 5_000_000_000, "quiesce starts at the connection error");
    assert!(qe + 2_000_000_000 >= relogin && qe <= relogin + 2_000_000_000, "quiesce ends at the re-login");
    assert!(qe - qs >= 15_000_000_000, "the stall lasts most of the outage");
}
