//! iscfreeze and submitslower: bad input on any machine (no VM, no iSCSI):
//! one clear line on stderr, a non-zero exit, nothing typed by the user in
//! the C text; --ebpf works without root.

use std::process::{Command, Output};

fn run(tool: &str, args: &[&str]) -> Output {
    let bin = match tool {
        "iscfreeze" => env!("CARGO_BIN_EXE_iscfreeze"),
        "submitslower" => env!("CARGO_BIN_EXE_submitslower"),
        _ => unreachable!(),
    };
    Command::new(bin).args(args).output().unwrap()
}

fn one_line_error(tool: &str, args: &[&str], code: i32, contains: &str) {
    let out = run(tool, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{tool} {args:?}: exit status for {err:?}");
    assert_eq!(err.lines().count(), 1, "{tool} {args:?}: want one line, got {err:?}");
    assert!(err.starts_with(&format!("{tool}: error: ")), "{err:?}");
    assert!(err.contains(contains), "{tool} {args:?}: {err:?} lacks {contains:?}");
    assert!(!err.contains("panicked"));
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", String::from_utf8_lossy(&out.stdout));
}

/// Run unprivileged: as nobody when we are root.
fn as_nobody(tool: &str, args: &[&str]) -> Output {
    let bin = match tool {
        "iscfreeze" => env!("CARGO_BIN_EXE_iscfreeze"),
        _ => env!("CARGO_BIN_EXE_submitslower"),
    };
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

#[test]
fn bad_thresholds() {
    for tool in ["iscfreeze", "submitslower"] {
        one_line_error(tool, &["-m", "-1"], 2, "invalid value '-1'");
        one_line_error(tool, &["-u", "abc"], 2, "invalid value 'abc'");
        one_line_error(tool, &["-u", "99999999999999"], 2, "more than an hour");
        one_line_error(tool, &["-m", "1", "-u", "5"], 2, "cannot be used with");
        one_line_error(tool, &["--duration", "0"], 2, "--duration must be at least 1 second");
        one_line_error(tool, &["--bogus"], 2, "unexpected argument '--bogus'");
    }
}

#[test]
fn unknown_disk() {
    for tool in ["iscfreeze", "submitslower"] {
        one_line_error(tool, &["--disk", "sdzz"], 2, "--disk sdzz: no such disk");
        one_line_error(tool, &["--disk", "sda) || (1"], 2, "not a block device name");
        one_line_error(tool, &["--disk", "sdzz", "--ebpf"], 2, "--disk sdzz: no such disk");
    }
}

#[test]
fn conflicting_disk_filters() {
    one_line_error("iscfreeze", &["--disk", "sda", "--all-disks"], 2, "--disk and --all-disks cannot be used together");
    one_line_error("submitslower", &["--disk", "sda", "--iscsi"], 2, "cannot be used with");
}

#[test]
fn bad_pid() {
    one_line_error("submitslower", &["-p", "1) || (1"], 2, "invalid value '1) || (1'");
}

#[test]
fn not_root() {
    for tool in ["iscfreeze", "submitslower"] {
        let out = as_nobody(tool, &["--all-disks"].iter().copied().filter(|_| tool == "iscfreeze").collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{tool}: {err}");
        assert!(err.starts_with(&format!("{tool}: error: must be run as root")) && err.lines().count() == 1, "{err:?}");
    }
}

#[test]
fn ebpf_without_root_or_iscsi() {
    let out = as_nobody("iscfreeze", &["--ebpf", "-m", "7"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("#define MIN_NS (7000LL * 1000ULL)"), "threshold substituted");
    assert!(text.contains("#define FILTER_SET 1"), "iSCSI disks only by default");
    assert!(!text.contains("{{"), "placeholder left");
    for f in ["int freeze_begin(", "int freeze_end(", "int quiesce_begin(", "int wait_return("] {
        assert!(text.contains(f), "{f} missing");
    }
    let out = as_nobody("iscfreeze", &["--ebpf", "--all-disks"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("#define FILTER_SET 0"));

    let out = as_nobody("submitslower", &["--ebpf", "-u", "250", "-p", "42", "--iscsi"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("#define MIN_NS (250LL * 1000ULL)"));
    assert!(text.contains("#define FILTER_PID 1") && text.contains("#define PID_VALUE 42LL"));
    assert!(text.contains("#define FILTER_SET 1") && text.contains("#define FILTER_DEV 0"));
    assert!(!text.contains("{{"));
    assert!(text.contains("int submit_entry(") && text.contains("int submit_return("));
}

#[test]
fn help_has_examples() {
    for (tool, must) in [("iscfreeze", "-U is not implemented"), ("submitslower", "submit_bio_noacct")] {
        let out = run(tool, &["--help"]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("examples:") && text.contains(must), "{tool} --help: {text}");
    }
}
