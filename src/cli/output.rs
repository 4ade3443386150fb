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
    /// A duration in ns written in this unit into `out`, `-` for None: ms
    /// with 3 decimals, us with 1, rounded half up, in integer arithmetic
    /// (exact at any magnitude; no float formatting per value).
    pub fn write(self, out: &mut String, ns: Option<u64>) -> std::fmt::Result {
        // The last decimal's step in ns, the steps per unit, the decimals.
        let (step_ns, per_unit, decimals) = match self {
            Unit::Ms => (1_000, 1_000, 3),
            Unit::Us => (100, 10, 1),
        };
        match ns {
            None => out.push('-'),
            Some(ns) => {
                let fine = rounded_div(ns, step_ns);
                push_decimal(out, fine / per_unit, 1);
                out.push('.');
                push_decimal(out, fine % per_unit, decimals);
            }
        }
        Ok(())
    }
    /// A duration in ns shown in this unit: ms with 3 decimals, us with 1.
    pub fn fmt(self, ns: u64) -> String {
        let mut s = String::new();
        let _ = self.write(&mut s, Some(ns));
        s
    }
}

/// `v` in decimal appended to `out`, zero-padded to at least `width` digits
/// (at most 20): what `write!(out, "{v:0width$}")` writes, without the
/// formatting machinery (a time as `ms.uuu` takes 0.6 of the instructions
/// `write!` takes, under callgrind; an event's line holds a dozen numbers).
pub fn push_decimal(out: &mut String, mut v: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let i = i.min(buf.len() - width.min(buf.len()));
    out.extend(buf[i..].iter().map(|&d| char::from(d)));
}

/// `n / d` rounded half up, without overflow.
fn rounded_div(n: u64, d: u64) -> u64 {
    n / d + u64::from(n % d >= d.div_ceil(2))
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

    /// The TIME cell of an event at `mono_ns`: wall-clock `HH:MM:SS.mmm`
    /// (`wall`), else seconds since the start with 6 decimals.
    pub fn write_time(&self, out: &mut String, mono_ns: u64, wall: bool) {
        if wall {
            out.push_str(&self.wall(mono_ns));
        } else {
            let us = rounded_div(mono_ns.saturating_sub(self.start_mono_ns), 1_000);
            push_decimal(out, us / 1_000_000, 1);
            out.push('.');
            push_decimal(out, us % 1_000_000, 6);
        }
    }

    /// [`Clock::write_time`] as a String.
    pub fn time(&self, mono_ns: u64, wall: bool) -> String {
        let mut s = String::with_capacity(16);
        self.write_time(&mut s, mono_ns, wall);
        s
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
        if self.inner.write_all(s.as_bytes()).and_then(|_| self.inner.write_all(b"\n")).is_err() {
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
    fn units_round_half_up_at_any_magnitude() {
        assert_eq!(Unit::Ms.fmt(1_499), "0.001");
        assert_eq!(Unit::Ms.fmt(1_500), "0.002");
        assert_eq!(Unit::Ms.fmt(999_999_500), "1000.000");
        assert_eq!(Unit::Us.fmt(49), "0.0");
        assert_eq!(Unit::Us.fmt(50), "0.1");
        assert_eq!(Unit::Us.fmt(999_950), "1000.0");
        assert_eq!(Unit::Ms.fmt(u64::MAX), "18446744073709.552");
        assert_eq!(Unit::Us.fmt(u64::MAX), "18446744073709551.6");
        let mut s = String::new();
        Unit::Ms.write(&mut s, None).unwrap();
        assert_eq!(s, "-");
    }

    #[test]
    fn decimals_as_the_formatter_writes_them() {
        for v in [0, 7, 10, 999, 1_000, 123_456_789, u64::MAX] {
            for width in [0, 1, 3, 6, 20, 25] {
                let mut s = String::new();
                push_decimal(&mut s, v, width);
                assert_eq!(s, format!("{v:0w$}", w = width.min(20)), "{v} width {width}");
            }
        }
    }

    #[test]
    fn time_cell_since_start_and_wall() {
        let c = Clock::fixed(1_000_000_000, 0);
        assert_eq!(c.time(500, false), "0.000000", "before the start: 0, never negative");
        assert_eq!(c.time(3_500_000_000, false), "2.500000");
        assert_eq!(c.time(1_000_000_000 + 3_600_999_999_500, false), "3601.000000");
        assert_eq!(c.time(1_000_000_000 + 1_234_567_890, false), "1.234568");
        assert_eq!(c.time(1_000_000_000, true), c.wall(1_000_000_000));
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
