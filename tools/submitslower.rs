//! submitslower: bio submissions slower than a threshold, per thread, with
//! the disk. The tool of the Ceph/bcache queue-freeze write-up (slow
//! generic_make_request() calls), for today's kernels.

use clap::Parser;
use std::path::Path;
use storprototrace::bpf::events::Submission;
use storprototrace::bpf::maps::{self, Counter};
use storprototrace::bpf::runner::{self, Probe};
use storprototrace::cli::output::{Clock, Unit};
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::iscsi::blockdev::{self, BlockDevs};
use storprototrace::kernel::headers::BlockLayout;
use storprototrace::kernel::types as kernel_types;
use storprototrace::start::{BufferFlag, Program, Startup, Tracer};
use storprototrace::submit::{self, SubmitPlan, PARTS, SUBMIT};
use storprototrace::{error, Error, Result};

const ABOUT: &str = "Trace bio submissions slower than a threshold (default 1 ms), with the disk.

LAT is the time one thread spent in submit_bio_noacct() (generic_make_request()
on kernels before 5.9), from entry to return, timed per thread. A submission
is slow when the submitter sleeps in it: a frozen queue (blk_queue_enter /
bio_queue_enter waiting for an unfreeze), no free tag or request, throttling.
A fast submission says nothing about when the I/O completes.
DISK is the bio's device (a partition if it targets one); --disk and --iscsi
filter on its whole disk, in the kernel. Nested submissions of one thread
(stacked devices) are timed as the outermost one.";

const EXAMPLES: &str = "examples:
    submitslower               # submissions of 1 ms or more, any disk
    submitslower -m 10         # 10 ms or more
    submitslower -u 200        # 200 us or more, times in us
    submitslower --iscsi       # iSCSI disks only
    submitslower --disk sdb -T # one disk, wall-clock timestamps
    submitslower -p 1234       # one process
    submitslower --json        # one JSON object per submission, times in ns
    submitslower --ebpf        # print the BPF program and exit";

#[derive(Parser, Debug)]
#[command(name = "submitslower", version, about = "Trace slow bio submissions (submit_bio_noacct) with their disk", long_about = ABOUT, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    threshold: Threshold,
    /// Only submissions by this process id
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pid: Option<u32>,
    /// Only this disk (e.g. sdb; partitions of it included)
    #[arg(long, value_name = "DISK", conflicts_with = "iscsi")]
    disk: Option<String>,
    /// Only iSCSI disks (those of the logged-in sessions at start)
    #[arg(long)]
    iscsi: bool,
    #[command(flatten)]
    buffer: BufferFlag,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("submitslower", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(1)?;
    let mut s = Startup::new("submitslower", &args.common)?;
    s.event_pages = args.buffer.pages()?;
    if let Some(d) = &args.disk {
        blockdev::validate_disk_name("--disk", d)?;
    }
    let sys = Path::new("/sys");
    let plan = |layout, buffer, dev| SubmitPlan { layout, buffer, min_us, pid: args.pid, dev, disk_set: args.iscsi };
    let dev = || args.disk.as_ref().map(|d| BlockDevs::disk_dev(sys, "--disk", d)).transpose();
    let ebpf = s.ebpf(|kernel| {
        let (types, layout) = BlockLayout::choose(kernel, PARTS);
        let layout = layout.unwrap_or_else(|_| BlockLayout::modern());
        Ok(kernel_types::program(types.as_ref().ok(), &plan(layout, s.ebpf_buffer(), dev()?).render()?))
    })?;
    if ebpf {
        return Ok(());
    }

    // The user's mistakes first, then the machine's.
    let dev = dev()?;
    s.preflight(args.iscsi)?;
    let iscsi_devs: Vec<u32> = if args.iscsi {
        blockdev::iscsi_disk_devs(sys, "--iscsi: ", "")?.into_iter().map(|(_, d)| d).collect()
    } else {
        Vec::new()
    };
    let k = &s.kernel;
    let function = k.first_of(SUBMIT).ok_or_else(|| Error::missing_probe("bio submission", SUBMIT))?;
    let (types, layout) = BlockLayout::choose(k, PARTS);
    let layout = layout?;
    let text = kernel_types::program(types.as_ref().ok(), &plan(layout, s.event_buffer(), dev).render()?);
    let mut program = Program {
        describe: vec![format!(
            "kernel {}: functions from {:?}, ring buffer: {}, bio disk via {}, {}",
            k.release,
            k.source,
            k.ringbuf,
            if layout.bio_bdev { "bio->bi_bdev" } else { "bio->bi_disk" },
            kernel_types::describe(&types)
        )],
        ..Program::new(text, vec![Probe::entry(function, "submit_entry"), Probe::ret(function, "submit_return")])
    };
    if function != SUBMIT[0] {
        program.notes.push(format!("this kernel has no {}, timing {function} instead", SUBMIT[0]));
    }
    let (bpf, _links) = s.load(&program, |bpf| {
        if args.iscsi {
            maps::fill_set(&mut bpf.table("disks")?, &iscsi_devs, |d: u32| d.to_ne_bytes().to_vec())?;
        }
        Ok(())
    })?;
    let clock = Clock::start();
    let mut devs = BlockDevs::read(sys);
    let amount = if unit == Unit::Ms { min_us / 1000 } else { min_us };
    let what = if min_us == 0 {
        "all bio submissions".to_string()
    } else {
        format!("bio submissions slower than {amount} {}", unit.label())
    };
    let scope = match (&args.disk, args.iscsi) {
        (Some(d), _) => format!(" on {d}"),
        (None, true) => " on iSCSI disks".to_string(),
        _ => String::new(),
    };
    let mut events = s.events(&bpf)?;
    let mut t = s.trace(&format!("{what}{scope} ({function})"))?;
    let Tracer { stop, out, .. } = &mut t;
    if !args.common.json {
        out.line(&submit::header(args.common.timestamp, unit));
    }
    let (mut shown, mut malformed) = (0u64, 0u64);
    runner::print_events(&mut events, stop, out, |rec, out| {
        let Some(e) = Submission::parse(rec) else {
            malformed += 1;
            return true;
        };
        let time = clock.time(e.ts, args.common.timestamp);
        let ok = out.line(&submit::line(&e, &time, unit, &mut devs, args.common.json));
        shown += ok as u64;
        ok
    });
    let mut counters = bpf.table("counters")?;
    let full = maps::counter(&mut counters, Counter::Lost);
    let timed = maps::counter(&mut counters, Counter::SubmitTimed);
    let mut summary =
        vec![format!("{shown} slow submissions shown, {timed} submissions timed, {} events lost", full + malformed)];
    summary.extend(s.event_buffer().full_note(full));
    t.finish(&summary);
    Ok(())
}
