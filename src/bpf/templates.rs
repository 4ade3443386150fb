//! C probe templates and their substitution.
//!
//! A template is C text with placeholders written `{{NAME}}` (upper case,
//! digits, underscore). Values are typed: integers, booleans and identifiers
//! that are `&'static str` (so they are written in our source, never typed by
//! a user). Rendering fails if a value names no placeholder, if a name is
//! given twice, or if any placeholder is left.

use crate::error::{Error, Result};

/// The templates, embedded in the binaries at build time.
pub const COMMON: &str = include_str!("../../bpf_templates/common.h");
pub const ISCSI_STAGES: &str = include_str!("../../bpf_templates/iscsi_stages.c");
pub const ISCLATENCY: &str = include_str!("../../bpf_templates/isclatency.c");
pub const ISCSTAT: &str = include_str!("../../bpf_templates/iscstat.c");
pub const ISCCOUNT: &str = include_str!("../../bpf_templates/isccount.c");
pub const SUBMITSLOWER: &str = include_str!("../../bpf_templates/submitslower.c");
pub const ISCFREEZE: &str = include_str!("../../bpf_templates/iscfreeze.c");
pub const ISCSTATES: &str = include_str!("../../bpf_templates/iscstates.c");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Bool(bool),
    /// A C identifier or token chosen by the program (never user input).
    Ident(&'static str),
}

impl Value {
    fn to_c(self) -> String {
        match self {
            Value::Int(v) => format!("{v}LL"),
            Value::Bool(b) => (if b { "1" } else { "0" }).to_string(),
            Value::Ident(s) => s.to_string(),
        }
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v as i64)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// A template assembled from one or more parts, in order.
#[derive(Debug, Clone)]
pub struct Template {
    text: String,
}

impl Template {
    pub fn new(parts: &[&str]) -> Self {
        Template { text: parts.join("\n") }
    }

    /// Names of the placeholders in the text, in order of first appearance.
    pub fn placeholders(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (_, name) in scan(&self.text) {
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
        }
        out
    }

    pub fn render(&self, values: &[(&str, Value)]) -> Result<String> {
        let wanted = self.placeholders();
        for (i, (name, _)) in values.iter().enumerate() {
            if values[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::Template(format!("template: value {name} given twice")));
            }
            if !wanted.iter().any(|w| w == name) {
                return Err(Error::Template(format!("template: no placeholder named {name}")));
            }
        }
        let mut out = String::with_capacity(self.text.len());
        let mut last = 0;
        let mut missing = Vec::new();
        for (start, name) in scan(&self.text) {
            out.push_str(&self.text[last..start]);
            match values.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => out.push_str(&v.to_c()),
                None => {
                    if !missing.contains(&name) {
                        missing.push(name);
                    }
                }
            }
            last = start + name.len() + 4;
        }
        out.push_str(&self.text[last..]);
        if !missing.is_empty() {
            return Err(Error::Template(format!(
                "template: placeholder(s) left unsubstituted: {}",
                missing.join(", ")
            )));
        }
        Ok(out)
    }
}

/// Every `{{NAME}}` in `text`: (byte offset of the braces, NAME).
fn scan(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(off) = text[i..].find("{{") {
        let start = i + off;
        let name_start = start + 2;
        let mut j = name_start;
        while j < bytes.len() && (bytes[j].is_ascii_uppercase() || bytes[j].is_ascii_digit() || bytes[j] == b'_') {
            j += 1;
        }
        if j > name_start && text[j..].starts_with("}}") {
            found.push((start, &text[name_start..j]));
            i = j + 2;
        } else {
            i = start + 2;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_typed_values() {
        let t = Template::new(&["if (d < {{MIN_US}} * 1000) return 0;", "x = {{ON}}; y = {{KIND}}; z = {{MIN_US}};"]);
        let s = t
            .render(&[("MIN_US", Value::from(10_000u64)), ("ON", true.into()), ("KIND", Value::Ident("BPF_HASH"))])
            .unwrap();
        assert_eq!(s, "if (d < 10000LL * 1000) return 0;\nx = 1; y = BPF_HASH; z = 10000LL;");
    }

    #[test]
    fn negative_numbers_render_as_c() {
        let t = Template::new(&["a = {{A}};"]);
        assert_eq!(t.render(&[("A", Value::Int(-5))]).unwrap(), "a = -5LL;");
    }

    #[test]
    fn leftover_placeholder_fails() {
        let t = Template::new(&["{{A}} {{B}} {{B}}"]);
        let e = t.render(&[("A", 1u32.into())]).unwrap_err();
        assert_eq!(e.to_string(), "template: placeholder(s) left unsubstituted: B");
    }

    #[test]
    fn unknown_value_fails() {
        let t = Template::new(&["{{A}}"]);
        let e = t.render(&[("A", 1u32.into()), ("SID", 3u32.into())]).unwrap_err();
        assert!(e.to_string().contains("no placeholder named SID"));
    }

    #[test]
    fn duplicate_value_fails() {
        let t = Template::new(&["{{A}}"]);
        let e = t.render(&[("A", 1u32.into()), ("A", 2u32.into())]).unwrap_err();
        assert!(e.to_string().contains("given twice"));
    }

    #[test]
    fn c_braces_are_not_placeholders() {
        let t = Template::new(&["struct x {{ int a; }}; {{lower}} {{}}"]);
        assert!(t.placeholders().is_empty());
        assert_eq!(t.render(&[]).unwrap(), "struct x {{ int a; }}; {{lower}} {{}}");
    }

    #[test]
    fn shipped_templates_render_fully() {
        // Every placeholder of the shipped templates is one the tools know.
        let t = Template::new(&[COMMON, ISCSI_STAGES, ISCLATENCY]);
        let names = t.placeholders();
        for must in [
            "MIN_US",
            "FILTER_HOST",
            "FILTER_LUN",
            "LUN",
            "FILTER_DIR",
            "FILTER_PID",
            "PID",
            "FILTER_CID",
            "CID",
            "USE_RINGBUF",
        ] {
            assert!(names.iter().any(|n| n == must), "{must} missing from isclatency template");
        }
    }
}
