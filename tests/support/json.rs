//! Typed access to the JSON the tools and fio print.

use serde_json::Value;

/// Typed access to a field of a JSON object (a tool's --json line, fio's
/// output) by a dotted path: `c.u64("wait_ns")`, `j.f64("jobs.0.read.clat_ns.mean")`.
/// Each panics, naming the path and showing the object, when the field is
/// missing or of another type: a test never reads a default.
pub trait JsonExt {
    fn path(&self, p: &str) -> &Value;
    fn str(&self, p: &str) -> &str;
    fn u64(&self, p: &str) -> u64;
    fn f64(&self, p: &str) -> f64;
}

impl JsonExt for Value {
    fn path(&self, p: &str) -> &Value {
        self.pointer(&format!("/{}", p.replace('.', "/"))).unwrap_or_else(|| panic!("no field {p:?} in {self}"))
    }
    fn str(&self, p: &str) -> &str {
        let v = self.path(p);
        v.as_str().unwrap_or_else(|| panic!("field {p:?} is {v}, not a string, in {self}"))
    }
    fn u64(&self, p: &str) -> u64 {
        let v = self.path(p);
        v.as_u64().unwrap_or_else(|| panic!("field {p:?} is {v}, not an unsigned integer, in {self}"))
    }
    fn f64(&self, p: &str) -> f64 {
        let v = self.path(p);
        v.as_f64().unwrap_or_else(|| panic!("field {p:?} is {v}, not a number, in {self}"))
    }
}

/// Where the split commands among `cmds` took NET from (their JSON
/// net_from), for a test's log.
pub fn net_from(cmds: &[&Value]) -> String {
    let n = |f: &str| cmds.iter().filter(|c| !c["net_ns"].is_null() && c.str("net_from") == f).count();
    format!(
        "from round trips {}, reverse delay {}, TCP's minimum RTT {}",
        n("round-trip"),
        n("reverse-delay"),
        n("tcp-min-rtt")
    )
}
