//! node_exporter textfile-collector files (iscstat's and iscstates'
//! `--prom-file`): the text exposition format's label escaping and numbers,
//! and writing the file so that a reader never sees half of it.

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A label value in the text exposition format: only backslash, double
/// quote and line feed are escaped (`\\`, `\"`, `\n`); everything else,
/// tabs and any UTF-8 included, is written as it is.
pub fn escape_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Check at start that PATH can be written (its directory exists and is writable).
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let probe = tmp_path(path);
    std::fs::File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| Error::usage(format!("--prom-file {}: cannot write in {}: {e}", path.display(), dir.display())))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}

/// Seconds from nanoseconds, without trailing zeros.
pub fn seconds(ns: u64) -> String {
    let s = format!("{:.9}", ns as f64 / 1e9);
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').map(|x| x.to_string()).unwrap_or_else(|| s.to_string())
}

/// Replace PATH with `text` through a temporary file and a rename, so a
/// reader never sees half (iscstat's and iscstates' --prom-file).
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = tmp_path(path);
    let r = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    r.and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("--prom-file {}: {e}", path.display()))
    })
}
