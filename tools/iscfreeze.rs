//! iscfreeze: request-queue freezes (and quiesces) on iSCSI disks: who
//! started them, with the kernel stack, how long the queue stayed frozen,
//! and the submitters that blocked behind the freeze.

use clap::Parser;
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};
use storprototrace::bpf::maps::{self, Counter};
use storprototrace::cli::output::{Clock, Unit};
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::freeze::view::{self, FreezeView};
use storprototrace::freeze::{self, DiskNamer, FreezePlan, Matcher, Total};
use storprototrace::iscsi::blockdev::{self, BlockDevs};
use storprototrace::kernel::headers::BlockLayout;
use storprototrace::kernel::ksyms::Ksyms;
use storprototrace::kernel::types as kernel_types;
use storprototrace::start::{Program, Startup, Tracer};
use storprototrace::{error, Error, Result};

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

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(0)?;
    let s = Startup::new("iscfreeze", &args.common)?;
    if args.disk.is_some() && args.all_disks {
        return Err(Error::usage("--disk and --all-disks cannot be used together"));
    }
    if let Some(d) = &args.disk {
        blockdev::validate_disk_name("--disk", d)?;
    }
    let sys = Path::new("/sys");
    let ebpf = s.ebpf(|kernel| {
        if let Some(d) = &args.disk {
            BlockDevs::disk_dev(sys, "--disk", d)?;
        }
        let (types, layout) = BlockLayout::choose(kernel, freeze::PARTS);
        let layout = layout.unwrap_or_else(|_| BlockLayout::modern());
        let plan = FreezePlan::choose(kernel, layout).unwrap_or(FreezePlan { probes: vec![], notes: vec![], layout });
        Ok(kernel_types::program(types.as_ref().ok(), &plan.render(s.ebpf_buffer(), min_us, !args.all_disks)?))
    })?;
    if ebpf {
        return Ok(());
    }

    // Which disks: the user's mistakes first, then the machine's.
    let wanted: Option<Vec<(String, u32)>> = match &args.disk {
        Some(d) => Some(vec![(d.clone(), BlockDevs::disk_dev(sys, "--disk", d)?)]),
        None => None,
    };
    s.preflight(wanted.is_none() && !args.all_disks)?;
    let wanted = match wanted {
        Some(w) => Some(w),
        None if args.all_disks => None,
        None => Some(blockdev::iscsi_disk_devs(sys, "", "; try --all-disks")?),
    };
    let (types, layout) = BlockLayout::choose(&s.kernel, freeze::PARTS);
    let plan = FreezePlan::choose(&s.kernel, layout?)?;
    let text = kernel_types::program(types.as_ref().ok(), &plan.render(s.event_buffer(), min_us, wanted.is_some())?);
    let program = Program {
        describe: vec![format!("{}, {}", plan.describe(&s.kernel), kernel_types::describe(&types))],
        notes: plan.notes.clone(),
        ..Program::new(text, plan.probes.clone())
    };
    let (bpf, _links) = s.load(&program, |bpf| {
        maps::check_sizes(bpf.table("totals")?, "totals", Total::KEY_SIZE, Total::SIZE)?;
        if let Some(w) = &wanted {
            let devs: Vec<u32> = w.iter().map(|(_, d)| *d).collect();
            maps::fill_set(&mut bpf.table("disks")?, &devs, |d: u32| d.to_ne_bytes().to_vec())?;
        }
        Ok(())
    })?;
    let mut view = FreezeView {
        json: args.common.json,
        timestamp: args.common.timestamp,
        unit,
        clock: Clock::start(),
        ksyms: Ksyms::load(),
        namer: DiskNamer {
            layout: plan.layout,
            devs: BlockDevs::read(sys),
            wanted: wanted.as_ref().map(|w| w.iter().map(|(_, d)| *d).collect::<HashSet<u32>>()),
        },
        matcher: Matcher::default(),
        shown: 0,
        malformed: 0,
    };
    let scope = match &wanted {
        Some(w) => w.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" "),
        None => "all disks".to_string(),
    };
    let amount = if unit == Unit::Ms { min_us / 1000 } else { min_us };
    let limit = if min_us == 0 { String::new() } else { format!(" of {amount} {} or more", unit.label()) };
    let mut events = s.events(&bpf)?;
    let mut t = s.trace(&format!("queue freezes and quiesces{limit} on {scope}"))?;
    let Tracer { stop, out, .. } = &mut t;
    if !args.common.json {
        out.line(&view.header());
    }
    let mut stack_table = bpf.table("stacks")?;
    while !stop.stopped() && !out.closed() {
        view.take(events.poll(stop.poll_ms(100)), &mut stack_table);
        view.print_ready(out, false);
        out.flush();
    }
    // Waiters wake after the unfreeze: give the last ones a moment.
    if !out.closed() {
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until && !view.matcher.is_empty() {
            view.take(events.poll(50), &mut stack_table);
            view.print_ready(out, false);
        }
        view.take(events.poll(0), &mut stack_table);
        view.print_ready(out, true);
    }
    out.flush();

    // Summary per disk, from the kernel's totals (every freeze, any length).
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost) + view.malformed;
    let mut active = bpf.table("active")?;
    let still = maps::count_entries(&mut active, 1 << 12);
    let mut totals = bpf.table("totals")?;
    let totals: Vec<Total> =
        maps::entries(&mut totals, 1 << 12).iter().filter_map(|(k, v)| Total::parse(k, v)).collect();
    let per_disk = freeze::summarise(&totals, &mut view.namer);
    if !out.closed() {
        let mut lines = view::summary_table(&per_disk, unit);
        lines.push(format!(
            "{} freezes/quiesces shown, {still} still frozen or quiesced, {lost} events lost",
            view.shown
        ));
        t.finish(&lines);
    }
    Ok(())
}
