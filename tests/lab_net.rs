//! NET follows the network while a session stays up: a netem delay added
//! and removed mid-session, one direction at a time, and a delay inside the
//! target changed mid-session, each against fio's own latencies and the
//! dm-delay device's. Runs only inside the lab VM, through `tests/all`.

pub mod support {
    pub mod faults;
    pub mod fio;
    pub mod json;
    pub mod lab;
    pub mod margin;
    pub mod tools;
}

use serde_json::Value;
use std::time::Duration;
use support::margin::{at_least, at_most, ms, timing, within};
use support::{faults::*, fio::*, json::*, lab::*, tools::*};

/// The network's delay added mid-session, ms (each direction).
const D_MS: u32 = 5;
/// What dm-delay is told mid-session, ms.
const DM_MS: u32 = 8;
/// Idle long enough for the initiator to ping the target: open-iscsi's
/// noop_out_interval (5 s, the lab's) with nothing received, and the
/// NOP-In's way back.
const NOP_WAIT: Duration = Duration::from_secs(7);
/// Writes of 256 KiB: an R2T each (more than the 8 KiB of immediate data
/// LIO takes by default).
const BIG: &str = "--bs=256k";

/// NET's change under netem both ways, against `trips` x what netem adds to
/// a round trip: from NET_LOW x the minimum's growth to 15% above the
/// median's. Below, 20%: the anchor of the symmetric estimate is a clean
/// round trip taken under netem's jitter (emulated: 1-2 ms), so after the
/// delay is removed NET stays up to 2 ms high until the next clean round
/// trip (81% seen on 6.1, docs/measurements.md).
const NET_LOW: f64 = 0.8;
/// The same for 256 KiB writes (two round trips, an R2T each), and for
/// them one way (against the lesser of netem's growth and fio's change).
/// Their NET is mostly 1.00-1.06 x netem's minimum growth, but in one 6.1
/// run of ten it took a third less, every phase alike (0.72 both ways,
/// 0.74 one way; TARGET +7.38 ms): 0.6 keeps such a run green and still
/// fails an estimate that misses one of the two round trips (0.5)
/// (docs/measurements.md, "Timing bounds and their spread").
const BIG_WRITES_NET_LOW: f64 = 0.6;
/// TARGET moves with the network (rises when it is added, falls when it is
/// removed) by at most 1 ms plus this share of the change: what a delayed
/// exchange takes beyond the round trip under emulation (+1.44 and -1.67 ms
/// of about 10.5 seen on 6.1).
const TARGET_SHARE: f64 = 0.2;
/// The same for 256 KiB writes: +3.06 ms seen in a good run, +7.38 ms (0.35
/// of netem's median growth) in the run whose NET took a third less.
const BIG_WRITES_TARGET_SHARE: f64 = 0.4;

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
    // A share that depends on scheduling (lab_e2e's phase_split): statistical.
    timing(
        at_most(&format!("{} {} not split", job.step, job.what), (c.len() - s.len()) as f64, c.len() as f64 / 20.0),
        format!("{} / {}: {} of {} not split", job.step, job.what, c.len() - s.len(), c.len()),
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

/// What netem adds to a round trip in this boot (support's netem_adds),
/// as (the lesser, the greater) of the minimum's and the median's growth:
/// on a loaded host the plain median can be the noisy one (1.80 ms for a
/// 0.57 ms minimum, 6.1, 2026-12-06), its growth then the lesser.
fn netem_range(plain: &[u64], delayed: &[u64]) -> (f64, f64) {
    let (by_min, by_median) = netem_adds(D_MS as f64, plain, delayed);
    (by_min.min(by_median), by_min.max(by_median))
}

/// Everything with one start of isclatency, on one session of the plain
/// LUN that never logs in again, and on a LUN on dm-delay:
/// 1. netem delay on lo (both ways) added mid-session: NET's median moves
///    by what netem adds to a round trip in this boot (UDP echoes: from
///    NET_LOW, BIG_WRITES_NET_LOW for 256 KiB writes, of its minimum's
///    growth to 15% above its median's) from 10 s after it, once per round
///    trip; TARGET does not rise (fall, when it is removed) by more than
///    1 ms plus TARGET_SHARE (BIG_WRITES_TARGET_SHARE) of the change; reads
///    at iodepth 1 and 8, writes of 4 and 256 KiB. fio's change is printed
///    beside it.
/// 2. The delay one way only (to the target's port, then from it, with the
///    delay removed and a clean round trip between): reads have no clean
///    round trip and follow the reverse delay assuming a symmetric path,
///    so NET misses a forward delay (its move is printed; asserted under
///    half the delay, which shows as TARGET) and counts a reverse one
///    twice, up to what the exchange took; writes with an R2T follow the
///    true change (half a round trip's worth each way, twice). The errors
///    against fio are printed.
/// 3. dm-delay's delay changed mid-session (suspend, reload, resume):
///    TARGET moves by what the device added (TARGET_RANGE of the range
///    spanned by what dm-delay is told, the device's time per I/O and fio's
///    change), NET by less than NET_MOVE_INSIDE_TARGET_NS.
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
    let adds = netem_range(&rt_plain, &rt_delayed);

    // Every measure is printed before any is judged; every judgment is a
    // timing one (support::margin): the counts were asserted above.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, why: String| {
        if !ok {
            println!("FAILED: {why}");
            failed.push(why);
        }
    };

    // 1. Both ways, added and removed: NET's change (its sign taken out)
    // against what netem adds to the round trips the workload crosses.
    let works = ["4 KiB reads, iodepth 1", "4 KiB reads, iodepth 8", "4 KiB writes", "256 KiB writes"];
    for (a, b, sign) in [("plain", "netem", 1.0), ("netem", "removed", -1.0)] {
        for what in works {
            let c = change(&cmds, &jobs, a, b, what, untimed);
            let big = what == works[3];
            let trips = if big { 2.0 } else { 1.0 };
            println!(
                "{a} -> {b}, {what}: NET {:+.3} ms for fio's {:+.3} ms ({:.0}%)",
                ms(c.net),
                ms(c.fio),
                100.0 * c.net / c.fio
            );
            let low = if big { BIG_WRITES_NET_LOW } else { NET_LOW };
            let (lo, hi) = (low * trips * adds.0, 1.15 * trips * adds.1);
            check(
                within(&format!("{a}->{b} {what} NET"), ms(c.net * sign), ms(lo), ms(hi)),
                format!("{a} -> {b}, {what}: NET moved {:.3} ms, netem {:.3}..{:.3} ms", ms(c.net), ms(lo), ms(hi)),
            );
            // What NET leaves of the network's change goes to TARGET: it must
            // not rise (fall, when the delay is removed) by more than this.
            // The other way TARGET may move freely: at iodepth 8 the
            // target's own queueing shrinks while the network slows the
            // commands down (-2.5 ms and -3.2 ms seen on 6.1), and comes back
            // when it is removed; NET's upper bound catches an estimate that
            // takes more than the network's change.
            let t_share = if big { BIG_WRITES_TARGET_SHARE } else { TARGET_SHARE };
            let t_hi = 1e6 + t_share * trips * adds.1;
            check(
                at_most(&format!("{a}->{b} {what} TARGET"), ms(c.target * sign), ms(t_hi)),
                format!("{a} -> {b}, {what}: TARGET moved {:.3} ms with the network", ms(c.target)),
            );
        }
    }

    // 2. One way.
    let one_way = adds.0 / 2.0;
    for step in ["to the target", "from the target"] {
        for what in ["4 KiB reads, iodepth 1", "256 KiB writes"] {
            let c = change(&cmds, &jobs, "removed", step, what, untimed);
            println!(
                "one way ({step}), {what}: NET {:+.3} ms for fio's {:+.3} ms: error {:+.3} ms",
                ms(c.net),
                ms(c.fio),
                ms(c.net - c.fio)
            );
            let name = format!("one way {step} {what} NET");
            let ok = match (what, step) {
                // No forward delay is seen without a clean round trip (the
                // limit is printed above, not asserted): NET moves by well
                // under the delay (-0.01 to +1.31 ms seen for 5.1-5.4 ms
                // one way), and the delay shows as TARGET instead.
                ("4 KiB reads, iodepth 1", "to the target") => {
                    let net_ok = within(&name, ms(c.net), -ms(one_way) / 2.0, ms(one_way) / 2.0);
                    at_least(&format!("one way {step} {what} TARGET"), ms(c.target), 0.6 * ms(one_way)) && net_ok
                }
                // A reverse delay counted twice, capped by what each
                // exchange took: between the true change and twice it.
                ("4 KiB reads, iodepth 1", _) => within(&name, ms(c.net), 0.85 * ms(one_way), 1.15 * ms(adds.1)),
                // Two round trips, each crossing the delay once; a reverse
                // delay also slows the Data-Out, whose ACKs it holds (NET's
                // transfer time): fio's change is the upper measure.
                _ => within(&name, ms(c.net), BIG_WRITES_NET_LOW * ms(adds.0.min(c.fio)), 1.15 * ms(adds.1.max(c.fio))),
            };
            check(
                ok,
                format!(
                    "one way ({step}), {what}: NET moved {:.3} ms, TARGET {:.3} ms, netem {:.3} ms one way",
                    ms(c.net),
                    ms(c.target),
                    ms(one_way)
                ),
            );
        }
    }

    // 3. Inside the target.
    let (before, after) = (t1.mean_since(&t0), t2.mean_since(&t1));
    for what in slow_works {
        let c = change(&cmds, &jobs, "slow, plain", "slow, delayed", what, untimed);
        let dm = if what.contains("reads") { after.0 - before.0 } else { after.1 - before.1 };
        println!(
            "dm-delay {DM_MS} ms, {what}: the device's time per I/O {:+.3} ms, fio {:+.3} ms; TARGET {:+.3} ms, NET {:+.3} ms",
            ms(dm),
            ms(c.fio),
            ms(c.target),
            ms(c.net)
        );
        check(dm > 2e6, format!("{what}: dm-delay added only {:.3} ms", ms(dm)));
        // What dm-delay adds, three ways, each off in its own way under
        // emulation: what it is told (5.10 and 6.1 end each wait on a timer
        // tick, 4 ms at HZ=250, so they add more), the device's diskstats
        // (whole ticks there), fio's change (time outside RESP; on 7.3 it
        // was below the device's: 7.12 ms for 8.02). TARGET in TARGET_RANGE
        // of the range they span, but for what NET took of it (bounded below):
        // the R2T round trip that anchors NET here includes LIO's
        // turnaround, which grows with its backend's delay under emulation
        // (+0.3 to +1.2 ms seen).
        let told = DM_MS as f64 * 1e6;
        let (lo, hi) = (TARGET_RANGE.0 * told.min(dm).min(c.fio), TARGET_RANGE.1 * dm.max(c.fio));
        let target_ok = within(&format!("dm-delay {what} TARGET+NET"), ms(c.target + c.net.max(0.0)), ms(lo), ms(hi))
            && at_most(&format!("dm-delay {what} TARGET"), ms(c.target), ms(hi));
        check(
            target_ok,
            format!(
                "{what}: TARGET moved {:.3} ms; dm-delay told {DM_MS} ms, the device {:.3} ms, fio {:.3} ms",
                ms(c.target),
                ms(dm),
                ms(c.fio)
            ),
        );
        // NET does not take the target's delay (NET_MOVE_INSIDE_TARGET_NS).
        check(
            at_most(&format!("dm-delay {what} NET"), ms(c.net.abs()), ms(NET_MOVE_INSIDE_TARGET_NS)),
            format!("{what}: NET moved {:.3} ms with a delay inside the target", ms(c.net)),
        );
    }
    timing(failed.is_empty(), format!("{} failed:\n{}", failed.len(), failed.join("\n")));
}

/// NET before any clean round trip, two sessions whose connections had
/// traffic without a delay (TCP's minimum RTT is the loopback's, for its
/// 300 s window). isclatency (the watcher) sees a burst of reads on session
/// B, then netem's delay (both ways) is added; session A's first traffic it
/// sees comes after the delay: a tool started while the network is already
/// slow. Reads at iodepth 1 and 4 KiB writes (immediate data, no R2T) in
/// each stretch:
/// 1. On B after the change, then on A: no command is split with NET below
///    half of what netem adds to a round trip in this boot; the rest are
///    not split, and the exit summary counts them as "round trip not known".
/// 2. A second isclatency started with `--tur 2 --disk A` (the prober): a
///    TEST UNIT READY every 2 s, as multipathd's path checker sends, for
///    the watcher; and the active probe, started during the incident, for
///    the prober. From then on, in both, at least 80% of the commands are
///    split, NET's median within 15% (or 1 ms) of the round trip under the
///    delay (UDP echoes: from 15% below their minimum to 15% above their
///    median).
/// 3. The delay removed, the TEST UNIT READYs going on: from 2.5 s after,
///    in both, at least 80% split, NET's median below a quarter of netem's
///    addition.
/// 4. The delay toward the target only, from 10 s after it: in both, at
///    least 80% split, NET's median within 15% (or 1 ms above) of half
///    netem's addition to a round trip (without clean round trips, reads
///    miss a delay toward the target: net_follows_network_changes_mid_session).
///
/// And a target already slow when the tools start: a LUN on dm-delay
/// (DM_MS), logged in and read from before the watcher starts, so that the
/// watcher sees none of its scan.
/// 5. Before any evidence (no netem): no command split with NET above
///    NET_MOVE_INSIDE_TARGET_NS; the rest not split, counted as in 1.
/// 6. With the TEST UNIT READYs (the prober sends them to every disk), the
///    delay removed: in both, at least 80% split, NET's median below a
///    quarter of netem's addition, TARGET's within TARGET_RANGE of what
///    dm-delay is told, the device's time per I/O and fio's latency against
///    the plain LUN's.
///
/// And an idle connection:
/// 7. The prober stopped, then the delay toward the target removed, the
///    connection idle for NOP_WAIT (the reverse delay does not move, and no
///    TEST UNIT READY comes: only the initiator's NOP-Out pings tell the
///    round trip fell): in the watcher, at least 80% split, NET's median
///    below a quarter of netem's addition (the round trip under the delay,
///    half of it, would put it above).
#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn net_known_only_from_evidence_when_started_into_a_slow_network() {
    let lab = lab();
    quiet_disks(&lab);
    let disk = lab.disks[0].clone();
    let disk_b = lab.disks.iter().find(|d| sid_of(d) != sid_of(&disk)).expect("a disk on a second session").clone();
    let slow = SlowLun::create(&lab, DM_MS);
    for d in [&disk, &disk_b, &slow.disk] {
        fio(d, "randread", 50, 1, &[]);
    }
    let rt_plain = udp_round_trips(100);
    let mut jobs = Jobs::default();
    let watcher = start("isclatency", &["-u", "0", "--json", "-T"]);
    let works = ["4 KiB reads, iodepth 1", "4 KiB writes"];
    let stretch = |jobs: &mut Jobs, step: &'static str, disk: &str| {
        jobs.run((step, works[0]), disk, "randread", 150, 1, &[]);
        jobs.run((step, works[1]), disk, "randwrite", 100, 1, &[]);
    };
    jobs.run(("burst", "4 KiB reads"), &disk_b, "randread", 100, 1, &[]);
    stretch(&mut jobs, "slow target, no evidence", &slow.disk);
    let delay = Netem::add(&format!("delay {D_MS}ms"));
    let rt_delayed = udp_round_trips(100);
    stretch(&mut jobs, "changed after first seen", &disk_b);
    stretch(&mut jobs, "no evidence", &disk);
    let prober = start("isclatency", &["-u", "0", "--json", "-T", "--tur", "2"]);
    stretch(&mut jobs, "TEST UNIT READY every 2 s", &disk);
    drop(delay);
    std::thread::sleep(Duration::from_millis(2500));
    stretch(&mut jobs, "delay removed", &disk);
    let t0 = DiskTime::read(&slow.dm);
    stretch(&mut jobs, "slow target, TEST UNIT READY every 2 s", &slow.disk);
    let dm = DiskTime::read(&slow.dm).mean_since(&t0);
    let one_way = Netem::one_way("dport", 3260, &format!("delay {D_MS}ms"));
    jobs.settle("one way", &disk);
    stretch(&mut jobs, "one way to the target", &disk);
    let prober = prober.stop();
    drop(one_way);
    std::thread::sleep(NOP_WAIT);
    stretch(&mut jobs, "idle, one way removed", &disk);
    let watcher = watcher.stop();
    for out in [&watcher, &prober] {
        assert!(out.status.success(), "{}", out.stderr);
        println!("isclatency: {}", out.stderr.lines().rfind(|l| l.contains("commands shown")).unwrap_or(""));
    }
    let adds = netem_range(&rt_plain, &rt_delayed);
    let (cmds, untimed) = (watcher.json(), watcher.untimed());
    let answered = prober.summary("TEST UNIT READYs answered");
    let tur_line = prober.stderr.lines().find(|l| l.contains("TEST UNIT READYs answered")).unwrap();
    let failed_turs: u64 =
        tur_line.rsplit(", ").next().and_then(|f| f.strip_suffix(" failed")).unwrap().parse().unwrap();
    // One at a time (a round goes disk by disk): at most one in flight at
    // the prober's stop.
    let traced = cmds.iter().filter(|c| c.u64("opcode") == 0).count() as u64;
    println!("prober: {answered} TEST UNIT READYs answered, {failed_turs} failed; the watcher traced {traced}");
    assert_eq!(failed_turs, 0, "{}", prober.stderr);
    assert!(
        answered >= 3 && (answered..=answered + 1 + untimed).contains(&traced),
        "{answered} answered, {traced} traced"
    );

    // 1 and 5. Every command either unsplit or split with a NET that is
    // not wrong; the unsplit ones counted with their reason.
    let mut unsplit = 0;
    for (step, what) in ["changed after first seen", "no evidence", "slow target, no evidence"]
        .into_iter()
        .flat_map(|s| works.map(|w| (s, w)))
    {
        let job = jobs.get(step, what);
        let c = commands(&cmds, job, untimed);
        let s: Vec<u64> = c.iter().filter(|c| !c["net_ns"].is_null()).map(|c| c.u64("net_ns")).collect();
        unsplit += c.len() - s.len();
        // Wrong: NET below half of netem's addition; on the slow target
        // (5), NET above NET_MOVE_INSIDE_TARGET_NS, the target's delay taken
        // for the network's.
        let slow_target = step.starts_with("slow target");
        let (wrong, bound) = if slow_target { ("above", NET_MOVE_INSIDE_TARGET_NS) } else { ("below", adds.0 / 2.0) };
        let n_wrong = s.iter().filter(|&&n| if slow_target { n as f64 > bound } else { (n as f64) < bound }).count();
        println!(
            "{step} / {what}: {} commands, {} split ({n_wrong} with NET {wrong} {:.3} ms; {}), NET median {:.3} ms, fio clat mean {:.3} ms",
            c.len(),
            s.len(),
            ms(bound),
            net_from(&c),
            if s.is_empty() { f64::NAN } else { ms(median(s.clone())) },
            ms(job.fio.clat_mean_ns())
        );
        assert_eq!(
            n_wrong,
            0,
            "{step} / {what}: {n_wrong} commands split with NET {wrong} {:.3} ms (netem adds {:.3} ms to a round trip; dm-delay {DM_MS} ms on the slow target)",
            ms(bound),
            ms(adds.0)
        );
    }
    let unknown = watcher.summary_if("with the round trip not known").unwrap_or(0);
    assert!(
        unknown >= unsplit as u64,
        "{unsplit} commands not split before any evidence, {unknown} counted as round trip not known"
    );

    // 2 and 3, in both tools: the share split, NET's median against the
    // round trip under the delay (UDP echoes: its minimum to its median).
    let delayed = (rt_delayed[0] as f64, rt_delayed[rt_delayed.len() / 2] as f64);
    let mut failed: Vec<String> = Vec::new();
    for (tool, out) in [("watcher", &watcher), ("prober", &prober)] {
        let (cmds, untimed) = (out.json(), out.untimed());
        for (step, lo, hi) in [
            (
                "TEST UNIT READY every 2 s",
                (0.85 * delayed.0).min(delayed.0 - 1e6),
                (1.15 * delayed.1).max(delayed.1 + 1e6),
            ),
            ("delay removed", 0.0, adds.0 / 4.0),
            // Seen by the TEST UNIT READYs' round trips once the window's
            // minima from before the change have aged out (8 s: the settling).
            ("one way to the target", 0.85 * adds.0 / 2.0, 1.15 * adds.1 / 2.0 + 1e6),
            // 7: the watcher only (the prober had stopped).
            ("idle, one way removed", 0.0, adds.0 / 4.0),
        ] {
            if tool == "prober" && step.starts_with("idle") {
                continue;
            }
            for what in works {
                let job = jobs.get(step, what);
                let c = commands(&cmds, job, untimed);
                let s: Vec<u64> = c.iter().filter(|c| !c["net_ns"].is_null()).map(|c| c.u64("net_ns")).collect();
                let net = if s.is_empty() { f64::NAN } else { median(s.clone()) };
                println!(
                    "{tool}, {step} / {what}: {} of {} split ({}), NET median {:.3} ms ({:.3}..{:.3}), fio clat mean {:.3} ms",
                    s.len(),
                    c.len(),
                    net_from(&c),
                    ms(net),
                    ms(lo),
                    ms(hi),
                    ms(job.fio.clat_mean_ns())
                );
                let ok = at_least(&format!("{tool} {step} {what} split"), s.len() as f64, 0.8 * c.len() as f64)
                    && within(&format!("{tool} {step} {what} NET"), ms(net), ms(lo), ms(hi));
                if !ok {
                    failed.push(format!(
                        "{tool}, {step} / {what}: {} of {} split, NET median {:.3} ms",
                        s.len(),
                        c.len(),
                        ms(net)
                    ));
                }
            }
        }
        // 6. The slow target with the TEST UNIT READYs: NET the network's,
        // TARGET what dm-delay adds, three ways, each off in its own way
        // (net_follows_network_changes_mid_session): what it is told, the
        // device's time per I/O (whole timer ticks on some kernels), and
        // fio's latency against the plain LUN's same workload just before
        // (on 7.3 dm-delay adds less than it is told: fio +6.7 ms against
        // the plain LUN, the device 8.0 ms per I/O, TARGET's median
        // 6.15-6.36 ms).
        let step = "slow target, TEST UNIT READY every 2 s";
        for (what, dev) in works.into_iter().zip([dm.0, dm.1]) {
            let job = jobs.get(step, what);
            let c = commands(&cmds, job, untimed);
            let s: Vec<&Value> = c.iter().copied().filter(|c| !c["net_ns"].is_null()).collect();
            let med = |k: &str| if s.is_empty() { f64::NAN } else { median(s.iter().map(|c| c.u64(k)).collect()) };
            let (net, target) = (med("net_ns"), med("target_ns"));
            let told = DM_MS as f64 * 1e6;
            let fio = job.fio.clat_mean_ns() - jobs.get("delay removed", what).fio.clat_mean_ns();
            let (lo, hi) = (TARGET_RANGE.0 * told.min(dev).min(fio), TARGET_RANGE.1 * told.max(dev).max(fio));
            println!(
                "{tool}, {step} / {what}: {} of {} split, NET median {:.3} ms (below {:.3}), TARGET median {:.3} ms ({:.3}..{:.3}; dm-delay told {DM_MS} ms, the device {:.3} ms per I/O, fio {:+.3} ms against the plain LUN)",
                s.len(),
                c.len(),
                ms(net),
                ms(adds.0 / 4.0),
                ms(target),
                ms(lo),
                ms(hi),
                ms(dev),
                ms(fio)
            );
            let ok = at_least(&format!("{tool} {step} {what} split"), s.len() as f64, 0.8 * c.len() as f64)
                && at_most(&format!("{tool} {step} {what} NET"), ms(net), ms(adds.0 / 4.0))
                && within(&format!("{tool} {step} {what} TARGET"), ms(target), ms(lo), ms(hi));
            if !ok {
                failed.push(format!(
                    "{tool}, {step} / {what}: {} of {} split, NET median {:.3} ms, TARGET median {:.3} ms",
                    s.len(),
                    c.len(),
                    ms(net),
                    ms(target)
                ));
            }
        }
    }
    timing(failed.is_empty(), format!("{} failed:\n{}", failed.len(), failed.join("\n")));
}
