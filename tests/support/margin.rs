//! Timing judgments under emulation. Each prints its margin on one line,
//!   MARGIN <test> <check> value=<v> bound=<lo>..<hi> margin=<p>%
//! (p: the distance to the nearer bound as a share of that bound, negative
//! outside), which tests/all's summary ranks; a failed one panics through
//! `timing`, whose message starts with "statistical: ": tests/lab/suite runs
//! such a test once more and the second try decides. Counts, attributions,
//! fields and states are judged with plain asserts and never rerun.

/// The prefix tests/lab/suite looks for in a panic message.
pub const STATISTICAL: &str = "statistical: ";

fn test_name() -> String {
    std::thread::current().name().unwrap_or("main").to_string()
}

fn share(left: f64, bound: f64) -> f64 {
    if bound.is_infinite() {
        f64::INFINITY
    } else if bound == 0.0 {
        if left >= 0.0 {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        }
    } else {
        100.0 * left / bound.abs()
    }
}

/// Whether `value` lies in `lo..=hi` (either may be infinite); prints its
/// MARGIN line. `check` names what is judged, without spaces.
pub fn within(check: &str, value: f64, lo: f64, hi: f64) -> bool {
    let m = share(value - lo, lo).min(share(hi - value, hi));
    println!(
        "MARGIN {} {} value={value:.4} bound={lo:.4}..{hi:.4} margin={m:.1}%",
        test_name(),
        check.replace(' ', "_")
    );
    (lo..=hi).contains(&value)
}

pub fn at_most(check: &str, value: f64, hi: f64) -> bool {
    within(check, value, f64::NEG_INFINITY, hi)
}

pub fn at_least(check: &str, value: f64, lo: f64) -> bool {
    within(check, value, lo, f64::INFINITY)
}

/// Fails the test as statistical (rerun once) unless `ok`.
pub fn timing(ok: bool, why: impl std::fmt::Display) {
    if !ok {
        panic!("{STATISTICAL}{why}");
    }
}

/// Nanoseconds as milliseconds, for judgments and messages: a count (u64),
/// or a mean or a change, which may be negative (f64).
pub fn ms(ns: impl Nanos) -> f64 {
    ns.nanos() / 1e6
}

/// A number of nanoseconds, as `ms` takes it.
pub trait Nanos {
    fn nanos(self) -> f64;
}

impl Nanos for u64 {
    fn nanos(self) -> f64 {
        self as f64
    }
}

impl Nanos for f64 {
    fn nanos(self) -> f64 {
        self
    }
}
