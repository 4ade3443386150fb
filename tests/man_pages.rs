//! The man pages, man/man8/<tool>.8, checked as a reader's man(1) would
//! meet them and against the tools themselves, with neither root nor iSCSI:
//!
//! - each page renders with groff without a single warning (`groff -man
//!   -ww -z -Tutf8`, plus `-rCHECKSTYLE=3` where groff is 1.23 or newer
//!   and has the man macros' style checks), and, where mandoc is
//!   installed, passes `mandoc -T lint` at its warning level;
//! - the options a tool's `--help` lists and those its page's OPTIONS
//!   section documents are the same, both ways, so the two cannot drift;
//! - each page has the sections of bcc's man pages, in their order.
//!
//! groff comes with the Debian package groff-base, which tests/lab/setup
//! installs; mandoc is optional.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Every tool, with the binary cargo built for this test.
const TOOLS: [(&str, &str); 5] = [
    ("isclatency", env!("CARGO_BIN_EXE_isclatency")),
    ("iscstat", env!("CARGO_BIN_EXE_iscstat")),
    ("iscfreeze", env!("CARGO_BIN_EXE_iscfreeze")),
    ("iscstates", env!("CARGO_BIN_EXE_iscstates")),
    ("submitslower", env!("CARGO_BIN_EXE_submitslower")),
];

/// The sections every page has, in this order (bcc's man/man8 pages; they
/// may have others between them, such as EXIT STATUS or ENVIRONMENT).
const SECTIONS: [&str; 10] = [
    "NAME",
    "SYNOPSIS",
    "DESCRIPTION",
    "REQUIREMENTS",
    "OPTIONS",
    "EXAMPLES",
    "FIELDS",
    "OVERHEAD",
    "SOURCE",
    "SEE ALSO",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The page's path relative to the repository (as messages name it).
fn page(tool: &str) -> PathBuf {
    Path::new("man/man8").join(format!("{tool}.8"))
}

fn read_page(tool: &str) -> String {
    let p = root().join(page(tool));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: cannot read: {e}", p.display()))
}

/// Run a program from the repository's root; None if it is not installed.
fn run(program: &str, args: &[&str]) -> Option<Output> {
    match Command::new(program).args(args).current_dir(root()).env("LC_ALL", "C").output() {
        Ok(o) => Some(o),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => panic!("cannot run {program}: {e}"),
    }
}

/// Each non-empty line a program wrote (stdout, then stderr), and its exit
/// status if it failed.
fn complaints(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = [&o.stdout, &o.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b).lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    if !o.status.success() {
        v.push(format!("({})", o.status));
    }
    v
}

/// groff's (major, minor) version, from `groff --version`.
fn groff_version() -> Option<(u32, u32)> {
    let o = run("groff", &["--version"])?;
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let v = text.lines().next()?.split_whitespace().last()?.to_string();
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

#[test]
fn pages_render_without_warnings() {
    let Some(version) = groff_version() else {
        panic!("groff is not installed: tests/lab/setup installs it (Debian package groff-base)");
    };
    // The man macros' style checks (blank lines, deprecated macros, .TH's
    // arguments, ...) came with groff 1.23; older groff ignores the register.
    let mut groff_args = vec!["-man", "-ww", "-z", "-Tutf8"];
    if version >= (1, 23) {
        groff_args.push("-rCHECKSTYLE=3");
    }
    let mut failures = Vec::new();
    let mut mandoc_ran = false;
    for (tool, _) in TOOLS {
        let path = page(tool);
        let file = path.to_str().unwrap();
        let mut args = groff_args.clone();
        args.push(file);
        let out = run("groff", &args).unwrap();
        failures.extend(complaints(&out).into_iter().map(|l| format!("{file}: groff {}: {l}", groff_args.join(" "))));
        // mandoc's own lint, where it is installed. Its style level is
        // left out: it asks for an upper-case title, and bcc's pages (and
        // these) name the tool in its own case.
        if let Some(out) = run("mandoc", &["-T", "lint", "-W", "warning", file]) {
            mandoc_ran = true;
            failures.extend(complaints(&out).into_iter().map(|l| format!("{file}: mandoc -T lint -W warning: {l}")));
        }
    }
    if !mandoc_ran {
        eprintln!("man_pages: mandoc is not installed: pages checked with groff only");
    }
    assert!(failures.is_empty(), "man pages with warnings:\n{}", failures.join("\n"));
}

/// The page's sections, in order: (name, its lines).
fn sections(text: &str) -> Vec<(String, Vec<&str>)> {
    let mut v: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix(".SH") {
            if name.is_empty() || name.starts_with(' ') {
                v.push((name.trim().trim_matches('"').to_string(), Vec::new()));
                continue;
            }
        }
        if let Some((_, lines)) = v.last_mut() {
            lines.push(line);
        }
    }
    v
}

/// A roff line as text: a leading macro call dropped (its arguments kept,
/// unquoted), escapes removed, `\-` as `-`.
fn plain(line: &str) -> String {
    let line = match line.strip_prefix('.') {
        Some(rest) => rest.split_once(' ').map(|(_, args)| args).unwrap_or("").replace('"', ""),
        None => line.to_string(),
    };
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('-') => out.push('-'),
            Some(' ') | Some('~') => out.push(' '),
            Some('e') | Some('\\') => out.push('\\'),
            // \fB, \fR, \f[...], \f(XX: a font change.
            Some('f') => match chars.next() {
                Some('[') => {
                    for c in chars.by_ref() {
                        if c == ']' {
                            break;
                        }
                    }
                }
                Some('(') => {
                    chars.next();
                    chars.next();
                }
                _ => {}
            },
            // \(xx: a special character (\(-> and the like), not an option.
            Some('(') => {
                chars.next();
                chars.next();
                out.push(' ');
            }
            // \&, \%, \c, \/, \, and the like: no text.
            _ => {}
        }
    }
    out
}

/// The options (`-x`, `--long`) named in a piece of text.
fn options_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '|' | '(' | ')' | '='))
        .filter_map(|tok| {
            if let Some(long) = tok.strip_prefix("--") {
                let name: String = long.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
                (!name.is_empty()).then(|| format!("--{name}"))
            } else {
                let mut c = tok.chars();
                match (c.next(), c.next(), c.next()) {
                    (Some('-'), Some(x), None) if x.is_ascii_alphanumeric() => Some(tok.to_string()),
                    _ => None,
                }
            }
        })
        .collect()
}

/// The options a page documents: those in the tags of its OPTIONS section
/// (the line after `.TP` or `.TQ`, or the first argument of `.IP`), not
/// those its text mentions in passing.
fn page_options(text: &str) -> BTreeSet<String> {
    let secs = sections(text);
    let Some((_, lines)) = secs.iter().find(|(n, _)| n == "OPTIONS") else { return BTreeSet::new() };
    let mut found = BTreeSet::new();
    let mut tag_next = false;
    for line in lines {
        if tag_next {
            found.extend(options_in(&plain(line)));
            tag_next = false;
        } else if line.starts_with(".TP") || line.starts_with(".TQ") {
            tag_next = true;
        } else if let Some(args) = line.strip_prefix(".IP ") {
            let tag = match args.strip_prefix('"') {
                Some(q) => q.split('"').next().unwrap_or(""),
                None => args.split_whitespace().next().unwrap_or(""),
            };
            found.extend(options_in(&plain(tag)));
        }
    }
    found
}

/// The options `--help` lists: the definition lines of its "Options:"
/// section (clap: `  -m, --min-ms <MIN_MS>`, `      --json`), not the
/// options its descriptions mention.
fn help_options(help: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut in_options = false;
    for line in help.lines() {
        if line.trim_end() == "Options:" {
            in_options = true;
            continue;
        }
        if !line.is_empty() && !line.starts_with(' ') {
            in_options = false;
        }
        let spec = line.trim_start();
        if !in_options || !spec.starts_with('-') || line.len() - spec.len() > 6 {
            continue;
        }
        // A short help puts the description on the same line.
        let spec = spec.split("  ").next().unwrap_or("");
        found.extend(options_in(spec));
    }
    found
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(", ")
}

#[test]
fn options_match_help() {
    let mut failures = Vec::new();
    for (tool, bin) in TOOLS {
        let out = Command::new(bin).arg("--help").output().unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
        assert!(out.status.success(), "{tool} --help failed: {}", String::from_utf8_lossy(&out.stderr));
        let help = help_options(&String::from_utf8_lossy(&out.stdout));
        assert!(
            help.contains("--help") && help.contains("--json"),
            "{tool} --help: its options were not found in:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let documented = page_options(&read_page(tool));
        let file = page(tool);
        let missing: BTreeSet<String> = help.difference(&documented).cloned().collect();
        let extra: BTreeSet<String> = documented.difference(&help).cloned().collect();
        if !missing.is_empty() {
            failures.push(format!(
                "{}: OPTIONS does not document {} ({tool} --help lists them)",
                file.display(),
                join(&missing)
            ));
        }
        if !extra.is_empty() {
            failures.push(format!(
                "{}: OPTIONS documents {}, which {tool} --help does not list",
                file.display(),
                join(&extra)
            ));
        }
    }
    assert!(failures.is_empty(), "man pages and --help disagree:\n{}", failures.join("\n"));
}

#[test]
fn pages_have_the_sections() {
    let mut failures = Vec::new();
    for (tool, _) in TOOLS {
        let text = read_page(tool);
        let file = page(tool);
        let names: Vec<String> = sections(&text).into_iter().map(|(n, _)| n).collect();
        let missing: Vec<&str> = SECTIONS.iter().copied().filter(|s| !names.iter().any(|n| n == s)).collect();
        if !missing.is_empty() {
            failures.push(format!("{}: no section {}", file.display(), missing.join(", ")));
        }
        let order: Vec<&str> = names.iter().map(String::as_str).filter(|n| SECTIONS.contains(n)).collect();
        if missing.is_empty() && order != SECTIONS {
            failures.push(format!(
                "{}: sections in the order {}, want {}",
                file.display(),
                order.join(", "),
                SECTIONS.join(", ")
            ));
        }
        if names.iter().any(|n| n == "AUTHOR" || n == "AUTHORS") {
            failures.push(format!("{}: has an AUTHOR section", file.display()));
        }
        // .TH <tool> 8 <date> "storprototrace <version>"
        let th = text.lines().find(|l| l.starts_with(".TH ")).unwrap_or("");
        let want = format!(".TH {tool} 8 ");
        let version = format!("\"storprototrace {}\"", env!("CARGO_PKG_VERSION"));
        if !th.starts_with(&want) || !th.contains(&version) {
            failures.push(format!("{}: want a title line {want}\"DATE\" {version}, found {th:?}", file.display()));
        }
    }
    assert!(failures.is_empty(), "man pages:\n{}", failures.join("\n"));
}

#[test]
fn option_parsing_reads_definitions_not_mentions() {
    let help = concat!(
        "About text, see -U and --other.\n\nUsage: t [OPTIONS]\n\nOptions:\n",
        "  -m, --min-ms <MIN_MS>\n          Show only; see --json (0 = all)\n\n",
        "      --listen <[ADDR:]PORT>\n          A port alone: -q\n\n",
        "  -h, --help  Print help\n\n",
        "examples:\n    t -x --nope\n",
    );
    assert_eq!(join(&help_options(help)), "--help, --listen, --min-ms, -h, -m");
    let page = concat!(
        ".SH OPTIONS\n.TP\n\\fB\\-m\\fR, \\fB\\-\\-min\\-ms\\fR \\fIMIN_MS\\fR\nmentions \\-u and \\-\\-wide\n",
        ".TP\n\\fIINTERVAL\\fR\nSeconds.\n",
        ".IP \"\\-q, \\-\\-quiet\" 4\nQuiet.\n",
        ".PP\n\\-\\-sid is resolved at start.\n",
        ".SH EXAMPLES\n.TP\nx\n.B t \\-\\-nope\n",
    );
    assert_eq!(join(&page_options(page)), "--min-ms, --quiet, -m, -q");
    assert_eq!(plain(".B isclatency \\-m 5 \\(-> \\%x\\&"), "isclatency -m 5   x");
}
