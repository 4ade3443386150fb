//! iscstates: iSCSI connection failures and recoveries, one line per
//! session or connection event (tcpstates for iSCSI), with the I/O each
//! failure held up.

use clap::Parser;
use std::path::{Path, PathBuf};
use storprototrace::bpf::maps::{self, Counter};
use storprototrace::cli::output::Clock;
use storprototrace::cli::textfile;
use storprototrace::cli::{self, Common};
use storprototrace::iscsi::topology::Topology;
use storprototrace::kernel::types as kernel_types;
use storprototrace::stages::filters::Filters;
use storprototrace::start::{Program, Startup, Tracer};
use storprototrace::states::view::{Sessions, StatesView};
use storprototrace::states::{self, Kind, SessionInfo, Shown, StateEvent, StatesPlan, Tracker};
use storprototrace::{error, Result};

const ABOUT: &str = "Trace iSCSI session and connection state changes: failures, recovery, logout and login.

One line per event, when the kernel makes it:
  SID:CID  session and connection ids (as in /sys/class/iscsi_connection/connectionSID:CID)
  OLD/NEW  the session's state before and after; MS: milliseconds in OLD
           (- when OLD began before tracing)
  conn_error        LOGGED_IN -> FAILED: the kernel's reason (NOP_TIMEDOUT 1022: ping
                    timeout, TCP_CONN_CLOSE 1020, XMIT_FAILED 1019, CONN_FAILED 1011, ...)
  conn_stop         -> STOPPED: the commands in flight that recovery flushed (sent, or
                    not sent yet), and the age of the oldest (since its request was made)
  blocked           -> BLOCKED: I/O held until relogin or replacement_timeout
  recovery_timeout  -> TIMED_OUT: after replacement_timeout, I/O fails
  relogin / login   -> STARTED: the connection started again / a new login
  unblocked         -> LOGGED_IN: how long the session was blocked, commands requeued
                    by SCSI to be sent again, I/O requests failed to the block layer
  logout            -> LOGGED_OUT: an administrator's logout (not a failure)
Only control paths are probed; the one per-I/O probe (raw tracepoint
block_rq_complete: I/O errors, and the longest request held up) is attached at
the first failure. At exit: a summary per session, with LONGEST: the longest
time a request held up by a recovery took from its start (where iostat's await
counts from) to its final completion, retried or failed (commands retried after
the relogin complete after the unblocked line, so it is in the summary only);
'-' where no request was held up or the probe could not be attached.";

const EXAMPLES: &str = "examples:
    iscstates                      # every session's events
    iscstates -T                   # wall-clock timestamps
    iscstates --sid 1              # one session
    iscstates --target 'target2$'  # sessions whose target IQN matches
    iscstates --json               # one JSON object per event, times in ns
    iscstates --prom-file /var/lib/node_exporter/iscsi_states.prom
    iscstates --duration 600 -v    # ten minutes, say which probes were chosen
    iscstates --ebpf               # print the BPF program and exit";

#[derive(Parser, Debug)]
#[command(name = "iscstates", version, about = "Trace iSCSI connection failures and recoveries, with the I/O they held up", long_about = ABOUT, after_help = EXAMPLES)]
struct Args {
    /// Only this iSCSI session id (as in /sys/class/iscsi_session/sessionN)
    #[arg(long, value_name = "SID")]
    sid: Option<u32>,
    /// Only sessions whose target IQN matches REGEX (sessions logged in later too)
    #[arg(long, value_name = "REGEX")]
    target: Option<String>,
    /// After each event and at exit, atomically replace PATH with
    /// node_exporter textfile-collector counters
    #[arg(long, value_name = "PATH")]
    prom_file: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("iscstates", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    let s = Startup::new("iscstates", &args.common)?;
    let filters = Filters { sid: args.sid, target: args.target.clone(), ..Default::default() };
    filters.validate()?;
    let target_re = filters.target_regex()?;
    let types = kernel_types::from_btf_dir(&s.kernel.btf_dir, states::PARTS, kernel_types::ISCSI_MODULES);
    let ebpf = s.ebpf(|kernel| {
        let plan = StatesPlan::choose(kernel).unwrap_or_else(|_| StatesPlan::assume_all());
        Ok(kernel_types::program(types.as_ref().ok(), &plan.render(s.ebpf_buffer())?))
    })?;
    if ebpf {
        return Ok(());
    }
    let sys = Path::new("/sys");
    let topo = Topology::read(sys)?;
    filters.resolve(&topo)?; // a --sid or --target that names no session
    if let Some(p) = &args.prom_file {
        textfile::check_writable(p)?;
    }
    s.preflight(true)?;
    let plan = StatesPlan::choose(&s.kernel)?;
    let k = &s.kernel;
    let program = Program {
        describe: vec![
            format!(
                "kernel {}: functions from {:?}, ring buffer: {}, {}, kprobes (control paths only)",
                k.release,
                k.source,
                k.ringbuf,
                kernel_types::describe(&types)
            ),
            "probe raw_tracepoint:block_rq_complete -> rq_done (attached at the first failure)".into(),
        ],
        notes: plan.notes.clone(),
        ..Program::new(kernel_types::program(types.as_ref().ok(), &plan.render(s.event_buffer())?), plan.probes.clone())
    };
    let (mut bpf, _links) = s.load(&program, |_| Ok(()))?;
    let mut view = StatesView {
        sessions: Sessions::new(sys, &topo),
        tracker: Tracker::new(plan.have_flush, plan.have_requeue),
        rq_attached: None,
        ncpus: maps::possible_cpus()?,
        clock: Clock::start(),
        malformed: 0,
        shown: 0,
    };
    for s in &topo.sessions {
        view.tracker.known(s.sid, &s.state);
    }
    let json = args.common.json;
    let mut events = s.events(&bpf)?;
    let mut t = s.trace("iSCSI session and connection events")?;
    let Tracer { stop, out, .. } = &mut t;
    if !json {
        out.line(&Shown::header(args.common.timestamp));
    }
    let keep = |sid: u32, info: &SessionInfo| {
        args.sid.map(|s| s == sid).unwrap_or(true)
            && target_re.as_ref().map(|re| re.is_match(&info.target)).unwrap_or(true)
    };
    let write_prom = |view: &StatesView| -> Result<()> {
        match &args.prom_file {
            Some(p) => {
                textfile::write_atomically(p, &states::prom_text(&view.tracker.totals, &|sid| view.sessions.info(sid)))
            }
            None => Ok(()),
        }
    };
    write_prom(&view)?;
    while !stop.stopped() && !out.closed() {
        let mut changed = false;
        for b in events.poll(stop.poll_ms(100)) {
            let Some(mut e) = StateEvent::parse(b) else {
                view.malformed += 1;
                continue;
            };
            if e.kind == Kind::Requeue {
                match view.sessions.sid_of_host(e.code as u32) {
                    Some(sid) => e.sid = sid,
                    None => continue, // not an iSCSI host
                }
            }
            let info = view.sessions.lookup(e.sid);
            if !keep(e.sid, &info) {
                continue;
            }
            if let Some(s) = view.take(&mut bpf, &e) {
                let time = view.clock.time(s.ts, args.common.timestamp);
                out.line(&if json { s.json(&time, &info) } else { s.line(&time, &info) });
                view.shown += 1;
                changed = true;
            }
        }
        out.flush();
        if changed {
            write_prom(&view)?;
        }
    }
    write_prom(&view)?;
    view.fold_longest(&bpf);
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost) + view.malformed;
    if !out.closed() {
        let mut lines = states::summary_lines(&view.tracker.totals, &|sid| view.sessions.info(sid), plan.have_requeue);
        let open: Vec<String> = view.tracker.episodes.keys().map(|s| s.to_string()).collect();
        if !open.is_empty() {
            lines.push(format!("still in recovery at exit (not in the totals): session {}", open.join(", ")));
        }
        lines.push(format!("{} events shown, {lost} events lost", view.shown));
        t.finish(&lines);
    }
    Ok(())
}
