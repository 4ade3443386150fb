//! Command-line pieces every tool shares: parsing with one-line errors,
//! thresholds, session filters and their resolution against the topology.

use crate::error::{Error, Result};
use crate::output::Unit;
use crate::stages::{device_key, KernelFilter};
use crate::topology::Topology;
use clap::{Args, Parser};
use regex::Regex;

/// Parse arguments; usage errors become one line (exit 2), --help and
/// --version print and exit 0.
pub fn parse<T: Parser>() -> Result<T> {
    T::try_parse().map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                std::process::exit(0);
            }
            _ => {
                let text = e.to_string();
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad arguments");
                Error::usage(first.trim_start_matches("error: ").to_string())
            }
        }
    })
}

/// `-m MIN_MS | -u MIN_US`.
#[derive(Args, Debug, Clone, Default)]
pub struct Threshold {
    /// Show only what took MIN_MS milliseconds or more; times in ms
    #[arg(short = 'm', long = "min-ms", value_name = "MIN_MS", allow_negative_numbers = true, conflicts_with = "min_us")]
    pub min_ms: Option<u64>,
    /// Show only what took MIN_US microseconds or more; times in us (0 = everything)
    #[arg(short = 'u', long = "min-us", value_name = "MIN_US", allow_negative_numbers = true)]
    pub min_us: Option<u64>,
}

impl Threshold {
    /// (threshold in us, display unit); `default_ms` when neither is given.
    pub fn resolve(&self, default_ms: u64) -> Result<(u64, Unit)> {
        const MAX_US: u64 = 3_600_000_000; // one hour
        let (us, unit) = match (self.min_ms, self.min_us) {
            (Some(ms), _) => (ms.checked_mul(1000).unwrap_or(u64::MAX), Unit::Ms),
            (None, Some(us)) => (us, Unit::Us),
            (None, None) => (default_ms * 1000, Unit::Ms),
        };
        if us > MAX_US {
            return Err(Error::usage(format!("threshold {us} us is more than an hour")));
        }
        Ok((us, unit))
    }
}

/// Which commands to trace: sessions, connections, LUNs, disks, direction, process.
#[derive(Args, Debug, Clone, Default)]
pub struct Filters {
    /// Only this iSCSI session id (as in /sys/class/iscsi_session/sessionN)
    #[arg(long, value_name = "SID")]
    pub sid: Option<u32>,
    /// Only this connection id within the session(s)
    #[arg(long, value_name = "CID")]
    pub cid: Option<u32>,
    /// Only this LUN
    #[arg(long, value_name = "LUN")]
    pub lun: Option<u64>,
    /// Only this iSCSI block device (e.g. sda)
    #[arg(long, value_name = "DISK")]
    pub disk: Option<String>,
    /// Only sessions whose target IQN matches REGEX
    #[arg(long, value_name = "REGEX")]
    pub target: Option<String>,
    /// Only sessions whose initiator name matches REGEX
    #[arg(long, value_name = "REGEX")]
    pub initiator: Option<String>,
    /// Only reads
    #[arg(short = 'r', long = "reads", conflicts_with = "writes")]
    pub reads: bool,
    /// Only writes
    #[arg(short = 'w', long = "writes")]
    pub writes: bool,
    /// Only commands dispatched by this process id
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
}

fn regex(flag: &str, s: &str) -> Result<Regex> {
    Regex::new(s).map_err(|e| {
        let msg = e.to_string();
        let last = msg.lines().filter(|l| !l.trim().is_empty()).last().unwrap_or("invalid").trim().to_string();
        Error::usage(format!("{flag} '{s}': bad regular expression: {}", last.trim_start_matches("error: ")))
    })
}

impl Filters {
    /// Check what needs no kernel (regex syntax), before anything else.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = &self.target {
            regex("--target", t)?;
        }
        if let Some(i) = &self.initiator {
            regex("--initiator", i)?;
        }
        if let Some(d) = &self.disk {
            if d.is_empty() || d.len() > 32 || !d.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(Error::usage(format!("--disk '{d}': not a block device name (e.g. sda)")));
            }
        }
        Ok(())
    }

    /// The kernel filter as if every filter matched something, for --ebpf
    /// on a machine without sessions (the sets are filled at run time).
    pub fn assume_sets(&self) -> KernelFilter {
        KernelFilter {
            hosts: (self.sid.is_some() || self.target.is_some() || self.initiator.is_some()).then(Vec::new),
            devices: self.disk.is_some().then(Vec::new),
            lun: self.lun,
            cid: self.cid,
            pid: self.pid,
            dir: if self.reads { 1 } else if self.writes { 2 } else { 0 },
        }
    }

    pub fn any_session_filter(&self) -> bool {
        self.sid.is_some() || self.target.is_some() || self.initiator.is_some() || self.disk.is_some() || self.cid.is_some() || self.lun.is_some()
    }

    /// Turn the filters into numbers for the kernel, against the sessions
    /// that exist now. A filter that matches nothing is an error listing them.
    pub fn resolve(&self, topo: &Topology) -> Result<KernelFilter> {
        self.validate()?;
        let none = |what: String| Error::usage(format!("{what} matches no iSCSI session (sessions: {})", topo.describe()));
        let mut sessions: Vec<&crate::topology::Session> = topo.sessions.iter().collect();
        let narrowed = self.sid.is_some() || self.target.is_some() || self.initiator.is_some();
        if let Some(sid) = self.sid {
            sessions.retain(|s| s.sid == sid);
            if sessions.is_empty() {
                return Err(none(format!("--sid {sid}")));
            }
        }
        if let Some(t) = &self.target {
            let re = regex("--target", t)?;
            sessions.retain(|s| re.is_match(&s.target));
            if sessions.is_empty() {
                return Err(none(format!("--target '{t}'")));
            }
        }
        if let Some(i) = &self.initiator {
            let re = regex("--initiator", i)?;
            sessions.retain(|s| re.is_match(&s.initiator));
            if sessions.is_empty() {
                return Err(none(format!("--initiator '{i}'")));
            }
        }
        if let Some(cid) = self.cid {
            if !sessions.iter().any(|s| s.connections.iter().any(|c| c.cid == cid)) {
                return Err(none(format!("--cid {cid}")));
            }
        }
        if let Some(lun) = self.lun {
            if !sessions.iter().any(|s| s.luns.iter().any(|l| l.lun == lun)) {
                return Err(none(format!("--lun {lun}")));
            }
        }
        let mut f = KernelFilter {
            hosts: narrowed.then(|| sessions.iter().map(|s| s.host).collect()),
            lun: self.lun,
            cid: self.cid,
            pid: self.pid,
            dir: if self.reads { 1 } else if self.writes { 2 } else { 0 },
            devices: None,
        };
        if let Some(d) = &self.disk {
            let (s, l) = topo.disk(d).ok_or_else(|| none(format!("--disk {d}")))?;
            if narrowed && !sessions.iter().any(|x| x.sid == s.sid) {
                return Err(Error::usage(format!("--disk {d} belongs to session {}, which the other filters exclude", s.sid)));
            }
            f.devices = Some(vec![device_key(s.host, l.lun)]);
        }
        Ok(f)
    }
}

/// Options every tool has.
#[derive(Args, Debug, Clone, Default)]
pub struct Common {
    /// Wall-clock timestamps (HH:MM:SS.mmm) instead of seconds since start
    #[arg(short = 'T', long = "timestamp")]
    pub timestamp: bool,
    /// One JSON object per line (times in ns); status lines go to stderr
    #[arg(long)]
    pub json: bool,
    /// Stop after SECS seconds
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Print the final BPF program and exit (needs neither root nor iSCSI)
    #[arg(long)]
    pub ebpf: bool,
    /// Say which probe points were chosen and why
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

impl Common {
    pub fn duration(&self) -> Result<Option<std::time::Duration>> {
        match self.duration {
            Some(0) => Err(Error::usage("--duration must be at least 1 second")),
            Some(s) => Ok(Some(std::time::Duration::from_secs(s))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn topo() -> Topology {
        Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap()
    }

    #[test]
    fn threshold_units() {
        assert_eq!(Threshold { min_ms: Some(10), min_us: None }.resolve(10).unwrap(), (10_000, Unit::Ms));
        assert_eq!(Threshold { min_ms: None, min_us: Some(0) }.resolve(10).unwrap(), (0, Unit::Us));
        assert_eq!(Threshold::default().resolve(10).unwrap(), (10_000, Unit::Ms));
        assert!(Threshold { min_ms: Some(u64::MAX), min_us: None }.resolve(10).is_err());
    }

    #[test]
    fn sid_filter_maps_to_host() {
        let t = topo();
        let f = Filters { sid: Some(2), ..Default::default() }.resolve(&t).unwrap();
        assert_eq!(f.hosts, Some(vec![t.session(2).unwrap().host]));
        assert_eq!(f.devices, None);
    }

    #[test]
    fn unknown_sid_lists_sessions() {
        let e = Filters { sid: Some(99), ..Default::default() }.resolve(&topo()).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--sid 99 matches no iSCSI session (sessions: sid 1 "), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn target_regex_selects_sessions() {
        let t = topo();
        let f = Filters { target: Some("target2$".into()), ..Default::default() }.resolve(&t).unwrap();
        assert_eq!(f.hosts, Some(vec![t.session(2).unwrap().host]));
        let f = Filters { target: Some("storprototrace".into()), ..Default::default() }.resolve(&t).unwrap();
        assert_eq!(f.hosts.unwrap().len(), 2);
        let e = Filters { target: Some("(".into()), ..Default::default() }.resolve(&t).unwrap_err();
        assert!(e.to_string().starts_with("--target '(': bad regular expression"), "{e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        assert!(Filters { target: Some("nomatch".into()), ..Default::default() }.resolve(&t).is_err());
    }

    #[test]
    fn disk_filter_maps_to_host_and_lun() {
        let t = topo();
        let s2 = t.session(2).unwrap();
        let d = s2.luns[1].disk.clone().unwrap();
        let f = Filters { disk: Some(d.clone()), ..Default::default() }.resolve(&t).unwrap();
        assert_eq!(f.devices, Some(vec![device_key(s2.host, 1)]));
        assert!(Filters { disk: Some("sdq".into()), ..Default::default() }.resolve(&t).is_err());
        assert!(Filters { disk: Some("sda; rm".into()), ..Default::default() }.validate().is_err());
        assert!(Filters { disk: Some(d), sid: Some(1), ..Default::default() }.resolve(&t).is_err());
    }

    #[test]
    fn lun_and_direction() {
        let t = topo();
        let f = Filters { lun: Some(1), writes: true, ..Default::default() }.resolve(&t).unwrap();
        assert_eq!((f.lun, f.dir, f.hosts.clone()), (Some(1), 2, None));
        assert!(Filters { lun: Some(7), ..Default::default() }.resolve(&t).is_err());
        assert!(Filters { cid: Some(3), ..Default::default() }.resolve(&t).is_err());
    }
}
