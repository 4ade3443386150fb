//! iscfreeze: request-queue freezes (and quiesces) on iSCSI disks: who
//! started them, with the kernel stack, how long the queue stayed frozen,
//! and the submitters that blocked behind the freeze.

use clap::Parser;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::events::Reader;
use storprototrace::freeze::{self, BlockDevs, Ksyms, Layout};
use storprototrace::kernel::Kernel;
use storprototrace::maps::{self, Counter};
use storprototrace::output::{self, Clock, Out, Unit};
use storprototrace::runner::{self, Events, Probe, Stop};
use storprototrace::stages;
use storprototrace::templates::{self, Template, Value};
use storprototrace::topology::Topology;
use storprototrace::{error, json, Error, Result};

const ABOUT: &str = "Trace request-queue freezes and quiesces of iSCSI disks (all disks with --all-disks).

One line per freeze, when the queue is unfrozen again:
  TIME     when the freeze started
  COMM/PID who started it (blk_freeze_queue_start), then its kernel stack
  FROZEN   start -> the unfreeze that brought the queue back to unfrozen
           (nested freezes are one freeze: the kernel's mq_freeze_depth decides)
  WAITERS  submissions that blocked entering the frozen queue
           (blk_queue_enter, __bio_queue_enter), with their longest and total wait
A freeze waits for the I/O in flight to drain, then holds new I/O back.

iSCSI session recovery does not freeze a queue, it quiesces it
(blk_mq_quiesce_queue* .. blk_mq_unquiesce_queue): I/O is queued but not
dispatched. Quiesces are traced too and shown as KIND quiesce, with their
length; their waiters are not counted (nothing blocks on entry). A scheduler
switch quiesces inside its freeze, so it shows both.
The user stack of the starter is not shown (-U is not implemented).
At exit: per disk, all freezes and quiesces whatever the threshold, and the
I/O they delayed.";

const EXAMPLES: &str = "examples:
    iscfreeze                  # every freeze/quiesce of iSCSI disks, times in ms
    iscfreeze -m 100           # only those of 100 ms or more
    iscfreeze -u 0             # every one, times in us
    iscfreeze --disk sdb -T    # one disk (any disk), wall-clock timestamps
    iscfreeze --all-disks      # every disk of the machine
    iscfreeze --json           # one JSON object per freeze, times in ns
    iscfreeze --duration 60 -v # one minute, say which probes were chosen
    iscfreeze --ebpf           # print the BPF program and exit";

#[derive(Parser, Debug)]
#[command(name = "iscfreeze", version, about = "Trace request-queue freezes and quiesces of iSCSI disks", long_about = ABOUT, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    threshold: Threshold,
    /// Only this disk (any block disk, e.g. sdb)
    #[arg(long, value_name = "DISK")]
    disk: Option<String>,
    /// Every disk, not only iSCSI ones
    #[arg(long = "all-disks")]
    all_disks: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("iscfreeze", cli::parse::<Args>().and_then(run));
}

const FREEZE_BEGIN: &[&str] = &["blk_freeze_queue_start", "__blk_freeze_queue_start", "blk_freeze_queue_start_non_owner", "blk_freeze_queue", "blk_mq_freeze_queue", "blk_mq_freeze_queue_nomemsave"];
const FREEZE_END: &[&str] = &["blk_mq_unfreeze_queue", "__blk_mq_unfreeze_queue", "blk_mq_unfreeze_queue_nomemrestore", "blk_mq_unfreeze_queue_non_owner"];
const QUIESCE_BEGIN: &[&str] = &["blk_mq_quiesce_queue", "blk_mq_quiesce_queue_nowait"];
const QUIESCE_END: &[&str] = &["blk_mq_unquiesce_queue"];

struct Plan {
    probes: Vec<Probe>,
    notes: Vec<String>,
    layout: Layout,
    ringbuf: bool,
}

impl Plan {
    fn choose(kernel: &Kernel, layout: Layout) -> Result<Plan> {
        let have = |c: &[&'static str]| -> Vec<&'static str> { c.iter().copied().filter(|f| kernel.can_probe(f)).collect() };
        let mut probes = Vec::new();
        let mut notes = Vec::new();
        let (fb, fe) = (have(FREEZE_BEGIN), have(FREEZE_END));
        if fb.is_empty() {
            return Err(Error::missing_probe("a queue freeze", FREEZE_BEGIN));
        }
        if fe.is_empty() {
            return Err(Error::missing_probe("a queue unfreeze", FREEZE_END));
        }
        probes.extend(fb.iter().map(|f| Probe::entry(f, "freeze_begin")));
        probes.extend(fe.iter().map(|f| Probe::entry(f, "freeze_end")));
        let (qb, qe) = (have(QUIESCE_BEGIN), have(QUIESCE_END));
        if qb.is_empty() || qe.is_empty() {
            notes.push(format!("no traceable {} / {}: quiesces (iSCSI recovery stalls) are not shown", QUIESCE_BEGIN.join(", "), QUIESCE_END.join(", ")));
        } else {
            probes.extend(qb.iter().map(|f| Probe::entry(f, "quiesce_begin")));
            probes.extend(qe.iter().map(|f| Probe::entry(f, "quiesce_end")));
        }
        if kernel.can_probe("blk_queue_enter") {
            probes.push(Probe::entry("blk_queue_enter", "wait_enter_queue"));
            probes.push(Probe::ret("blk_queue_enter", "wait_return"));
        } else {
            notes.push("blk_queue_enter is not traceable: waits for request allocation (passthrough commands) are not counted".into());
        }
        if kernel.can_probe("__bio_queue_enter") {
            probes.push(Probe::entry("__bio_queue_enter", "wait_enter_bio"));
            probes.push(Probe::ret("__bio_queue_enter", "wait_return"));
        } else {
            notes.push("__bio_queue_enter is not traceable (bio_queue_enter is inline before 6.1): bios that wait for an unfreeze are not counted".into());
        }
        if !layout.queue_disk {
            notes.push("struct request_queue has no disk pointer (before 5.15): disks are named from the queue's bdi, filtered in user space".into());
        }
        Ok(Plan { probes, notes, layout, ringbuf: kernel.ringbuf })
    }
}

fn render(plan: &Plan, min_us: u64, filter_set: bool) -> Result<String> {
    let values: Vec<(&str, Value)> = vec![
        ("USE_RINGBUF", plan.ringbuf.into()),
        ("MIN_US", min_us.into()),
        ("FILTER_SET", (filter_set && plan.layout.queue_disk).into()),
        ("QUEUE_DISK", plan.layout.queue_disk.into()),
        ("QUIESCE_DEPTH", plan.layout.quiesce_depth.into()),
    ];
    Template::new(&[templates::COMMON, templates::ISCFREEZE]).render(&values)
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(0)?;
    let duration = args.common.duration()?;
    if args.disk.is_some() && args.all_disks {
        return Err(Error::usage("--disk and --all-disks cannot be used together"));
    }
    if let Some(d) = &args.disk {
        freeze::validate_disk_name("--disk", d)?;
    }
    let sys = Path::new("/sys");
    let kernel = Kernel::detect();

    if args.common.ebpf {
        if let Some(d) = &args.disk {
            BlockDevs::disk_dev(sys, "--disk", d)?;
        }
        let layout = Layout::from_headers(&stages::header_dirs(&kernel)).unwrap_or_else(|_| Layout::modern());
        let plan = Plan::choose(&kernel, layout).unwrap_or(Plan { probes: vec![], notes: vec![], layout, ringbuf: true });
        let ringbuf = kernel.ringbuf || kernel.function_count() == 0;
        println!("{}", render(&Plan { ringbuf, ..plan }, min_us, !args.all_disks)?);
        return Ok(());
    }

    // Which disks: the user's mistakes first, then the machine's.
    let wanted: Option<Vec<(String, u32)>> = match &args.disk {
        Some(d) => Some(vec![(d.clone(), BlockDevs::disk_dev(sys, "--disk", d)?)]),
        None => None,
    };
    runner::preflight(&kernel, wanted.is_none() && !args.all_disks)?;
    let wanted = match wanted {
        Some(w) => Some(w),
        None if args.all_disks => None,
        None => {
            let topo = Topology::read(sys)?;
            if topo.sessions.is_empty() {
                return Err(Error::no_sessions());
            }
            let names = freeze::iscsi_disks(&topo);
            if names.is_empty() {
                return Err(Error::env(format!("no iSCSI session has a disk (sessions: {}); try --all-disks", topo.describe())));
            }
            Some(names.iter().map(|n| Ok((n.clone(), BlockDevs::disk_dev(sys, "--disk", n)?))).collect::<Result<Vec<_>>>()?)
        }
    };
    let layout = Layout::from_headers(&stages::header_dirs(&kernel))?;
    let plan = Plan::choose(&kernel, layout)?;
    if args.common.verbose {
        eprintln!(
            "kernel {}: functions from {:?}, ring buffer: {}, queue disk via {}, nested quiesce depth: {}",
            kernel.release, kernel.source, kernel.ringbuf, if layout.queue_disk { "q->disk" } else { "q->backing_dev_info" }, layout.quiesce_depth
        );
        for p in &plan.probes {
            eprintln!("probe {}", p.describe());
        }
    }
    for n in &plan.notes {
        eprintln!("iscfreeze: note: {n}");
    }
    let text = render(&plan, min_us, wanted.is_some())?;
    let mut bpf = runner::compile(&kernel, &text)?;
    if let Some(w) = &wanted {
        let mut set = bpf.table("disks")?;
        let devs: Vec<u32> = w.iter().map(|(_, d)| *d).collect();
        maps::fill_set(&mut set, &devs, |d: u32| d.to_ne_bytes().to_vec())?;
    }
    let _links = runner::attach(&mut bpf, &plan.probes)?;
    let mut events = Events::open(&bpf, kernel.ringbuf)?;
    let stop = Stop::install(duration)?;
    let mut view = View {
        json: args.common.json,
        timestamp: args.common.timestamp,
        unit,
        clock: Clock::start(),
        ksyms: Ksyms::load(),
        devs: BlockDevs::read(sys),
        layout,
        wanted: wanted.as_ref().map(|w| w.iter().map(|(_, d)| *d).collect()),
        pending: Vec::new(),
        waits: HashMap::new(),
        shown: 0,
    };
    let mut out = Out::new();
    let scope = match &wanted {
        Some(w) => w.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" "),
        None => "all disks".to_string(),
    };
    let amount = if unit == Unit::Ms { min_us / 1000 } else { min_us };
    let limit = if min_us == 0 { String::new() } else { format!(" of {amount} {} or more", unit.label()) };
    output::status(args.common.json, &mut out, &format!("Tracing queue freezes and quiesces{limit} on {scope}... Hit Ctrl-C to end."));
    if !args.common.json {
        out.line(&view.header());
    }
    let mut stack_table = bpf.table("stacks")?;
    while !stop.stopped() && !out.closed() {
        let recs = events.poll(stop.poll_ms(100));
        view.take(&recs, &mut stack_table);
        view.print_ready(&mut out, false);
        out.flush();
    }
    // Waiters wake after the unfreeze: give the last ones a moment.
    if !out.closed() {
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until && !view.pending.is_empty() {
            let recs = events.poll(50);
            view.take(&recs, &mut stack_table);
            view.print_ready(&mut out, false);
        }
        let recs = events.poll(0);
        view.take(&recs, &mut stack_table);
        view.print_ready(&mut out, true);
    }
    out.flush();

    // Summary per disk, from the kernel's totals (every freeze, any length).
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost);
    let mut active = bpf.table("active")?;
    let still = maps::count_entries(&mut active, 1 << 12);
    let mut totals = bpf.table("totals")?;
    let mut per_disk: BTreeMap<String, [u64; 7]> = BTreeMap::new();
    for (k, v) in maps::entries(&mut totals, 1 << 12) {
        let mut kr = Reader::new(&k);
        let (Some(_queue), Some(kind)) = (kr.u64(), kr.u32()) else { continue };
        let mut r = Reader::new(&v);
        let (Some(count), Some(time), Some(waits), Some(wait_ns), Some(max_wait), Some(dev), Some(_), Some(name)) =
            (r.u64(), r.u64(), r.u64(), r.u64(), r.u64(), r.u32(), r.u32(), r.cstr(32))
        else {
            continue;
        };
        let Some((disk, _)) = view.disk(dev, &name) else { continue };
        let row = per_disk.entry(disk).or_default();
        if kind == 0 {
            row[0] += count;
            row[1] += time;
            row[2] += waits;
            row[3] += wait_ns;
            row[4] = row[4].max(max_wait);
        } else {
            row[5] += count;
            row[6] += time;
        }
    }
    if !out.closed() {
        let u = unit;
        let mut lines = vec![format!(
            "{:<8} {:>7} {:>12} {:>8} {:>12} {:>12} {:>8} {:>12}",
            "DISK", "FREEZES", format!("FROZEN({})", u.label()), "DELAYED", format!("WAITED({})", u.label()), format!("MAXWAIT({})", u.label()), "QUIESCES", format!("QUIESCED({})", u.label())
        )];
        for (d, r) in &per_disk {
            lines.push(format!("{d:<8} {:>7} {:>12} {:>8} {:>12} {:>12} {:>8} {:>12}", r[0], u.fmt(r[1]), r[2], u.fmt(r[3]), u.fmt(r[4]), r[5], u.fmt(r[6])));
        }
        if per_disk.is_empty() {
            lines.push("(no freeze or quiesce seen)".into());
        }
        lines.push(format!("{} freezes/quiesces shown, {still} still frozen or quiesced, {lost} events lost", view.shown));
        output::summary(args.common.json, &mut out, &lines);
    }
    Ok(())
}

/// `struct event` of iscfreeze.c.
#[derive(Debug, Clone)]
struct Rec {
    ty: u64,
    q: u64,
    start: u64,
    end: u64,
    value: u64,
    kind: u32,
    pid: u32,
    tid: u32,
    dev: u32,
    stack: i32,
    comm: String,
    disk: String,
}

impl Rec {
    fn parse(b: &[u8]) -> Option<Rec> {
        let mut r = Reader::new(b);
        let (ty, q, start, end, value) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (kind, pid, tid, dev, stack, _pad) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.i32()?, r.u32()?);
        Some(Rec { ty, q, start, end, value, kind, pid, tid, dev, stack, comm: r.cstr(16)?, disk: r.cstr(32)? })
    }
}

struct Pending {
    rec: Rec,
    disk: String,
    stack: Vec<String>,
    arrived: Instant,
}

struct View {
    json: bool,
    timestamp: bool,
    unit: Unit,
    clock: Clock,
    ksyms: Ksyms,
    devs: BlockDevs,
    layout: Layout,
    wanted: Option<HashSet<u32>>,
    pending: Vec<Pending>,
    /// (queue, freeze start) -> (wait ns, arrival) of each waiter seen.
    waits: HashMap<(u64, u64), (Vec<u64>, Instant)>,
    shown: u64,
}

impl View {
    /// (name, dev) of a queue's disk, or None when the user-space filter
    /// (kernels without q->disk) excludes it.
    fn disk(&mut self, dev: u32, name: &str) -> Option<(String, u32)> {
        let (name, dev) = if self.layout.queue_disk {
            (if name.is_empty() { "-".to_string() } else { name.to_string() }, dev)
        } else {
            let dev = freeze::parse_dev(name).unwrap_or(0);
            (self.devs.name(dev), dev)
        };
        match &self.wanted {
            Some(w) if !self.layout.queue_disk && !w.contains(&dev) => None,
            _ => Some((name, dev)),
        }
    }

    fn take(&mut self, recs: &[Vec<u8>], stacks: &mut bcc::table::Table) {
        for b in recs {
            let Some(r) = Rec::parse(b) else { continue };
            if r.ty == 1 {
                self.waits.entry((r.q, r.start)).or_insert_with(|| (Vec::new(), Instant::now())).0.push(r.value);
                continue;
            }
            let Some((disk, _)) = self.disk(r.dev, &r.disk) else { continue };
            let mut stack = Vec::new();
            if r.stack >= 0 {
                let mut key = (r.stack as u32).to_ne_bytes().to_vec();
                if let Ok(v) = stacks.get(&mut key) {
                    stack = freeze::stack_addrs(&v).into_iter().map(|a| self.ksyms.resolve(a)).collect();
                }
            }
            self.pending.push(Pending { rec: r, disk, stack, arrived: Instant::now() });
        }
    }

    /// Print freezes whose waiters have all reported (or after 1 s, or at the end).
    fn print_ready(&mut self, out: &mut Out, all: bool) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            let got = self.waits.get(&(p.rec.q, p.rec.start)).map(|w| w.0.len() as u64).unwrap_or(0);
            if all || got >= p.rec.value || p.arrived.elapsed() >= Duration::from_secs(1) {
                let p = self.pending.remove(i);
                let w = self.waits.remove(&(p.rec.q, p.rec.start)).map(|w| w.0).unwrap_or_default();
                for l in self.lines(&p, &w) {
                    out.line(&l);
                }
                self.shown += 1;
            } else {
                i += 1;
            }
        }
        // Waits of freezes never shown (under the threshold, another disk).
        self.waits.retain(|_, (_, t)| t.elapsed() < Duration::from_secs(2));
    }

    fn header(&self) -> String {
        let u = self.unit.label();
        let time = if self.timestamp { "TIME" } else { "TIME(s)" };
        format!(
            "{time:<14} {:<7} {:<8} {:<16} {:>7} {:>12} {:>7} {:>12} {:>12}",
            "KIND", "DISK", "COMM", "PID", format!("FROZEN({u})"), "WAITERS", format!("MAXWAIT({u})"), format!("WAITED({u})")
        )
    }

    fn lines(&self, p: &Pending, waits: &[u64]) -> Vec<String> {
        let r = &p.rec;
        let u = self.unit;
        let time = if self.timestamp { self.clock.wall(r.start) } else { format!("{:.6}", self.clock.since_start(r.start)) };
        let kind = if r.kind == 0 { "freeze" } else { "quiesce" };
        let frozen = r.end.saturating_sub(r.start);
        let max = waits.iter().copied().max().unwrap_or(0);
        let total: u64 = waits.iter().sum();
        if self.json {
            let o = json::Object::new()
                .str("time", &time)
                .str("kind", kind)
                .str("disk", &p.disk)
                .str("comm", &r.comm)
                .num("pid", r.pid)
                .num("tid", r.tid)
                .num("start_ns", r.start)
                .num("end_ns", r.end)
                .num("frozen_ns", frozen);
            let o = if r.kind == 0 {
                o.num("waiters", r.value).num("waits_seen", waits.len()).num("wait_max_ns", max).num("wait_total_ns", total)
            } else {
                o.null("waiters").null("waits_seen").null("wait_max_ns").null("wait_total_ns")
            };
            return vec![o.str("stack", &p.stack.join(";")).finish()];
        }
        let (n, mx, tot) = if r.kind == 0 { (r.value.to_string(), u.fmt(max), u.fmt(total)) } else { ("-".into(), "-".into(), "-".into()) };
        let mut v = vec![format!("{time:<14} {kind:<7} {:<8} {:<16} {:>7} {:>12} {n:>7} {mx:>12} {tot:>12}", p.disk, r.comm, r.pid, u.fmt(frozen))];
        v.extend(p.stack.iter().map(|s| format!("        {s}")));
        v
    }
}
