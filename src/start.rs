//! The one start-up path every tool takes, in this order:
//!
//! 1. [`Startup::new`]: the flags every tool shares (`--duration`), and the
//!    running kernel, read from files;
//! 2. [`Startup::ebpf`]: with `--ebpf`, print the program the tool would
//!    compile and stop (no root, no iSCSI needed);
//! 3. the tool's own checks of what the user typed (a filter that names
//!    nothing is the user's mistake, said before the machine's);
//! 4. [`Startup::preflight`]: root, BTF or headers, the iSCSI modules;
//! 5. the tool's plan, as a [`Program`]: its C text and probes;
//! 6. [`Startup::load`]: say what the kernel cannot give (and with `-v`
//!    every probe), compile, fill the maps the tool fills, attach;
//! 7. [`Startup::events`]: open the event buffer (for tools that send
//!    events), and [`Startup::trace`]: install Ctrl-C/SIGTERM and the
//!    duration, print the "Tracing ..." line;
//! 8. the tool's print loop, then [`Tracer::finish`]: the exit summary.

use crate::bpf::fentry::Targets;
use crate::bpf::runner::{self, EventBuffer, Events, Links, Probe, Stop};
use crate::cli::output::{self, Out};
use crate::cli::Common;
use crate::error::Result;
use crate::kernel::Kernel;
use bcc::BPF;
use clap::Args;
use std::time::Duration;

/// `-b PAGES`, for tools that send an event per command.
#[derive(Args, Debug, Clone, Default)]
pub struct BufferFlag {
    /// Event buffer size in pages, a power of two (default 256: 1 MiB; see EXIT SUMMARY in the man page)
    #[arg(short = 'b', long = "buffer-pages", value_name = "PAGES")]
    pub buffer_pages: Option<u32>,
}

impl BufferFlag {
    pub fn pages(&self) -> Result<u32> {
        match self.buffer_pages {
            None => Ok(EventBuffer::DEFAULT_PAGES),
            Some(p) => EventBuffer::checked_pages("-b/--buffer-pages", p),
        }
    }
}

/// A tool on its way to tracing.
pub struct Startup<'a> {
    pub tool: &'static str,
    pub common: &'a Common,
    pub kernel: Kernel,
    /// Status and summary lines on stderr even without `--json` (a tool
    /// whose reports are off).
    pub quiet: bool,
    /// The event buffer's size in pages (`-b` where a tool has it).
    pub event_pages: u32,
    duration: Option<Duration>,
}

/// What a tool compiles and attaches.
pub struct Program {
    /// The C text, every placeholder substituted.
    pub text: String,
    pub probes: Vec<Probe>,
    /// fentry/fexit targets from BTF (empty for kprobe-only programs).
    pub targets: Targets,
    /// With `-v`: what the kernel offers and where the types come from.
    pub describe: Vec<String>,
    /// Said once at start: what this kernel cannot give.
    pub notes: Vec<String>,
}

impl Program {
    pub fn new(text: String, probes: Vec<Probe>) -> Program {
        Program { text, probes, targets: Targets::default(), describe: Vec::new(), notes: Vec::new() }
    }
}

/// A tool tracing: when to stop, and where its lines go.
pub struct Tracer {
    pub stop: Stop,
    pub out: Out,
    /// Status and summary lines go to stderr (stdout is JSON or off).
    pub quiet: bool,
}

impl<'a> Startup<'a> {
    pub fn new(tool: &'static str, common: &'a Common) -> Result<Startup<'a>> {
        let duration = common.duration()?;
        Ok(Startup {
            tool,
            common,
            kernel: Kernel::detect(),
            quiet: common.json,
            event_pages: EventBuffer::DEFAULT_PAGES,
            duration,
        })
    }

    /// The event buffer of what `--ebpf` prints: a ring buffer where the
    /// running kernel has one or cannot be read.
    pub fn ebpf_buffer(&self) -> EventBuffer {
        EventBuffer { ring: self.kernel.ringbuf || self.kernel.function_count() == 0, ..self.event_buffer() }
    }

    /// The event buffer the program is compiled with and read from.
    pub fn event_buffer(&self) -> EventBuffer {
        EventBuffer { ring: self.kernel.ringbuf, pages: self.event_pages }
    }

    /// With `--ebpf`: print the program and return true (the tool then
    /// ends). The program is rendered only then.
    pub fn ebpf(&self, program: impl FnOnce(&Kernel) -> Result<String>) -> Result<bool> {
        if !self.common.ebpf {
            return Ok(false);
        }
        println!("{}", program(&self.kernel)?);
        Ok(true)
    }

    /// Root, the kernel's types (BTF or headers), and with `need_iscsi` the
    /// iSCSI initiator modules.
    pub fn preflight(&self, need_iscsi: bool) -> Result<()> {
        runner::preflight(&self.kernel, need_iscsi)
    }

    /// Say what the program needs to (notes always, the rest with `-v`).
    pub fn announce(&self, p: &Program) {
        if self.common.verbose {
            for l in &p.describe {
                eprintln!("{l}");
            }
            for probe in &p.probes {
                eprintln!("probe {}", probe.describe());
            }
        }
        for n in &p.notes {
            eprintln!("{}: note: {n}", self.tool);
        }
    }

    /// Announce, compile, let `setup` fill the tool's maps, attach.
    pub fn load(&self, p: &Program, setup: impl FnOnce(&mut BPF) -> Result<()>) -> Result<(BPF, Links)> {
        self.announce(p);
        let (bpf, links) = self.try_load(p, setup)?;
        Ok((bpf, links?))
    }

    /// As [`Startup::load`] without announcing, and with the attach's
    /// result apart, for a tool that falls back to other probes when the
    /// kernel refuses these.
    pub fn try_load(&self, p: &Program, setup: impl FnOnce(&mut BPF) -> Result<()>) -> Result<(BPF, Result<Links>)> {
        let mut bpf = runner::compile(&self.kernel, &p.text)?;
        setup(&mut bpf)?;
        let links = runner::attach(&mut bpf, &p.probes, &p.targets);
        Ok((bpf, links))
    }

    /// The program's event buffer: its ring buffer, or its perf buffer
    /// where the kernel has no ring buffer.
    pub fn events(&self, bpf: &BPF) -> Result<Events> {
        Events::open(bpf, self.event_buffer())
    }

    /// Install the stop conditions (Ctrl-C, SIGTERM, `--duration`) and say
    /// "Tracing `what`... Hit Ctrl-C to end." (on stderr when quiet).
    pub fn trace(&self, what: &str) -> Result<Tracer> {
        let stop = Stop::install(self.duration)?;
        let mut out = Out::new();
        output::status(self.quiet, &mut out, &format!("Tracing {what}... Hit Ctrl-C to end."));
        Ok(Tracer { stop, out, quiet: self.quiet })
    }
}

impl Tracer {
    /// The exit summary (on stderr with `--json`).
    pub fn finish(&mut self, lines: &[String]) {
        output::summary(self.quiet, &mut self.out, lines);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_pages() {
        let b = |p| BufferFlag { buffer_pages: p }.pages();
        assert_eq!(b(None).unwrap(), 256);
        assert_eq!(b(Some(1)).unwrap(), 1);
        assert_eq!(b(Some(65536)).unwrap(), 65536);
        for bad in [0, 3, 1000, 131072] {
            assert_eq!(
                b(Some(bad)).unwrap_err().to_string(),
                "-b/--buffer-pages must be a power of two from 1 to 65536"
            );
        }
    }
}
