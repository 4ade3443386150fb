//! The capabilities table (target/lab/capabilities.md) from tools run with -v.

/// The `CAPS |` table row of a tool started with -v (tests/all collects the
/// rows into target/lab/capabilities.md): the probe points it named, the
/// kernel facts it detected, its notes; and the probe points alone.
pub fn caps_row(tool: &str, stderr: &str) -> (Vec<String>, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string();
    let mut probes: Vec<String> = Vec::new();
    for l in stderr.lines().filter_map(|l| l.strip_prefix("probe ")) {
        let f = l.split(" -> ").next().unwrap_or(l).to_string();
        if !probes.contains(&f) {
            probes.push(f);
        }
    }
    let detail: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once(": ").filter(|(k, _)| k.starts_with("kernel ")).map(|(_, v)| v))
        .collect();
    let notes: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix(&format!("{tool}: note: "))).collect();
    let row = format!(
        "CAPS | {kernel} | {tool} | {} | {} | {} |",
        probes.join(", "),
        detail.join("; "),
        if notes.is_empty() { "-".to_string() } else { notes.join("; ") }
    );
    (probes, row)
}
