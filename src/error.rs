//! One error type for every tool. Errors travel as values up to `main`, which
//! prints one line and exits: 2 for bad usage, 1 for an environment problem.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The user asked for something that cannot be: bad flag value, unknown
    /// session, bad regex. Exit status 2.
    Usage(String),
    /// The machine cannot run the tool: not root, no headers, no iSCSI, a
    /// kernel without a needed probe point, a failed compile. Exit status 1.
    Env(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }
    pub fn env(msg: impl Into<String>) -> Self {
        Error::Env(msg.into())
    }
    pub fn not_root() -> Self {
        Error::env("must be run as root (eBPF programs need CAP_BPF and CAP_PERFMON): try sudo")
    }
    pub fn no_headers(path: &str) -> Self {
        Error::env(format!(
            "kernel headers not found at {path}: install linux-headers-$(uname -r) (Debian/Ubuntu) or kernel-devel (RHEL), or point BCC_KERNEL_SOURCE at them"
        ))
    }
    pub fn no_iscsi_modules() -> Self {
        Error::env("iSCSI initiator modules are not loaded (no /sys/module/libiscsi): modprobe iscsi_tcp and log in to a target with iscsiadm")
    }
    pub fn no_sessions() -> Self {
        Error::env("no iSCSI session is logged in: log in with iscsiadm -m node -T <iqn> -p <portal> -l")
    }
    pub fn missing_probe(what: &str, candidates: &[&str]) -> Self {
        Error::env(format!(
            "this kernel offers no probe point for {what} (none of {} is traceable)",
            candidates.join(", ")
        ))
    }
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::Env(_) => 1,
        }
    }
    pub fn message(&self) -> &str {
        match self {
            Error::Usage(m) | Error::Env(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Error {}

impl From<bcc::BccError> for Error {
    fn from(e: bcc::BccError) -> Self {
        Error::env(format!("bcc: {e}"))
    }
}

/// The one place where a tool's error is printed. Never panics, never prints
/// a backtrace.
pub fn exit_with(tool: &str, result: Result<()>) -> ! {
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{tool}: error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_kind() {
        assert_eq!(Error::usage("x").exit_code(), 2);
        assert_eq!(Error::not_root().exit_code(), 1);
        assert!(Error::no_headers("/lib/modules/x/build").to_string().contains("linux-headers"));
        assert!(Error::missing_probe("dispatch", &["a", "b"]).to_string().contains("a, b"));
    }
}
