//! iscstates' running state: the sessions' names and hosts from sysfs, the
//! episode tracker, and the per-request tracepoint attached at the first
//! failure.

use crate::bpf::maps;
use crate::cli::output::Clock;
use crate::iscsi::topology::Topology;
use crate::states::{Held, Kind, SessionInfo, Shown, StateEvent, Tracker};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What iscstates keeps while it runs.
pub struct StatesView {
    pub sessions: Sessions,
    pub tracker: Tracker,
    /// block_rq_complete: None not yet, Some(false) could not attach.
    pub rq_attached: Option<bool>,
    pub ncpus: usize,
    pub clock: Clock,
    pub malformed: u64,
    pub shown: u64,
}

impl StatesView {
    /// One event: attach the per-request tracepoint at the first failure,
    /// mark the window of requests held up, and the line to show, if any.
    pub fn take(&mut self, bpf: &mut bcc::BPF, e: &StateEvent) -> Option<Shown> {
        let opens = matches!(e.kind, Kind::ConnError | Kind::Block)
            || (e.kind == Kind::ConnStop && e.code == super::STOP_RECOVER);
        if opens && self.rq_attached.is_none() {
            let r = bcc::RawTracepoint::new().handler("rq_done").tracepoint("block_rq_complete").attach(bpf);
            if let Err(err) = &r {
                eprintln!("iscstates: note: cannot attach raw tracepoint block_rq_complete ({err}): failed commands and LONGEST show '-'");
            }
            self.rq_attached = Some(r.is_ok());
        }
        let host = self.sessions.host(e.sid);
        // The window of the episode, for the requests it holds up: opened
        // at its first event, closed at the unblock.
        let window = match (self.tracker.episodes.get(&e.sid), e.kind) {
            (None, _) if opens => {
                if let Some(h) = host {
                    self.fold_host(bpf, h, e.sid);
                }
                Some(Held::open(e.ts))
            }
            (Some(ep), Kind::Unblock) => Some(Held { from: ep.start, until: e.ts }),
            _ => None,
        };
        if let (Some(h), Some(w), Some(true)) = (host, window, self.rq_attached) {
            if let Ok(mut t) = bpf.table("held") {
                let _ = t.set(&mut h.to_ne_bytes().to_vec(), &mut w.to_bytes());
            }
        }
        let errors = match (opens || e.kind == Kind::Unblock, self.rq_attached, host) {
            (true, Some(true), Some(h)) => self.errors(bpf, h),
            _ => None,
        };
        self.tracker.take(e, errors)
    }

    /// I/O errors so far on SCSI host `host` (one per iSCSI session).
    fn errors(&self, bpf: &bcc::BPF, host: u32) -> Option<u64> {
        let mut t = bpf.table("rq_errors").ok()?;
        Some(t.get(&mut host.to_ne_bytes().to_vec()).map(|v| maps::first_u64(&v)).unwrap_or(0))
    }

    /// The longest request the last episode of `host` held up, into the
    /// session's totals; the slot starts again for the next episode.
    fn fold_host(&mut self, bpf: &bcc::BPF, host: u32, sid: u32) {
        let Ok(mut t) = bpf.table("held_longest") else { return };
        let key = host.to_ne_bytes();
        if let Some(v) = maps::percpu_get(&mut t, &key, self.ncpus) {
            let longest = super::percpu_max(&v, self.ncpus);
            let total = self.tracker.totals.entry(sid).or_default();
            total.longest_held_ns = Some(total.longest_held_ns.unwrap_or(0).max(longest));
            maps::delete(&mut t, &key);
        }
    }

    /// At exit: every session's last episode.
    pub fn fold_longest(&mut self, bpf: &bcc::BPF) {
        let sids: Vec<u32> = self.tracker.totals.keys().copied().collect();
        for sid in sids {
            if let Some(h) = self.sessions.host(sid) {
                self.fold_host(bpf, h, sid);
            }
        }
    }
}

/// Names and SCSI host of each session, from sysfs; kept after a session
/// is gone (its logout is shown after sysfs dropped it).
pub struct Sessions {
    sys: PathBuf,
    known: HashMap<u32, (SessionInfo, u32)>,
}

impl Sessions {
    /// The sessions sysfs shows now.
    pub fn new(sys: &Path, topo: &Topology) -> Sessions {
        let mut s = Sessions { sys: sys.to_path_buf(), known: HashMap::new() };
        s.learn(topo);
        s
    }

    fn learn(&mut self, topo: &Topology) {
        for s in &topo.sessions {
            self.known.insert(s.sid, (SessionInfo { target: s.target.clone(), portal: s.portal() }, s.host));
        }
    }

    fn refresh(&mut self) {
        if let Ok(t) = Topology::read(&self.sys) {
            self.learn(&t);
        }
    }

    /// The names of a session (empty where never seen).
    pub fn info(&self, sid: u32) -> SessionInfo {
        self.known.get(&sid).map(|k| k.0.clone()).unwrap_or_default()
    }

    /// As `info`, reading sysfs again for a session not seen yet (a login).
    pub fn lookup(&mut self, sid: u32) -> SessionInfo {
        if !self.known.contains_key(&sid) {
            self.refresh();
        }
        self.info(sid)
    }

    /// The session's SCSI host (one per iSCSI session).
    pub fn host(&mut self, sid: u32) -> Option<u32> {
        if !self.known.contains_key(&sid) {
            self.refresh();
        }
        self.known.get(&sid).map(|k| k.1)
    }

    /// The session of a SCSI host.
    pub fn sid_of_host(&mut self, host: u32) -> Option<u32> {
        let find = |k: &HashMap<u32, (SessionInfo, u32)>| k.iter().find(|(_, v)| v.1 == host).map(|(s, _)| *s);
        find(&self.known).or_else(|| {
            self.refresh();
            find(&self.known)
        })
    }
}
