//! Pieces shared by iscfreeze and submitslower: block device numbers and
//! names from sysfs, what the kernel headers say about struct layouts, the
//! disks a tool watches, and kernel stack symbolisation from /proc/kallsyms.

use crate::error::{Error, Result};
use crate::topology::Topology;
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
        return Err(Error::usage(format!("{flag} '{d}': not a block device name (e.g. sda)")));
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
            let mut known: Vec<String> = fs::read_dir(sysfs.join("block")).map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
            known.sort();
            Error::usage(format!("{flag} {name}: no such disk (disks: {})", if known.is_empty() { "none".to_string() } else { known.join(" ") }))
        })?;
        parse_dev(&text).ok_or_else(|| Error::env(format!("{}: unexpected content {:?}", p.display(), text.trim())))
    }
}

/// Disks of every iSCSI LUN, in session/LUN order.
pub fn iscsi_disks(topo: &Topology) -> Vec<String> {
    topo.sessions.iter().flat_map(|s| s.luns.iter().filter_map(|l| l.disk.clone())).collect()
}

/// Does `include/<rel>` of the first header tree that has it contain `needle`?
/// None when no tree has the file.
pub fn header_contains(dirs: &[PathBuf], rel: &str, needle: &str) -> Option<bool> {
    dirs.iter().find_map(|d| fs::read_to_string(d.join("include").join(rel)).ok()).map(|t| t.contains(needle))
}

/// The body of `struct <name> {` ... `};` in `include/<rel>`, if found.
pub fn header_struct(dirs: &[PathBuf], rel: &str, name: &str) -> Option<String> {
    let text = dirs.iter().find_map(|d| fs::read_to_string(d.join("include").join(rel)).ok())?;
    let open = format!("struct {name} {{");
    let start = text.lines().position(|l| l.starts_with(&open))?;
    let body: Vec<&str> = text.lines().skip(start + 1).take_while(|l| !l.starts_with("};")).collect();
    Some(body.join("\n"))
}

/// Struct layout facts the two templates depend on, read from the headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `bio->bi_bdev` (5.12+), else `bio->bi_disk` + `bi_partno`.
    pub bio_bdev: bool,
    /// `struct request_queue` has `struct gendisk *disk` (5.15+).
    pub queue_disk: bool,
    /// `struct request_queue` has `quiesce_depth` (nested quiesce, 5.17+).
    pub quiesce_depth: bool,
}

impl Layout {
    /// What a current kernel (6.1+) has: used by --ebpf when no headers are installed.
    pub fn modern() -> Layout {
        Layout { bio_bdev: true, queue_disk: true, quiesce_depth: true }
    }

    pub fn from_headers(dirs: &[PathBuf]) -> Result<Layout> {
        let lack = |what: &str| {
            Error::env(format!(
                "kernel headers lack {what} (looked in {}): install the full linux-headers package",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        };
        let bio_bdev = header_contains(dirs, "linux/blk_types.h", "*bi_bdev;").ok_or_else(|| lack("include/linux/blk_types.h"))?;
        let q = header_struct(dirs, "linux/blkdev.h", "request_queue").ok_or_else(|| lack("struct request_queue in include/linux/blkdev.h"))?;
        Ok(Layout {
            bio_bdev,
            queue_disk: q.lines().any(|l| l.contains("struct gendisk") && l.trim_end().ends_with("*disk;")),
            quiesce_depth: q.contains("quiesce_depth"),
        })
    }
}

/// Kernel symbols from /proc/kallsyms, for stack addresses.
#[derive(Debug, Clone, Default)]
pub struct Ksyms {
    syms: Vec<(u64, String)>,
}

impl Ksyms {
    pub fn load() -> Ksyms {
        Ksyms::parse(&fs::read_to_string("/proc/kallsyms").unwrap_or_default())
    }

    pub fn parse(text: &str) -> Ksyms {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort();
        Ksyms { syms }
    }

    /// `name+0xoff`, or the address in hex.
    pub fn resolve(&self, addr: u64) -> String {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        if i == 0 {
            return format!("0x{addr:x}");
        }
        let (a, n) = &self.syms[i - 1];
        format!("{n}+0x{:x}", addr - a)
    }

    /// Function name only (for matching).
    pub fn name(&self, addr: u64) -> String {
        let s = self.resolve(addr);
        s.split('+').next().unwrap_or("").to_string()
    }
}

/// Addresses of a BPF_STACK_TRACE value (127 u64 slots, zero-terminated).
pub fn stack_addrs(value: &[u8]) -> Vec<u64> {
    value.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).take_while(|&a| a != 0).collect()
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
        let d = std::env::temp_dir().join(format!("stpt-freeze-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("class/block/sdb")).unwrap();
        fs::create_dir_all(d.join("block/sdb")).unwrap();
        fs::write(d.join("class/block/sdb/dev"), "8:16\n").unwrap();
        fs::write(d.join("block/sdb/dev"), "8:16\n").unwrap();
        let mut b = BlockDevs::read(&d);
        assert_eq!(b.name(kdev(8, 16)), "sdb");
        assert_eq!(b.name(kdev(8, 17)), "8:17");
        assert_eq!(BlockDevs::disk_dev(&d, "--disk", "sdb").unwrap(), kdev(8, 16));
        let e = BlockDevs::disk_dev(&d, "--disk", "sdq").unwrap_err();
        assert_eq!(e.to_string(), "--disk sdq: no such disk (disks: sdb)");
    }

    #[test]
    fn layout_from_headers() {
        let d = std::env::temp_dir().join(format!("stpt-layout-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("new/include/linux")).unwrap();
        fs::create_dir_all(d.join("old/include/linux")).unwrap();
        fs::write(d.join("new/include/linux/blk_types.h"), "struct bio {\n\tstruct block_device\t*bi_bdev;\n};\n").unwrap();
        fs::write(d.join("new/include/linux/blkdev.h"), "struct gendisk {\n};\nstruct request_queue {\n\tstruct gendisk\t\t*disk;\n\tint quiesce_depth;\n};\n").unwrap();
        fs::write(d.join("old/include/linux/blk_types.h"), "struct bio {\n\tstruct gendisk\t*bi_disk;\n};\n").unwrap();
        fs::write(d.join("old/include/linux/blkdev.h"), "struct request_queue {\n\tstruct backing_dev_info\t*backing_dev_info;\n};\nstruct x {\n\tstruct gendisk *disk;\n};\n").unwrap();
        assert_eq!(Layout::from_headers(&[d.join("nothing"), d.join("new")]).unwrap(), Layout::modern());
        assert_eq!(Layout::from_headers(&[d.join("old")]).unwrap(), Layout { bio_bdev: false, queue_disk: false, quiesce_depth: false });
        assert!(Layout::from_headers(&[d.join("nothing")]).is_err());
    }

    #[test]
    fn ksyms_resolve() {
        let k = Ksyms::parse("ffffffff81000000 T _stext\nffffffff81000100 t elevator_switch\nffffffff81000200 d data\nffffffffc0000000 t iscsi_queuecommand\t[libiscsi]\n");
        assert_eq!(k.resolve(0xffffffff81000110), "elevator_switch+0x10");
        assert_eq!(k.name(0xffffffff81000210), "elevator_switch");
        assert_eq!(k.resolve(0x10), "0x10");
        assert_eq!(stack_addrs(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), vec![1]);
    }
}
