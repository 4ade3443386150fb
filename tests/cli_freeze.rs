//! iscfreeze and submitslower: bad input on any machine (no VM, no iSCSI):
//! one clear line on stderr, a non-zero exit, nothing typed by the user in
//! the C text; --ebpf works without root.

// The tests/support modules this binary uses: public, so what it leaves unused
// of one is not dead code; a module it does not use at all is an unused import.
pub mod support {
    pub mod cli;
}

use std::process::{Command, Output};
use support::cli::*;

fn bin(tool: &str) -> &'static str {
    match tool {
        "iscfreeze" => env!("CARGO_BIN_EXE_iscfreeze"),
        "submitslower" => env!("CARGO_BIN_EXE_submitslower"),
        _ => unreachable!(),
    }
}

fn run(tool: &str, args: &[&str]) -> Output {
    Command::new(bin(tool)).args(args).output().unwrap()
}

/// `tool args` fails with one line (support::cli::one_line_error).
fn tool_error(tool: &str, args: &[&str], code: i32, contains: &str) {
    one_line_error(tool, &format!("{tool} {args:?}: "), &run(tool, args), code, contains);
}

#[test]
fn bad_thresholds() {
    for tool in ["iscfreeze", "submitslower"] {
        tool_error(tool, &["-m", "-1"], 2, "invalid value '-1'");
        tool_error(tool, &["-u", "abc"], 2, "invalid value 'abc'");
        tool_error(tool, &["-u", "99999999999999"], 2, "more than an hour");
        tool_error(tool, &["-m", "1", "-u", "5"], 2, "cannot be used with");
        tool_error(tool, &["--duration", "0"], 2, "--duration must be at least 1 second");
        tool_error(tool, &["--bogus"], 2, "unexpected argument '--bogus'");
    }
}

#[test]
fn unknown_disk() {
    for tool in ["iscfreeze", "submitslower"] {
        tool_error(tool, &["--disk", "sdzz"], 2, "--disk sdzz: no such disk");
        tool_error(tool, &["--disk", "sda) || (1"], 2, "not a block device name");
        tool_error(tool, &["--disk", "sdzz", "--ebpf"], 2, "--disk sdzz: no such disk");
    }
}

#[test]
fn conflicting_disk_filters() {
    tool_error("iscfreeze", &["--disk", "sda", "--all-disks"], 2, "--disk and --all-disks cannot be used together");
    tool_error("submitslower", &["--disk", "sda", "--iscsi"], 2, "cannot be used with");
}

#[test]
fn bad_pid() {
    tool_error("submitslower", &["-p", "1) || (1"], 2, "invalid value '1) || (1'");
}

#[test]
fn not_root() {
    for tool in ["iscfreeze", "submitslower"] {
        let out =
            as_nobody(bin(tool), &["--all-disks"].iter().copied().filter(|_| tool == "iscfreeze").collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{tool}: {err}");
        assert!(err.starts_with(&format!("{tool}: error: must be run as root")) && err.lines().count() == 1, "{err:?}");
    }
}

#[test]
fn ebpf_without_root_or_iscsi() {
    let out = as_nobody(bin("iscfreeze"), &["--ebpf", "-m", "7"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("#define MIN_NS (7000LL * 1000ULL)"), "threshold substituted");
    assert!(text.contains("#define FILTER_SET 1"), "iSCSI disks only by default");
    assert!(!text.contains("{{"), "placeholder left");
    for f in ["int freeze_begin(", "int freeze_end(", "int quiesce_begin(", "int wait_return("] {
        assert!(text.contains(f), "{f} missing");
    }
    let out = as_nobody(bin("iscfreeze"), &["--ebpf", "--all-disks"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("#define FILTER_SET 0"));

    let out = as_nobody(bin("submitslower"), &["--ebpf", "-u", "250", "-p", "42", "--iscsi"]);
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
