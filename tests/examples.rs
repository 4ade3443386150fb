//! The example files, tools/<tool>_example.txt, against the tools
//! themselves, with neither root nor iSCSI: the USAGE section at their end
//! is the tool's `--help`, word for word where it holds the whole text, and
//! where it is a short synopsis, every option it names is one `--help`
//! lists. The runs above it are captures and are not checked here.

use std::path::Path;
use std::process::Command;

/// Every tool with an example file, with the binary cargo built for this test.
const TOOLS: [(&str, &str); 4] = [
    ("isclatency", env!("CARGO_BIN_EXE_isclatency")),
    ("iscstat", env!("CARGO_BIN_EXE_iscstat")),
    ("iscfreeze", env!("CARGO_BIN_EXE_iscfreeze")),
    ("submitslower", env!("CARGO_BIN_EXE_submitslower")),
];

fn help(bin: &str) -> String {
    let out = Command::new(bin).arg("--help").output().unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    assert!(out.status.success(), "{bin} --help failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The options named in a synopsis: `-x` and `--long`, without their values.
fn options(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || "[]|".contains(c))
        .filter(|w| {
            w.starts_with('-') && w.len() > 1 && w.chars().nth(1).is_some_and(|c| c == '-' || c.is_ascii_alphabetic())
        })
        .map(|w| w.trim_end_matches([',', '.']).to_string())
        .collect()
}

#[test]
fn usage_sections_are_the_tools_help() {
    let mut failures = Vec::new();
    for (tool, bin) in TOOLS {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tools/{tool}_example.txt"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let usage = text.split_once("\nUSAGE:\n").unwrap_or_else(|| panic!("{}: no USAGE section", path.display())).1;
        let help = help(bin);
        let first = help.lines().next().unwrap_or("");
        if usage.starts_with(first) {
            if usage.trim_end() != help.trim_end() {
                failures.push(format!(
                    "{}: the USAGE section is not `{tool} --help` (copy it again from the binary)",
                    path.display()
                ));
            }
        } else {
            let named = options(usage);
            assert!(!named.is_empty(), "{}: its USAGE synopsis names no option", path.display());
            for o in named {
                let listed = help.lines().any(|l| {
                    l.trim_start().starts_with('-')
                        && l.split(|c: char| c.is_whitespace() || c == ',' || c == '=').any(|w| w == o)
                });
                if !listed {
                    failures.push(format!("{}: USAGE names {o}, which {tool} --help does not list", path.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "example files and --help disagree:\n{}", failures.join("\n"));
}

#[test]
fn options_of_a_synopsis() {
    assert_eq!(
        options("    iscfreeze [-m MIN_MS | -u MIN_US] [--disk DISK | --all-disks] [-T]\nSee iscfreeze --help."),
        ["-m", "-u", "--disk", "--all-disks", "-T", "--help"]
    );
}
