//! isclatency: every slow iSCSI command, with where its time went.
//! WAIT (in the driver's queue), SEND (handing the PDU to TCP), RESP (waiting
//! for the target), split into NET and TARGET, and the TCP retransmits on
//! the way. Like bcc's ext4slower, for the iSCSI initiator.

use clap::Parser;
use storprototrace::bpf::events::Command;
use storprototrace::bpf::maps::Counter;
use storprototrace::bpf::runner;
use storprototrace::bpf::templates;
use storprototrace::cli::output::{Clock, Unit};
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::stages::filters::Filters;
use storprototrace::stages::latency_view::{Columns, LatencyView};
use storprototrace::stages::tur_probe::{TurFlag, TurProbe};
use storprototrace::start::{BufferFlag, Startup, Tracer};
use storprototrace::{error, stages, Result};

const ABOUT: &str = "Trace iSCSI commands slower than a threshold, with where their time went.

Each command's time in the iSCSI initiator, in stages:
  WAIT    queued in the driver (iscsi_queuecommand -> PDU preparation)
  SEND    PDU preparation -> command PDU handed to TCP
  NET     the network's share of the wait for the target
  TARGET  the target's share (RESP - NET)
  TOTAL   WAIT + SEND + RESP (RESP = NET + TARGET, shown with -W)
The definitions, every field, and when a field shows '-': man 8 isclatency.";

const EXAMPLES: &str = "examples:
    isclatency                 # iSCSI commands of 10 ms or more, in ms
    isclatency -m 1            # 1 ms or more
    isclatency -u 0            # every command, times in us
    isclatency -W              # every column: session, LUN, RESP, RETX, result
    isclatency -I              # COMM and PID: the process that issued the I/O
    isclatency -m 5 -e         # -W and R2T count, target name, initiator, portal
    isclatency --sid 1 -w      # writes of session 1 only
    isclatency --target 'storage0[12]' --lun 0
    isclatency --disk sdb -T   # one disk, wall-clock timestamps
    isclatency --tur 5         # a TEST UNIT READY to each disk every 5 s: NET known at once
    isclatency -u 500 --json   # one JSON object per command, times in ns
    isclatency --duration 60 > slow.txt
    isclatency --ebpf          # print the BPF program and exit";

#[derive(Parser, Debug)]
#[command(name = "isclatency", version, about = "Trace slow iSCSI commands with their WAIT/SEND/RESP (NET/TARGET) breakdown", long_about = ABOUT, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    threshold: Threshold,
    #[command(flatten)]
    filters: Filters,
    #[command(flatten)]
    tur: TurFlag,
    #[command(flatten)]
    buffer: BufferFlag,
    /// Every column: SID:CID, LUN, RESP, RETX and RESULT beside the default ones
    #[arg(short = 'W', long)]
    wide: bool,
    /// Wide, and R2Ts waited for (writes), target name (IQN), initiator, portal
    #[arg(short = 'e', long)]
    extended: bool,
    /// COMM and PID: the process that submitted the I/O, not the context that
    /// dispatched it to the driver (marked [comm] where not known); with -W or
    /// -e a CGROUP column; one more program run per command
    #[arg(short = 'I', long)]
    issuer: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("isclatency", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(10)?;
    args.filters.validate()?;
    let tur_every = args.tur.interval(&args.filters)?;
    let mut s = Startup::new("isclatency", &args.common)?;
    s.event_pages = args.buffer.pages()?;
    let issuer = args.filters.issuer_needed(args.issuer);
    let mut values = vec![("MIN_US", min_us.into()), ("WHO", true.into())];
    values.push(("ISSUER", issuer.into()));
    let Some(t) = stages::start(&s, &args.filters, templates::ISCLATENCY, &values)? else {
        return Ok(());
    };
    let mut events = s.events(&t.bpf)?;
    let view = LatencyView::new(
        unit,
        args.common.timestamp,
        Columns::from_flags(args.wide, args.extended),
        &t.plan,
        Clock::start(),
        t.topo.clone(),
        Some("/sys".into()),
    );
    let mut view = if issuer && (args.wide || args.extended) { view.with_cgroup_column() } else { view };
    let what = if min_us == 0 {
        "all iSCSI commands".to_string()
    } else {
        format!("iSCSI commands slower than {} {}", if unit == Unit::Ms { min_us / 1000 } else { min_us }, unit.label())
    };
    let mut tracer = s.trace(&what)?;
    let probe = tur_every.map(|every| TurProbe::start(&t.topo, t.filter.clone(), "/sys".into(), every));
    let Tracer { stop, out, .. } = &mut tracer;
    if !args.common.json {
        out.line(&view.header());
    }
    let (mut shown, mut malformed) = (0u64, 0u64);
    let mut line = String::with_capacity(256);
    runner::print_events(&mut events, stop, out, |rec, out| {
        let Some(cmd) = Command::parse(rec) else {
            malformed += 1;
            return true;
        };
        if args.common.json {
            line = view.json(&cmd);
        } else {
            view.write_row(&mut line, &cmd);
        }
        let ok = out.line(&line);
        shown += ok as u64;
        ok
    });
    let mut summary = vec![format!("{shown} commands shown, {}", t.untimed_summary(malformed)?)];
    summary.extend(probe.map(TurProbe::finish));
    summary.extend(s.event_buffer().full_note(t.counter(Counter::Lost)?));
    tracer.finish(&summary);
    Ok(())
}
