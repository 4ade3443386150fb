//! Command-line pieces every tool shares: parsing with one-line errors,
//! thresholds, and the options every tool has. Session filters are in
//! src/stages/filters.rs.

pub mod json;
pub mod output;
pub mod textfile;

use crate::cli::output::Unit;
use crate::error::{Error, Result};
use clap::{Args, Parser};

/// Parse arguments; usage errors become one line (exit 2), --help and
/// --version print and exit 0.
pub fn parse<T: Parser>() -> Result<T> {
    // A reader that goes away (`| head`) ends the tool quietly, as it ends
    // a C tool, instead of a panic in println!.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    T::try_parse().map_err(|e| {
        use clap::error::ErrorKind;
        match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let _ = e.print();
                std::process::exit(0);
            }
            _ => {
                let text = e.to_string();
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad arguments");
                Error::usage(first.trim_start_matches("error: ").to_string())
            }
        }
    })
}

/// `-m MIN_MS | -u MIN_US`.
#[derive(Args, Debug, Clone, Default)]
pub struct Threshold {
    /// Show only what took MIN_MS milliseconds or more; times in ms
    #[arg(
        short = 'm',
        long = "min-ms",
        value_name = "MIN_MS",
        allow_negative_numbers = true,
        conflicts_with = "min_us"
    )]
    pub min_ms: Option<u64>,
    /// Show only what took MIN_US microseconds or more; times in us (0 = everything)
    #[arg(short = 'u', long = "min-us", value_name = "MIN_US", allow_negative_numbers = true)]
    pub min_us: Option<u64>,
}

impl Threshold {
    /// (threshold in us, display unit); `default_ms` when neither is given.
    pub fn resolve(&self, default_ms: u64) -> Result<(u64, Unit)> {
        const MAX_US: u64 = 3_600_000_000; // one hour
        let (us, unit) = match (self.min_ms, self.min_us) {
            (Some(ms), _) => (ms.saturating_mul(1000), Unit::Ms),
            (None, Some(us)) => (us, Unit::Us),
            (None, None) => (default_ms * 1000, Unit::Ms),
        };
        if us > MAX_US {
            return Err(Error::usage(format!("threshold {us} us is more than an hour")));
        }
        Ok((us, unit))
    }
}

/// Options every tool has.
#[derive(Args, Debug, Clone, Default)]
pub struct Common {
    /// Wall-clock timestamps (HH:MM:SS.mmm) instead of seconds since start
    #[arg(short = 'T', long = "timestamp")]
    pub timestamp: bool,
    /// One JSON object per line (times in ns); status lines go to stderr
    #[arg(long)]
    pub json: bool,
    /// Stop after SECS seconds
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Print the final BPF program and exit (needs neither root nor iSCSI)
    #[arg(long)]
    pub ebpf: bool,
    /// Say which probe points were chosen and why
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

impl Common {
    pub fn duration(&self) -> Result<Option<std::time::Duration>> {
        match self.duration {
            Some(0) => Err(Error::usage("--duration must be at least 1 second")),
            Some(s) => Ok(Some(std::time::Duration::from_secs(s))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_units() {
        assert_eq!(Threshold { min_ms: Some(10), min_us: None }.resolve(10).unwrap(), (10_000, Unit::Ms));
        assert_eq!(Threshold { min_ms: None, min_us: Some(0) }.resolve(10).unwrap(), (0, Unit::Us));
        assert_eq!(Threshold::default().resolve(10).unwrap(), (10_000, Unit::Ms));
        assert!(Threshold { min_ms: Some(u64::MAX), min_us: None }.resolve(10).is_err());
    }
}
