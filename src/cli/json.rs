//! A minimal JSON object writer: one object per line, no dependency needed.

#[derive(Debug, Default)]
pub struct Object {
    buf: String,
}

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    escape_into(&mut out, s);
    out
}

/// `s` as the inside of a JSON string, appended to `out`.
fn escape_into(out: &mut String, s: &str) {
    use std::fmt::Write;
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Integer types: what `num` writes as a JSON number as it is.
pub trait Integer: Copy {
    /// The number in decimal, appended to `out`.
    fn push(self, out: &mut String);
}
macro_rules! unsigned { ($($t:ty),*) => { $(impl Integer for $t {
    fn push(self, out: &mut String) {
        crate::cli::output::push_decimal(out, self as u64, 0);
    }
})* } }
macro_rules! signed { ($($t:ty),*) => { $(impl Integer for $t {
    fn push(self, out: &mut String) {
        if self < 0 {
            out.push('-');
        }
        crate::cli::output::push_decimal(out, self.unsigned_abs() as u64, 0);
    }
})* } }
unsigned!(u8, u16, u32, u64, usize);
signed!(i8, i16, i32, i64);

impl Object {
    pub fn new() -> Self {
        let mut buf = String::with_capacity(512);
        buf.push('{');
        Object { buf }
    }
    fn key(&mut self, k: &str) {
        if self.buf.len() > 1 {
            self.buf.push(',');
        }
        // Keys are the program's own names: nothing in them to escape.
        debug_assert_eq!(escape(k), k);
        self.buf.push('"');
        self.buf.push_str(k);
        self.buf.push_str("\":");
    }
    pub fn str(mut self, k: &str, v: &str) -> Self {
        self.key(k);
        self.buf.push('"');
        escape_into(&mut self.buf, v);
        self.buf.push('"');
        self
    }
    pub fn opt_str(self, k: &str, v: Option<&str>) -> Self {
        match v {
            Some(s) => self.str(k, s),
            None => self.null(k),
        }
    }
    /// An integer (only integer types implement [`Integer`]).
    pub fn num<N: Integer>(mut self, k: &str, v: N) -> Self {
        self.key(k);
        v.push(&mut self.buf);
        self
    }
    /// A float with `decimals` digits; null when not finite (JSON has no
    /// NaN or infinity).
    pub fn float(mut self, k: &str, v: f64, decimals: usize) -> Self {
        self.key(k);
        if v.is_finite() {
            use std::fmt::Write;
            let _ = write!(self.buf, "{v:.decimals$}");
        } else {
            self.buf.push_str("null");
        }
        self
    }
    pub fn opt_num<N: Integer>(self, k: &str, v: Option<N>) -> Self {
        match v {
            Some(n) => self.num(k, n),
            None => self.null(k),
        }
    }
    pub fn bool(mut self, k: &str, v: bool) -> Self {
        self.key(k);
        self.buf.push_str(if v { "true" } else { "false" });
        self
    }
    pub fn opt_bool(self, k: &str, v: Option<bool>) -> Self {
        match v {
            Some(b) => self.bool(k, b),
            None => self.null(k),
        }
    }
    pub fn null(mut self, k: &str) -> Self {
        self.key(k);
        self.buf.push_str("null");
        self
    }
    pub fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn writes_escaped_object() {
        let s = Object::new()
            .str("comm", "a\"b\\c\n")
            .num("ns", 12u64)
            .opt_num::<u32>("r2t", None)
            .bool("ok", true)
            .finish();
        assert_eq!(s, r#"{"comm":"a\"b\\c\n","ns":12,"r2t":null,"ok":true}"#);
        assert_eq!(Object::new().finish(), "{}");
        assert_eq!(escape("\u{1}"), "\\u0001");
    }

    #[test]
    fn floats_are_finite_or_null() {
        let s = Object::new()
            .float("a", 1.23456, 3)
            .float("b", f64::NAN, 3)
            .float("c", f64::INFINITY, 1)
            .num("d", -4i32)
            .finish();
        assert_eq!(s, r#"{"a":1.235,"b":null,"c":null,"d":-4}"#);
        let s = Object::new().num("min", i64::MIN).num("max", u64::MAX).num("zero", 0i8).finish();
        assert_eq!(s, r#"{"min":-9223372036854775808,"max":18446744073709551615,"zero":0}"#);
    }
}
