//! What the running kernel's headers say about struct layouts the templates
//! depend on. Chosen from the headers (the code the program compiles
//! against), never from a version number.

use crate::error::{Error, Result};
use crate::kernel::types::KernelTypes;
use crate::kernel::Kernel;
use std::fs;
use std::path::PathBuf;

/// Header trees to search: the build dir, and Debian's `source` sibling.
pub fn header_dirs(kernel: &Kernel) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = &kernel.headers {
        v.push(h.clone());
        if let Some(parent) = h.parent() {
            v.push(parent.join("source"));
        }
    }
    v
}

/// `include/<rel>` from the first header tree that has it.
fn read(dirs: &[PathBuf], rel: &str) -> Option<String> {
    dirs.iter().find_map(|d| fs::read_to_string(d.join("include").join(rel)).ok())
}

/// The body of `struct <name> {` ... `};` in a header's text, if found.
pub fn struct_body(text: &str, name: &str) -> Option<String> {
    let open = format!("struct {name} {{");
    let start = text.lines().position(|l| l.starts_with(&open))?;
    let body: Vec<&str> = text.lines().skip(start + 1).take_while(|l| !l.starts_with("};")).collect();
    Some(body.join("\n"))
}

fn lack(dirs: &[PathBuf], what: &str) -> Error {
    Error::kernel_types(format!(
        "kernel headers lack {what} (looked in {}): install the full linux-headers package",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    ))
}

/// The SCSI facts bpf_templates/iscsi_stages.c depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiLayout {
    /// `unsigned char *cmnd` (before 5.19) instead of `unsigned char cmnd[32]`.
    pub cdb_pointer: bool,
}

impl ScsiLayout {
    /// What a current kernel (6.1+) has: for --ebpf without headers.
    pub fn modern() -> ScsiLayout {
        ScsiLayout { cdb_pointer: false }
    }

    /// `cmnd` became an array in 5.19.
    pub fn from_headers(dirs: &[PathBuf]) -> Result<ScsiLayout> {
        let cmnd = read(dirs, "scsi/scsi_cmnd.h")
            .and_then(|t| struct_body(&t, "scsi_cmnd"))
            .ok_or_else(|| lack(dirs, "struct scsi_cmnd in include/scsi/scsi_cmnd.h"))?;
        let cdb_pointer =
            cmnd.lines().any(|l| l.split_whitespace().collect::<String>().starts_with("unsignedchar*cmnd;"));
        let cdb_array = cmnd.lines().any(|l| l.split_whitespace().collect::<String>().starts_with("unsignedcharcmnd["));
        if cdb_pointer == cdb_array {
            return Err(lack(dirs, "a recognisable `cmnd` member in struct scsi_cmnd"));
        }
        Ok(ScsiLayout { cdb_pointer })
    }
}

impl ScsiLayout {
    /// The same facts from the kernel types written from BTF.
    pub fn from_types(t: &KernelTypes) -> Result<ScsiLayout> {
        Ok(ScsiLayout { cdb_pointer: t.is_pointer("scsi_cmnd.cmnd") })
    }
}

/// The block-layer facts iscfreeze.c and submitslower.c depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    /// `bio->bi_bdev` (5.12+), else `bio->bi_disk` + `bi_partno`.
    pub bio_bdev: bool,
    /// `struct request_queue` has `struct gendisk *disk` (5.15+).
    pub queue_disk: bool,
    /// `struct request_queue` has `quiesce_depth` (nested quiesce, 5.17+).
    pub quiesce_depth: bool,
}

impl BlockLayout {
    /// What a current kernel (6.1+) has: for --ebpf without headers.
    pub fn modern() -> BlockLayout {
        BlockLayout { bio_bdev: true, queue_disk: true, quiesce_depth: true }
    }

    /// The kernel types of a program of template `parts` from BTF where
    /// the kernel has it (Err: why not), and the layout they or else the
    /// headers give.
    pub fn choose(kernel: &Kernel, parts: &[&str]) -> (Result<KernelTypes>, Result<BlockLayout>) {
        let types = crate::kernel::types::from_btf_dir(&kernel.btf_dir, parts, &[]);
        let layout = match &types {
            Ok(t) => Ok(BlockLayout::from_types(t)),
            Err(_) => BlockLayout::from_headers(&header_dirs(kernel)),
        };
        (types, layout)
    }

    /// The same facts from the kernel types written from BTF.
    pub fn from_types(t: &KernelTypes) -> BlockLayout {
        BlockLayout {
            bio_bdev: t.has("bio.bi_bdev"),
            queue_disk: t.has("request_queue.disk"),
            quiesce_depth: t.has("request_queue.quiesce_depth"),
        }
    }

    pub fn from_headers(dirs: &[PathBuf]) -> Result<BlockLayout> {
        let bio_bdev = read(dirs, "linux/blk_types.h")
            .map(|t| t.contains("*bi_bdev;"))
            .ok_or_else(|| lack(dirs, "include/linux/blk_types.h"))?;
        let q = read(dirs, "linux/blkdev.h")
            .and_then(|t| struct_body(&t, "request_queue"))
            .ok_or_else(|| lack(dirs, "struct request_queue in include/linux/blkdev.h"))?;
        Ok(BlockLayout {
            bio_bdev,
            queue_disk: q.lines().any(|l| l.contains("struct gendisk") && l.trim_end().ends_with("*disk;")),
            quiesce_depth: q.contains("quiesce_depth"),
        })
    }
}

/// A header tree for tests: `files` are (path under include/, text).
#[cfg(test)]
pub fn fixture(root: &std::path::Path, files: &[(&str, &str)]) -> PathBuf {
    for (rel, text) in files {
        let p = root.join("include").join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    root.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CMND_ARRAY: &str =
        "struct scsi_cmnd {\n\tstruct scsi_device *device;\n\tunsigned char cmnd[32]; /* SCSI CDB */\n};\n";
    const CMND_POINTER: &str = "struct scsi_cmnd {\n\tunsigned short cmd_len;\n\tunsigned char *cmnd;\n};\n";

    #[test]
    fn scsi_layout_from_headers() {
        let d = tempfile::tempdir().unwrap();
        let new = fixture(&d.path().join("new"), &[("scsi/scsi_cmnd.h", CMND_ARRAY)]);
        let old = fixture(&d.path().join("old"), &[("scsi/scsi_cmnd.h", CMND_POINTER)]);
        let nothing = d.path().join("nothing");
        assert_eq!(ScsiLayout::from_headers(&[nothing.clone(), new]).unwrap(), ScsiLayout::modern());
        assert_eq!(ScsiLayout::from_headers(&[old]).unwrap(), ScsiLayout { cdb_pointer: true });
        assert!(ScsiLayout::from_headers(&[nothing]).is_err());
        let odd = fixture(&d.path().join("odd"), &[("scsi/scsi_cmnd.h", "struct scsi_cmnd {\n\tint x;\n};\n")]);
        let e = ScsiLayout::from_headers(&[odd]).unwrap_err();
        assert!(e.to_string().contains("`cmnd` member"), "{e}");
    }

    #[test]
    fn scsi_layout_of_the_installed_headers() {
        // This machine's Debian headers (6.1, installed by tests/lab/setup).
        let dirs: Vec<PathBuf> = match fs::read_dir("/usr/src") {
            Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.join("include/scsi/scsi_cmnd.h").exists()).collect(),
            Err(_) => Vec::new(),
        };
        if dirs.is_empty() {
            eprintln!("note: no kernel headers under /usr/src: nothing to check");
            return;
        }
        for d in dirs {
            let l = ScsiLayout::from_headers(std::slice::from_ref(&d)).unwrap();
            assert!(!l.cdb_pointer, "{}: 6.1 headers hold the CDB as an array", d.display());
        }
    }

    #[test]
    fn block_layout_from_headers() {
        let d = tempfile::tempdir().unwrap();
        let new = fixture(&d.path().join("new"), &[
            ("linux/blk_types.h", "struct bio {\n\tstruct block_device\t*bi_bdev;\n};\n"),
            ("linux/blkdev.h", "struct gendisk {\n};\nstruct request_queue {\n\tstruct gendisk\t\t*disk;\n\tint quiesce_depth;\n};\n"),
        ]);
        let old = fixture(&d.path().join("old"), &[
            ("linux/blk_types.h", "struct bio {\n\tstruct gendisk\t*bi_disk;\n};\n"),
            ("linux/blkdev.h", "struct request_queue {\n\tstruct backing_dev_info\t*backing_dev_info;\n};\nstruct x {\n\tstruct gendisk *disk;\n};\n"),
        ]);
        assert_eq!(BlockLayout::from_headers(&[d.path().join("nothing"), new]).unwrap(), BlockLayout::modern());
        assert_eq!(
            BlockLayout::from_headers(&[old]).unwrap(),
            BlockLayout { bio_bdev: false, queue_disk: false, quiesce_depth: false }
        );
        assert!(BlockLayout::from_headers(&[d.path().join("nothing")]).is_err());
    }
}
