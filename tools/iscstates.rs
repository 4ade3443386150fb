//! iscstates: iSCSI connection failures and recoveries, one line per
//! session or connection event (tcpstates for iSCSI), with the I/O each
//! failure held up.

use clap::Parser;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use storprototrace::blockdev::BlockDevs;
use storprototrace::cli::{self, Common};
use storprototrace::filters::Filters;
use storprototrace::kernel::Kernel;
use storprototrace::maps::{self, Counter};
use storprototrace::output::{self, Clock, Out};
use storprototrace::runner::{self, Events, Stop};
use storprototrace::states::{self, Kind, SessionInfo, Shown, StateEvent, StatesPlan, Tracker};
use storprototrace::topology::Topology;
use storprototrace::{error, kernel_types, prom, Error, Result};

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
Only control paths are probed; the per-I/O error count (block:block_rq_complete)
is attached at the first failure. At exit: a summary per session.";

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

/// The block_rq_complete record offsets of this kernel (those of 5.10 to
/// 7.3 where tracefs cannot say: --ebpf only).
fn rq_offsets(kernel: &Kernel) -> Option<(u32, u32, u32)> {
    kernel.tracepoint_format("block", "block_rq_complete").and_then(|f| states::rq_complete_offsets(&f))
}

fn run(args: Args) -> Result<()> {
    let duration = args.common.duration()?;
    let filters = Filters { sid: args.sid, target: args.target.clone(), ..Default::default() };
    filters.validate()?;
    let target_re = filters.target_regex()?;
    let kernel = Kernel::detect();
    let types = kernel_types::from_btf_dir(&kernel.btf_dir, states::PARTS, kernel_types::ISCSI_MODULES);

    if args.common.ebpf {
        let plan = StatesPlan::choose(&kernel).unwrap_or_else(|_| StatesPlan::assume_all());
        let ringbuf = kernel.ringbuf || kernel.function_count() == 0;
        println!("{}", kernel_types::program(types.as_ref().ok(), &plan.render(ringbuf, rq_offsets(&kernel).unwrap_or((8, 24, 28)))?));
        return Ok(());
    }
    let sys = Path::new("/sys");
    let topo = Topology::read(sys)?;
    filters.resolve(&topo)?; // a --sid or --target that names no session
    if let Some(p) = &args.prom_file {
        prom::check_writable(p)?;
    }
    runner::preflight(&kernel, true)?;
    let plan = StatesPlan::choose(&kernel)?;
    let offsets = rq_offsets(&kernel).ok_or_else(|| Error::env("no block:block_rq_complete tracepoint format in tracefs"))?;
    if args.common.verbose {
        eprintln!("kernel {}: functions from {:?}, ring buffer: {}, {}, kprobes (control paths only)", kernel.release, kernel.source, kernel.ringbuf, kernel_types::describe(&types));
        for p in &plan.probes {
            eprintln!("probe {}", p.describe());
        }
        eprintln!("probe tracepoint:block:block_rq_complete -> rq_complete (attached at the first failure)");
    }
    for n in &plan.notes {
        eprintln!("iscstates: note: {n}");
    }
    let mut bpf = runner::compile(&kernel, &kernel_types::program(types.as_ref().ok(), &plan.render(kernel.ringbuf, offsets)?))?;
    let _links = runner::attach(&mut bpf, &plan.probes, &mut None)?;
    let mut events = Events::open(&bpf, kernel.ringbuf)?;
    let stop = Stop::install(duration)?;

    let mut view = View { sessions: Sessions::new(sys, &topo), tracker: Tracker::new(plan.have_flush, plan.have_requeue), rq_attached: None, clock: Clock::start(), malformed: 0, shown: 0 };
    for s in &topo.sessions {
        view.tracker.known(s.sid, &s.state);
    }
    let mut out = Out::new();
    let json = args.common.json;
    output::status(json, &mut out, "Tracing iSCSI session and connection events... Hit Ctrl-C to end.");
    if !json {
        out.line(&Shown::header(args.common.timestamp));
    }
    let keep = |sid: u32, info: &SessionInfo| args.sid.map(|s| s == sid).unwrap_or(true) && target_re.as_ref().map(|re| re.is_match(&info.target)).unwrap_or(true);
    let write_prom = |view: &View| -> Result<()> {
        match &args.prom_file {
            Some(p) => prom::write_atomically(p, &states::prom_text(&view.tracker.totals, &|sid| view.sessions.info(sid))),
            None => Ok(()),
        }
    };
    write_prom(&view)?;
    while !stop.stopped() && !out.closed() {
        let recs = events.poll(stop.poll_ms(100));
        let mut changed = false;
        for b in &recs {
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
                let time = if args.common.timestamp { view.clock.wall(s.ts) } else { format!("{:.6}", view.clock.since_start(s.ts)) };
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
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost) + view.malformed;
    if !out.closed() {
        let mut lines = states::summary_lines(&view.tracker.totals, &|sid| view.sessions.info(sid), plan.have_requeue);
        let open: Vec<String> = view.tracker.episodes.keys().map(|s| s.to_string()).collect();
        if !open.is_empty() {
            lines.push(format!("still in recovery at exit (not in the totals): session {}", open.join(", ")));
        }
        lines.push(format!("{} events shown, {lost} events lost", view.shown));
        output::summary(json, &mut out, &lines);
    }
    Ok(())
}

struct View {
    sessions: Sessions,
    tracker: Tracker,
    /// block_rq_complete: None not yet, Some(false) could not attach.
    rq_attached: Option<bool>,
    clock: Clock,
    malformed: u64,
    shown: u64,
}

impl View {
    fn take(&mut self, bpf: &mut bcc::BPF, e: &StateEvent) -> Option<Shown> {
        let opens = matches!(e.kind, Kind::ConnError | Kind::Block) || (e.kind == Kind::ConnStop && e.code == states::STOP_RECOVER);
        if opens && self.rq_attached.is_none() {
            let r = bcc::Tracepoint::new().handler("rq_complete").subsystem("block").tracepoint("block_rq_complete").attach(bpf);
            if let Err(err) = &r {
                eprintln!("iscstates: note: cannot attach block:block_rq_complete ({err}): failed commands show '-'");
            }
            self.rq_attached = Some(r.is_ok());
        }
        let errors = match (opens || e.kind == Kind::Unblock, self.rq_attached) {
            (true, Some(true)) => self.errors(bpf, e.sid),
            _ => None,
        };
        self.tracker.take(e, errors)
    }

    /// I/O errors so far on the disks of session `sid`.
    fn errors(&mut self, bpf: &bcc::BPF, sid: u32) -> Option<u64> {
        let mut t = bpf.table("rq_errors").ok()?;
        Some(self.sessions.devs(sid).iter().map(|d| t.get(&mut d.to_ne_bytes().to_vec()).map(|v| maps::first_u64(&v)).unwrap_or(0)).sum())
    }
}

/// Names, SCSI host and disks of each session, from sysfs; kept after a
/// session is gone (its logout is shown after sysfs dropped it).
struct Sessions {
    sys: PathBuf,
    known: HashMap<u32, (SessionInfo, u32, Vec<u32>)>,
}

impl Sessions {
    fn new(sys: &Path, topo: &Topology) -> Sessions {
        let mut s = Sessions { sys: sys.to_path_buf(), known: HashMap::new() };
        s.learn(topo);
        s
    }

    fn learn(&mut self, topo: &Topology) {
        for s in &topo.sessions {
            let devs = s.luns.iter().filter_map(|l| l.disk.as_deref()).filter_map(|d| BlockDevs::disk_dev(&self.sys, "disk", d).ok()).collect();
            self.known.insert(s.sid, (SessionInfo { target: s.target.clone(), portal: s.portal() }, s.host, devs));
        }
    }

    fn refresh(&mut self) {
        if let Ok(t) = Topology::read(&self.sys) {
            self.learn(&t);
        }
    }

    fn info(&self, sid: u32) -> SessionInfo {
        self.known.get(&sid).map(|k| k.0.clone()).unwrap_or_default()
    }

    /// As `info`, reading sysfs again for a session not seen yet (a login).
    fn lookup(&mut self, sid: u32) -> SessionInfo {
        if !self.known.contains_key(&sid) {
            self.refresh();
        }
        self.info(sid)
    }

    fn sid_of_host(&mut self, host: u32) -> Option<u32> {
        let find = |k: &HashMap<u32, (SessionInfo, u32, Vec<u32>)>| k.iter().find(|(_, v)| v.1 == host).map(|(s, _)| *s);
        find(&self.known).or_else(|| {
            self.refresh();
            find(&self.known)
        })
    }

    /// The session's disks, read again (LUNs appear after a login).
    fn devs(&mut self, sid: u32) -> Vec<u32> {
        self.refresh();
        self.known.get(&sid).map(|k| k.2.clone()).unwrap_or_default()
    }
}
