//! iscstates' logic: which kernel functions carry each session and
//! connection event, the template values, the event record, and the
//! episodes (failure .. unblock) with what they did to I/O, per session.
//! The C side is bpf_templates/iscstates.c; the kernel functions it
//! probes per kernel are in docs/kernels.md.

pub mod view;

use crate::bpf::events::Reader;
use crate::bpf::runner::{EventBuffer, Probe};
use crate::bpf::templates::{self, Template};
use crate::cli::json;
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use std::collections::{BTreeMap, HashMap};

pub const PARTS: &[&str] = &[templates::COMMON, templates::ISCSTATES];

pub const CONN_ERROR: &str = "iscsi_conn_error_event";
pub const CONN_STOP: &str = "iscsi_conn_stop";
pub const CONN_START: &str = "iscsi_conn_start";
pub const BLOCK: &str = "__iscsi_block_session";
pub const UNBLOCK: &str = "__iscsi_unblock_session";
pub const TIMEOUT: &str = "session_recovery_timedout";
/// The per-command flush inside iscsi_conn_stop: 6.1+ name, then 5.10's.
pub const FLUSH: &[&str] = &["__fail_scsi_task", "fail_scsi_task"];
pub const REQUEUE: &str = "__scsi_queue_insert";

/// `enum iscsi_err` (include/scsi/iscsi_if.h, the same 5.10 to 7.3).
pub fn err_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1001 => "DATASN",
        1002 => "DATA_OFFSET",
        1003 => "MAX_CMDSN",
        1004 => "EXP_CMDSN",
        1005 => "BAD_OPCODE",
        1006 => "DATALEN",
        1007 => "AHSLEN",
        1008 => "PROTO",
        1009 => "LUN",
        1010 => "BAD_ITT",
        1011 => "CONN_FAILED",
        1012 => "R2TSN",
        1013 => "SESSION_FAILED",
        1014 => "HDR_DGST",
        1015 => "DATA_DGST",
        1016 => "PARAM_NOT_FOUND",
        1017 => "NO_SCSI_CMD",
        1018 => "INVALID_HOST",
        1019 => "XMIT_FAILED",
        1020 => "TCP_CONN_CLOSE",
        1021 => "SCSI_EH_SESSION_RST",
        1022 => "NOP_TIMEDOUT",
        _ => "UNKNOWN",
    }
}

/// `STOP_CONN_*` (include/scsi/iscsi_if.h).
pub const STOP_TERM: i32 = 1;
pub const STOP_SUSPEND: i32 = 2;
pub const STOP_RECOVER: i32 = 3;

/// Event types; iscstates.c's `EV_*` have the same numbers (tested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ConnError = 1,
    ConnStop = 2,
    ConnStart = 3,
    Block = 4,
    Unblock = 5,
    RecoveryTimeout = 6,
    Requeue = 7,
}

impl Kind {
    pub const ALL: [(Kind, &'static str); 7] = [
        (Kind::ConnError, "EV_CONN_ERROR"),
        (Kind::ConnStop, "EV_CONN_STOP"),
        (Kind::ConnStart, "EV_CONN_START"),
        (Kind::Block, "EV_BLOCK"),
        (Kind::Unblock, "EV_UNBLOCK"),
        (Kind::RecoveryTimeout, "EV_RECOVERY_TIMEOUT"),
        (Kind::Requeue, "EV_REQUEUE"),
    ];
    pub fn from_code(c: u32) -> Option<Kind> {
        Kind::ALL.iter().map(|(k, _)| *k).find(|k| *k as u32 == c)
    }
}

/// `struct event` of iscstates.c.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEvent {
    pub ts: u64,
    pub oldest_ns: u64,
    pub kind: Kind,
    pub sid: u32,
    pub cid: u32,
    pub code: i32,
    pub sent: u32,
    pub unsent: u32,
    pub recovery_tmo: i32,
}

impl StateEvent {
    pub const SIZE: usize = 48;
    pub fn parse(b: &[u8]) -> Option<StateEvent> {
        if b.len() < Self::SIZE {
            return None;
        }
        let mut r = Reader::new(b);
        let (ts, oldest_ns, kind, sid, cid, code, sent, unsent, recovery_tmo) =
            (r.u64()?, r.u64()?, r.u32()?, r.u32()?, r.u32()?, r.i32()?, r.u32()?, r.u32()?, r.i32()?);
        Some(StateEvent { ts, oldest_ns, kind: Kind::from_code(kind)?, sid, cid, code, sent, unsent, recovery_tmo })
    }
}

/// `struct held_t` of iscstates.c: the window of a host's latest recovery
/// episode, from its first failure event to the unblock (`until` u64::MAX
/// while it lasts). Requests completing inside it that started before its
/// end were held up by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub from: u64,
    pub until: u64,
}

impl Held {
    pub const SIZE: usize = 16;
    pub fn open(from: u64) -> Held {
        Held { from, until: u64::MAX }
    }
    pub fn to_bytes(self) -> Vec<u8> {
        [self.from.to_ne_bytes(), self.until.to_ne_bytes()].concat()
    }
}

/// The largest of the per-CPU u64 values of one key of a per-CPU map
/// (`ncpus` copies of 8 bytes).
pub fn percpu_max(value: &[u8], ncpus: usize) -> u64 {
    value.chunks_exact(8).take(ncpus).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).max().unwrap_or(0)
}

/// The probes on this kernel, and what it cannot show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatesPlan {
    pub probes: Vec<Probe>,
    pub notes: Vec<String>,
    /// Commands flushed at a conn stop are counted (fail_scsi_task traceable).
    pub have_flush: bool,
    pub have_requeue: bool,
}

impl StatesPlan {
    pub fn choose(kernel: &Kernel) -> Result<StatesPlan> {
        for (f, what) in [
            (CONN_ERROR, "a connection failure"),
            (CONN_STOP, "a connection stop"),
            (CONN_START, "a connection start"),
            (BLOCK, "a session block"),
            (UNBLOCK, "a session unblock"),
            (TIMEOUT, "a recovery timeout"),
        ] {
            if !kernel.can_probe(f) {
                return Err(Error::missing_probe(what, &[f]));
            }
        }
        Ok(Self::with(kernel.first_of(FLUSH), kernel.can_probe(REQUEUE)))
    }

    /// The plan with every probe point (for --ebpf where the kernel cannot be read).
    pub fn assume_all() -> StatesPlan {
        Self::with(Some(FLUSH[0]), true)
    }

    fn with(flush: Option<&str>, have_requeue: bool) -> StatesPlan {
        let mut probes = vec![
            Probe::entry(CONN_ERROR, "conn_error"),
            Probe::entry(CONN_STOP, "conn_stop"),
            Probe::ret(CONN_STOP, "conn_stop_ret"),
            Probe::entry(CONN_START, "conn_start"),
            Probe::entry(BLOCK, "session_block"),
            Probe::entry(UNBLOCK, "session_unblock"),
            Probe::ret(UNBLOCK, "session_unblock_ret"),
            Probe::entry(TIMEOUT, "session_timeout"),
        ];
        let mut notes = Vec::new();
        match flush {
            Some(f) => probes.push(Probe::entry(f, "flush_task")),
            None => notes
                .push(format!("none of {} is traceable: commands in flight at a failure show '-'", FLUSH.join(", "))),
        }
        if have_requeue {
            probes.push(Probe::entry(REQUEUE, "requeue"));
        } else {
            notes.push(format!("{REQUEUE} is not traceable: requeued commands show '-'"));
        }
        StatesPlan { probes, notes, have_flush: flush.is_some(), have_requeue }
    }

    pub fn render(&self, buffer: EventBuffer) -> Result<String> {
        Template::new(PARTS).render(&buffer.values())
    }
}

/// What the tool knows of a session from sysfs, for its lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInfo {
    pub target: String,
    pub portal: String,
}

/// One failure and its recovery: from the first failure event of a
/// session (conn error, conn stop for recovery, or block) to the unblock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Episode {
    pub start: u64,
    pub reason: Option<i32>,
    pub blocked_at: Option<u64>,
    pub timed_out: bool,
    /// Commands flushed by the conn stop (None: not traceable).
    pub in_flight: Option<u32>,
    pub requeued: u32,
    /// I/O errors of the session's disks when the episode began.
    pub errors_at_start: Option<u64>,
}

/// Per session, over the whole run (the exit summary and --prom-file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub failures: BTreeMap<i32, u64>,
    pub episodes: u64,
    pub blocked_ns: u64,
    pub max_blocked_ns: u64,
    pub timeouts: u64,
    pub requeued: u64,
    pub failed: u64,
    pub logouts: u64,
    pub logins: u64,
    /// The longest a request held up by an episode took from its start to
    /// its final completion (None: not known, e.g. no episode yet).
    pub longest_held_ns: Option<u64>,
}

/// One event as shown: a line, or a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub ts: u64,
    pub sid: u32,
    pub cid: Option<u32>,
    pub old: String,
    pub new: &'static str,
    /// Time in the old state; None when it began before tracing.
    pub duration_ns: Option<u64>,
    pub event: &'static str,
    pub detail: String,
    /// Event-specific fields for --json, in order.
    pub fields: Vec<(&'static str, Field)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    Num(i64),
    Str(String),
    Null,
}

fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

fn opt_num(v: Option<u64>) -> Field {
    v.map(|n| Field::Num(n as i64)).unwrap_or(Field::Null)
}

/// A line's event-specific JSON fields, in order.
type Fields = Vec<(&'static str, Field)>;
/// A line's new state, event name and detail text.
type Line = (&'static str, &'static str, String);

/// The state machine of every session seen: each event becomes a line,
/// episodes are opened and closed, totals kept.
#[derive(Debug, Default)]
pub struct Tracker {
    /// sid -> (state name, since when; None: before tracing)
    state: HashMap<u32, (String, Option<u64>)>,
    pub episodes: HashMap<u32, Episode>,
    pub totals: BTreeMap<u32, Totals>,
    pub have_flush: bool,
    pub have_requeue: bool,
}

impl Tracker {
    pub fn new(have_flush: bool, have_requeue: bool) -> Tracker {
        Tracker { have_flush, have_requeue, ..Default::default() }
    }

    /// A session that existed at start, in the state sysfs gives.
    pub fn known(&mut self, sid: u32, sysfs_state: &str) {
        self.state
            .entry(sid)
            .or_insert_with(|| (if sysfs_state.is_empty() { "-".into() } else { sysfs_state.into() }, None));
    }

    fn open(&mut self, sid: u32, ts: u64, errors: Option<u64>) -> &mut Episode {
        let t = self.totals.entry(sid).or_default();
        self.episodes.entry(sid).or_insert_with(|| {
            t.episodes += 1;
            Episode { start: ts, errors_at_start: errors, ..Default::default() }
        })
    }

    /// Take one event; `errors`: the I/O errors of the session's disks so
    /// far (None where unknown). Returns what to show (nothing for a requeue).
    pub fn take(&mut self, e: &StateEvent, errors: Option<u64>) -> Option<Shown> {
        let sid = e.sid;
        if e.kind == Kind::Requeue {
            if let Some(ep) = self.episodes.get_mut(&sid) {
                ep.requeued += 1;
            }
            return None;
        }
        let (old, since) = self.state.get(&sid).cloned().unwrap_or(("-".into(), None));
        let duration_ns = since.map(|s| e.ts.saturating_sub(s));
        let mut fields: Fields = Vec::new();
        let (new, event, detail) = match e.kind {
            Kind::ConnError => self.conn_error(e, errors, &mut fields),
            Kind::ConnStop => self.conn_stop(e, errors, &mut fields),
            Kind::Block => self.block(e, errors, &mut fields),
            Kind::RecoveryTimeout => self.recovery_timeout(e, &mut fields),
            Kind::ConnStart => self.conn_start(e, &mut fields),
            Kind::Unblock => self.unblock(e, errors, &mut fields),
            Kind::Requeue => unreachable!(),
        };
        self.state.insert(sid, (new.to_string(), Some(e.ts)));
        let cid = matches!(e.kind, Kind::ConnError | Kind::ConnStop | Kind::ConnStart).then_some(e.cid);
        Some(Shown { ts: e.ts, sid, cid, old, new, duration_ns, event, detail, fields })
    }

    /// A connection failure opens (or joins) the episode.
    fn conn_error(&mut self, e: &StateEvent, errors: Option<u64>, fields: &mut Fields) -> Line {
        let sid = e.sid;

        let ep = self.open(sid, e.ts, errors);
        ep.reason.get_or_insert(e.code);
        *self.totals.entry(sid).or_default().failures.entry(e.code).or_default() += 1;
        fields.push(("reason_code", Field::Num(e.code as i64)));
        fields.push(("reason", Field::Str(err_name(e.code).into())));
        ("FAILED", "conn_error", format!("conn error {} ({})", err_name(e.code), e.code))
    }

    /// A connection stopped: for recovery (with what was in flight), at logout, or otherwise.
    fn conn_stop(&mut self, e: &StateEvent, errors: Option<u64>, fields: &mut Fields) -> Line {
        let sid = e.sid;

        let n = e.sent + e.unsent;
        let (flushed, oldest) =
            if self.have_flush { (Some(n as u64), (n > 0).then_some(e.oldest_ns)) } else { (None, None) };
        fields.push(("in_flight", opt_num(flushed)));
        fields.push(("sent", opt_num(self.have_flush.then_some(e.sent as u64))));
        fields.push(("unsent", opt_num(self.have_flush.then_some(e.unsent as u64))));
        fields.push(("oldest_ns", opt_num(oldest)));
        fields.push(("flag", Field::Num(e.code as i64)));
        let what = match (flushed, oldest) {
            (None, _) => "in flight: -".to_string(),
            (Some(0), _) => "0 commands in flight".to_string(),
            (Some(n), o) => format!(
                "{n} commands in flight ({} sent, {} not sent), oldest {}",
                e.sent,
                e.unsent,
                o.map(secs).unwrap_or("-".into())
            ),
        };
        match e.code {
            STOP_RECOVER => {
                let ep = self.open(sid, e.ts, errors);
                ep.in_flight = flushed.map(|n| n as u32);
                ("STOPPED", "conn_stop", format!("stopped for recovery: {what}"))
            }
            STOP_TERM => {
                self.totals.entry(sid).or_default().logouts += 1;
                ("LOGGED_OUT", "logout", format!("logout (conn stopped, terminated): {what}"))
            }
            _ => ("SUSPENDED", "conn_stop", format!("conn stopped (flag {}): {what}", e.code)),
        }
    }

    /// The session blocked: I/O is held until it unblocks or recovery times out.
    fn block(&mut self, e: &StateEvent, errors: Option<u64>, fields: &mut Fields) -> Line {
        let sid = e.sid;

        let ep = self.open(sid, e.ts, errors);
        ep.blocked_at.get_or_insert(e.ts);
        fields.push(("replacement_timeout_s", Field::Num(e.recovery_tmo as i64)));
        let tmo = if e.recovery_tmo < 0 { "none".to_string() } else { format!("{} s", e.recovery_tmo) };
        ("BLOCKED", "blocked", format!("session blocked, I/O held; replacement_timeout {tmo}"))
    }

    /// Recovery gave up: held I/O fails.
    fn recovery_timeout(&mut self, e: &StateEvent, fields: &mut Fields) -> Line {
        let sid = e.sid;

        let after = self.episodes.get(&sid).and_then(|ep| ep.blocked_at).map(|b| e.ts.saturating_sub(b));
        if let Some(ep) = self.episodes.get_mut(&sid) {
            ep.timed_out = true;
        }
        self.totals.entry(sid).or_default().timeouts += 1;
        fields.push(("after_ns", opt_num(after)));
        fields.push(("replacement_timeout_s", Field::Num(e.recovery_tmo as i64)));
        (
            "TIMED_OUT",
            "recovery_timeout",
            format!(
                "recovery timed out after {} (replacement_timeout {} s): I/O fails",
                after.map(secs).unwrap_or("-".into()),
                e.recovery_tmo
            ),
        )
    }

    /// A connection started: after recovery, or a login.
    fn conn_start(&mut self, e: &StateEvent, fields: &mut Fields) -> Line {
        let sid = e.sid;

        fields.push(("stop_stage", Field::Num(e.code as i64)));
        if e.code == STOP_RECOVER {
            ("STARTED", "relogin", "conn started again after recovery".to_string())
        } else {
            self.totals.entry(sid).or_default().logins += 1;
            ("STARTED", "login", "login: conn started".to_string())
        }
    }

    /// The session runs again: the episode ends, into the totals.
    fn unblock(&mut self, e: &StateEvent, errors: Option<u64>, fields: &mut Fields) -> Line {
        let sid = e.sid;
        match self.episodes.remove(&sid) {
            Some(ep) => {
                let blocked = ep.blocked_at.map(|b| e.ts.saturating_sub(b));
                let failed = match (ep.errors_at_start, errors) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                    _ => None,
                };
                let t = self.totals.entry(sid).or_default();
                if let Some(b) = blocked {
                    t.blocked_ns += b;
                    t.max_blocked_ns = t.max_blocked_ns.max(b);
                }
                t.requeued += ep.requeued as u64;
                t.failed += failed.unwrap_or(0);
                let requeued = self.have_requeue.then_some(ep.requeued as u64);
                fields.push(("blocked_ns", opt_num(blocked)));
                fields.push(("episode_ns", Field::Num(e.ts.saturating_sub(ep.start) as i64)));
                fields.push(("reason", ep.reason.map(|r| Field::Str(err_name(r).into())).unwrap_or(Field::Null)));
                fields.push(("in_flight", opt_num(ep.in_flight.map(u64::from))));
                fields.push(("requeued", opt_num(requeued)));
                fields.push(("failed", opt_num(failed)));
                fields.push(("timed_out", Field::Num(ep.timed_out as i64)));
                let n = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or("-".into());
                (
                    "LOGGED_IN",
                    "unblocked",
                    format!(
                        "I/O resumes: blocked {}, requeued {}, failed {}",
                        blocked.map(secs).unwrap_or("-".into()),
                        n(requeued),
                        n(failed)
                    ),
                )
            }
            None => ("LOGGED_IN", "unblocked", "I/O runs".to_string()),
        }
    }
}

impl Shown {
    pub fn header(timestamp: bool) -> String {
        format!(
            "{:<14} {:<7} {:<40} {:<15} {:<10}    {:<10} {:>10} DETAIL",
            if timestamp { "TIME" } else { "TIME(s)" },
            "SID:CID",
            "TARGET",
            "PORTAL",
            "OLD",
            "NEW",
            "MS"
        )
    }

    pub fn line(&self, time: &str, info: &SessionInfo) -> String {
        let id = format!("{}:{}", self.sid, self.cid.map(|c| c.to_string()).unwrap_or("-".into()));
        let ms = self.duration_ns.map(|d| format!("{:.3}", d as f64 / 1e6)).unwrap_or("-".into());
        let target = if info.target.is_empty() { "-" } else { &info.target };
        let portal = if info.portal.is_empty() { "-" } else { &info.portal };
        format!(
            "{time:<14} {id:<7} {target:<40} {portal:<15} {:<10} -> {:<10} {ms:>10} {}",
            self.old, self.new, self.detail
        )
    }

    pub fn json(&self, time: &str, info: &SessionInfo) -> String {
        let mut o =
            json::Object::new().str("time", time).num("ts_ns", self.ts).str("event", self.event).num("sid", self.sid);
        o = match self.cid {
            Some(c) => o.num("cid", c),
            None => o.null("cid"),
        };
        o = o.str("target", &info.target).str("portal", &info.portal).str("old", &self.old).str("new", self.new);
        o = match self.duration_ns {
            Some(d) => o.num("duration_ns", d),
            None => o.null("duration_ns"),
        };
        for (k, v) in &self.fields {
            o = match v {
                Field::Num(n) => o.num(k, *n),
                Field::Str(s) => o.str(k, s),
                Field::Null => o.null(k),
            };
        }
        o.str("detail", &self.detail).finish()
    }
}

/// The exit summary, one row per session seen.
pub fn summary_lines(
    totals: &BTreeMap<u32, Totals>,
    info: &dyn Fn(u32) -> SessionInfo,
    have_requeue: bool,
) -> Vec<String> {
    let mut v = vec![format!(
        "{:<5} {:<40} {:<24} {:>8} {:>11} {:>14} {:>11} {:>8} {:>8} {:>6} {:>7} {:>6}",
        "SID",
        "TARGET",
        "FAILURES",
        "EPISODES",
        "BLOCKED(s)",
        "MAXBLOCKED(s)",
        "LONGEST(s)",
        "TIMEOUTS",
        "REQUEUED",
        "FAILED",
        "LOGOUTS",
        "LOGINS"
    )];
    for (sid, t) in totals {
        let f = if t.failures.is_empty() {
            "0".to_string()
        } else {
            t.failures.iter().map(|(c, n)| format!("{}:{n}", err_name(*c))).collect::<Vec<_>>().join(",")
        };
        let target = info(*sid).target;
        let rq = if have_requeue { t.requeued.to_string() } else { "-".into() };
        let longest = t.longest_held_ns.map(|n| format!("{:.3}", n as f64 / 1e9)).unwrap_or("-".into());
        v.push(format!(
            "{sid:<5} {:<40} {f:<24} {:>8} {:>11.3} {:>14.3} {longest:>11} {:>8} {rq:>8} {:>6} {:>7} {:>6}",
            if target.is_empty() { "-" } else { &target },
            t.episodes,
            t.blocked_ns as f64 / 1e9,
            t.max_blocked_ns as f64 / 1e9,
            t.timeouts,
            t.failed,
            t.logouts,
            t.logins
        ));
    }
    if totals.is_empty() {
        v.push("(no session event seen)".into());
    }
    v
}

/// The --prom-file text: counters per session since the tool started.
pub fn prom_text(totals: &BTreeMap<u32, Totals>, info: &dyn Fn(u32) -> SessionInfo) -> String {
    use crate::cli::textfile::{escape_label, seconds};
    let labels = |sid: u32| format!("sid=\"{sid}\",target=\"{}\"", escape_label(&info(sid).target));
    let mut o = String::from("# HELP iscsi_connection_failures_total iSCSI connection failures, by the kernel's reason.\n# TYPE iscsi_connection_failures_total counter\n");
    for (sid, t) in totals {
        for (c, n) in &t.failures {
            o.push_str(&format!(
                "iscsi_connection_failures_total{{{},reason=\"{}\"}} {n}\n",
                labels(*sid),
                err_name(*c)
            ));
        }
    }
    o.push_str("# HELP iscsi_session_blocked_seconds_total Time sessions spent blocked by recovery (ended episodes).\n# TYPE iscsi_session_blocked_seconds_total counter\n");
    for (sid, t) in totals {
        o.push_str(&format!("iscsi_session_blocked_seconds_total{{{}}} {}\n", labels(*sid), seconds(t.blocked_ns)));
    }
    o.push_str("# HELP iscsi_commands_failed_total I/O requests failed back to the block layer during recovery (ended episodes).\n# TYPE iscsi_commands_failed_total counter\n");
    for (sid, t) in totals {
        o.push_str(&format!("iscsi_commands_failed_total{{{}}} {}\n", labels(*sid), t.failed));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::layout::{self, Sample};

    #[test]
    fn event_matches_iscstates_c() {
        let s = Sample::new(layout::parse(templates::ISCSTATES, "event").unwrap());
        assert_eq!(s.layout.size, StateEvent::SIZE);
        let mut b = s.bytes.clone();
        // The sample's type field holds an arbitrary number: make it a kind.
        let off = s.layout.field("type").offset;
        b[off..off + 4].copy_from_slice(&5u32.to_ne_bytes());
        let e = StateEvent::parse(&b).unwrap();
        assert_eq!(e.kind, Kind::Unblock);
        assert_eq!(
            [
                e.ts,
                e.oldest_ns,
                e.sid as u64,
                e.cid as u64,
                e.code as u64,
                e.sent as u64,
                e.unsent as u64,
                e.recovery_tmo as u64
            ],
            ["ts", "oldest_ns", "sid", "cid", "code", "sent", "unsent", "recovery_tmo"].map(|n| s.int(n, 0))
        );
        for (k, name) in Kind::ALL {
            assert!(templates::ISCSTATES.contains(&format!("#define {name} {}\n", k as u32)), "{name}");
        }
        assert!(StateEvent::parse(&b[..40]).is_none());
    }

    #[test]
    fn held_matches_iscstates_c_and_per_cpu_values_give_their_max() {
        let l = layout::parse(templates::ISCSTATES, "held_t").unwrap();
        assert_eq!((l.size, l.field("from").offset, l.field("until").offset), (Held::SIZE, 0, 8));
        let b = Held::open(7).to_bytes();
        assert_eq!((b.len(), &b[..8], &b[8..]), (Held::SIZE, &7u64.to_ne_bytes()[..], &u64::MAX.to_ne_bytes()[..]));
        let v: Vec<u8> = [3u64, 9, 4].iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(percpu_max(&v, 3), 9);
        assert_eq!(percpu_max(&v, 1), 3);
        assert_eq!(percpu_max(&v[..5], 3), 0);
    }

    #[test]
    fn every_plan_renders() {
        for (flush, rq) in [(Some("fail_scsi_task"), true), (None, false)] {
            let p = StatesPlan::with(flush, rq);
            let c = p.render(EventBuffer::new(true)).unwrap();
            assert!(c.contains("#define USE_RINGBUF 1") && !c.contains("{{"));
            assert_eq!(p.notes.len(), (flush.is_none() as usize) + (!rq as usize));
        }
    }

    fn ev(kind: Kind, ts: u64, code: i32) -> StateEvent {
        StateEvent { ts, oldest_ns: 0, kind, sid: 1, cid: 0, code, sent: 0, unsent: 0, recovery_tmo: 120 }
    }

    #[test]
    fn an_episode_from_failure_to_unblock() {
        let s = 1_000_000_000u64;
        let mut t = Tracker::new(true, true);
        t.known(1, "LOGGED_IN");
        let l = t.take(&ev(Kind::ConnError, 10 * s, 1022), Some(0)).unwrap();
        assert_eq!((l.old.as_str(), l.new, l.duration_ns), ("LOGGED_IN", "FAILED", None));
        assert!(l.detail.contains("NOP_TIMEDOUT (1022)"), "{}", l.detail);
        let stop = StateEvent {
            sent: 3,
            unsent: 1,
            oldest_ns: 10 * s,
            code: STOP_RECOVER,
            ..ev(Kind::ConnStop, 10 * s + 5, 3)
        };
        let l = t.take(&stop, Some(0)).unwrap();
        assert!(l.detail.contains("4 commands in flight (3 sent, 1 not sent), oldest 10.000 s"), "{}", l.detail);
        assert_eq!(l.duration_ns, Some(5));
        t.take(&ev(Kind::Block, 11 * s, 0), Some(0)).unwrap();
        for _ in 0..4 {
            assert!(t.take(&ev(Kind::Requeue, 11 * s, 0), None).is_none());
        }
        let l = t.take(&ev(Kind::RecoveryTimeout, 13 * s, 0), Some(0)).unwrap();
        assert!(l.detail.contains("after 2.000 s"), "{}", l.detail);
        assert_eq!(t.take(&ev(Kind::ConnStart, 20 * s, 3), Some(7)).unwrap().event, "relogin");
        let l = t.take(&ev(Kind::Unblock, 20 * s + 1, 0), Some(7)).unwrap();
        assert_eq!(l.detail, "I/O resumes: blocked 9.000 s, requeued 4, failed 7");
        let tot = &t.totals[&1];
        assert_eq!(
            (tot.episodes, tot.blocked_ns, tot.timeouts, tot.requeued, tot.failed, tot.logins),
            (1, 9 * s + 1, 1, 4, 7, 0)
        );
        assert_eq!(tot.failures[&1022], 1);
        assert!(t.episodes.is_empty());
        // A login's unblock is no episode; a logout is no failure.
        t.take(&ev(Kind::ConnStop, 30 * s, STOP_TERM), None).unwrap();
        t.take(&ev(Kind::ConnStart, 31 * s, 0), None).unwrap();
        assert_eq!(t.take(&ev(Kind::Unblock, 31 * s, 0), None).unwrap().detail, "I/O runs");
        let tot = &t.totals[&1];
        assert_eq!((tot.episodes, tot.logouts, tot.logins, tot.failures.len()), (1, 1, 1, 1));
        let j: String = l.json("1.0", &SessionInfo { target: "iqn.x".into(), portal: "p".into() });
        assert!(
            j.contains("\"blocked_ns\":9000000001")
                && j.contains("\"failed\":7")
                && j.contains("\"reason\":\"NOP_TIMEDOUT\""),
            "{j}"
        );
        let p = prom_text(&t.totals, &|_| SessionInfo { target: "iqn.x".into(), portal: String::new() });
        assert!(
            p.contains("iscsi_connection_failures_total{sid=\"1\",target=\"iqn.x\",reason=\"NOP_TIMEDOUT\"} 1\n"),
            "{p}"
        );
        assert!(p.contains("iscsi_session_blocked_seconds_total{sid=\"1\",target=\"iqn.x\"} 9.000000001\n"), "{p}");
        assert!(p.contains("iscsi_commands_failed_total{sid=\"1\",target=\"iqn.x\"} 7\n"), "{p}");
    }

    #[test]
    fn unknown_counts_show_a_dash() {
        let mut t = Tracker::new(false, false);
        let l = t.take(&StateEvent { sent: 2, code: STOP_RECOVER, ..ev(Kind::ConnStop, 5, 3) }, None).unwrap();
        assert!(l.detail.ends_with("in flight: -"), "{}", l.detail);
        t.take(&ev(Kind::Block, 6, 0), None);
        let l = t.take(&ev(Kind::Unblock, 9, 0), None).unwrap();
        assert_eq!(l.detail, "I/O resumes: blocked 0.000 s, requeued -, failed -");
        assert_eq!(err_name(4242), "UNKNOWN");
    }
}
