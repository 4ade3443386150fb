//! isclatency: every slow iSCSI command, with where its time went.
//! WAIT (in the driver's queue), SEND (handing the PDU to TCP), RESP (waiting
//! for the target), split into NET and TARGET, and the TCP retransmits on
//! the way. Like bcc's ext4slower, for the iSCSI initiator.

use clap::Parser;
use storprototrace::bpf::events::Command;
use storprototrace::bpf::runner::{self, Events, Stop};
use storprototrace::bpf::templates;
use storprototrace::cli::output::{self, Clock, Out, Unit};
use storprototrace::cli::{self, Common, Threshold};
use storprototrace::stages::filters::Filters;
use storprototrace::stages::latency_view::LatencyView;
use storprototrace::{error, stages, Result};

const ABOUT: &str = "Trace iSCSI commands slower than a threshold, with where their time went.

Stages of each SCSI command in the iSCSI initiator (libiscsi):
  WAIT   iscsi_queuecommand -> the xmit worker prepares its PDU (queued in the driver)
  SEND   PDU preparation -> command PDU and any immediate/unsolicited data handed to TCP
  RESP   handed to TCP -> the response completes the task. For writes this
         includes waiting for R2Ts and sending the solicited Data-Out PDUs.
  NET    RESP's network share: one round trip at the connection's floor RTT
         per exchange with the target, each capped at what it took (command
         -> first PDU back; for writes with R2T also Data-Out -> response),
         plus the data transfer the initiator sees (first Data-In -> end for
         reads; R2T -> last Data-Out handed to TCP for writes).
  TARGET = RESP - NET: the target's service time (and whatever else the
         floor RTT does not explain).
  TOTAL  = WAIT + SEND + RESP
  RETX   TCP segments retransmitted on the command's connection while it was
         in flight (the socket's own total_retrans counter).
The floor RTT is TCP's windowed minimum RTT of the connection (tcp_min_rtt:
the lowest of the last net.ipv4.tcp_min_rtt_wlen seconds, 300 by default,
delayed ACKs left out), not srtt, which delayed ACKs piggybacked on the
target's answers fill with target time. Limits: when the network's RTT
rises, NET follows only as old samples leave that window (the rise shows as
TARGET meanwhile); data queued in TCP's send buffer or in the network ahead
of a write's Data-Out, the target's queue ahead of a read's first Data-In,
and the network's jitter above its minimum RTT count as TARGET. NET and TARGET show '-' for a command with no PDU
back seen, not on iscsi_tcp, before the connection's first RTT sample, or
whose first PDU back came before its send call returned (the round trip is
then inside SEND); the summary counts them.
COMM/PID is the context that dispatched the command to the driver: often the
submitting process, often a kworker (blk-mq runs queues from workqueues).
Commands that are aborted or failed by session recovery are not timed; they
are counted in the summary.";

const EXAMPLES: &str = "examples:
    isclatency                 # iSCSI commands of 10 ms or more, in ms
    isclatency -m 1            # 1 ms or more
    isclatency -u 0            # every command, times in us
    isclatency -m 5 -e         # with R2T count, target name, initiator and portal
    isclatency --sid 1 -w      # writes of session 1 only
    isclatency --target 'storage0[12]' --lun 0
    isclatency --disk sdb -T   # one disk, wall-clock timestamps
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
    /// Extended columns: R2Ts waited for (writes), target name (IQN), initiator, portal
    #[arg(short = 'e', long)]
    extended: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("isclatency", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(10)?;
    args.filters.validate()?;
    let duration = args.common.duration()?;
    let values = [("MIN_US", min_us.into()), ("WHO", true.into())];
    let Some(t) = stages::start("isclatency", &args.common, &args.filters, templates::ISCLATENCY, &values)? else {
        return Ok(());
    };
    let mut events = Events::open(&t.bpf, t.kernel.ringbuf)?;
    let stop = Stop::install(duration)?;
    let mut out = Out::new();
    let mut view = LatencyView::new(
        unit,
        args.common.timestamp,
        args.extended,
        &t.plan,
        Clock::start(),
        t.topo.clone(),
        Some("/sys".into()),
    );

    let what = if min_us == 0 {
        "all iSCSI commands".to_string()
    } else {
        format!("iSCSI commands slower than {} {}", if unit == Unit::Ms { min_us / 1000 } else { min_us }, unit.label())
    };
    output::status(args.common.json, &mut out, &format!("Tracing {what}... Hit Ctrl-C to end."));
    if !args.common.json {
        out.line(&view.header());
    }
    let (mut shown, mut malformed) = (0u64, 0u64);
    runner::print_events(&mut events, &stop, &mut out, |rec, out| {
        let Some(cmd) = Command::parse(rec) else {
            malformed += 1;
            return true;
        };
        let line = if args.common.json { view.json(&cmd) } else { view.row(&cmd) };
        let ok = out.line(&line);
        shown += ok as u64;
        ok
    });
    let line = format!("{shown} commands shown, {}", t.untimed_summary(malformed)?);
    output::summary(args.common.json, &mut out, &[line]);
    Ok(())
}
