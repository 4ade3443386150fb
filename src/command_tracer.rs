//! Trace iSCSI commands from your own program: the per-command stages that
//! `isclatency` prints, as typed records, with its filters and threshold.
//!
//! ```no_run
//! use std::time::Duration;
//! use storprototrace::command_tracer::Options;
//!
//! # fn main() -> storprototrace::Result<()> {
//! // Commands of 5 ms or more on session 1 (needs root and a logged-in session).
//! let mut tracer = Options::new().min_latency(Duration::from_millis(5)).session(1).start()?;
//! for _ in 0..10 {
//!     for c in tracer.poll(Duration::from_secs(1)) {
//!         println!("{} {:?} {} total {:?} target {:?}", c.disk, c.direction, c.bytes, c.total, c.target_time);
//!     }
//! }
//! println!("{}", tracer.stop()?);
//! # Ok(())
//! # }
//! ```
//!
//! The program is the one `isclatency` compiles (fentry where the kernel
//! takes it, else kprobes), so every figure means what `isclatency(8)` says
//! it means. The tracer detaches when it is stopped or dropped.

use crate::bpf::events::Command;
use crate::bpf::runner::Events;
use crate::bpf::templates;
use crate::cli::Common;
use crate::error::Result;
use crate::iscsi::topology::LiveTopology;
use crate::stages::filters::Filters;
use crate::stages::{self, Tracing};
use crate::start::Startup;
use std::time::Duration;

pub use crate::bpf::events::Direction;

/// What to trace: a threshold and filters, as isclatency's flags.
#[derive(Debug, Clone)]
pub struct Options {
    filters: Filters,
    min: Duration,
    verbose: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options::new()
    }
}

impl Options {
    /// Commands of 10 ms or more, on every session.
    pub fn new() -> Options {
        Options { filters: Filters::default(), min: Duration::from_millis(10), verbose: false }
    }

    /// Only commands that took at least this long (zero: every command).
    pub fn min_latency(mut self, min: Duration) -> Options {
        self.min = min;
        self
    }

    /// Only this iSCSI session id (`/sys/class/iscsi_session/sessionN`).
    pub fn session(mut self, sid: u32) -> Options {
        self.filters.sid = Some(sid);
        self
    }

    /// Only this connection id within the session(s).
    pub fn connection(mut self, cid: u32) -> Options {
        self.filters.cid = Some(cid);
        self
    }

    /// Only this LUN.
    pub fn lun(mut self, lun: u64) -> Options {
        self.filters.lun = Some(lun);
        self
    }

    /// Only this iSCSI disk (e.g. `sdb`).
    pub fn disk(mut self, disk: &str) -> Options {
        self.filters.disk = Some(disk.to_string());
        self
    }

    /// Only sessions whose target IQN matches this regular expression.
    pub fn target(mut self, regex: &str) -> Options {
        self.filters.target = Some(regex.to_string());
        self
    }

    /// Only sessions whose initiator name matches this regular expression.
    pub fn initiator(mut self, regex: &str) -> Options {
        self.filters.initiator = Some(regex.to_string());
        self
    }

    /// Only reads.
    pub fn reads_only(mut self) -> Options {
        self.filters.reads = true;
        self.filters.writes = false;
        self
    }

    /// Only writes.
    pub fn writes_only(mut self) -> Options {
        self.filters.writes = true;
        self.filters.reads = false;
        self
    }

    /// Only commands dispatched by this process id.
    pub fn pid(mut self, pid: u32) -> Options {
        self.filters.pid = Some(pid);
        self
    }

    /// Say on stderr which probe points were chosen and why.
    pub fn verbose(mut self, verbose: bool) -> Options {
        self.verbose = verbose;
        self
    }

    /// Check, compile and attach (the tools' start-up: root, kernel types,
    /// iSCSI modules and sessions, filters that name something).
    pub fn start(self) -> Result<CommandTracer> {
        self.filters.validate()?;
        let min_us = u64::try_from(self.min.as_micros()).unwrap_or(u64::MAX);
        let common = Common { verbose: self.verbose, ..Common::default() };
        let startup = Startup::new("storprototrace", &common)?;
        let mut values = vec![("MIN_US", min_us.into()), ("WHO", true.into())];
        values.push(("ISSUER", false.into()));
        let tracing = stages::start_tracing(&startup, &self.filters, templates::ISCLATENCY, &values)?;
        let events = startup.events(&tracing.bpf)?;
        let topo = LiveTopology::new(tracing.topo.clone(), Some("/sys".into()));
        Ok(CommandTracer { tracing, events, topo, malformed: 0 })
    }
}

/// One iSCSI command that completed, with where its time went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// When it completed, CLOCK_MONOTONIC nanoseconds.
    pub completed_ns: u64,
    /// The task that dispatched it to the driver (often a kworker).
    pub comm: String,
    /// That task's process id.
    pub pid: u32,
    /// iSCSI session id.
    pub sid: u32,
    /// Connection id within the session.
    pub cid: u32,
    /// The LUN.
    pub lun: u64,
    /// The disk (e.g. `sdb`), `?` where sysfs does not name it.
    pub disk: String,
    /// The session's target IQN, where sysfs names it.
    pub target: Option<String>,
    /// Read, write or neither.
    pub direction: Direction,
    /// Bytes transferred.
    pub bytes: u32,
    /// Queued in the driver.
    pub wait: Duration,
    /// Handing the PDU to TCP; None where the kernel cannot tell it apart.
    pub send: Option<Duration>,
    /// From handed to TCP to the response.
    pub resp: Duration,
    /// RESP's network share; None where it could not be split.
    pub net: Option<Duration>,
    /// RESP's target share; None where it could not be split.
    pub target_time: Option<Duration>,
    /// WAIT + SEND + RESP.
    pub total: Duration,
    /// TCP segments retransmitted on the connection while it was in
    /// flight; None without a TCP socket.
    pub retransmits: Option<u32>,
    /// The SCSI result is success.
    pub ok: bool,
}

/// A running tracer of iSCSI commands, from [`Options::start`].
pub struct CommandTracer {
    tracing: Tracing,
    events: Events,
    /// Disk and target names, read again for a session that logs in later.
    topo: LiveTopology,
    malformed: u64,
}

impl CommandTracer {
    /// Wait up to `timeout` for commands; those that completed since the
    /// last call (possibly none).
    pub fn poll(&mut self, timeout: Duration) -> Vec<CommandRecord> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let mut cmds = Vec::new();
        for rec in self.events.poll(ms) {
            match Command::parse(rec) {
                Some(c) => cmds.push(c),
                None => self.malformed += 1,
            }
        }
        cmds.iter().map(|c| self.record(c)).collect()
    }

    /// Hand every command to `handler` until `keep_going` says no (asked
    /// at least every 100 ms).
    pub fn for_each(&mut self, mut keep_going: impl FnMut() -> bool, mut handler: impl FnMut(&CommandRecord)) {
        while keep_going() {
            for c in self.poll(Duration::from_millis(100)) {
                handler(&c);
            }
        }
    }

    /// What was not timed and why (events lost, commands that ended
    /// without a response, still in flight, not split), as the tools'
    /// exit summary says it.
    pub fn summary(&self) -> Result<String> {
        self.tracing.untimed_summary(self.malformed)
    }

    /// Detach, and return [`CommandTracer::summary`].
    pub fn stop(self) -> Result<String> {
        self.summary()
    }

    fn record(&mut self, c: &Command) -> CommandRecord {
        let ns = Duration::from_nanos;
        let split = c.net_target(self.tracing.plan.have_rx);
        CommandRecord {
            completed_ns: c.ts_queue + c.total,
            comm: c.comm.clone(),
            pid: c.pid,
            sid: c.sid,
            cid: c.cid,
            lun: c.lun,
            disk: self.topo.disk_name(c.host, c.channel, c.id, c.lun),
            target: self.topo.session(c.sid).map(|s| s.target.clone()),
            direction: c.dir,
            bytes: c.bytes,
            wait: ns(c.wait),
            send: self.tracing.plan.have_sent.then(|| ns(c.send)),
            resp: ns(c.resp),
            net: split.map(|s| ns(s.0)),
            target_time: split.map(|s| ns(s.1)),
            total: ns(c.total),
            retransmits: c.retrans,
            ok: c.ok(),
        }
    }
}
