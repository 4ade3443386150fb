//! Slow iSCSI commands counted per target, with an alarm line when a target
//! has too many in one interval: a custom handler on storprototrace's
//! command tracer.
//!
//! usage: slow_per_target [MIN_MS [ALARM_COUNT [SECONDS [DISK]]]]
//!   MIN_MS       commands of at least this many ms count as slow (default 10; 0: all)
//!   ALARM_COUNT  say ALARM when a target has this many in one second (default 100)
//!   SECONDS      stop after this many seconds (default: until Ctrl-C)
//!   DISK         only this iSCSI disk (e.g. sdb)
//! Every second: one line per target that had slow commands. At exit: the
//! last part of a second, the totals per target, and what the tracer could
//! not time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storprototrace::{CommandRecord, Options};

#[derive(Default)]
struct Tally {
    commands: u64,
    bytes: u64,
    worst: Duration,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |a| {
            a.parse().unwrap_or_else(|_| {
                eprintln!("slow_per_target: '{a}' is not a number");
                std::process::exit(2)
            })
        })
    };
    let (min_ms, alarm, seconds) = (number(0, 10), number(1, 100), number(2, 0));
    let mut options = Options::new().min_latency(Duration::from_millis(min_ms));
    if let Some(disk) = args.get(3) {
        options = options.disk(disk);
    }
    let mut tracer = options.start().unwrap_or_else(|e| {
        eprintln!("slow_per_target: error: {e}");
        std::process::exit(e.exit_code())
    });

    let running = Arc::new(AtomicBool::new(true));
    let r = running.clone();
    if let Err(e) = ctrlc::set_handler(move || r.store(false, Ordering::SeqCst)) {
        eprintln!("slow_per_target: error: cannot install the Ctrl-C handler: {e}");
        std::process::exit(1)
    }
    let end = (seconds > 0).then(|| Instant::now() + Duration::from_secs(seconds));
    eprintln!("Tracing iSCSI commands of {min_ms} ms or more, counted per target... Hit Ctrl-C to end.");

    let name = |c: &CommandRecord| c.target.clone().unwrap_or_else(|| format!("session {}", c.sid));
    let (mut interval, mut total): (BTreeMap<String, Tally>, BTreeMap<String, Tally>) = Default::default();
    let mut next = Instant::now() + Duration::from_secs(1);
    let keep_going = || running.load(Ordering::SeqCst) && end.is_none_or(|e| Instant::now() < e);
    while keep_going() {
        for c in tracer.poll(Duration::from_millis(100)) {
            for t in [interval.entry(name(&c)).or_default(), total.entry(name(&c)).or_default()] {
                t.commands += 1;
                t.bytes += c.bytes as u64;
                t.worst = t.worst.max(c.total);
            }
        }
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            report(&mut interval, alarm, "1 s");
        }
    }
    // The part of a second since the last report.
    let rest = Duration::from_secs(1).saturating_sub(next.saturating_duration_since(Instant::now()));
    report(&mut interval, alarm, &format!("the last {:.1} s", rest.as_secs_f64()));
    for (target, t) in &total {
        println!("total {target}: {} commands, {} bytes, worst {:.3} ms", t.commands, t.bytes, ms(t.worst));
    }
    match tracer.stop() {
        Ok(untimed) => println!("{untimed}"),
        Err(e) => eprintln!("slow_per_target: error: {e}"),
    }
}

/// One line per target that had slow commands in the interval, ALARM first
/// where it had `alarm` or more; the interval starts again.
fn report(interval: &mut BTreeMap<String, Tally>, alarm: u64, span: &str) {
    for (target, t) in std::mem::take(interval) {
        let flag = if t.commands >= alarm { "ALARM " } else { "" };
        println!("{flag}{target}: {} slow commands in {span}, worst {:.3} ms", t.commands, ms(t.worst));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
