//! The BPF programs this process has loaded, and what the kernel counts for
//! each (`struct bpf_prog_info`): run time and run count (only while
//! `kernel.bpf_stats_enabled` is 1), and hits skipped because the program
//! was already running on that CPU (5.12+). bcc keeps the fds of the kprobe
//! programs it loads; they are found through /proc/self/fd.

use crate::bpf::syscall::{bpf, get32, get64, put32, put64};
use std::os::fd::RawFd;

const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
/// Offsets in struct bpf_prog_info (include/uapi/linux/bpf.h).
const INFO_NAME: usize = 64;
const INFO_RUN_TIME_NS: usize = 192;
const INFO_RUN_CNT: usize = 200;
const INFO_RECURSION_MISSES: usize = 208;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    /// The C function's name, cut to 15 characters by the kernel.
    pub name: String,
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub recursion_misses: u64,
}

/// What the kernel says of one program fd; None if it is not a program.
pub fn info(fd: RawFd) -> Option<ProgInfo> {
    let mut info = [0u8; 224];
    let mut attr = [0u8; 16];
    put32(&mut attr, 0, fd as u32);
    put32(&mut attr, 4, info.len() as u32);
    put64(&mut attr, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).ok()?;
    let len = get32(&attr, 4) as usize;
    let at = |off: usize| if len >= off + 8 { get64(&info, off) } else { 0 };
    let name = &info[INFO_NAME..INFO_NAME + 16];
    let name = String::from_utf8_lossy(&name[..name.iter().position(|&c| c == 0).unwrap_or(16)]).into_owned();
    Some(ProgInfo {
        id: get32(&info, 4),
        name,
        run_time_ns: at(INFO_RUN_TIME_NS),
        run_cnt: at(INFO_RUN_CNT),
        recursion_misses: at(INFO_RECURSION_MISSES),
    })
}

/// Every BPF program this process holds, each once (by program id).
pub fn own_programs() -> Vec<ProgInfo> {
    let mut out: Vec<ProgInfo> = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else { return out };
    for e in rd.flatten() {
        let is_prog =
            std::fs::read_link(e.path()).map(|l| l.to_string_lossy() == "anon_inode:bpf-prog").unwrap_or(false);
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else { continue };
        if !is_prog {
            continue;
        }
        if let Some(p) = info(fd) {
            if !out.iter().any(|o| o.id == p.id) {
                out.push(p);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    out
}

/// `kernel.bpf_stats_enabled`: whether run time and run count are kept.
pub fn stats_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").map(|s| s.trim() == "1").unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_not_a_program() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert_eq!(info(std::os::fd::AsRawFd::as_raw_fd(&f)), None);
        assert!(own_programs().is_empty(), "a test process holds no BPF program");
    }
}
