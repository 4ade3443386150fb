//! Printing: time units, timestamps, and a stdout that ends quietly when the
//! reader goes away (`tool | head -3` exits 0, no broken-pipe panic).

use std::io::{self, Write};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ms,
    Us,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::Ms => "ms",
            Unit::Us => "us",
        }
    }
    /// A duration in ns written in this unit into `out`, `-` for None.
    pub fn write(self, out: &mut String, ns: Option<u64>) -> std::fmt::Result {
        use std::fmt::Write;
        match (self, ns) {
            (_, None) => write!(out, "-"),
            (Unit::Ms, Some(ns)) => write!(out, "{:.3}", ns as f64 / 1e6),
            (Unit::Us, Some(ns)) => write!(out, "{:.1}", ns as f64 / 1e3),
        }
    }
    /// A duration in ns shown in this unit: ms with 3 decimals, us with 1.
    pub fn fmt(self, ns: u64) -> String {
        let mut s = String::new();
        let _ = self.write(&mut s, Some(ns));
        s
    }
}

/// Converts bpf_ktime_get_ns() (CLOCK_MONOTONIC) to times people read.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start_mono_ns: u64,
    wall_minus_mono_ns: i128,
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Clock {
    pub fn start() -> Clock {
        let mono = monotonic_ns();
        let wall = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0) as i128;
        Clock { start_mono_ns: mono, wall_minus_mono_ns: wall - mono as i128 }
    }

    #[cfg(test)]
    pub fn fixed(start_mono_ns: u64, wall_at_start_ns: i128) -> Clock {
        Clock { start_mono_ns, wall_minus_mono_ns: wall_at_start_ns - start_mono_ns as i128 }
    }

    /// Seconds since the tool started (never negative).
    pub fn since_start(&self, mono_ns: u64) -> f64 {
        mono_ns.saturating_sub(self.start_mono_ns) as f64 / 1e9
    }

    /// Local wall-clock `HH:MM:SS.mmm`.
    pub fn wall(&self, mono_ns: u64) -> String {
        let ns = mono_ns as i128 + self.wall_minus_mono_ns;
        let t = chrono::DateTime::from_timestamp((ns / 1_000_000_000) as i64, (ns % 1_000_000_000) as u32)
            .unwrap_or_default();
        t.with_timezone(&chrono::Local).format("%H:%M:%S%.3f").to_string()
    }

    pub fn start_mono_ns(&self) -> u64 {
        self.start_mono_ns
    }
}

/// Buffered stdout, written out by `flush`: the print loops flush after each
/// batch of events (at least every 100 ms) rather than once per line, which
/// costs a write(2) per command with `-u 0`. `line` returns false once the
/// reader has gone.
pub struct Out {
    inner: io::BufWriter<io::Stdout>,
    closed: bool,
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

impl Out {
    pub fn new() -> Out {
        Out { inner: io::BufWriter::with_capacity(1 << 16, io::stdout()), closed: false }
    }
    pub fn line(&mut self, s: &str) -> bool {
        if self.closed {
            return false;
        }
        if writeln!(self.inner, "{s}").is_err() {
            self.closed = true;
        }
        !self.closed
    }
    pub fn closed(&self) -> bool {
        self.closed
    }
    pub fn flush(&mut self) {
        if !self.closed && self.inner.flush().is_err() {
            self.closed = true;
        }
    }
}

/// Status text goes to stderr with --json (so stdout stays pure JSON), else stdout.
pub fn status(json: bool, out: &mut Out, s: &str) {
    if json {
        eprintln!("{s}");
    } else {
        out.line(s);
        out.flush();
    }
}

/// The exit summary: after a blank line on stdout, or on stderr with --json.
pub fn summary(json: bool, out: &mut Out, lines: &[String]) {
    if json {
        for l in lines {
            eprintln!("{l}");
        }
    } else if !out.closed() {
        out.line("");
        for l in lines {
            out.line(l);
        }
        out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(Unit::Ms.fmt(12_345_678), "12.346");
        assert_eq!(Unit::Us.fmt(12_345_678), "12345.7");
        assert_eq!(Unit::Ms.fmt(0), "0.000");
        assert_eq!(Unit::Us.label(), "us");
    }

    #[test]
    fn clock_never_goes_negative() {
        let c = Clock::fixed(1_000_000_000, 0);
        assert_eq!(c.since_start(500), 0.0);
        assert_eq!(c.since_start(3_500_000_000), 2.5);
        let w = c.wall(1_000_000_000);
        assert_eq!(w.len(), "00:00:00.000".len());
        assert!(w.ends_with(":00.000"), "{w}");
    }
}
