//! The iSCSI layout, read from sysfs: sessions, their connections, the SCSI
//! host of each session and the LUNs with their block devices. The sysfs root
//! is a parameter so tests read a fixture captured from a real lab session.

use crate::error::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub cid: u32,
    pub address: String,
    pub port: String,
    pub state: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lun {
    pub channel: u32,
    pub id: u32,
    pub lun: u64,
    pub disk: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub sid: u32,
    pub host: u32,
    pub target: String,
    pub initiator: String,
    pub state: String,
    pub connections: Vec<Connection>,
    pub luns: Vec<Lun>,
}

impl Session {
    /// `address:port` of the first connection, or "-".
    pub fn portal(&self) -> String {
        match self.connections.first() {
            Some(c) if !c.address.is_empty() => format!("{}:{}", c.address, c.port),
            _ => "-".to_string(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pub sessions: Vec<Session>,
}

fn read_attr(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// `prefix<N>` -> N
fn number_after(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

fn sorted_entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = match fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect(),
        Err(_) => Vec::new(),
    };
    v.sort_by_key(|a| natural_key(&a.0));
    v
}

fn natural_key(s: &str) -> (String, Vec<u64>) {
    let prefix: String = s.chars().take_while(|c| !c.is_ascii_digit()).collect();
    let nums = s[prefix.len()..].split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
    (prefix, nums)
}

impl Topology {
    /// Read the layout under `sysfs` (normally `/sys`).
    pub fn read(sysfs: &Path) -> Result<Topology> {
        let class = sysfs.join("class/iscsi_session");
        if !class.is_dir() {
            return Ok(Topology::default());
        }
        let mut sessions = Vec::new();
        for (name, link) in sorted_entries(&class) {
            let Some(sid) = number_after(&name, "session") else { continue };
            let dev = fs::canonicalize(&link).map_err(|e| Error::io(format!("cannot read {}: {e}", link.display())))?;
            // .../platform/hostH/sessionN/iscsi_session/sessionN
            let session_dir = dev.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
            let host = session_dir
                .ancestors()
                .filter_map(|a| a.file_name().and_then(|n| number_after(&n.to_string_lossy(), "host")))
                .next()
                .ok_or_else(|| Error::io(format!("no SCSI host above {}", dev.display())))?;
            sessions.push(Session {
                sid,
                host,
                target: read_attr(&dev, "targetname"),
                initiator: read_attr(&dev, "initiatorname"),
                state: read_attr(&dev, "state"),
                connections: read_connections(sysfs, sid),
                luns: read_luns(&session_dir),
            });
        }
        Ok(Topology { sessions })
    }

    pub fn session(&self, sid: u32) -> Option<&Session> {
        self.sessions.iter().find(|s| s.sid == sid)
    }

    pub fn session_by_host(&self, host: u32) -> Option<&Session> {
        self.sessions.iter().find(|s| s.host == host)
    }

    /// The session and LUN behind a block device name like `sda`.
    pub fn disk(&self, name: &str) -> Option<(&Session, &Lun)> {
        self.sessions
            .iter()
            .flat_map(|s| s.luns.iter().map(move |l| (s, l)))
            .find(|(_, l)| l.disk.as_deref() == Some(name))
    }

    /// Block device of a SCSI address, if the kernel gave it one.
    pub fn disk_name(&self, host: u32, channel: u32, id: u32, lun: u64) -> Option<&str> {
        self.session_by_host(host)?
            .luns
            .iter()
            .find(|l| l.channel == channel && l.id == id && l.lun == lun)
            .and_then(|l| l.disk.as_deref())
    }

    /// Whether this topology names session `sid` on SCSI host `host` with
    /// LUN `lun` and its disk; false means it is stale for that row (a
    /// login, or a LUN's disk that appeared, since it was read).
    pub fn knows(&self, sid: u32, host: u32, lun: u64) -> bool {
        self.session(sid)
            .map(|s| s.host == host && s.luns.iter().any(|l| l.lun == lun && l.disk.is_some()))
            .unwrap_or(false)
    }

    /// One line per session for error messages: `1 (iqn..., host 2, sda sdb)`.
    pub fn describe(&self) -> String {
        if self.sessions.is_empty() {
            return "none".to_string();
        }
        self.sessions
            .iter()
            .map(|s| {
                let disks: Vec<&str> = s.luns.iter().filter_map(|l| l.disk.as_deref()).collect();
                format!(
                    "sid {} {} (host {}, LUNs {})",
                    s.sid,
                    s.target,
                    s.host,
                    if disks.is_empty() { "-".to_string() } else { disks.join(" ") }
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn read_connections(sysfs: &Path, sid: u32) -> Vec<Connection> {
    let mut out = Vec::new();
    let prefix = format!("connection{sid}:");
    for (name, path) in sorted_entries(&sysfs.join("class/iscsi_connection")) {
        let Some(cid) = name.strip_prefix(&prefix).and_then(|c| c.parse().ok()) else { continue };
        out.push(Connection {
            cid,
            address: read_attr(&path, "persistent_address").pipe_or(|| read_attr(&path, "address")),
            port: read_attr(&path, "persistent_port").pipe_or(|| read_attr(&path, "port")),
            state: read_attr(&path, "state"),
        });
    }
    out
}

trait OrElse {
    fn pipe_or(self, f: impl FnOnce() -> String) -> String;
}
impl OrElse for String {
    fn pipe_or(self, f: impl FnOnce() -> String) -> String {
        if self.is_empty() {
            f()
        } else {
            self
        }
    }
}

/// `sessionN/targetH:C:T/H:C:T:L/block/sdX`
fn read_luns(session_dir: &Path) -> Vec<Lun> {
    let mut luns = Vec::new();
    for (tname, tpath) in sorted_entries(session_dir) {
        if !tname.starts_with("target") {
            continue;
        }
        for (dname, dpath) in sorted_entries(&tpath) {
            let parts: Vec<&str> = dname.split(':').collect();
            if parts.len() != 4 {
                continue;
            }
            let (Ok(channel), Ok(id), Ok(lun)) = (parts[1].parse(), parts[2].parse(), parts[3].parse()) else {
                continue;
            };
            let disk = sorted_entries(&dpath.join("block")).into_iter().map(|(n, _)| n).next();
            luns.push(Lun { channel, id, lun, disk });
        }
    }
    luns
}

/// The topology as sysfs shows it now: read again, at most once a second,
/// when asked for a disk it does not know (a session that logged in later).
#[derive(Debug, Clone)]
pub struct LiveTopology {
    pub topo: Topology,
    /// Where to read it again; None: never (a fixed topology, for tests).
    sysfs: Option<PathBuf>,
    read_at: Instant,
}

impl LiveTopology {
    pub fn new(topo: Topology, sysfs: Option<PathBuf>) -> LiveTopology {
        LiveTopology { topo, sysfs, read_at: Instant::now() }
    }

    /// Read sysfs again (at most once a second) if it names no disk for
    /// this SCSI address yet.
    pub fn learn(&mut self, host: u32, channel: u32, id: u32, lun: u64) {
        if self.topo.disk_name(host, channel, id, lun).is_some() {
            return;
        }
        if let Some(sys) = &self.sysfs {
            if self.read_at.elapsed().as_secs() >= 1 {
                if let Ok(t) = Topology::read(sys) {
                    self.topo = t;
                }
                self.read_at = Instant::now();
            }
        }
    }

    /// The disk of a SCSI address as last read, `?` where sysfs names none.
    pub fn known_disk(&self, host: u32, channel: u32, id: u32, lun: u64) -> &str {
        self.topo.disk_name(host, channel, id, lun).unwrap_or("?")
    }

    /// The disk of a SCSI address, `?` where sysfs names none.
    pub fn disk_name(&mut self, host: u32, channel: u32, id: u32, lun: u64) -> String {
        self.learn(host, channel, id, lun);
        self.known_disk(host, channel, id, lun).to_string()
    }

    pub fn session(&self, sid: u32) -> Option<&Session> {
        self.topo.session(sid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")
    }

    #[test]
    fn reads_two_sessions_with_two_luns_each() {
        let t = Topology::read(&fixture()).unwrap();
        assert_eq!(t.sessions.len(), 2, "{t:#?}");
        let s1 = &t.sessions[0];
        assert_eq!(s1.sid, 1);
        assert!(s1.target.ends_with(":target1"), "{}", s1.target);
        assert!(s1.initiator.starts_with("iqn."), "{}", s1.initiator);
        assert_eq!(s1.state, "LOGGED_IN");
        assert_eq!(s1.connections.len(), 1);
        assert_eq!(s1.connections[0].cid, 0);
        assert_eq!(s1.portal(), "127.0.0.1:3260");
        assert_eq!(s1.luns.len(), 2);
        assert_eq!(s1.luns.iter().map(|l| l.lun).collect::<Vec<_>>(), vec![0, 1]);
        assert!(s1.luns.iter().all(|l| l.disk.as_deref().map(|d| d.starts_with("sd")).unwrap_or(false)));
        let s2 = &t.sessions[1];
        assert_eq!(s2.sid, 2);
        assert_ne!(s1.host, s2.host);
        let d = s2.luns[1].disk.clone().unwrap();
        let (s, l) = t.disk(&d).unwrap();
        assert_eq!((s.sid, l.lun), (2, 1));
        assert_eq!(t.disk_name(s2.host, l.channel, l.id, 1), Some(d.as_str()));
        assert!(t.disk("sdzz").is_none());
        assert!(t.describe().contains("sid 2"));
        assert!(t.knows(2, s2.host, 1) && t.knows(1, s1.host, 0));
        assert!(!t.knows(3, s2.host, 0) && !t.knows(2, s1.host, 0) && !t.knows(2, s2.host, 7));
    }

    #[test]
    fn no_iscsi_class_means_no_sessions() {
        let t = Topology::read(Path::new("/nonexistent-sysfs")).unwrap();
        assert!(t.sessions.is_empty());
        assert_eq!(t.describe(), "none");
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["session10", "session2", "session1"];
        v.sort_by_key(|a| natural_key(a));
        assert_eq!(v, vec!["session1", "session2", "session10"]);
    }
}
