//! C struct layouts read from the templates, so a test can check that each
//! Rust decoder (src/bpf/events.rs, src/stages/stats.rs, src/freeze/mod.rs) reads the
//! fields where the compiler puts them. Knows the field types the templates
//! use (u8..u64, s32, int, char arrays, nested structs of the same text)
//! and x86-64/arm64 natural alignment; anything else is an error.

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: usize,
    /// Size of the whole field (all elements of an array).
    pub size: usize,
    /// Size of one element (for arrays), else `size`.
    pub elem: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Struct {
    pub fields: Vec<Field>,
    pub size: usize,
    pub align: usize,
}

impl Struct {
    pub fn field(&self, name: &str) -> &Field {
        self.fields.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no field {name} in {:?}", self.fields))
    }
}

/// `#define NAME <number>` values of a text, plus the kernel's TASK_COMM_LEN.
pub fn defines(text: &str) -> HashMap<String, usize> {
    let mut m = HashMap::from([("TASK_COMM_LEN".to_string(), 16)]);
    for l in text.lines() {
        let mut it = l.split_whitespace();
        if it.next() == Some("#define") {
            if let (Some(n), Some(v)) = (it.next(), it.next()) {
                if let Ok(v) = v.parse() {
                    m.insert(n.to_string(), v);
                }
            }
        }
    }
    m
}

fn round_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

/// The layout of `struct <name>` as defined in `text` (C template source).
pub fn parse(text: &str, name: &str) -> Result<Struct, String> {
    let defs = defines(text);
    let open = format!("struct {name} {{");
    let start = text.lines().position(|l| l.trim() == open).ok_or_else(|| format!("no `{open}` in the text"))?;
    let mut fields = Vec::new();
    let (mut off, mut align) = (0usize, 1usize);
    for raw in text.lines().skip(start + 1) {
        let l = raw.split("/*").next().unwrap_or("").split("//").next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        if l.starts_with("};") {
            let size = round_up(off, align);
            return Ok(Struct { fields, size, align });
        }
        let l = l.strip_suffix(';').ok_or_else(|| format!("struct {name}: cannot read `{l}`"))?;
        let (ty, decl) =
            l.rsplit_once(char::is_whitespace).ok_or_else(|| format!("struct {name}: cannot read `{l}`"))?;
        let (fname, count) = match decl.split_once('[') {
            Some((n, rest)) => {
                let c = rest.strip_suffix(']').ok_or_else(|| format!("struct {name}: bad array `{decl}`"))?;
                let c = c
                    .parse()
                    .ok()
                    .or_else(|| defs.get(c).copied())
                    .ok_or_else(|| format!("struct {name}: unknown array length `{c}`"))?;
                (n, c)
            }
            None => (decl, 1),
        };
        let (esize, ealign) = match ty.trim() {
            "u8" | "s8" | "char" | "unsigned char" => (1, 1),
            "u16" | "s16" => (2, 2),
            "u32" | "s32" | "int" | "unsigned int" => (4, 4),
            "u64" | "s64" => (8, 8),
            t if t.starts_with("struct ") => {
                let inner = parse(text, t.trim_start_matches("struct ").trim())?;
                (inner.size, inner.align)
            }
            t => return Err(format!("struct {name}: unknown type `{t}` of {fname}")),
        };
        off = round_up(off, ealign);
        fields.push(Field { name: fname.to_string(), offset: off, size: esize * count, elem: esize });
        off += esize * count;
        align = align.max(ealign);
    }
    Err(format!("struct {name}: no closing `}};`"))
}

/// A record of `layout` with every field set to a value of its own, for
/// checking a decoder: integers get `value(i)`, char arrays `"f<i>"`,
/// nested structs stay zero.
pub struct Sample {
    pub layout: Struct,
    pub bytes: Vec<u8>,
}

impl Sample {
    pub fn new(layout: Struct) -> Sample {
        let mut bytes = vec![0u8; layout.size];
        for (i, f) in layout.fields.iter().enumerate() {
            let b = &mut bytes[f.offset..f.offset + f.size];
            if f.elem > 8 {
                continue; // a nested struct: left zero, checked on its own
            }
            if f.elem == 1 && f.size > 1 {
                let s = format!("f{i}");
                b[..s.len()].copy_from_slice(s.as_bytes());
            } else {
                for (j, chunk) in b.chunks_mut(f.elem).enumerate() {
                    let v = Self::value(i, j).to_ne_bytes();
                    chunk.copy_from_slice(&v[..f.elem]);
                }
            }
        }
        Sample { layout, bytes }
    }

    /// Element `j` of field number `i`: distinct per field and element,
    /// and small enough for a u8.
    fn value(i: usize, j: usize) -> u64 {
        (i * 8 + j + 1) as u64
    }

    /// What a decoder must have read from field `name` (element `j`).
    pub fn int(&self, name: &str, j: usize) -> u64 {
        let i = self.layout.fields.iter().position(|f| f.name == name).unwrap_or_else(|| panic!("no field {name}"));
        Self::value(i, j)
    }

    pub fn string(&self, name: &str) -> String {
        let i = self.layout.fields.iter().position(|f| f.name == name).unwrap_or_else(|| panic!("no field {name}"));
        format!("f{i}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_alignment_and_tail_padding() {
        let s = parse("#define N 3\nstruct a {\n    u64 x;\n    u8 c; /* one */\n    u32 y;\n    char s[N];\n};\nstruct b {\n    struct a a;\n    u32 z;\n};\n", "b").unwrap();
        assert_eq!(s.size, 32);
        assert_eq!(s.field("a").size, 24);
        assert_eq!(s.field("z").offset, 24);
        let a = parse("#define N 3\nstruct a {\n    u64 x;\n    u8 c;\n    u32 y;\n    char s[N];\n};\n", "a").unwrap();
        assert_eq!((a.field("c").offset, a.field("y").offset, a.field("s").offset, a.size), (8, 12, 16, 24));
        assert!(parse("struct a {\n    float f;\n};\n", "a").unwrap_err().contains("unknown type"));
        assert!(parse("struct a {\n    char s[M];\n};\n", "a").unwrap_err().contains("unknown array length"));
    }
}
