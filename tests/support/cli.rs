//! Bad input on any machine (no VM, no iSCSI): a tool's one-line error, and
//! running a tool unprivileged.

use std::process::{Command, Output};

/// `out` is `tool`'s answer to bad input: exit status `code`, one line on
/// stderr, "TOOL: error: ..." with `contains` in it, no panic, nothing on
/// stdout. `at` begins the messages of the checks that can name what was
/// run ("" or "TOOL [ARGS]: ").
pub fn one_line_error(tool: &str, at: &str, out: &Output, code: i32, contains: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{at}exit status for {err:?}");
    assert_eq!(err.lines().count(), 1, "{at}want one line, got {err:?}");
    assert!(err.starts_with(&format!("{tool}: error: ")), "{err:?}");
    assert!(err.contains(contains), "{at}{err:?} lacks {contains:?}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"));
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", String::from_utf8_lossy(&out.stdout));
}

/// Run the tool at `bin` unprivileged: as nobody when we are root.
pub fn as_nobody(bin: &str, args: &[&str]) -> Output {
    if unsafe { libc::geteuid() } == 0 {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin])
            .args(args)
            .output()
            .expect("setpriv")
    } else {
        Command::new(bin).args(args).output().unwrap()
    }
}
