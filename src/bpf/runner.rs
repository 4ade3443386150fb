//! Running a program: compile through bcc, attach probes, read events from a
//! ring buffer (perf buffer where the kernel lacks one), stop on Ctrl-C,
//! SIGTERM or a duration, detach (on drop).

use crate::bpf::templates::Value;
use crate::error::{Error, Result};
use crate::kernel::{self, Kernel};
use bcc::perf_event::PerfMapBuilder;
use bcc::ring_buf::{RingBufBuilder, RingCallback};
use bcc::{Kprobe, Kretprobe, BPF};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// kprobe
    Entry,
    /// kretprobe
    Return,
    /// fentry (BTF trampoline), loaded by src/bpf/fentry.rs
    Fentry,
    /// fexit: sees the arguments and the return value
    Fexit,
}

/// One attach point: a kernel function and the C handler that runs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub kind: ProbeKind,
    pub function: String,
    pub handler: &'static str,
    /// The module the function is in (fentry needs its BTF); None: vmlinux.
    pub module: Option<String>,
}

impl Probe {
    pub fn entry(function: &str, handler: &'static str) -> Probe {
        Probe { kind: ProbeKind::Entry, function: function.to_string(), handler, module: None }
    }
    pub fn ret(function: &str, handler: &'static str) -> Probe {
        Probe { kind: ProbeKind::Return, function: function.to_string(), handler, module: None }
    }
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            ProbeKind::Entry => "kprobe",
            ProbeKind::Return => "kretprobe",
            ProbeKind::Fentry => "fentry",
            ProbeKind::Fexit => "fexit",
        };
        match &self.module {
            Some(m) => format!("{kind}:{m}:{} -> {}", self.function, self.handler),
            None => format!("{kind}:{} -> {}", self.function, self.handler),
        }
    }
}

/// Checks every tool makes before compiling: root, headers, iSCSI modules.
pub fn preflight(kernel: &Kernel, need_iscsi: bool) -> Result<()> {
    kernel::require_root()?;
    kernel.require_headers()?;
    if need_iscsi && !kernel::module_loaded(std::path::Path::new("/sys/module"), "libiscsi") {
        return Err(Error::NoIscsiModules);
    }
    Ok(())
}

/// Compile C text with libbcc for this kernel. bcc prints the compiler's
/// diagnostics itself.
pub fn compile(kernel: &Kernel, text: &str) -> Result<BPF> {
    // What start-up read and freed (kallsyms, BTF, sysfs) goes back to the
    // kernel before clang's peak, instead of under it (the peak RSS of a start is clang's).
    unsafe { libc::malloc_trim(0) };
    bcc::BPFBuilder::new(text).and_then(|b| b.cflags(&kernel.cflags)).and_then(|b| b.build()).map_err(|e| {
        Error::bpf(format!("BPF program failed to compile or load ({e}); the compiler's messages are above"))
    })
}

/// fentry/fexit programs this process loaded and attached; detached when
/// dropped (kprobes belong to the `BPF` and go with it).
#[derive(Default)]
pub struct Links {
    programs: Vec<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
}

impl Links {
    /// Hits the kernel skipped because the same program was already running
    /// on that CPU (fentry and raw tracepoint programs only: kprobes share
    /// one flag per CPU and their skips are not reported here).
    pub fn missed(&self) -> u64 {
        self.programs.iter().map(|(prog, _)| crate::bpf::fentry::misses(prog)).sum()
    }

    /// Keep an attached program and its link.
    pub fn push(&mut self, prog: std::os::fd::OwnedFd, link: std::os::fd::OwnedFd) {
        self.programs.push((prog, link));
    }
}

/// `targets`: the BTF target of every fentry/fexit probe, resolved before
/// the compile (empty for kprobes only).
pub fn attach(bpf: &mut BPF, probes: &[Probe], targets: &crate::bpf::fentry::Targets) -> Result<Links> {
    let mut links = Links::default();
    for p in probes {
        let fail = |e: String| Error::bpf(format!("cannot attach {}: {e}", p.describe()));
        match p.kind {
            ProbeKind::Entry => {
                Kprobe::new().handler(p.handler).function(&p.function).attach(bpf).map_err(|e| fail(e.to_string()))?
            }
            ProbeKind::Return => Kretprobe::new()
                .handler(p.handler)
                .function(&p.function)
                .attach(bpf)
                .map_err(|e| fail(e.to_string()))?,
            ProbeKind::Fentry | ProbeKind::Fexit => {
                let target = targets.get(&p.function).ok_or_else(|| fail("its BTF target was not resolved".into()))?;
                let name = std::ffi::CString::new(p.handler).map_err(|e| fail(e.to_string()))?;
                let insns = bpf.dump_func(name).map_err(|e| fail(e.to_string()))?;
                let side = if p.kind == ProbeKind::Fentry {
                    crate::bpf::fentry::Side::Entry
                } else {
                    crate::bpf::fentry::Side::Exit
                };
                let prog = crate::bpf::fentry::load(&insns, p.handler, side, target).map_err(fail)?;
                let link = crate::bpf::fentry::attach(&prog).map_err(|e| fail(e.to_string()))?;
                links.programs.push((prog, link));
            }
        }
    }
    Ok(links)
}

/// The buffer a program's events go through: the BPF ring buffer where the
/// kernel has one (5.8+), else a perf buffer; `pages` pages of memory (per
/// CPU for a perf buffer), a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventBuffer {
    pub ring: bool,
    pub pages: u32,
}

impl EventBuffer {
    /// 1 MiB: 6553 of isclatency's events (152 bytes and the ring buffer's 8-byte header each).
    pub const DEFAULT_PAGES: u32 = 256;
    /// 256 MiB.
    pub const MAX_PAGES: u32 = 65536;

    pub fn new(ring: bool) -> EventBuffer {
        EventBuffer { ring, pages: EventBuffer::DEFAULT_PAGES }
    }

    /// The template values of common.h.
    pub fn values(&self) -> [(&'static str, Value); 2] {
        [("USE_RINGBUF", self.ring.into()), ("EVENT_PAGES", self.pages.into())]
    }

    /// What the exit summary adds when `full` events did not fit.
    pub fn full_note(&self, full: u64) -> Option<String> {
        (full > 0).then(|| {
            format!(
                "{full} events did not fit the event buffer (-b {}): a larger -b (up to {}) or a higher threshold keeps them",
                self.pages,
                EventBuffer::MAX_PAGES
            )
        })
    }

    /// A page count given by the user: a power of two up to MAX_PAGES.
    pub fn checked_pages(flag: &str, pages: u32) -> Result<u32> {
        if pages.is_power_of_two() && pages <= EventBuffer::MAX_PAGES {
            Ok(pages)
        } else {
            Err(Error::usage(format!("{flag} must be a power of two from 1 to {}", EventBuffer::MAX_PAGES)))
        }
    }
}

/// Raw event records, whichever buffer carries them. The buffer's callback
/// appends each record to one byte arena (its length, then its bytes); a
/// poll takes the arena whole, so a record costs a copy and no allocation.
pub struct Events {
    source: Source,
    arena: Arc<Mutex<Vec<u8>>>,
    batch: Vec<u8>,
}

enum Source {
    Ring(bcc::ring_buf::RingBuf),
    Perf(bcc::perf_event::PerfMap),
}

/// Append one record to the arena (a poisoned lock still holds bytes).
fn append(arena: &Mutex<Vec<u8>>, data: &[u8]) {
    let mut a = arena.lock().unwrap_or_else(|p| p.into_inner());
    a.extend_from_slice(&(data.len() as u32).to_ne_bytes());
    a.extend_from_slice(data);
}

/// The records of one poll, in the order the buffer gave them.
pub struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Records<'a> {
    pub fn new(arena: &'a [u8]) -> Records<'a> {
        Records { rest: arena }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let (len, rest) = self.rest.split_first_chunk::<4>()?;
        let len = (u32::from_ne_bytes(*len) as usize).min(rest.len());
        let (rec, rest) = rest.split_at(len);
        self.rest = rest;
        Some(rec)
    }
}

impl Events {
    /// Open the `events` table of a program built from common.h.
    pub fn open(bpf: &BPF, buffer: EventBuffer) -> Result<Events> {
        let table = bpf.table("events")?;
        let arena = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
        let source = if buffer.ring {
            let a = arena.clone();
            let cb = RingCallback::new(Box::new(move |data: &[u8]| append(&a, data)));
            Source::Ring(RingBufBuilder::new(table, cb).build()?)
        } else {
            let a = arena.clone();
            let perf = PerfMapBuilder::new(table, move || {
                let a = a.clone();
                Box::new(move |data: &[u8]| append(&a, data))
            })
            .page_count(buffer.pages as i32)
            .build()?;
            Source::Perf(perf)
        };
        Ok(Events { source, arena, batch: Vec::with_capacity(1 << 16) })
    }

    /// Wait up to `timeout_ms` and return the records that arrived. The
    /// programs wake the ring buffer's reader only once a batch is waiting
    /// (common.h), so after the wait whatever is there is drained.
    pub fn poll(&mut self, timeout_ms: i32) -> Records<'_> {
        match &mut self.source {
            Source::Ring(r) => {
                r.poll(timeout_ms);
                r.consume();
            }
            Source::Perf(p) => p.poll(timeout_ms),
        }
        self.batch.clear();
        std::mem::swap(&mut *self.arena.lock().unwrap_or_else(|p| p.into_inner()), &mut self.batch);
        Records::new(&self.batch)
    }
}

/// Hand every record to `show` until stopped or stdout is gone, then the
/// records already buffered. `show` returns false when output must stop.
pub fn print_events(
    events: &mut Events,
    stop: &Stop,
    out: &mut crate::cli::output::Out,
    mut show: impl FnMut(&[u8], &mut crate::cli::output::Out) -> bool,
) {
    'outer: while !stop.stopped() && !out.closed() {
        for rec in events.poll(stop.poll_ms(100)) {
            if !show(rec, out) {
                break 'outer;
            }
        }
        out.flush();
    }
    if !out.closed() {
        for rec in events.poll(0) {
            if !show(rec, out) {
                break;
            }
        }
    }
    out.flush();
}

/// Ctrl-C, SIGTERM, SIGHUP, or the end of `--duration`.
#[derive(Clone)]
pub struct Stop {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Stop {
    pub fn install(duration: Option<Duration>) -> Result<Stop> {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        ctrlc::set_handler(move || f.store(true, Ordering::SeqCst))
            .map_err(|e| Error::bpf(format!("cannot install signal handler: {e}")))?;
        Ok(Stop { flag, deadline: duration.map(|d| Instant::now() + d) })
    }

    pub fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst) || self.deadline.map(|d| Instant::now() >= d).unwrap_or(false)
    }

    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Milliseconds to wait in one poll, never past the deadline.
    pub fn poll_ms(&self, max: u64) -> i32 {
        let ms = match self.deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).as_millis().min(max as u128) as u64,
            None => max,
        };
        ms.max(1) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_whole_and_in_order() {
        let arena = Mutex::new(Vec::new());
        for rec in [&b"abc"[..], b"", b"0123456789"] {
            append(&arena, rec);
        }
        let bytes = arena.into_inner().unwrap();
        let got: Vec<&[u8]> = Records::new(&bytes).collect();
        assert_eq!(got, [&b"abc"[..], b"", b"0123456789"]);
    }

    #[test]
    fn a_cut_record_ends_the_batch_without_a_panic() {
        let arena = Mutex::new(Vec::new());
        append(&arena, b"whole");
        append(&arena, b"cut short");
        let mut bytes = arena.into_inner().unwrap();
        bytes.truncate(bytes.len() - 3);
        let got: Vec<&[u8]> = Records::new(&bytes).collect();
        assert_eq!(got, [&b"whole"[..], b"cut sh"]);
        assert_eq!(Records::new(&[1, 0]).count(), 0);
    }

    #[test]
    fn event_buffer_values_and_full_note() {
        let b = EventBuffer { ring: false, pages: 4 };
        let v = b.values();
        assert_eq!((v[0].0, v[1].0), ("USE_RINGBUF", "EVENT_PAGES"));
        assert_eq!(EventBuffer::new(true).pages, EventBuffer::DEFAULT_PAGES);
        assert_eq!(b.full_note(0), None);
        assert_eq!(
            b.full_note(7).unwrap(),
            "7 events did not fit the event buffer (-b 4): a larger -b (up to 65536) or a higher threshold keeps them"
        );
    }
}
