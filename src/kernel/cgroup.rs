//! cgroup v2: a path given by the user checked to be a cgroup (BPF tests a
//! task against it through a cgroup array holding its directory), and ids
//! seen by BPF turned back into paths.
//! A cgroup's id is its directory's inode number in the cgroup2 file
//! system (kernfs node ids, 64-bit and never reused, since 5.5 on 64-bit
//! machines), which `bpf_get_current_cgroup_id` returns.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on a hybrid host), from a mounts table.
pub fn cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1].replace("\\040", " ")))
    })
}

/// The cgroup v2 mount of this machine.
pub fn mount() -> Option<PathBuf> {
    cgroup2_mount(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default())
}

/// A cgroup to filter on: its directory in the cgroup2 file system, whose
/// open file is what `bpf_current_task_under_cgroup`'s array holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFilter {
    pub dir: PathBuf,
    /// Its id (the directory's inode number) and depth below the root
    /// (0 for the root): kernel threads' bios are filtered by their
    /// cgroup's ancestor at that depth.
    pub id: u64,
    pub level: u32,
}

/// `--cgroup ARG` under the hierarchy mounted at `mount`: a path under the
/// mount (`/sys/fs/cgroup/system.slice`), or one relative to it
/// (`system.slice`, `/system.slice`), naming a cgroup directory.
pub fn resolve(mount: &Path, arg: &str) -> Result<CgroupFilter> {
    let bad = |why: &str| Error::filter(format!("--cgroup '{arg}': {why}"));
    let p = Path::new(arg);
    let rel = match p.strip_prefix(mount) {
        Ok(r) => r.to_path_buf(),
        Err(_) => p.components().filter(|c| !matches!(c, Component::RootDir)).collect(),
    };
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(bad("give the cgroup's path without '.' or '..'"));
    }
    let dir = mount.join(&rel);
    let meta = std::fs::metadata(&dir).map_err(|e| bad(&format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() || !dir.join("cgroup.procs").exists() {
        return Err(bad(&format!("{} is not a cgroup v2 directory", dir.display())));
    }
    let level = u32::try_from(rel.components().count()).map_err(|_| bad("too deep"))?;
    Ok(CgroupFilter { dir, id: meta.ino(), level })
}

/// cgroup ids to paths (relative to the mount, with a leading '/'), read
/// from the cgroup2 file system when an id is first seen and kept: ids are
/// never reused, so a path found stays that id's; an id not found (a cgroup
/// removed before it was looked up) stays unknown and is shown by its id.
#[derive(Debug, Default)]
pub struct CgroupPaths {
    mount: Option<PathBuf>,
    known: HashMap<u64, Option<String>>,
}

impl CgroupPaths {
    pub fn new(mount: Option<PathBuf>) -> CgroupPaths {
        CgroupPaths { mount, known: HashMap::new() }
    }

    /// The path of cgroup `id` if [`Self::look_up`] found it.
    pub fn known(&self, id: u64) -> Option<&str> {
        self.known.get(&id).and_then(|p| p.as_deref())
    }

    /// Find cgroup `id`'s path, once.
    pub fn look_up(&mut self, id: u64) {
        if !self.known.contains_key(&id) {
            if let Some(m) = &self.mount {
                let mut found = Vec::new();
                walk(m, m, &mut found);
                for (i, p) in found {
                    self.known.entry(i).or_insert(Some(p));
                }
            }
            self.known.entry(id).or_insert(None);
        }
    }
}

/// Every cgroup directory under `dir`: (id, path relative to `root`).
fn walk(root: &Path, dir: &Path, out: &mut Vec<(u64, String)>) {
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let rel = dir.strip_prefix(root).map(|r| format!("/{}", r.display())).unwrap_or_default();
    out.push((meta.ino(), rel));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &e.path(), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for d in ["", "system.slice", "system.slice/a.service"] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
            std::fs::write(t.path().join(d).join("cgroup.procs"), "").unwrap();
        }
        std::fs::create_dir_all(t.path().join("plain")).unwrap();
        t
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_the_mounts_table() {
        let m = "sysfs /sys sysfs rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n";
        assert_eq!(cgroup2_mount(m), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n"), None);
    }

    #[test]
    fn a_cgroup_is_named_under_the_mount_or_relative_to_it() {
        let t = tree();
        let m = t.path();
        let full = m.join("system.slice/a.service");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        for arg in [full.to_str().unwrap(), "system.slice/a.service", "/system.slice/a.service"] {
            let want = CgroupFilter { dir: full.clone(), id: ino(&full), level: 2 };
            assert_eq!(resolve(m, arg).unwrap(), want, "{arg}");
        }
        assert_eq!(resolve(m, "/").unwrap(), CgroupFilter { dir: m.to_path_buf(), id: ino(m), level: 0 });
        for (arg, why) in [
            ("nosuch", "No such file"),
            ("plain", "is not a cgroup v2 directory"),
            ("system.slice/../plain", "without '.' or '..'"),
        ] {
            let e = resolve(m, arg).unwrap_err();
            assert!(e.to_string().starts_with(&format!("--cgroup '{arg}': ")) && e.to_string().contains(why), "{e}");
            assert_eq!(e.exit_code(), 2);
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn ids_become_paths_and_a_removed_cgroup_stays_unknown() {
        let t = tree();
        let m = t.path();
        let id = std::fs::metadata(m.join("system.slice/a.service")).unwrap().ino();
        let path = |p: &mut CgroupPaths, id| {
            p.look_up(id);
            p.known(id).map(str::to_string)
        };
        let mut p = CgroupPaths::new(Some(m.to_path_buf()));
        assert_eq!(p.known(id), None, "not looked up yet");
        assert_eq!(path(&mut p, id).as_deref(), Some("/system.slice/a.service"));
        assert_eq!(path(&mut p, std::fs::metadata(m).unwrap().ino()).as_deref(), Some("/"));
        assert_eq!(path(&mut p, u64::MAX), None);
        // No cgroup2 mount: no path.
        assert_eq!(path(&mut CgroupPaths::new(None), id), None);
    }
}
