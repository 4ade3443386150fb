//! fentry/fexit programs on kernel and module functions, loaded and attached
//! with the bpf(2) syscall. libbcc 0.26 loads fentry programs only against
//! vmlinux's BTF; the iSCSI functions live in modules (libiscsi,
//! libiscsi_tcp), whose BTF ids and BTF object must be given to the kernel.
//! bcc still compiles the program and owns its maps: only the loading and
//! attaching of these programs happen here.
//!
//! Why fentry: it costs about half of a kprobe per hit, and the kernel's
//! guard against nested BPF programs is per program for fentry, but one flag
//! per CPU for kprobes: a kprobe program interrupted by a softirq that
//! completes another iSCSI command makes the kernel skip the completion's
//! program, and that command is never counted (seen once in CI under netem).

use crate::bpf::syscall::{bpf, get32, put32, put64};
use crate::error::{Error, Result};
use crate::kernel::btf::Loaded;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_PROG_LOAD: i64 = 5;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;
const BPF_BTF_GET_FD_BY_ID: i64 = 19;
const BPF_BTF_GET_NEXT_ID: i64 = 23;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;
const BPF_TRACE_FEXIT: u32 = 25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Entry,
    Exit,
}

/// Where a function's BTF type is: vmlinux (`obj` None) or a module's BTF
/// object, and the type id within it.
pub struct Target {
    pub function: String,
    pub btf_id: u32,
    obj: Option<std::sync::Arc<OwnedFd>>,
}

/// The BTF targets of the fentry/fexit probes, by function: resolved
/// before the program is compiled, so the parsed BTF (about 8 MB for
/// vmlinux's) is released before clang's peak instead of adding to it.
#[derive(Default)]
pub struct Targets(std::collections::HashMap<String, Target>);

impl Targets {
    pub fn get(&self, function: &str) -> Option<&Target> {
        self.0.get(function)
    }

    pub fn insert(&mut self, t: Target) {
        self.0.insert(t.function.clone(), t);
    }
}

/// Resolves functions to BTF ids, reading and parsing each BTF file once
/// (the same files the kernel types are written from, see `btf()`).
pub struct Resolver {
    btf: Loaded,
    fds: std::collections::HashMap<String, std::sync::Arc<OwnedFd>>,
}

impl Resolver {
    pub fn new(root: &std::path::Path) -> Result<Resolver> {
        Ok(Resolver { btf: Loaded::open(root)?, fds: Default::default() })
    }

    /// The BTF read so far, to write kernel types from.
    pub fn btf(&mut self) -> &mut Loaded {
        &mut self.btf
    }

    /// `module` is None for a function of vmlinux.
    pub fn target(&mut self, function: &str, module: Option<&str>) -> Result<Target> {
        let Some(m) = module else {
            let btf_id = self
                .btf
                .vmlinux
                .find_func(function)
                .ok_or_else(|| Error::bpf(format!("{function} is not in the kernel's BTF")))?;
            return Ok(Target { function: function.into(), btf_id, obj: None });
        };
        let btf_id = self
            .btf
            .module(m)?
            .find_func(function)
            .ok_or_else(|| Error::bpf(format!("{function} is not in the BTF of module {m}")))?;
        if !self.fds.contains_key(m) {
            self.fds.insert(m.to_string(), std::sync::Arc::new(module_btf_fd(m)?));
        }
        Ok(Target { function: function.into(), btf_id, obj: Some(self.fds[m].clone()) })
    }
}

/// The kernel's BTF object of a loaded module, found by name.
fn module_btf_fd(module: &str) -> Result<OwnedFd> {
    let mut id = 0u32;
    loop {
        let mut attr = [0u8; 16];
        put32(&mut attr, 0, id);
        if bpf(BPF_BTF_GET_NEXT_ID, &mut attr).is_err() {
            return Err(Error::bpf(format!("no BTF object of module {module} loaded")));
        }
        id = get32(&attr, 4);
        let mut attr = [0u8; 16];
        put32(&mut attr, 0, id);
        let Ok(fd) = bpf(BPF_BTF_GET_FD_BY_ID, &mut attr) else { continue };
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut name = [0u8; 64];
        let mut info = [0u8; 32]; // struct bpf_btf_info
        put64(&mut info, 16, name.as_mut_ptr() as u64);
        put32(&mut info, 24, name.len() as u32);
        let mut attr = [0u8; 16];
        put32(&mut attr, 0, fd.as_raw_fd() as u32);
        put32(&mut attr, 4, info.len() as u32);
        put64(&mut attr, 8, info.as_mut_ptr() as u64);
        if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).is_ok() {
            let n = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            if &name[..n] == module.as_bytes() {
                return Ok(fd);
            }
        }
    }
}

/// Load compiled instructions as a fentry or fexit program on `target`.
pub fn load(insns: &[u8], name: &str, side: Side, target: &Target) -> std::result::Result<OwnedFd, String> {
    let try_load = |log: &mut Vec<u8>| -> std::io::Result<i64> {
        let license = b"GPL\0";
        let mut attr = [0u8; 128];
        put32(&mut attr, 0, BPF_PROG_TYPE_TRACING);
        put32(&mut attr, 4, (insns.len() / 8) as u32);
        put64(&mut attr, 8, insns.as_ptr() as u64);
        put64(&mut attr, 16, license.as_ptr() as u64);
        if !log.is_empty() {
            put32(&mut attr, 24, 1);
            put32(&mut attr, 28, log.len() as u32);
            put64(&mut attr, 32, log.as_mut_ptr() as u64);
        }
        let n = name.len().min(15);
        attr[48..48 + n].copy_from_slice(&name.as_bytes()[..n]);
        put32(&mut attr, 68, if side == Side::Entry { BPF_TRACE_FENTRY } else { BPF_TRACE_FEXIT });
        put32(&mut attr, 108, target.btf_id);
        if let Some(obj) = &target.obj {
            put32(&mut attr, 112, obj.as_raw_fd() as u32);
        }
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    match try_load(&mut Vec::new()) {
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
        Err(e) => {
            let mut log = vec![0u8; 1 << 20];
            let _ = try_load(&mut log);
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)]).into_owned();
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty() && !l.starts_with("processed"))
                .unwrap_or("")
                .to_string();
            Err(if last.is_empty() { e.to_string() } else { format!("{e}: verifier: {last}") })
        }
    }
}

/// Attach a loaded fentry/fexit program; detached when the link is dropped.
pub fn attach(prog: &OwnedFd) -> std::io::Result<OwnedFd> {
    raw_tracepoint_open(prog, None)
}

/// Attach a loaded raw tracepoint program to `tracepoint` (its event name);
/// detached when the link is dropped.
pub fn attach_raw_tracepoint(prog: &OwnedFd, tracepoint: &std::ffi::CStr) -> std::io::Result<OwnedFd> {
    raw_tracepoint_open(prog, Some(tracepoint))
}

/// BPF_RAW_TRACEPOINT_OPEN: { u64 name; u32 prog_fd; }, name 0 for a
/// tracing (fentry/fexit) program.
fn raw_tracepoint_open(prog: &OwnedFd, name: Option<&std::ffi::CStr>) -> std::io::Result<OwnedFd> {
    let mut attr = [0u8; 16];
    let name = name.map_or(0u64, |n| n.as_ptr() as u64);
    attr[..8].copy_from_slice(&name.to_ne_bytes());
    put32(&mut attr, 8, prog.as_raw_fd() as u32);
    let fd = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether `target` takes a fentry program at all: a two-instruction
/// program (r0 = 0; exit), as libbpf-tools' fentry_can_attach does.
pub fn can_attach(target: &Target) -> bool {
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    load(&insns, "probe_fentry", Side::Entry, target).and_then(|p| attach(&p).map_err(|e| e.to_string())).is_ok()
}

/// Times the kernel skipped this program because it was already running on
/// that CPU (`recursion_misses`, 5.12 and later; 0 where the kernel does
/// not report it).
pub fn misses(prog: &OwnedFd) -> u64 {
    crate::bpf::progs::info(prog.as_raw_fd()).map(|p| p.recursion_misses).unwrap_or(0)
}
