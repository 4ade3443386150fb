//! One error type for every tool. Errors travel as values up to `main`, which
//! prints one line and exits: 2 for the user's mistakes, 1 for what the
//! machine or the kernel cannot give (see [`Error`]).

use std::fmt;

/// What failed. Exit status 2 for the user's mistakes (`Usage`, `Filter`),
/// 1 for everything the machine or the kernel cannot give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A flag's value or a combination of flags that cannot be.
    Usage(String),
    /// A filter that names nothing or does not parse: an unknown session,
    /// connection, LUN or disk, a bad regular expression.
    Filter(String),
    /// Not run as root.
    NotRoot,
    /// Neither kernel BTF nor kernel headers give the types a program reads.
    KernelTypes(String),
    /// The iSCSI initiator modules are not loaded.
    NoIscsiModules,
    /// No iSCSI session is logged in, or none has a disk.
    NoSessions(String),
    /// The running kernel has no probe point for something a tool needs.
    MissingProbe(String),
    /// The BPF program did not compile, load or attach, or a map did not
    /// answer as the program defines it.
    Bpf(String),
    /// A file or interface of the system could not be read or written.
    Io(String),
    /// A template and the values given for it disagree: a defect of the tool.
    Template(String),
}

/// The result of everything that can fail in this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A bad flag value or combination.
    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }
    /// A filter that names nothing or does not parse.
    pub fn filter(msg: impl Into<String>) -> Self {
        Error::Filter(msg.into())
    }
    /// A system file or interface that could not be read or written.
    pub fn io(msg: impl Into<String>) -> Self {
        Error::Io(msg.into())
    }
    /// The BPF program or its maps failed.
    pub fn bpf(msg: impl Into<String>) -> Self {
        Error::Bpf(msg.into())
    }
    /// The kernel types a program reads are not to be had.
    pub fn kernel_types(msg: impl Into<String>) -> Self {
        Error::KernelTypes(msg.into())
    }
    /// No kernel headers where BCC looks for them, and no BTF to use instead.
    pub fn no_headers(path: &str) -> Self {
        Error::KernelTypes(format!(
            "kernel headers not found at {path}: install linux-headers-$(uname -r) (Debian/Ubuntu) or kernel-devel (RHEL), or point BCC_KERNEL_SOURCE at them"
        ))
    }
    /// No iSCSI session is logged in.
    pub fn no_sessions() -> Self {
        Error::NoSessions("no iSCSI session is logged in: log in with iscsiadm -m node -T <iqn> -p <portal> -l".into())
    }
    /// The running kernel can trace none of `candidates`, which carry `what`.
    pub fn missing_probe(what: &str, candidates: &[&str]) -> Self {
        Error::MissingProbe(format!(
            "this kernel offers no probe point for {what} (none of {} is traceable)",
            candidates.join(", ")
        ))
    }
    /// 2: the user's mistake; 1: the machine's.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) | Error::Filter(_) => 2,
            _ => 1,
        }
    }
    /// The one line said to the user.
    pub fn message(&self) -> &str {
        match self {
            Error::NotRoot => "must be run as root (eBPF programs need CAP_BPF and CAP_PERFMON): try sudo",
            Error::NoIscsiModules => {
                "iSCSI initiator modules are not loaded (no /sys/module/libiscsi): modprobe iscsi_tcp and log in to a target with iscsiadm"
            }
            Error::Usage(m)
            | Error::Filter(m)
            | Error::KernelTypes(m)
            | Error::NoSessions(m)
            | Error::MissingProbe(m)
            | Error::Bpf(m)
            | Error::Io(m)
            | Error::Template(m) => m,
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
        Error::bpf(format!("bcc: {e}"))
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
        assert_eq!(Error::filter("x").exit_code(), 2);
        assert_eq!(Error::NotRoot.exit_code(), 1);
        assert!(Error::NotRoot.to_string().contains("root"));
        assert_eq!(Error::NoIscsiModules.exit_code(), 1);
        assert!(Error::no_headers("/lib/modules/x/build").to_string().contains("linux-headers"));
        assert!(Error::missing_probe("dispatch", &["a", "b"]).to_string().contains("a, b"));
    }
}
