//! What each tool chooses on the running kernel, from real runs: each tool
//! is started with -v, must compile, attach and print its Tracing line, and
//! its probe choices and notes are printed as `CAPS |` table rows, which
//! tests/all collects into target/lab/capabilities.md for the README.
//! iscstates' row comes from its own test (tests/lab_states.rs), which
//! every suite runs: one tool start fewer.

// The tests/support modules this binary uses: public, so what it leaves unused
// of one is not dead code; a module it does not use at all is an unused import.
pub mod support {
    pub mod caps;
    pub mod lab;
    pub mod tools;
}

use std::path::PathBuf;
use std::time::Duration;
use storprototrace::bpf::{runner, templates};
use storprototrace::kernel::headers::{self, BlockLayout, ScsiLayout};
use storprototrace::kernel::{btf::Loaded, types as kernel_types, Kernel};
use storprototrace::stages;
use support::{caps::*, lab::*, tools::*};

#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn every_tool_starts_and_reports_its_probe_points() {
    let _lab = lab();
    let tools: [(&str, &[&str]); 4] = [
        ("isclatency", &["-v", "--json", "-m", "1000"]),
        ("iscstat", &["-v", "--json", "5"]),
        ("iscfreeze", &["-v", "--json"]),
        ("submitslower", &["-v", "--json", "--iscsi"]),
    ];
    let started: Vec<_> = tools.iter().map(|(t, _)| t).zip(start_together(&tools)).collect();
    std::thread::sleep(Duration::from_secs(1));
    for (tool, t) in started {
        let out = t.stop();
        assert!(out.status.success(), "{tool}: {}", out.stderr);
        let (probes, row) = caps_row(tool, &out.stderr);
        assert!(!probes.is_empty(), "{tool} -v named no probe: {}", out.stderr);
        if ["isclatency", "iscstat"].contains(tool) {
            // The stage probes are fentry/fexit wherever the iSCSI modules
            // have BTF (and the kernel a ring buffer), kprobes elsewhere.
            let module_btf = std::path::Path::new("/sys/kernel/btf/libiscsi").exists();
            assert_eq!(
                probes.iter().all(|p| p.starts_with("fentry:") || p.starts_with("fexit:")),
                module_btf,
                "{tool}: {probes:?}"
            );
        }
        // Kernel types come from BTF wherever the kernel has it for every
        // type read: vmlinux for the block tools, the modules for the others.
        let btf = std::path::Path::new(if ["isclatency", "iscstat"].contains(tool) {
            "/sys/kernel/btf/libiscsi"
        } else {
            "/sys/kernel/btf/vmlinux"
        })
        .exists();
        assert_eq!(out.stderr.contains("kernel types from BTF"), btf, "{tool}: {}", out.stderr);
        println!("{row}");
    }
}
/// The kernel types the templates read, written from `btf` (the iSCSI
/// modules' where they have BTF, vmlinux's), each tool's layout the same as
/// the headers', and the socket offsets the stage programs take from BTF as
/// numbers: the `_Static_assert`s of all of them, and what was compared.
fn btf_asserts(
    mut btf: Loaded,
    dirs: Vec<PathBuf>,
    stage_parts: &[Vec<&str>],
    block_parts: &[Vec<&str>],
) -> (String, Vec<&'static str>) {
    let mut asserts = String::new();
    let mut compared = Vec::new();
    for parts in stage_parts {
        match kernel_types::from_btf(&mut btf, parts, kernel_types::ISCSI_MODULES) {
            Ok(t) => {
                assert_eq!(ScsiLayout::from_types(&t).unwrap(), ScsiLayout::from_headers(&dirs).unwrap());
                asserts.push_str(&t.text);
                compared.push("SCSI/iSCSI");
            }
            // Without module BTF (5.10) the types are not written: the headers are used.
            Err(why) => {
                assert!(!std::path::Path::new("/sys/kernel/btf/libiscsi").exists(), "module BTF present, yet: {why}")
            }
        }
    }
    let from_headers = BlockLayout::from_headers(&dirs).unwrap();
    for (i, parts) in block_parts.iter().enumerate() {
        let t = kernel_types::from_btf(&mut btf, parts, &[])
            .unwrap_or_else(|why| panic!("vmlinux BTF present, yet: {why}"));
        let l = BlockLayout::from_types(&t);
        // Each tool's types say what it reads: the queue (iscfreeze), the bio (submitslower).
        if i == 0 {
            assert_eq!(
                (l.queue_disk, l.quiesce_depth),
                (from_headers.queue_disk, from_headers.quiesce_depth),
                "iscfreeze"
            );
        } else {
            assert_eq!(l.bio_bdev, from_headers.bio_bdev, "submitslower");
        }
        asserts.push_str(&t.text);
        compared.push("block");
    }
    // The socket's member offsets the stage programs take from vmlinux's
    // BTF as numbers (kernel_types::NET_MEMBERS), on the headers path too.
    let net = kernel_types::net_offsets(&mut btf).unwrap_or_else(|why| panic!("vmlinux BTF present, yet: {why}"));
    for ((_, s, m), o) in kernel_types::NET_MEMBERS.iter().zip(net) {
        asserts.push_str(&format!("_Static_assert(__builtin_offsetof(struct {s}, {m}) == {o}, \"{s}.{m}\");\n"));
    }
    compared.push("socket");
    (asserts, compared)
}

/// Compile `text`, the headers and then the checks; where 7.x's linux/tcp.h
/// does not compile with this libbcc, the same without it and without the
/// checks of struct tcp_sock. How many checks were compiled.
fn compile_checks(kernel: &Kernel, text: &str, includes: &[&str], checks: &[&str]) -> usize {
    let mut checked = checks.len();
    if let Err(e) = runner::compile(kernel, text) {
        // 7.x's linux/tcp.h pulls in a linux/bpf.h that needs a newer uapi
        // bpf.h than libbcc bundles (BPF_TRACE_FENTRY_MULTI, BPF_F_CPU...):
        // there the tcp_sock offsets are checked only by the asserts in the
        // program itself (from BTF). Said, and everything else still checked.
        let tcp = |l: &&str| l.contains("linux/tcp.h") || l.contains("struct tcp_sock");
        let (inc, chk): (Vec<&str>, Vec<&str>) = (
            includes.iter().copied().filter(|l| !tcp(l)).collect(),
            checks.iter().copied().filter(|l| !tcp(l)).collect(),
        );
        let text2 =
            format!("{}\n{}\nint kernel_types_check(void *ctx) {{ return 0; }}\n", inc.join("\n"), chk.join("\n"));
        runner::compile(kernel, &text2)
            .unwrap_or_else(|e2| panic!("the headers disagree with BTF: {e2}\n(with linux/tcp.h: {e})\n{text2}"));
        println!(
            "kernel {}: NOTE: linux/tcp.h does not compile with this libbcc ({e}); compared without struct tcp_sock",
            kernel.release
        );
        checked = chk.len();
    }
    checked
}

/// The kernel types written from BTF against the kernel's own headers: one
/// compile of every header the templates include, with every offset and
/// size the BTF types assert, and the socket offsets the stage programs
/// take from BTF as numbers; and the same layout choices both ways.
#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn kernel_types_agree_with_the_headers() {
    let _lab = lab();
    let mut kernel = Kernel::detect();
    kernel.cflags.push("-w".into()); // the kernel headers' own warnings (pages of them on 7.3)
    let dirs = headers::header_dirs(&kernel);
    let Ok(btf) = Loaded::open(&kernel.btf_dir) else {
        println!("kernel {}: no BTF, the headers are compiled: nothing to compare", kernel.release);
        return;
    };
    let stage_parts = [stages::parts(templates::ISCLATENCY).to_vec(), stages::parts(templates::ISCSTAT).to_vec()];
    let block_parts = [storprototrace::freeze::PARTS.to_vec(), vec![templates::COMMON, templates::SUBMITSLOWER]];
    let (asserts, compared) = btf_asserts(btf, dirs, &stage_parts, &block_parts);
    // The headers every template includes, then only the assertions.
    let mut includes: Vec<&str> = Vec::new();
    for part in stage_parts.iter().chain(&block_parts).flatten() {
        for l in part.lines().filter(|l| l.starts_with("#include")) {
            if !includes.contains(&l) {
                includes.push(l);
            }
        }
    }
    let checks: Vec<&str> = asserts.lines().filter(|l| l.starts_with("_Static_assert")).collect();
    let text =
        format!("{}\n{}\nint kernel_types_check(void *ctx) {{ return 0; }}\n", includes.join("\n"), checks.join("\n"));
    let t0 = std::time::Instant::now();
    let checked = compile_checks(&kernel, &text, &includes, &checks);
    println!(
        "kernel {}: {checked} offsets and sizes from BTF ({}) agree with the headers (compiled in {:.1} s)",
        kernel.release,
        compared.join(", "),
        t0.elapsed().as_secs_f64()
    );
}

/// The stage tools read a command's start on one CPU and its end on
/// another: the guest's clock (CLOCK_MONOTONIC, bpf_ktime_get_ns's) must
/// never step back between CPUs, whichever clocksource the lab booted on
/// (tests/lab/run --clock: the TSC by default, as real hosts run).
#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn guest_clock_never_steps_back_between_cpus() {
    let _lab = lab();
    let cmdline = std::fs::read_to_string("/proc/cmdline").expect("read /proc/cmdline");
    let current = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .expect("read the current clocksource");
    if let Some(asked) = cmdline.split_whitespace().find_map(|w| w.strip_prefix("clocksource=")) {
        assert_eq!(current.trim(), asked, "booted with clocksource={asked}, running on {current}");
    }
    let check = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/clock-check");
    let out = std::process::Command::new(check).arg("100000").output().expect("run tests/lab/clock-check");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(" 0 steps back"), "{text}");
    // Every read on the CPU its thread was pinned to: each handoff crossed CPUs.
    assert!(text.contains(", 100000 reads on the pinned CPUs over 100000 handoffs"), "{text}");
}
