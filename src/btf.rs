//! Just enough of the kernel's BTF to find a function's type id: fentry and
//! fexit programs on a module function are loaded against the module's BTF
//! (`/sys/kernel/btf/<module>`), which is split BTF on top of vmlinux's, so
//! its type ids and string offsets continue where vmlinux's end.

const MAGIC: u16 = 0xeb9f;
const KIND_FUNC: u32 = 12;

/// One BTF blob's type and string sections.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl<'a> Btf<'a> {
    pub fn parse(blob: &'a [u8]) -> Option<Btf<'a>> {
        if u16_at(blob, 0)? != MAGIC {
            return None;
        }
        let hdr_len = u32_at(blob, 4)? as usize;
        let (type_off, type_len) = (u32_at(blob, 8)? as usize, u32_at(blob, 12)? as usize);
        let (str_off, str_len) = (u32_at(blob, 16)? as usize, u32_at(blob, 20)? as usize);
        let types = blob.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = blob.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
        Some(Btf { types, strings })
    }

    pub fn string_bytes(&self) -> u32 {
        self.strings.len() as u32
    }

    /// Each type as (name offset, kind), in id order (the first is id 1).
    fn types(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut off = 0usize;
        std::iter::from_fn(move || {
            let name_off = u32_at(self.types, off)?;
            let info = u32_at(self.types, off + 4)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                1 | 14 | 17 => 4,      // int, var, decl_tag
                3 => 12,               // array
                4 | 5 | 15 => 12 * vlen, // struct, union, datasec
                6 | 13 => 8 * vlen,    // enum, func_proto
                19 => 12 * vlen,       // enum64
                2 | 7..=12 | 16 | 18 => 0,
                _ => return None,      // a kind we do not know: stop, never misread
            };
            off += 12 + extra;
            Some((name_off, kind))
        })
    }

    pub fn type_count(&self) -> u32 {
        self.types().count() as u32
    }

    /// The id of function `name`. `base` is vmlinux's BTF and its type
    /// count (`type_count`, counted once by the caller: it walks every type)
    /// when `self` is a module's split BTF: ids then start after vmlinux's,
    /// and a string offset below vmlinux's string size names one of
    /// vmlinux's strings.
    pub fn find_func(&self, name: &str, base: Option<(&Btf, u32)>) -> Option<u32> {
        let (first_id, base_strings) = match base {
            Some((b, types)) => (types + 1, b.string_bytes()),
            None => (1, 0),
        };
        let base = base.map(|(b, _)| b);
        let wanted = name.as_bytes();
        for (i, (name_off, kind)) in self.types().enumerate() {
            if kind != KIND_FUNC {
                continue;
            }
            let s = if name_off < base_strings { base.map(|b| b.string(name_off)) } else { Some(self.string(name_off - base_strings)) };
            if s == Some(wanted) {
                return Some(first_id + i as u32);
            }
        }
        None
    }

    fn string(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or(&[]);
        &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob from (name, kind, vlen) types; strings "\0" + names.
    fn blob(types: &[(&str, u32, u32)], string_base: u32, extra_strings: &[&str]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut t = Vec::new();
        for s in extra_strings {
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
        }
        for (name, kind, vlen) in types {
            let off = if name.is_empty() { 0 } else {
                let o = strings.len() as u32 + string_base;
                strings.extend_from_slice(name.as_bytes());
                strings.push(0);
                o
            };
            t.extend_from_slice(&off.to_ne_bytes());
            t.extend_from_slice(&((kind << 24) | vlen).to_ne_bytes());
            t.extend_from_slice(&0u32.to_ne_bytes());
            let extra = match kind { 1 => 4, 4 => 12 * vlen, 13 => 8 * vlen, _ => 0 };
            t.extend(std::iter::repeat(0u8).take(extra as usize));
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_ne_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [24u32, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend(t);
        b.extend(strings);
        b
    }

    #[test]
    fn finds_functions_in_base_and_split_btf() {
        let base = blob(&[("int", 1, 0), ("task", 4, 3), ("", 13, 2), ("submit_bio", 12, 0)], 0, &[]);
        let base = Btf::parse(&base).unwrap();
        assert_eq!(base.type_count(), 4);
        assert_eq!(base.find_func("submit_bio", None), Some(4));
        assert_eq!(base.find_func("task", None), None, "a struct is not a function");
        let module = blob(&[("iscsi_task", 4, 2), ("", 13, 1), ("iscsi_queuecommand", 12, 0)], base.string_bytes(), &[]);
        let module = Btf::parse(&module).unwrap();
        assert_eq!(module.find_func("iscsi_queuecommand", Some((&base, base.type_count()))), Some(7));
        assert_eq!(module.find_func("submit_bio", Some((&base, base.type_count()))), None);
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(Btf::parse(b"not btf at all, not at all").is_none());
        assert!(Btf::parse(&[0x9f, 0xeb]).is_none());
    }
}
