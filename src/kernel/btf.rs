//! Just enough of the kernel's BTF to find a function's type id: fentry and
//! fexit programs on a module function are loaded against the module's BTF
//! (`/sys/kernel/btf/<module>`), which is split BTF on top of vmlinux's, so
//! its type ids and string offsets continue where vmlinux's end. Ids are
//! counted, so every type record must be understood: a kind not known here,
//! a record cut short or bytes left over make the whole blob an error, never
//! a shorter count (which would shift module ids onto the wrong function).
use crate::error::{Error, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// One BTF blob, walked once by `parse`.
pub struct Btf {
    strings: Vec<u8>,
    /// The last type id: this blob's type count, plus the base's for split BTF.
    last_id: u32,
    /// Each FUNC's name and id, in id order.
    funcs: Vec<(Vec<u8>, u32)>,
    /// The type section, and where each of this blob's records starts in it.
    types: Vec<u8>,
    starts: Vec<u32>,
}

pub const KIND_INT: u32 = 1;
pub const KIND_PTR: u32 = 2;
pub const KIND_ARRAY: u32 = 3;
pub const KIND_STRUCT: u32 = 4;
pub const KIND_UNION: u32 = 5;
pub const KIND_ENUM: u32 = 6;
pub const KIND_TYPEDEF: u32 = 8;
pub const KIND_FUNC_PROTO: u32 = 13;
pub const KIND_ENUM64: u32 = 19;

/// One type record, with its name resolved.
#[derive(Debug, Clone, Copy)]
pub struct Type<'a> {
    pub kind: u32,
    pub name: &'a [u8],
    /// `size` for int, struct, union, enum; `type` for ptr, typedef, const ...
    pub size_or_type: u32,
    pub vlen: usize,
    pub kind_flag: bool,
    /// The bytes after `struct btf_type`.
    pub extra: &'a [u8],
}

/// A struct or union member: name, type id, offset in bits, bitfield size
/// (0 when not a bitfield, as far as the record says).
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub name: &'a [u8],
    pub type_id: u32,
    pub bit_offset: u32,
    pub bitfield_size: u32,
}

/// vmlinux's BTF, or a module's split BTF together with vmlinux's: type ids
/// and string offsets of the module continue where vmlinux's end.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub base: &'a Btf,
    pub split: Option<&'a Btf>,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// The bytes of a section at `off` after the header, if within the blob.
fn section(blob: &[u8], hdr_len: usize, off: usize, len: usize) -> Option<&[u8]> {
    let start = hdr_len.checked_add(off)?;
    blob.get(start..start.checked_add(len)?)
}

/// The NUL-terminated string at `off` (empty if out of range).
fn string(strings: &[u8], off: usize) -> &[u8] {
    let rest = strings.get(off..).unwrap_or(&[]);
    &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
}

/// Bytes following a type record's 12-byte `struct btf_type`, as in the
/// kernel's include/uapi/linux/btf.h; None for a kind not known here.
fn extra_bytes(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        1 | 14 | 17 => 4,             // int, var, decl_tag
        3 => 12,                      // array
        4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
        6 | 13 => 8 * vlen,           // enum, func_proto
        2 | 7..=12 | 16 | 18 => 0,    // ptr, fwd .. func, float, type_tag
        _ => return None,             // 0 (unkn) has no valid records; 20.. are newer
    })
}

impl Btf {
    /// `base` is vmlinux's BTF when `blob` is a module's split BTF. The
    /// error is a one-line reason.
    pub fn parse(blob: &[u8], base: Option<&Btf>) -> Result<Btf> {
        if u16_at(blob, 0) != Some(MAGIC) {
            return Err(Error::kernel_types(format!("not BTF (no magic {MAGIC:#x})")));
        }
        match blob.get(2) {
            Some(1) => {}
            Some(v) => return Err(Error::kernel_types(format!("BTF version {v}, not 1"))),
            None => return Err(Error::kernel_types("BTF header cut short")),
        }
        let field =
            |off| u32_at(blob, off).map(|v| v as usize).ok_or_else(|| Error::kernel_types("BTF header cut short"));
        let hdr_len = field(4)?;
        if hdr_len < 24 || hdr_len > blob.len() {
            return Err(Error::kernel_types(format!("BTF header length {hdr_len} (blob of {} bytes)", blob.len())));
        }
        let types = section(blob, hdr_len, field(8)?, field(12)?)
            .ok_or_else(|| Error::kernel_types("BTF type section outside the blob"))?;
        let strings = section(blob, hdr_len, field(16)?, field(20)?)
            .ok_or_else(|| Error::kernel_types("BTF string section outside the blob"))?;
        let (first_id, base_strings) = base.map_or((1, &[][..]), |b| (b.last_id + 1, &b.strings[..]));
        let mut funcs = Vec::new();
        let mut starts = Vec::new();
        let (mut off, mut id) = (0usize, first_id);
        while off < types.len() {
            let (Some(name_off), Some(info), Some(_)) =
                (u32_at(types, off), u32_at(types, off + 4), u32_at(types, off + 8))
            else {
                return Err(Error::kernel_types(format!(
                    "type section has {} bytes left over after type id {}",
                    types.len() - off,
                    id - 1
                )));
            };
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = extra_bytes(kind, vlen)
                .ok_or_else(|| Error::kernel_types(format!("unknown BTF kind {kind} at type id {id}")))?;
            starts.push(off as u32);
            off += 12 + extra;
            if off > types.len() {
                return Err(Error::kernel_types(format!(
                    "type id {id} (kind {kind}) runs past the end of the type section"
                )));
            }
            if kind == KIND_FUNC {
                let n = name_off as usize;
                let name = if n < base_strings.len() {
                    string(base_strings, n)
                } else {
                    string(strings, n - base_strings.len())
                };
                funcs.push((name.to_vec(), id));
            }
            id += 1;
        }
        Ok(Btf { strings: strings.to_vec(), last_id: id - 1, funcs, types: types.to_vec(), starts })
    }

    /// Type ids held by this blob (not its base's).
    fn first_id(&self) -> u32 {
        self.last_id + 1 - self.starts.len() as u32
    }

    pub fn string_bytes(&self) -> u32 {
        self.strings.len() as u32
    }

    /// The last type id (the type count, the base's included for split
    /// BTF): split BTF on top of this one starts after it.
    pub fn type_count(&self) -> u32 {
        self.last_id
    }

    /// The id of function `name` (the first, if several have it).
    pub fn find_func(&self, name: &str) -> Option<u32> {
        self.funcs.iter().find(|(n, _)| n == name.as_bytes()).map(|&(_, id)| id)
    }
}

/// vmlinux's BTF and modules' split BTF on top of it, each file read and
/// parsed once (`/sys/kernel/btf/<name>`).
pub struct Loaded {
    root: std::path::PathBuf,
    pub vmlinux: Btf,
    modules: std::collections::HashMap<String, Btf>,
}

impl Loaded {
    /// The error is a one-line reason.
    pub fn open(root: &std::path::Path) -> Result<Loaded> {
        let blob = std::fs::read(root.join("vmlinux"))
            .map_err(|e| Error::kernel_types(format!("no kernel BTF ({}/vmlinux: {e})", root.display())))?;
        let vmlinux = Btf::parse(&blob, None).map_err(|e| Error::kernel_types(format!("vmlinux BTF: {e}")))?;
        Ok(Loaded { root: root.to_path_buf(), vmlinux, modules: Default::default() })
    }

    /// Module `m`'s BTF, read on first use.
    pub fn module(&mut self, m: &str) -> Result<&Btf> {
        if !self.modules.contains_key(m) {
            let blob = std::fs::read(self.root.join(m))
                .map_err(|e| Error::kernel_types(format!("module {m} has no BTF ({e})")))?;
            let btf = Btf::parse(&blob, Some(&self.vmlinux))
                .map_err(|e| Error::kernel_types(format!("BTF of module {m}: {e}")))?;
            self.modules.insert(m.to_string(), btf);
        }
        Ok(&self.modules[m])
    }

    /// vmlinux, then each of `modules` that has BTF (one built into the
    /// kernel has its types in vmlinux's), to look types up in.
    pub fn views(&mut self, modules: &[&str]) -> Result<Vec<View<'_>>> {
        let present: Vec<&str> =
            modules.iter().copied().filter(|m| self.modules.contains_key(*m) || self.root.join(m).exists()).collect();
        for m in &present {
            self.module(m)?;
        }
        let mut v = vec![View { base: &self.vmlinux, split: None }];
        v.extend(present.iter().map(|m| View { base: &self.vmlinux, split: Some(&self.modules[*m]) }));
        Ok(v)
    }
}

impl<'a> View<'a> {
    fn blob(&self, id: u32) -> Option<&'a Btf> {
        match self.split {
            Some(s) if id > self.base.last_id => Some(s),
            _ if id >= 1 && id <= self.base.last_id => Some(self.base),
            _ => None,
        }
    }

    fn name(&self, off: u32, from_split: bool) -> &'a [u8] {
        let off = off as usize;
        match self.split {
            Some(s) if from_split && off >= self.base.strings.len() => {
                string(&s.strings, off - self.base.strings.len())
            }
            _ => string(&self.base.strings, off),
        }
    }

    /// Every type id of this view: the split blob's last, so its own types
    /// are found after vmlinux's.
    pub fn ids(&self) -> std::ops::RangeInclusive<u32> {
        1..=self.split.unwrap_or(self.base).last_id
    }

    /// Type ids of the split blob alone (vmlinux's when there is none).
    pub fn own_ids(&self) -> std::ops::RangeInclusive<u32> {
        let b = self.split.unwrap_or(self.base);
        b.first_id()..=b.last_id
    }

    pub fn get(&self, id: u32) -> Option<Type<'a>> {
        let b = self.blob(id)?;
        let start = *b.starts.get((id - b.first_id()) as usize)? as usize;
        let (name_off, info, sot) =
            (u32_at(&b.types, start)?, u32_at(&b.types, start + 4)?, u32_at(&b.types, start + 8)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let extra = b.types.get(start + 12..start + 12 + extra_bytes(kind, vlen)?)?;
        Some(Type {
            kind,
            name: self.name(name_off, !std::ptr::eq(b, self.base)),
            size_or_type: sot,
            vlen,
            kind_flag: info >> 31 == 1,
            extra,
        })
    }

    /// The arguments raw tracepoint `name` passes (its BTF prototype
    /// `btf_trace_<name>`, a pointer to a function whose first parameter,
    /// `void *`, is the program's context and not one of them); None where
    /// the BTF has no such typedef.
    pub fn raw_tracepoint_args(&self, name: &str) -> Option<usize> {
        let want = format!("btf_trace_{name}");
        let id =
            self.ids().find(|&i| self.get(i).is_some_and(|t| t.kind == KIND_TYPEDEF && t.name == want.as_bytes()))?;
        let ptr = self.get(self.get(id)?.size_or_type)?;
        let proto = self.get(ptr.size_or_type).filter(|_| ptr.kind == KIND_PTR)?;
        (proto.kind == KIND_FUNC_PROTO).then(|| proto.vlen.saturating_sub(1))
    }

    /// The members of a struct or union type.
    pub fn members(&self, id: u32) -> Vec<Member<'a>> {
        let Some(t) = self.get(id) else { return Vec::new() };
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return Vec::new();
        }
        let from_split = !std::ptr::eq(self.blob(id).unwrap_or(self.base), self.base);
        (0..t.vlen)
            .filter_map(|i| {
                let (n, ty, off) =
                    (u32_at(t.extra, i * 12)?, u32_at(t.extra, i * 12 + 4)?, u32_at(t.extra, i * 12 + 8)?);
                let (bit_offset, bitfield_size) = if t.kind_flag { (off & 0xff_ffff, off >> 24) } else { (off, 0) };
                Some(Member { name: self.name(n, from_split), type_id: ty, bit_offset, bitfield_size })
            })
            .collect()
    }

    /// The enumerators of an enum or enum64 type, with their values.
    pub fn enumerators(&self, id: u32) -> Vec<(&'a [u8], i64)> {
        let Some(t) = self.get(id) else { return Vec::new() };
        let from_split = !std::ptr::eq(self.blob(id).unwrap_or(self.base), self.base);
        let signed = t.kind_flag;
        (0..t.vlen)
            .filter_map(|i| match t.kind {
                KIND_ENUM => {
                    let (n, v) = (u32_at(t.extra, i * 8)?, u32_at(t.extra, i * 8 + 4)?);
                    Some((self.name(n, from_split), if signed { v as i32 as i64 } else { v as i64 }))
                }
                KIND_ENUM64 => {
                    let (n, lo, hi) =
                        (u32_at(t.extra, i * 12)?, u32_at(t.extra, i * 12 + 4)?, u32_at(t.extra, i * 12 + 8)?);
                    Some((self.name(n, from_split), ((hi as u64) << 32 | lo as u64) as i64))
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes after `struct btf_type` for each kind 1..=19 as (fixed, per
    /// vlen), typed out again from include/uapi/linux/btf.h to check
    /// `extra_bytes`: int, ptr, array, struct, union, enum, fwd, typedef,
    /// volatile, const, restrict, func, func_proto, var, datasec, float,
    /// decl_tag, type_tag, enum64.
    const KERNEL_EXTRA: [(usize, usize); 19] = [
        (4, 0),
        (0, 0),
        (12, 0),
        (0, 12),
        (0, 12),
        (0, 8),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 0),
        (0, 8),
        (4, 0),
        (0, 12),
        (0, 0),
        (4, 0),
        (0, 0),
        (0, 12),
    ];

    fn kernel_extra(kind: u32, vlen: u32) -> usize {
        let (fixed, per) = KERNEL_EXTRA[kind as usize - 1];
        fixed + per * vlen as usize
    }

    fn record(t: &mut Vec<u8>, name_off: u32, kind: u32, vlen: u32) {
        for v in [name_off, (kind << 24) | vlen, 0] {
            t.extend_from_slice(&v.to_ne_bytes());
        }
        let extra = if (1..=19).contains(&kind) { kernel_extra(kind, vlen) } else { 0 };
        t.resize(t.len() + extra, 0);
    }

    /// A BTF blob: header, type section `t`, string section `s`.
    fn wrap(t: &[u8], s: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_ne_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, t.len() as u32, t.len() as u32, s.len() as u32] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(t);
        b.extend_from_slice(s);
        b
    }

    /// A BTF blob's type section from (name, kind, vlen), and its strings
    /// ("\0" + names, offsets counted from `string_base`).
    fn sections(types: &[(&str, u32, u32)], string_base: u32) -> (Vec<u8>, Vec<u8>) {
        let (mut t, mut s) = (Vec::new(), vec![0u8]);
        for (name, kind, vlen) in types {
            let off = if name.is_empty() { 0 } else { s.len() as u32 + string_base };
            if !name.is_empty() {
                s.extend_from_slice(name.as_bytes());
                s.push(0);
            }
            record(&mut t, off, *kind, *vlen);
        }
        (t, s)
    }

    fn blob(types: &[(&str, u32, u32)], string_base: u32) -> Vec<u8> {
        let (t, s) = sections(types, string_base);
        wrap(&t, &s)
    }

    #[test]
    fn finds_functions_in_base_and_split_btf() {
        let base = blob(&[("int", 1, 0), ("task", 4, 3), ("", 13, 2), ("submit_bio", 12, 0)], 0);
        let base = Btf::parse(&base, None).unwrap();
        assert_eq!(base.type_count(), 4);
        assert_eq!(base.find_func("submit_bio"), Some(4));
        assert_eq!(base.find_func("task"), None, "a struct is not a function");
        let module = blob(&[("iscsi_task", 4, 2), ("", 13, 1), ("iscsi_queuecommand", 12, 0)], base.string_bytes());
        let module = Btf::parse(&module, Some(&base)).unwrap();
        assert_eq!(module.find_func("iscsi_queuecommand"), Some(7));
        assert_eq!(module.find_func("submit_bio"), None);
    }

    #[test]
    fn a_raw_tracepoints_arguments_come_from_its_prototype() {
        // 1 ptr -> 2, 2 func_proto (void *, q, bio, rw), 3 typedef
        // btf_trace_block_getrq -> 1, 4 typedef btf_trace_other -> 5 (int).
        let (mut t, mut s) = (Vec::new(), vec![0u8]);
        let name = |s: &mut Vec<u8>, n: &str| {
            let off = s.len() as u32;
            s.extend_from_slice(n.as_bytes());
            s.push(0);
            off
        };
        let getrq = name(&mut s, "btf_trace_block_getrq");
        let other = name(&mut s, "btf_trace_other");
        for (name_off, kind, vlen, sot) in [
            (0, KIND_PTR, 0, 2),
            (0, KIND_FUNC_PROTO, 4, 0),
            (getrq, KIND_TYPEDEF, 0, 1),
            (other, KIND_TYPEDEF, 0, 5),
            (0, KIND_INT, 0, 4),
        ] {
            record(&mut t, name_off, kind, vlen);
            let at = t.len() - 12 - kernel_extra(kind, vlen);
            t[at + 8..at + 12].copy_from_slice(&u32::to_ne_bytes(sot));
        }
        let btf = Btf::parse(&wrap(&t, &s), None).unwrap();
        let v = View { base: &btf, split: None };
        assert_eq!(v.raw_tracepoint_args("block_getrq"), Some(3));
        assert_eq!(v.raw_tracepoint_args("other"), None, "not a function pointer");
        assert_eq!(v.raw_tracepoint_args("block_rq_issue"), None);
    }

    #[test]
    fn split_btf_names_base_strings() {
        let base = Btf::parse(&blob(&[("submit_bio", 12, 0)], 0), None).unwrap();
        // A module FUNC named by offset 1: "submit_bio" in vmlinux's strings.
        let mut t = Vec::new();
        record(&mut t, 1, 12, 0);
        let module = Btf::parse(&wrap(&t, &[0]), Some(&base)).unwrap();
        assert_eq!(module.find_func("submit_bio"), Some(2));
    }

    #[test]
    fn sizes_every_kind_as_the_kernel_does() {
        let mut types: Vec<(&str, u32, u32)> = (1..=19).map(|k| ("", k, 2)).collect();
        types.push(("last", 12, 0));
        let btf = Btf::parse(&blob(&types, 0), None).unwrap();
        assert_eq!(btf.type_count(), 20);
        assert_eq!(btf.find_func("last"), Some(20));
    }

    #[test]
    fn rejects_unknown_kinds() {
        for kind in [0, 20, 25, 31] {
            let e =
                Btf::parse(&blob(&[("int", 1, 0), ("x", kind, 0), ("f", 12, 0)], 0), None).err().map(|e| e.to_string());
            assert_eq!(e.as_deref(), Some(&*format!("unknown BTF kind {kind} at type id 2")));
        }
        // In split BTF the id is counted from the base's.
        let base = Btf::parse(&blob(&[("int", 1, 0), ("f", 12, 0)], 0), None).unwrap();
        let module = blob(&[("g", 12, 0), ("x", 25, 0)], base.string_bytes());
        assert_eq!(
            Btf::parse(&module, Some(&base)).err().map(|e| e.to_string()).as_deref(),
            Some("unknown BTF kind 25 at type id 4")
        );
    }

    #[test]
    fn rejects_a_record_cut_short_or_bytes_left_over() {
        let (t, s) = sections(&[("int", 1, 0), ("task", 4, 3)], 0);
        let e = Btf::parse(&wrap(&t[..t.len() - 4], &s), None).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("type id 2 (kind 4) runs past the end of the type section"));
        let e = Btf::parse(&wrap(&t[..16 + 8], &s), None).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("type section has 8 bytes left over after type id 1"));
        let mut long = t.clone();
        long.extend_from_slice(&[0; 7]);
        let e = Btf::parse(&wrap(&long, &s), None).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("type section has 7 bytes left over after type id 2"));
        long.extend_from_slice(&[0; 5]); // 12 zero bytes read as a record of kind 0
        let e = Btf::parse(&wrap(&long, &s), None).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("unknown BTF kind 0 at type id 3"));
    }

    #[test]
    fn rejects_what_is_not_btf() {
        let good = blob(&[("f", 12, 0)], 0);
        assert!(Btf::parse(&good, None).is_ok());
        let bad = |at: usize, v: &[u8]| {
            let mut b = good.clone();
            b[at..at + v.len()].copy_from_slice(v);
            Btf::parse(&b, None).err().unwrap().to_string()
        };
        assert!(bad(0, &[0x9f, 0x9f]).contains("magic"), "bad magic");
        assert!(bad(2, &[2]).contains("version"), "version 2");
        assert!(bad(4, &16u32.to_ne_bytes()).contains("header length"), "header of 16 bytes");
        assert!(bad(4, &u32::MAX.to_ne_bytes()).contains("header length"), "header past the blob");
        assert!(bad(12, &1000u32.to_ne_bytes()).contains("type section"), "type section past the blob");
        assert!(bad(16, &u32::MAX.to_ne_bytes()).contains("string section"), "string section past the blob");
        assert!(Btf::parse(b"not btf at all, not at all", None).is_err());
        assert!(Btf::parse(&[0x9f, 0xeb], None).is_err());
        assert!(Btf::parse(&good[..20], None).is_err());
        assert!(Btf::parse(&[], None).is_err());
    }

    /// Type `id`'s kind and name in a vmlinux blob, walked with the sizes
    /// of KERNEL_EXTRA rather than `parse`'s.
    fn kind_and_name(blob: &[u8], id: u32) -> (u32, Vec<u8>) {
        let at = |off: usize| u32_at(blob, off).unwrap() as usize;
        let mut off = at(4) + at(8);
        for _ in 1..id {
            let info = at(off + 4) as u32;
            off += 12 + kernel_extra(info >> 24 & 0x1f, info & 0xffff);
        }
        let info = at(off + 4) as u32;
        (info >> 24 & 0x1f, string(&blob[at(4) + at(16)..], at(off)).to_vec())
    }

    /// The running kernel's BTF, where readable. Module BTF is split BTF
    /// on top of vmlinux's; a machine without modules (like the one this was
    /// written on) has only vmlinux, and that part checks nothing.
    #[test]
    fn parses_the_running_kernels_btf() {
        use std::io::Write;
        let dir = std::path::Path::new("/sys/kernel/btf");
        let path = dir.join("vmlinux");
        let blob = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                // Straight to stderr, past the test harness's capture.
                let _ = writeln!(
                    std::io::stderr(),
                    "note: parses_the_running_kernels_btf skipped: {}: {e}",
                    path.display()
                );
                return;
            }
        };
        let vmlinux = Btf::parse(&blob, None).unwrap();
        assert!(vmlinux.type_count() > 10000, "{} types", vmlinux.type_count());
        for f in ["vfs_read", "schedule"] {
            let id = vmlinux.find_func(f).unwrap_or_else(|| panic!("{f} not found"));
            assert_eq!(kind_and_name(&blob, id), (KIND_FUNC, f.as_bytes().to_vec()), "type id {id}");
        }
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.file_name() != "vmlinux" {
                let module = std::fs::read(entry.path()).unwrap();
                if let Err(e) = Btf::parse(&module, Some(&vmlinux)) {
                    panic!("BTF of module {:?}: {e}", entry.file_name());
                }
            }
        }
    }
}
