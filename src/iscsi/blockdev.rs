//! Block devices: the kernel's dev_t numbers, their names from sysfs, and
//! the disks of the iSCSI sessions.

use crate::error::{Error, Result};
use crate::iscsi::topology::Topology;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The kernel's internal dev_t: MKDEV(major, minor) = major << 20 | minor.
pub fn kdev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xfffff)
}

pub fn kdev_split(dev: u32) -> (u32, u32) {
    (dev >> 20, dev & 0xfffff)
}

/// "8:16" -> kernel dev_t.
pub fn parse_dev(text: &str) -> Option<u32> {
    let (ma, mi) = text.trim().split_once(':')?;
    Some(kdev(ma.parse().ok()?, mi.parse().ok()?))
}

/// A block device name typed by a user: letters and digits only.
pub fn validate_disk_name(flag: &str, d: &str) -> Result<()> {
    if d.is_empty() || d.len() > 32 || !d.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::filter(format!("{flag} '{d}': not a block device name (e.g. sda)")));
    }
    Ok(())
}

/// Block devices (disks and partitions) by kernel dev_t, from `<sysfs>/class/block/*/dev`.
#[derive(Debug, Clone, Default)]
pub struct BlockDevs {
    by_dev: HashMap<u32, String>,
    sysfs: PathBuf,
}

impl BlockDevs {
    pub fn read(sysfs: &Path) -> BlockDevs {
        let mut by_dev = HashMap::new();
        if let Ok(rd) = fs::read_dir(sysfs.join("class/block")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(dev) = fs::read_to_string(e.path().join("dev")).ok().and_then(|t| parse_dev(&t)) {
                    by_dev.insert(dev, name);
                }
            }
        }
        BlockDevs { by_dev, sysfs: sysfs.to_path_buf() }
    }

    /// Name of a dev_t; re-reads sysfs once if unknown (a disk that appeared later).
    pub fn name(&mut self, dev: u32) -> String {
        if dev == 0 {
            return "-".to_string();
        }
        if !self.by_dev.contains_key(&dev) {
            *self = BlockDevs::read(&self.sysfs.clone());
        }
        match self.by_dev.get(&dev) {
            Some(n) => n.clone(),
            None => {
                let (ma, mi) = kdev_split(dev);
                format!("{ma}:{mi}")
            }
        }
    }

    /// The dev_t of a whole disk, `<sysfs>/block/<name>/dev`.
    pub fn disk_dev(sysfs: &Path, flag: &str, name: &str) -> Result<u32> {
        validate_disk_name(flag, name)?;
        let p = sysfs.join("block").join(name).join("dev");
        let text = fs::read_to_string(&p).map_err(|_| {
            let mut known: Vec<String> = fs::read_dir(sysfs.join("block"))
                .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            known.sort();
            Error::filter(format!(
                "{flag} {name}: no such disk (disks: {})",
                if known.is_empty() { "none".to_string() } else { known.join(" ") }
            ))
        })?;
        parse_dev(&text).ok_or_else(|| Error::io(format!("{}: unexpected content {:?}", p.display(), text.trim())))
    }
}

/// Disks of every iSCSI LUN, in session/LUN order.
pub fn iscsi_disks(topo: &Topology) -> Vec<String> {
    topo.sessions.iter().flat_map(|s| s.luns.iter().filter_map(|l| l.disk.clone())).collect()
}

/// The disks a tool watches when none is named: every iSCSI disk, with
/// its dev_t. No session, or no session with a disk, is an error (`prefix`
/// and `hint` go around its text).
pub fn iscsi_disk_devs(sysfs: &Path, prefix: &str, hint: &str) -> Result<Vec<(String, u32)>> {
    let topo = Topology::read(sysfs)?;
    if topo.sessions.is_empty() {
        return Err(Error::no_sessions());
    }
    let names = iscsi_disks(&topo);
    if names.is_empty() {
        return Err(Error::NoSessions(format!(
            "{prefix}no iSCSI session has a disk (sessions: {}){hint}",
            topo.describe()
        )));
    }
    names.iter().map(|n| Ok((n.clone(), BlockDevs::disk_dev(sysfs, "--disk", n)?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        assert_eq!(parse_dev("8:16\n"), Some((8 << 20) | 16));
        assert_eq!(kdev_split(kdev(259, 3)), (259, 3));
        assert_eq!(parse_dev("x"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_disk_name("--disk", "sda").is_ok());
        let e = validate_disk_name("--disk", "sda) || (1").unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn block_devs_from_sysfs() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir_all(d.join("class/block/sdb")).unwrap();
        fs::create_dir_all(d.join("block/sdb")).unwrap();
        fs::write(d.join("class/block/sdb/dev"), "8:16\n").unwrap();
        fs::write(d.join("block/sdb/dev"), "8:16\n").unwrap();
        let mut b = BlockDevs::read(d);
        assert_eq!(b.name(kdev(8, 16)), "sdb");
        assert_eq!(b.name(kdev(8, 17)), "8:17");
        assert_eq!(BlockDevs::disk_dev(d, "--disk", "sdb").unwrap(), kdev(8, 16));
        let e = BlockDevs::disk_dev(d, "--disk", "sdq").unwrap_err();
        assert_eq!(e.to_string(), "--disk sdq: no such disk (disks: sdb)");
    }

    #[test]
    fn iscsi_disks_of_the_fixture() {
        let sys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2");
        assert_eq!(iscsi_disks(&Topology::read(&sys).unwrap()).len(), 4);
        let e = iscsi_disk_devs(Path::new("/nonexistent"), "", "").unwrap_err();
        assert!(e.to_string().starts_with("no iSCSI session is logged in"), "{e}");
    }
}
