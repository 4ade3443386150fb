//! What each tool chooses on the running kernel, from real runs: every tool
//! is started with -v, must compile, attach and print its Tracing line, and
//! its probe choices and notes are printed as `CAPS |` table rows, which
//! tests/all collects into target/lab/capabilities.md for the README.

mod support;

use std::time::Duration;
use support::*;

#[test]
#[ignore = "needs the iSCSI lab VM: run tests/all"]
fn every_tool_starts_and_reports_its_probe_points() {
    let _lab = lab();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string();
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
        let mut probes: Vec<String> = Vec::new();
        for l in out.stderr.lines().filter_map(|l| l.strip_prefix("probe ")) {
            let f = l.split(" -> ").next().unwrap_or(l).to_string();
            if !probes.contains(&f) {
                probes.push(f);
            }
        }
        assert!(!probes.is_empty(), "{tool} -v named no probe: {}", out.stderr);
        if ["isclatency", "iscstat"].contains(tool) {
            // The stage probes are fentry/fexit wherever the iSCSI modules
            // have BTF (and the kernel a ring buffer), kprobes elsewhere.
            let module_btf = std::path::Path::new("/sys/kernel/btf/libiscsi").exists();
            assert_eq!(probes.iter().all(|p| p.starts_with("fentry:") || p.starts_with("fexit:")), module_btf, "{tool}: {probes:?}");
        }
        let detail: Vec<&str> = out.stderr.lines().filter_map(|l| l.split_once(": ").filter(|(k, _)| k.starts_with("kernel ")).map(|(_, v)| v)).collect();
        let notes: Vec<&str> = out.stderr.lines().filter_map(|l| l.strip_prefix(&format!("{tool}: note: "))).collect();
        println!(
            "CAPS | {kernel} | {tool} | {} | {} | {} |",
            probes.join(", "),
            detail.join("; "),
            if notes.is_empty() { "-".to_string() } else { notes.join("; ") }
        );
    }
}
