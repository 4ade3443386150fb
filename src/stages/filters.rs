//! Which commands to trace: the session, connection, LUN, disk, direction
//! and process filters every stage tool takes, validated, resolved against
//! the sessions that exist, and turned into numbers for the kernel.

use crate::bpf::templates::Value;
use crate::error::{Error, Result};
use crate::iscsi::topology::Topology;
use crate::kernel::cgroup::{self, CgroupFilter};
use clap::Args;
use regex::Regex;

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
    /// Only I/O issued by processes in this cgroup v2 or below it (a path
    /// under /sys/fs/cgroup, or relative to it)
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
}

fn regex(flag: &str, s: &str) -> Result<Regex> {
    Regex::new(s).map_err(|e| {
        let msg = e.to_string();
        let last = msg.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("invalid").trim().to_string();
        Error::filter(format!("{flag} '{s}': bad regular expression: {}", last.trim_start_matches("error: ")))
    })
}

impl Filters {
    /// The --target regular expression, compiled (for a tool that matches
    /// session names itself); a bad one is the same usage error as validate's.
    pub fn target_regex(&self) -> Result<Option<Regex>> {
        self.target.as_deref().map(|t| regex("--target", t)).transpose()
    }

    /// Whether the programs must see each command's issuer: the tool asks
    /// for it, or the cgroup filter is told where the issuer is seen.
    pub fn issuer_needed(&self, asked: bool) -> bool {
        asked || self.cgroup.is_some()
    }

    /// Check what needs no kernel (regex syntax), before anything else.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = &self.target {
            regex("--target", t)?;
        }
        if let Some(i) = &self.initiator {
            regex("--initiator", i)?;
        }
        if let Some(d) = &self.disk {
            crate::iscsi::blockdev::validate_disk_name("--disk", d)?;
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
            dir: if self.reads {
                1
            } else if self.writes {
                2
            } else {
                0
            },
            cgroup: self
                .cgroup
                .as_ref()
                .map(|c| self.resolve_cgroup().unwrap_or(CgroupFilter { dir: c.into(), id: 0, level: 0 })),
        }
    }

    /// The --cgroup filter, against the cgroup v2 hierarchy of this machine.
    fn resolve_cgroup(&self) -> Result<CgroupFilter> {
        let arg = self.cgroup.as_deref().unwrap_or("");
        let mount = cgroup::mount()
            .ok_or_else(|| Error::filter(format!("--cgroup '{arg}': no cgroup v2 hierarchy is mounted")))?;
        cgroup::resolve(&mount, arg)
    }

    pub fn any_session_filter(&self) -> bool {
        self.sid.is_some()
            || self.target.is_some()
            || self.initiator.is_some()
            || self.disk.is_some()
            || self.cid.is_some()
            || self.lun.is_some()
    }

    /// Turn the filters into numbers for the kernel, against the sessions
    /// that exist now. A filter that matches nothing is an error listing them.
    pub fn resolve(&self, topo: &Topology) -> Result<KernelFilter> {
        self.validate()?;
        let none =
            |what: String| Error::filter(format!("{what} matches no iSCSI session (sessions: {})", topo.describe()));
        let mut sessions: Vec<&crate::iscsi::topology::Session> = topo.sessions.iter().collect();
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
            dir: if self.reads {
                1
            } else if self.writes {
                2
            } else {
                0
            },
            devices: None,
            cgroup: self.cgroup.as_ref().map(|_| self.resolve_cgroup()).transpose()?,
        };
        if let Some(d) = &self.disk {
            let (s, l) = topo.disk(d).ok_or_else(|| none(format!("--disk {d}")))?;
            if narrowed && !sessions.iter().any(|x| x.sid == s.sid) {
                return Err(Error::filter(format!(
                    "--disk {d} belongs to session {}, which the other filters exclude",
                    s.sid
                )));
            }
            f.devices = Some(vec![device_key(s.host, l.lun)]);
        }
        Ok(f)
    }
}

/// Filters every stage program applies in the kernel, resolved to numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFilter {
    /// SCSI hosts (one per iSCSI session) to keep; None = all.
    pub hosts: Option<Vec<u32>>,
    /// host<<32 | lun pairs to keep; None = all.
    pub devices: Option<Vec<u64>>,
    pub lun: Option<u64>,
    pub cid: Option<u32>,
    pub pid: Option<u32>,
    /// 0 all, 1 reads, 2 writes
    pub dir: u8,
    /// Only I/O issued from this cgroup or below it.
    pub cgroup: Option<CgroupFilter>,
}

impl KernelFilter {
    pub fn values(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("FILTER_HOST", self.hosts.is_some().into()),
            ("FILTER_DEV", self.devices.is_some().into()),
            ("FILTER_LUN", self.lun.is_some().into()),
            ("LUN", self.lun.unwrap_or(0).into()),
            ("FILTER_CID", self.cid.is_some().into()),
            ("CID", self.cid.unwrap_or(0).into()),
            ("FILTER_PID", self.pid.is_some().into()),
            ("PID", self.pid.unwrap_or(0).into()),
            ("FILTER_DIR", Value::Int(self.dir as i64)),
            ("FILTER_CGROUP", self.cgroup.is_some().into()),
            ("FILTER_CGROUP_ID", self.cgroup.as_ref().map_or(0, |c| c.id).into()),
            ("FILTER_CGROUP_LEVEL", self.cgroup.as_ref().map_or(0, |c| c.level).into()),
        ]
    }

    /// Fill the filter sets of a loaded program.
    pub fn load_sets(&self, bpf: &bcc::BPF) -> Result<()> {
        if let Some(hosts) = &self.hosts {
            let mut t = bpf.table("host_filter")?;
            crate::bpf::maps::fill_set(&mut t, hosts, |h: u32| h.to_ne_bytes().to_vec())?;
        }
        if let Some(devs) = &self.devices {
            let mut t = bpf.table("dev_filter")?;
            crate::bpf::maps::fill_set(&mut t, devs, |d: u64| d.to_ne_bytes().to_vec())?;
        }
        if let Some(c) = &self.cgroup {
            // The array keeps the cgroup; the file can close after.
            let dir = std::fs::File::open(&c.dir)
                .map_err(|e| Error::filter(format!("--cgroup: {}: {e}", c.dir.display())))?;
            let mut t = bpf.table("cgroup_filter")?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&dir) as u32;
            t.set(&mut 0u32.to_ne_bytes(), &mut fd.to_ne_bytes())
                .map_err(|e| Error::bpf(format!("cannot fill the cgroup filter: {e}")))?;
        }
        Ok(())
    }
}

pub fn device_key(host: u32, lun: u64) -> u64 {
    ((host as u64) << 32) | (lun as u32 as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn topo() -> Topology {
        Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap()
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

    #[test]
    fn filter_values_are_numbers() {
        let f = KernelFilter { hosts: Some(vec![2]), lun: Some(1), dir: 2, ..Default::default() };
        let v = f.values();
        assert!(v.contains(&("FILTER_HOST", Value::Bool(true))));
        assert!(v.contains(&("LUN", Value::Int(1))));
        assert!(v.contains(&("FILTER_DIR", Value::Int(2))));
        assert!(v.contains(&("FILTER_PID", Value::Bool(false))));
        assert!(v.contains(&("FILTER_CGROUP", Value::Bool(false))));
        let f = KernelFilter {
            cgroup: Some(CgroupFilter { dir: "/sys/fs/cgroup/a".into(), id: 7, level: 1 }),
            ..Default::default()
        };
        assert!(f.values().contains(&("FILTER_CGROUP", Value::Bool(true))));
        assert_eq!(device_key(3, 1), (3u64 << 32) | 1);
    }
}
