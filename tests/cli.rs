//! Bad input, on any machine (no VM, no iSCSI): one clear line on stderr, a
//! non-zero exit, no panic, and nothing typed by the user in the C text.

// The tests/support modules this binary uses: public, so what it leaves unused
// of one is not dead code; a module it does not use at all is an unused import.
pub mod support {
    pub mod cli;
}

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use support::cli::*;

fn isclatency(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_isclatency"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// isclatency's answer to bad input: support::cli::one_line_error.
fn isclatency_error(out: &Output, code: i32, contains: &str) {
    one_line_error("isclatency", "", out, code, contains);
}

#[test]
fn unknown_flag() {
    isclatency_error(&isclatency(&["--bogus"], &[]), 2, "unexpected argument '--bogus'");
}

#[test]
fn negative_and_non_numeric_thresholds() {
    isclatency_error(&isclatency(&["-m", "-1"], &[]), 2, "invalid value '-1'");
    isclatency_error(&isclatency(&["-m", "abc"], &[]), 2, "invalid value 'abc'");
    isclatency_error(&isclatency(&["-u", "99999999999999"], &[]), 2, "more than an hour");
    isclatency_error(&isclatency(&["-m", "1", "-u", "5"], &[]), 2, "cannot be used with");
}

#[test]
fn bad_regex() {
    isclatency_error(&isclatency(&["--target", "("], &[]), 2, "--target '(': bad regular expression");
    isclatency_error(&isclatency(&["--initiator", "[a-"], &[]), 2, "--initiator '[a-': bad regular expression");
}

#[test]
fn injection_attempt_is_not_a_number() {
    isclatency_error(&isclatency(&["--sid", "1) || (1"], &[]), 2, "invalid value '1) || (1' for '--sid <SID>'");
    isclatency_error(&isclatency(&["--disk", "sda) || (1"], &[]), 2, "not a block device name");
}

#[test]
fn unknown_session_lists_what_exists() {
    // This machine has no iSCSI sessions: the error says so.
    isclatency_error(&isclatency(&["--sid", "99"], &[]), 2, "--sid 99 matches no iSCSI session (sessions: none)");
    isclatency_error(&isclatency(&["--disk", "sdq"], &[]), 2, "--disk sdq matches no iSCSI session");
}

#[test]
fn buffer_pages_must_be_a_power_of_two() {
    for bad in ["0", "3", "131072"] {
        isclatency_error(&isclatency(&["-b", bad], &[]), 2, "-b/--buffer-pages must be a power of two from 1 to 65536");
    }
}

#[test]
fn issuer_and_cgroup_flags() {
    isclatency_error(&isclatency(&["--cgroup", "system.slice", "--tur", "1"], &[]), 2, "--tur cannot be used with");
    let out = isclatency(&["--ebpf", "-I"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("#define ISSUER 1\n") && text.contains("int issuer_getrq("),
        "-I compiles the issuer's program"
    );
    assert!(text.contains("#define FILTER_CGROUP 0\n"));
    let out = isclatency(&["--ebpf"], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("#define ISSUER 0\n"), "no issuer without -I");
}

#[test]
fn zero_duration() {
    isclatency_error(&isclatency(&["--duration", "0"], &[]), 2, "--duration must be at least 1 second");
}

#[test]
fn missing_headers() {
    if unsafe { libc::geteuid() } != 0 {
        return isclatency_error(&isclatency(&[], &[]), 1, "must be run as root");
    }
    isclatency_error(
        &isclatency(&[], &[("BCC_KERNEL_SOURCE", "/nonexistent/headers")]),
        1,
        "kernel headers not found at /nonexistent/headers",
    );
}

#[test]
fn not_root() {
    // Drop to nobody with setpriv (util-linux) when we are root.
    let out = if unsafe { libc::geteuid() } == 0 {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_isclatency"), "-m", "10"])
            .output()
            .expect("setpriv")
    } else {
        isclatency(&["-m", "10"], &[])
    };
    isclatency_error(&out, 1, "must be run as root");
}

#[test]
fn ebpf_prints_the_program_without_root_or_iscsi() {
    let out = isclatency(&["--ebpf", "-m", "7", "-r", "--lun", "3", "-b", "8"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("#define MIN_NS (7000LL * 1000ULL)"), "threshold substituted");
    assert!(text.contains("#define EVENT_PAGES 8LL "), "-b substituted");
    assert!(text.contains("#define FILTER_DIR 1LL"));
    assert!(text.contains("#define FILTER_LUN 1") && text.contains("#define FILTER_LUN_VALUE 3LL"));
    assert!(!text.contains("{{"), "placeholder left in the program");
    assert!(text.contains("int stages_complete("));
}

/// Run iscstat unprivileged: as nobody when we are root.
fn iscstat_as_nobody(args: &[&str]) -> Output {
    as_nobody(env!("CARGO_BIN_EXE_iscstat"), args)
}

#[test]
fn iscstat_ebpf_prints_the_program_without_root_or_iscsi() {
    let out = iscstat_as_nobody(&["--ebpf", "-L", "-D", "-r", "--lun", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "#define PER_LUN 1",
        "#define PER_DIR 1",
        "#define PROM 0",
        "#define FILTER_DIR 1",
        "#define FILTER_LUN 1",
        "#define FILTER_LUN_VALUE 3LL",
    ] {
        assert!(text.contains(want), "{want:?} missing from the program");
    }
    assert!(
        text.contains("int stages_complete(") || text.contains("int fentry_complete("),
        "no completion function in the program"
    );
    assert!(!text.contains("{{"), "placeholder left in the program");

    // --prom-file: iscstat checks at start, as the user it runs as, that it
    // can write next to PATH; the program then splits rows per LUN and
    // direction (the metrics' labels) even without -L and -D. The directory
    // is in /tmp (not $TMPDIR, which nobody may not reach) and world-writable.
    let dir = tempfile::Builder::new().prefix("iscstat-cli-").tempdir_in("/tmp").expect("temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let prom = dir.path().join("x.prom");
    let out = iscstat_as_nobody(&["--ebpf", "--prom-file", prom.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["#define PROM 1", "#define PER_LUN 1", "#define PER_DIR 1"] {
        assert!(text.contains(want), "--prom-file: {want:?} missing from the program");
    }
    assert!(!text.contains("{{"), "placeholder left in the program");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "--ebpf writes no metrics and removes its write probe: {left:?}");

    // --by-cgroup: rows keyed by the issuer's cgroup, at most N of them.
    let out = iscstat_as_nobody(&["--ebpf", "--by-cgroup", "--cgroup-rows", "5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["#define PER_CGROUP 1\n", "#define CGROUP_ROWS 5LL\n", "#define ISSUER 1\n", "int issuer_getrq("] {
        assert!(text.contains(want), "--by-cgroup: {want:?} missing from the program");
    }
    // The default the help and the man page state.
    let out = iscstat_as_nobody(&["--ebpf", "--by-cgroup"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("#define CGROUP_ROWS 32LL\n"));
}

#[test]
fn help_has_examples() {
    let out = isclatency(&["--help"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("examples:") && text.contains("isclatency -m 1"));
    assert!(text.contains("R2Ts"), "help says writes include R2T time");
}

#[test]
fn iscstat_bad_input() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_iscstat")).args(args).output().unwrap();
    for (args, want) in [
        (&["0"][..], "interval must be at least 1 second"),
        (&["1", "0"][..], "count must be at least 1"),
        (&["-1"][..], "unexpected argument '-1'"),
        (&["abc"][..], "invalid value 'abc'"),
        (&["--sid", "99"][..], "--sid 99 matches no iSCSI session"),
        (&["--target", "("][..], "bad regular expression"),
        (&["--cgroup-rows", "4"][..], "--cgroup-rows needs --by-cgroup"),
        (&["--by-cgroup", "--cgroup-rows", "0"][..], "0 is not in 1..=1024"),
        (&["--by-cgroup", "--cgroup-rows", "9;x"][..], "invalid value '9;x'"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err:?}");
        assert!(err.starts_with("iscstat: error: ") && err.contains(want), "{args:?}: {err:?}");
    }
}

/// `--listen`: the address is checked, then bound before anything else, so
/// a bad, taken or privileged port is one line and a non-zero exit.
#[test]
fn iscstat_listen_bad_input() {
    let check = |out: Output, code: i32, want: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{err}");
        assert_eq!(err.lines().count(), 1, "{err:?}");
        assert!(err.starts_with("iscstat: error: ") && err.contains(want), "{err:?} lacks {want:?}");
        assert!(!err.contains("panicked"));
    };
    for bad in ["host:9464", "99999", "0", "1.2.3.4"] {
        check(iscstat_as_nobody(&["--listen", bad]), 2, &format!("--listen '{bad}': "));
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    check(iscstat_as_nobody(&["--listen", &port]), 1, &format!("--listen 127.0.0.1:{port}: cannot listen: "));
    // As an unprivileged user (ip_unprivileged_port_start is 1024 here).
    let start: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .map(|s| s.trim().parse().unwrap_or(1024))
        .unwrap_or(1024);
    if start > 80 {
        check(iscstat_as_nobody(&["--listen", "80"]), 1, "ports below 1024 need root or CAP_NET_BIND_SERVICE");
    } else {
        eprintln!("note: unprivileged users may bind port 80 here (ip_unprivileged_port_start={start}): not checked");
    }
    // A free port and nothing else wrong but the user: the root check.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    check(iscstat_as_nobody(&["--listen", &free]), 1, "must be run as root");
}

#[test]
fn a_closed_pipe_ends_the_tool_quietly() {
    use std::io::Read;
    for tool in [env!("CARGO_BIN_EXE_isclatency"), env!("CARGO_BIN_EXE_iscfreeze")] {
        let mut child = Command::new(tool)
            .arg("--ebpf")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before the tool writes
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert!(!err.contains("panicked"), "{tool}: {err}");
        assert!(
            status.success() || std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGPIPE),
            "{tool}: {status:?} {err}"
        );
    }
}

fn iscstates(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iscstates")).args(args).output().unwrap()
}

fn iscstates_error(args: &[&str], code: i32, contains: &str) {
    let out = iscstates(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "exit status for {args:?}: {err:?}");
    assert_eq!(err.lines().count(), 1, "want one line, got {err:?}");
    assert!(err.starts_with("iscstates: error: ") && err.contains(contains), "{err:?} lacks {contains:?}");
    assert!(!err.contains("panicked") && out.stdout.is_empty(), "{err:?}");
}

#[test]
fn iscstates_bad_input() {
    // No iSCSI session on this machine: a --sid names none.
    iscstates_error(&["--sid", "99"], 2, "--sid 99 matches no iSCSI session (sessions: none)");
    iscstates_error(&["--sid", "-1"], 2, "unexpected argument '-1'");
    iscstates_error(&["--sid", "1) || (1"], 2, "invalid value '1) || (1' for '--sid <SID>'");
    iscstates_error(&["--target", "("], 2, "--target '(': bad regular expression");
    iscstates_error(
        &["--prom-file", "/nonexistent-dir/x.prom"],
        2,
        "--prom-file /nonexistent-dir/x.prom: cannot write in /nonexistent-dir",
    );
    iscstates_error(&["--duration", "0"], 2, "--duration must be at least 1 second");
    iscstates_error(&["--lun", "1"], 2, "unexpected argument '--lun'");
}

#[test]
fn iscstates_ebpf_needs_no_root_and_reads_only_numbers() {
    let out = iscstates(&["--ebpf", "--target", "x\"; evil"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = String::from_utf8_lossy(&out.stdout);
    assert!(c.contains("int conn_error(") && c.contains("int rq_done(") && !c.contains("evil"), "{c}");
}
