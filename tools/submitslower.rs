//! submitslower: bio submissions slower than a threshold, per thread, with
//! the disk. The tool of the Ceph/bcache queue-freeze write-up (slow
//! generic_make_request() calls), for today's kernels.

use clap::Parser;
use std::path::Path;
use storprototrace::bpf::events::Submission;
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::iscsi::blockdev::{self, BlockDevs};
use storprototrace::kernel::headers::BlockLayout;
use storprototrace::kernel::types as kernel_types;

/// The template parts of the program (`render`).
const PARTS: &[&str] = &[templates::COMMON, templates::SUBMITSLOWER];
use storprototrace::bpf::maps::{self, Counter};
use storprototrace::bpf::runner::{self, Events, Probe, Stop};
use storprototrace::bpf::templates::{self, Template, Value};
use storprototrace::cli::json;
use storprototrace::cli::output::{self, Clock, Out, Unit};
use storprototrace::kernel::Kernel;
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
    common: Common,
}

const SUBMIT: &[&str] = &["submit_bio_noacct", "generic_make_request"];

fn main() {
    error::exit_with("submitslower", cli::parse::<Args>().and_then(run));
}

struct Plan {
    layout: BlockLayout,
    ringbuf: bool,
}

fn render(plan: &Plan, args: &Args, min_us: u64, dev: Option<u32>) -> Result<String> {
    let values: Vec<(&str, Value)> = vec![
        ("USE_RINGBUF", plan.ringbuf.into()),
        ("MIN_US", min_us.into()),
        ("FILTER_PID", args.pid.is_some().into()),
        ("PID", args.pid.unwrap_or(0).into()),
        ("FILTER_DEV", dev.is_some().into()),
        ("DEV", dev.unwrap_or(0).into()),
        ("FILTER_SET", args.iscsi.into()),
        ("BIO_BDEV", plan.layout.bio_bdev.into()),
    ];
    Template::new(PARTS).render(&values)
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(1)?;
    let duration = args.common.duration()?;
    if let Some(d) = &args.disk {
        blockdev::validate_disk_name("--disk", d)?;
    }
    let sys = Path::new("/sys");
    let kernel = Kernel::detect();

    if args.common.ebpf {
        let dev = match &args.disk {
            Some(d) => Some(BlockDevs::disk_dev(sys, "--disk", d)?),
            None => None,
        };
        let (types, layout) = BlockLayout::choose(&kernel, PARTS);
        let layout = layout.unwrap_or_else(|_| BlockLayout::modern());
        let plan = Plan { layout, ringbuf: kernel.ringbuf || kernel.function_count() == 0 };
        println!("{}", kernel_types::program(types.as_ref().ok(), &render(&plan, &args, min_us, dev)?));
        return Ok(());
    }

    // The user's mistakes first, then the machine's.
    let dev = match &args.disk {
        Some(d) => Some(BlockDevs::disk_dev(sys, "--disk", d)?),
        None => None,
    };
    runner::preflight(&kernel, args.iscsi)?;
    let iscsi_devs: Vec<u32> = if args.iscsi {
        blockdev::iscsi_disk_devs(sys, "--iscsi: ", "")?.into_iter().map(|(_, d)| d).collect()
    } else {
        Vec::new()
    };
    let function = kernel.first_of(SUBMIT).ok_or_else(|| Error::missing_probe("bio submission", SUBMIT))?;
    let (types, layout) = BlockLayout::choose(&kernel, PARTS);
    let layout = layout?;
    let plan = Plan { layout, ringbuf: kernel.ringbuf };
    let probes = [Probe::entry(function, "submit_entry"), Probe::ret(function, "submit_return")];
    if args.common.verbose {
        eprintln!(
            "kernel {}: functions from {:?}, ring buffer: {}, bio disk via {}, {}",
            kernel.release,
            kernel.source,
            kernel.ringbuf,
            if layout.bio_bdev { "bio->bi_bdev" } else { "bio->bi_disk" },
            kernel_types::describe(&types)
        );
        for p in &probes {
            eprintln!("probe {}", p.describe());
        }
    }
    if function != SUBMIT[0] {
        eprintln!("submitslower: note: this kernel has no {}, timing {function} instead", SUBMIT[0]);
    }
    let text = kernel_types::program(types.as_ref().ok(), &render(&plan, &args, min_us, dev)?);
    let mut bpf = runner::compile(&kernel, &text)?;
    if args.iscsi {
        let mut set = bpf.table("disks")?;
        maps::fill_set(&mut set, &iscsi_devs, |d: u32| d.to_ne_bytes().to_vec())?;
    }
    let _links = runner::attach(&mut bpf, &probes, &Default::default())?;
    let mut events = Events::open(&bpf, kernel.ringbuf)?;
    let stop = Stop::install(duration)?;
    let clock = Clock::start();
    let mut out = Out::new();
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
    output::status(args.common.json, &mut out, &format!("Tracing {what}{scope} ({function})... Hit Ctrl-C to end."));
    let time_h = if args.common.timestamp { "TIME" } else { "TIME(s)" };
    if !args.common.json {
        out.line(&format!(
            "{time_h:<14} {:<16} {:>7} {:>10} {}",
            "COMM",
            "PID",
            format!("LAT({})", unit.label()),
            "DISK"
        ));
    }
    let (mut shown, mut malformed) = (0u64, 0u64);
    runner::print_events(&mut events, &stop, &mut out, |rec, out| {
        let Some(e) = Submission::parse(rec) else {
            malformed += 1;
            return true;
        };
        let time = if args.common.timestamp { clock.wall(e.ts) } else { format!("{:.6}", clock.since_start(e.ts)) };
        let disk = devs.name(e.dev);
        let line = if args.common.json {
            json::Object::new()
                .str("time", &time)
                .str("comm", &e.comm)
                .num("pid", e.pid)
                .num("tid", e.tid)
                .num("lat_ns", e.lat)
                .str("disk", &disk)
                .str("whole_disk", &devs.name(e.disk))
                .str("dev", &{
                    let (ma, mi) = blockdev::kdev_split(e.dev);
                    format!("{ma}:{mi}")
                })
                .num("end_ns", e.ts)
                .finish()
        } else {
            format!("{time:<14} {:<16} {:>7} {:>10} {disk}", e.comm, e.pid, unit.fmt(e.lat))
        };
        let ok = out.line(&line);
        shown += ok as u64;
        ok
    });
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost) + malformed;
    let timed = maps::counter(&mut counters, Counter::SubmitTimed);
    output::summary(
        args.common.json,
        &mut out,
        &[format!("{shown} slow submissions shown, {timed} submissions timed, {lost} events lost")],
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every branch of the template with the values this tool passes.
    #[test]
    fn every_branch_renders() {
        for argv in [
            &["submitslower"][..],
            &["submitslower", "-p", "42", "--iscsi"],
            &["submitslower", "--disk", "sda", "-u", "0"],
        ] {
            let args = Args::parse_from(argv);
            for bio_bdev in [true, false] {
                for ringbuf in [true, false] {
                    let plan = Plan { layout: BlockLayout { bio_bdev, ..BlockLayout::modern() }, ringbuf };
                    let dev = args.disk.as_ref().map(|_| blockdev::kdev(8, 0));
                    let c = render(&plan, &args, 1000, dev).unwrap();
                    assert!(!c.contains("{{"));
                    assert!(c.contains(&format!("#define BIO_BDEV {}\n", bio_bdev as u8)));
                    assert!(c.contains(&format!("#define FILTER_SET {}\n", args.iscsi as u8)));
                    assert!(c.contains(&format!("#define FILTER_DEV {}\n", dev.is_some() as u8)));
                    assert!(c.contains(&format!("#define USE_RINGBUF {}\n", ringbuf as u8)));
                }
            }
        }
    }
}
