//! C definitions of the kernel types a program reads, written from the
//! running kernel's BTF: only the members the templates name, each at the
//! offset BTF gives, in a struct of the size BTF gives. Compiling these
//! instead of the kernel's headers (which pull in thousands of lines the
//! programs never use) is most of a tool's start-up saved: clang spends
//! about 80% of its time on the included headers.
//!
//! Each template lists what it reads, in its own text:
//!
//! ```c
//!  * @struct scsi_cmnd device sdb.length cmnd
//!  * @struct request_queue disk? backing_dev_info?
//!  * @struct pt_regs *
//!  * @enum DMA_FROM_DEVICE ISCSI_TASK_COMPLETED
//! ```
//!
//! `a.b` is member `b` of the struct member `a`; `?` after a member or a
//! struct: may be absent (the template chooses by what exists, see
//! `KernelTypes::has`); `*`: every member. Offsets and sizes are checked by
//! the compiler too (`_Static_assert` lines in the text), so a mistake here
//! fails the compile, never reads the wrong bytes. Anything BTF cannot
//! express here (a bitfield, a missing type or member) is
//! an error with its reason, and the caller compiles the headers instead.

use crate::error::{Error, Result};
use crate::kernel::btf::{self, Loaded, View};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write;

/// What a template reads, from its `@struct` and `@enum` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    pub structs: Vec<StructSpec>,
    pub constants: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructSpec {
    pub name: String,
    pub optional: bool,
    /// Member paths (`sdb.length` as ["sdb", "length"]) and whether each may
    /// be absent; empty with `all`.
    pub members: Vec<(Vec<String>, bool)>,
    pub all: bool,
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

impl Spec {
    /// The `@struct`/`@enum` lines of a program's text, merged by struct.
    pub fn parse(text: &str) -> Result<Spec> {
        let mut spec = Spec::default();
        for line in text.lines() {
            let l = line.trim_start().trim_start_matches('*').trim_start_matches("//").trim();
            let mut words = l.split_whitespace();
            match words.next() {
                Some("@struct") => {
                    let name = words.next().ok_or_else(|| Error::kernel_types(format!("`{l}`: no struct name")))?;
                    let (name, optional) = name.strip_suffix('?').map_or((name, false), |n| (n, true));
                    if !is_ident(name) {
                        return Err(Error::kernel_types(format!("`{l}`: bad struct name")));
                    }
                    let at = match spec.structs.iter().position(|s| s.name == name) {
                        Some(i) => i,
                        None => {
                            spec.structs.push(StructSpec {
                                name: name.into(),
                                optional,
                                members: Vec::new(),
                                all: false,
                            });
                            spec.structs.len() - 1
                        }
                    };
                    let s = &mut spec.structs[at];
                    s.optional &= optional;
                    for w in words {
                        if w == "*" {
                            s.all = true;
                            continue;
                        }
                        let (path, opt) = w.strip_suffix('?').map_or((w, false), |p| (p, true));
                        let path: Vec<String> = path.split('.').map(str::to_string).collect();
                        if !path.iter().all(|p| is_ident(p)) {
                            return Err(Error::kernel_types(format!("`{l}`: bad member `{w}`")));
                        }
                        if !s.members.iter().any(|(p, _)| *p == path) {
                            s.members.push((path, opt));
                        }
                    }
                }
                Some("@enum") => {
                    for w in words {
                        if !is_ident(w) {
                            return Err(Error::kernel_types(format!("`{l}`: bad constant `{w}`")));
                        }
                        if !spec.constants.iter().any(|c| c == w) {
                            spec.constants.push(w.into());
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(spec)
    }
}

/// Where the iSCSI initiator's types are, after vmlinux: the modules of
/// the probed functions first (their BTF holds every type they use).
pub const ISCSI_MODULES: &[&str] = &["libiscsi", "libiscsi_tcp", "scsi_transport_iscsi", "scsi_mod"];

/// The kernel types the template `parts` read, from the running kernel's
/// BTF (`modules`: where to look after vmlinux; one without BTF is
/// skipped); Err says why not, and the program compiles the headers.
pub fn from_btf(btf: &mut Loaded, parts: &[&str], modules: &[&str]) -> Result<KernelTypes> {
    if std::env::var_os("STORPROTOTRACE_HEADERS").is_some() {
        return Err(Error::kernel_types("STORPROTOTRACE_HEADERS is set"));
    }
    let spec = Spec::parse(&parts.join("\n"))?;
    KernelTypes::write(&spec, &btf.views(modules)?)
}

/// The socket members the stage programs read through the TCP socket
/// behind an iscsi_tcp connection (`bpf_templates/iscsi_stages.c`, its
/// `@struct socket` and `@struct tcp_sock` lines): placeholder, struct,
/// member. Their byte offsets are given as numbers (`net_offsets`), so a
/// program compiled from the headers needs no networking headers: on 5.10
/// `linux/net.h` and `linux/tcp.h` took what the stage programs include
/// from 54,500 to 94,700 preprocessed lines and 2.6 times the parse.
pub const NET_MEMBERS: [(&str, &str, &str); 4] = [
    ("SOCKET_SK_OFF", "socket", "sk"),
    ("TCP_TOTAL_RETRANS_OFF", "tcp_sock", "total_retrans"),
    ("TCP_RTT_MIN_OFF", "tcp_sock", "rtt_min"),
    ("TCP_RCV_TSVAL_OFF", "tcp_sock", "rx_opt.rcv_tsval"),
];

/// The byte offsets of `NET_MEMBERS`, in order, from vmlinux's BTF.
pub fn net_offsets(btf: &mut Loaded) -> Result<[u32; NET_MEMBERS.len()]> {
    let views = btf.views(&[])?;
    offsets(&views, &NET_MEMBERS.map(|(_, s, m)| (s, m)))
}

/// What the issuer's program reads to find the cgroup a kernel thread's
/// bio is charged to (`bpf_templates/iscsi_stages.c` BIO_CGROUP):
/// placeholder, struct, member. `struct blkcg_gq` is private to block/
/// by 6.1 (no header defines it), so these are byte offsets from
/// vmlinux's BTF on every kernel.
pub const BIO_CGROUP_MEMBERS: [(&str, &str, &str); 7] = [
    ("TASK_FLAGS_OFF", "task_struct", "flags"),
    ("BIO_BLKG_OFF", "bio", "bi_blkg"),
    ("BLKG_BLKCG_OFF", "blkcg_gq", "blkcg"),
    ("BLKCG_CGROUP_OFF", "blkcg", "css.cgroup"),
    ("CGROUP_KN_OFF", "cgroup", "kn"),
    ("KERNFS_ID_OFF", "kernfs_node", "id"),
    ("CGROUP_LEVEL_OFF", "cgroup", "level"),
];

/// Where a bio's cgroup is, from vmlinux's BTF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BioCgroup {
    /// The offsets of `BIO_CGROUP_MEMBERS`, in order.
    pub offsets: [u32; BIO_CGROUP_MEMBERS.len()],
    /// `cgroup.ancestors` (pointers, 6.1+) or `cgroup.ancestor_ids`.
    pub ancestors: u32,
    /// The ancestors are their ids (`ancestor_ids`, before 6.1).
    pub ancestor_ids: bool,
}

/// The offsets of `BIO_CGROUP_MEMBERS` and of the cgroup's ancestors from
/// vmlinux's BTF.
pub fn bio_cgroup(btf: &mut Loaded) -> Result<BioCgroup> {
    bio_cgroup_in(&btf.views(&[])?)
}

fn bio_cgroup_in(views: &[View]) -> Result<BioCgroup> {
    // One index of the BTF's structs for the three lookups.
    let index = Index::new(views);
    let members = offsets_in(&index, &BIO_CGROUP_MEMBERS.map(|(_, s, m)| (s, m)))?;
    let (ancestors, ancestor_ids) = match offsets_in(&index, &[("cgroup", "ancestors")]) {
        Ok([o]) => (o, false),
        Err(_) => (offsets_in(&index, &[("cgroup", "ancestor_ids")])?[0], true),
    };
    Ok(BioCgroup { offsets: members, ancestors, ancestor_ids })
}

/// The byte offsets of `(struct, member)` pairs in `views`; a member may
/// be a path into embedded structs (`rx_opt.rcv_tsval`).
fn offsets<const N: usize>(views: &[View], members: &[(&str, &str); N]) -> Result<[u32; N]> {
    offsets_in(&Index::new(views), members)
}

/// [`offsets`] with an index already built.
fn offsets_in<const N: usize>(index: &Index, members: &[(&str, &str); N]) -> Result<[u32; N]> {
    let mut out = [0u32; N];
    for (o, (s, path)) in out.iter_mut().zip(members) {
        let &(view, mut id) = index
            .structs
            .get(s.as_bytes())
            .ok_or_else(|| Error::kernel_types(format!("struct {s} is not in the kernel's BTF")))?;
        let mut bits = 0;
        let mut parts = path.split('.').peekable();
        while let Some(m) = parts.next() {
            let member = find_member(&view, &view.members(id), m)
                .ok_or_else(|| Error::kernel_types(format!("struct {s} has no member {path}")))?;
            if member.bitfield_size != 0 || member.bit_offset % 8 != 0 {
                return Err(Error::kernel_types(format!("{s}.{path} is a bitfield")));
            }
            bits += member.bit_offset;
            if parts.peek().is_some() {
                let (inner, t) =
                    strip(&view, member.type_id).ok_or_else(|| Error::kernel_types("BTF type vanished"))?;
                if t.kind != btf::KIND_STRUCT && t.kind != btf::KIND_UNION {
                    return Err(Error::kernel_types(format!("{s}.{m} is not a struct")));
                }
                id = inner;
            }
        }
        *o = bits / 8;
    }
    Ok(out)
}

/// `from_btf` with the BTF files under `dir` (`/sys/kernel/btf`).
pub fn from_btf_dir(dir: &std::path::Path, parts: &[&str], modules: &[&str]) -> Result<KernelTypes> {
    from_btf(&mut Loaded::open(dir)?, parts, modules)
}

/// Where the kernel types came from, for -v.
pub fn describe(types: &Result<KernelTypes>) -> String {
    match types {
        Ok(_) => "kernel types from BTF".into(),
        Err(why) => format!("kernel types from the headers ({why})"),
    }
}

/// The program to compile: the kernel types (if from BTF), then the text.
pub fn program(types: Option<&KernelTypes>, text: &str) -> String {
    match types {
        Some(t) => format!("{}{text}", t.text),
        None => text.to_string(),
    }
}

/// The generated definitions, and which optional parts exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTypes {
    pub text: String,
    /// "struct" and "struct.member.path" for everything written.
    present: BTreeSet<String>,
}

impl KernelTypes {
    /// Whether `what` ("backing_dev_info", "request_queue.disk") was found and written.
    pub fn has(&self, what: &str) -> bool {
        self.present.contains(what)
    }

    /// Whether member `path` of struct `s` is a pointer (else an array or
    /// a value), as written.
    pub fn is_pointer(&self, what: &str) -> bool {
        self.present.contains(&format!("{what}:ptr"))
    }

    /// The definitions for `spec`, the types looked up in `views` in order
    /// (vmlinux first, then modules' split BTF).
    pub fn write(spec: &Spec, views: &[View]) -> Result<KernelTypes> {
        let mut out = String::from(
            "/* Kernel types from the running kernel's BTF (src/kernel/types.rs). */\n#define BTF_TYPES 1\n",
        );
        let mut asserts = String::new();
        let mut present = BTreeSet::new();
        let index = Index::new(views);
        for s in &spec.structs {
            let Some(&(view, id)) = index.structs.get(s.name.as_bytes()) else {
                if s.optional {
                    continue;
                }
                return Err(Error::kernel_types(format!("struct {} is not in the kernel's BTF", s.name)));
            };
            let t = view.get(id).ok_or_else(|| Error::kernel_types("BTF type vanished"))?;
            let tag = if t.kind == btf::KIND_UNION { "union" } else { "struct" };
            let mut paths: Vec<(Vec<String>, bool)> = s.members.clone();
            if s.all {
                for name in member_names(&view, id) {
                    paths.push((vec![name], false));
                }
            }
            let mut w = Writer {
                view,
                root: format!("{tag} {}", s.name),
                present: &mut present,
                asserts: &mut asserts,
                pad: 0,
            };
            let body = w.body(id, &s.name, 0, &paths, 1)?;
            writeln!(out, "{tag} {} {{\n{body}}};", s.name).ok();
            writeln!(
                asserts,
                "_Static_assert(sizeof({tag} {}) == {}, \"size of {tag} {}\");",
                s.name, t.size_or_type, s.name
            )
            .ok();
            present.insert(s.name.clone());
        }
        if !spec.constants.is_empty() {
            out.push_str("enum {\n");
            for c in &spec.constants {
                let v = index
                    .constants
                    .get(c.as_bytes())
                    .ok_or_else(|| Error::kernel_types(format!("{c} is not in the kernel's BTF")))?;
                writeln!(out, "    {c} = {v},").ok();
            }
            out.push_str("};\n");
        }
        out.push_str(&asserts);
        Ok(KernelTypes { text: out, present })
    }
}

/// Every complete struct or union and every enumerator of `views`, by
/// name, the first one in view and id order winning: one walk of all types
/// for a program, not one per struct and constant looked up.
struct Index<'a> {
    structs: HashMap<&'a [u8], (View<'a>, u32)>,
    constants: HashMap<&'a [u8], i64>,
}

impl<'a> Index<'a> {
    fn new(views: &[View<'a>]) -> Index<'a> {
        let mut ix = Index { structs: HashMap::new(), constants: HashMap::new() };
        for v in views {
            for id in v.own_ids() {
                let Some(t) = v.get(id) else { continue };
                match t.kind {
                    btf::KIND_STRUCT | btf::KIND_UNION if !t.name.is_empty() && (t.vlen > 0 || t.size_or_type > 0) => {
                        ix.structs.entry(t.name).or_insert((*v, id));
                    }
                    btf::KIND_ENUM | btf::KIND_ENUM64 => {
                        for (n, val) in v.enumerators(id) {
                            ix.constants.entry(n).or_insert(val);
                        }
                    }
                    _ => {}
                }
            }
        }
        ix
    }
}

/// Typedefs and qualifiers resolved away: the type a member really has.
fn strip<'a>(view: &View<'a>, mut id: u32) -> Option<(u32, btf::Type<'a>)> {
    for _ in 0..32 {
        let t = view.get(id)?;
        match t.kind {
            8..=11 | 18 => id = t.size_or_type, // typedef, volatile, const, restrict, type_tag
            _ => return Some((id, t)),
        }
    }
    None
}

struct Writer<'v, 'p> {
    view: View<'v>,
    /// `struct name` of the type being written.
    root: String,
    present: &'p mut BTreeSet<String>,
    asserts: &'p mut String,
    pad: usize,
}

impl Writer<'_, '_> {
    /// The inside of a struct definition: a union of one padded struct per
    /// member read, and the type's full size.
    fn body(
        &mut self,
        id: u32,
        path: &str,
        base: u32,
        members: &[(Vec<String>, bool)],
        depth: usize,
    ) -> Result<String> {
        let t = self.view.get(id).ok_or_else(|| Error::kernel_types("BTF type vanished"))?;
        let all = self.view.members(id);
        let ind = "    ".repeat(depth);
        let mut out = format!("{ind}union {{\n");
        let mut firsts: Vec<&str> = Vec::new();
        for (p, _) in members {
            if !firsts.contains(&p[0].as_str()) {
                firsts.push(&p[0]);
            }
        }
        for first in firsts {
            let sub: Vec<(Vec<String>, bool)> = members
                .iter()
                .filter(|(p, _)| p[0] == first && p.len() > 1)
                .map(|(p, o)| (p[1..].to_vec(), *o))
                .collect();
            let optional = members.iter().filter(|(p, _)| p[0] == first).all(|(_, o)| *o);
            let here = format!("{path}.{first}");
            let Some(m) = find_member(&self.view, &all, first) else {
                if optional {
                    continue;
                }
                return Err(Error::kernel_types(format!("{} has no member {first}", path.replace('.', "::"))));
            };
            if m.bitfield_size != 0 || m.bit_offset % 8 != 0 {
                return Err(Error::kernel_types(format!("{here} is a bitfield")));
            }
            let byte = m.bit_offset / 8;
            let pad = if byte > 0 {
                self.pad += 1;
                format!("char __pad{}[{byte}]; ", self.pad)
            } else {
                String::new()
            };
            if !sub.is_empty() && members.iter().any(|(p, _)| p.len() == 1 && p[0] == first) {
                return Err(Error::kernel_types(format!("{here}: read whole and by member")));
            }
            let decl = if sub.is_empty() {
                self.decl(m.type_id, first, &here)?
            } else {
                let (sid, st) = strip(&self.view, m.type_id).ok_or_else(|| Error::kernel_types("BTF type vanished"))?;
                if st.kind != btf::KIND_STRUCT && st.kind != btf::KIND_UNION {
                    return Err(Error::kernel_types(format!("{here} is not a struct")));
                }
                let inner = self.body(sid, &here, base + byte, &sub, depth + 2)?;
                format!("struct {{\n{inner}{ind}    }} {first}")
            };
            writeln!(out, "{ind}    struct {{ {pad}{decl}; }};").ok();
            let member = here.split_once('.').map_or(here.as_str(), |(_, rest)| rest);
            writeln!(
                self.asserts,
                "_Static_assert(__builtin_offsetof({}, {member}) == {}, \"offset of {here}\");",
                self.root,
                base + byte
            )
            .ok();
            self.present.insert(here);
        }
        let size = t.size_or_type;
        writeln!(out, "{ind}    char __size[{size}];\n{ind}}};").ok();
        Ok(out)
    }

    /// `type name` for a member read whole.
    fn decl(&mut self, type_id: u32, name: &str, here: &str) -> Result<String> {
        let (_, t) = strip(&self.view, type_id).ok_or_else(|| Error::kernel_types("BTF type vanished"))?;
        match t.kind {
            btf::KIND_INT => int_name(&t)
                .map(|ty| format!("{ty} {name}"))
                .ok_or_else(|| Error::kernel_types(format!("{here}: an integer of odd width"))),
            btf::KIND_ENUM | btf::KIND_ENUM64 => {
                let ty = match (t.size_or_type, t.kind_flag) {
                    (1, _) => "unsigned char",
                    (2, _) => "unsigned short",
                    (4, false) => "unsigned int",
                    (4, true) => "int",
                    (8, false) => "unsigned long long",
                    (8, true) => "long long",
                    _ => return Err(Error::kernel_types(format!("{here}: an enum of {} bytes", t.size_or_type))),
                };
                Ok(format!("{ty} {name}"))
            }
            btf::KIND_PTR => {
                self.present.insert(format!("{here}:ptr"));
                let pointee = strip(&self.view, t.size_or_type).map(|(_, p)| p);
                Ok(match pointee {
                    Some(p)
                        if (p.kind == btf::KIND_STRUCT || p.kind == btf::KIND_UNION || p.kind == 7)
                            && !p.name.is_empty() =>
                    {
                        let tag =
                            if p.kind == btf::KIND_UNION || (p.kind == 7 && p.kind_flag) { "union" } else { "struct" };
                        format!("{tag} {} *{name}", String::from_utf8_lossy(p.name))
                    }
                    Some(p) if p.kind == btf::KIND_INT => format!("{} *{name}", int_name(&p).unwrap_or("void")),
                    _ => format!("void *{name}"),
                })
            }
            btf::KIND_ARRAY => {
                let (elem, n) = (u32_at(t.extra, 0), u32_at(t.extra, 8));
                self.decl(elem, &format!("{name}[{n}]"), here)
            }
            // Read whole (its address taken, its bytes copied): opaque.
            btf::KIND_STRUCT | btf::KIND_UNION => Ok(format!("struct {{ char __opaque[{}]; }} {name}", t.size_or_type)),
            k => Err(Error::kernel_types(format!("{here}: BTF kind {k} not written here"))),
        }
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4).map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

/// A member by name, looking into anonymous struct and union members (as
/// C does); the offset returned is from the start of `members`' struct.
fn find_member<'a>(view: &View<'a>, members: &[btf::Member<'a>], name: &str) -> Option<btf::Member<'a>> {
    if let Some(m) = members.iter().find(|m| m.name == name.as_bytes()) {
        return Some(*m);
    }
    for m in members.iter().filter(|m| m.name.is_empty()) {
        let (id, _) = strip(view, m.type_id)?;
        if let Some(mut inner) = find_member(view, &view.members(id), name) {
            inner.bit_offset += m.bit_offset;
            return Some(inner);
        }
    }
    None
}

/// The names of a struct's members, those of anonymous struct and union
/// members included (as C lets them be named).
fn member_names(view: &View, id: u32) -> Vec<String> {
    let mut out = Vec::new();
    for m in view.members(id) {
        if !m.name.is_empty() {
            out.push(String::from_utf8_lossy(m.name).into_owned());
        } else if let Some((inner, _)) = strip(view, m.type_id) {
            out.extend(member_names(view, inner));
        }
    }
    out
}

fn int_name(t: &btf::Type) -> Option<&'static str> {
    let enc = u32_at(t.extra, 0);
    let (signed, boolean, bits, bit_off) = (enc >> 24 & 1 == 1, enc >> 24 & 4 == 4, enc & 0xff, enc >> 16 & 0xff);
    if bits != t.size_or_type * 8 || bit_off != 0 {
        return None;
    }
    Some(match (t.size_or_type, signed, boolean) {
        (1, _, true) => "_Bool",
        (1, _, _) if t.name == b"char" => "char",
        (1, true, _) => "signed char",
        (1, false, _) => "unsigned char",
        (2, true, _) => "short",
        (2, false, _) => "unsigned short",
        (4, true, _) => "int",
        (4, false, _) => "unsigned int",
        (8, true, _) => "long long",
        (8, false, _) => "unsigned long long",
        (16, true, _) => "__int128",
        (16, false, _) => "unsigned __int128",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::Btf;

    /// A BTF blob built type by type (ids from `first`), as the kernel
    /// writes it (include/uapi/linux/btf.h).
    struct Blob {
        t: Vec<u8>,
        s: Vec<u8>,
        next: u32,
        string_base: u32,
    }

    impl Blob {
        fn new(first: u32, string_base: u32) -> Blob {
            Blob { t: Vec::new(), s: vec![0], next: first, string_base }
        }
        fn push(&mut self, v: u32) {
            self.t.extend_from_slice(&v.to_ne_bytes());
        }
        fn name(&mut self, n: &str) -> u32 {
            if n.is_empty() {
                return 0;
            }
            let off = self.s.len() as u32 + self.string_base;
            self.s.extend_from_slice(n.as_bytes());
            self.s.push(0);
            off
        }
        fn rec(&mut self, name: &str, kind: u32, vlen: u32, kflag: bool, size_or_type: u32) -> u32 {
            let n = self.name(name);
            self.push(n);
            self.push((kflag as u32) << 31 | kind << 24 | vlen);
            self.push(size_or_type);
            self.next += 1;
            self.next - 1
        }
        fn int(&mut self, name: &str, size: u32, signed: bool, bits: u32) -> u32 {
            let id = self.rec(name, 1, 0, false, size);
            self.push((signed as u32) << 24 | bits);
            id
        }
        fn ptr(&mut self, to: u32) -> u32 {
            self.rec("", 2, 0, false, to)
        }
        fn array(&mut self, elem: u32, n: u32) -> u32 {
            let id = self.rec("", 3, 0, false, 0);
            for v in [elem, elem, n] {
                self.push(v);
            }
            id
        }
        /// Members: (name, type id, bit offset, bitfield size).
        fn compound(&mut self, kind: u32, name: &str, size: u32, members: &[(&str, u32, u32, u32)]) -> u32 {
            let kflag = members.iter().any(|m| m.3 != 0);
            let id = self.rec(name, kind, members.len() as u32, kflag, size);
            for (n, ty, off, bits) in members {
                let n = self.name(n);
                self.push(n);
                self.push(*ty);
                self.push(if kflag { bits << 24 | off } else { *off });
            }
            id
        }
        fn enumeration(&mut self, name: &str, values: &[(&str, i32)]) -> u32 {
            let id = self.rec(name, 6, values.len() as u32, true, 4);
            for (n, v) in values {
                let n = self.name(n);
                self.push(n);
                self.push(*v as u32);
            }
            id
        }
        fn bytes(&self) -> Vec<u8> {
            let mut b = vec![0x9f, 0xeb, 1, 0];
            for v in [24u32, 0, self.t.len() as u32, self.t.len() as u32, self.s.len() as u32] {
                b.extend_from_slice(&v.to_ne_bytes());
            }
            b.extend_from_slice(&self.t);
            b.extend_from_slice(&self.s);
            b
        }
    }

    /// vmlinux: ints, `struct gendisk` and an enum; a module on top: a
    /// command struct with a pointer, an anonymous union, a nested struct,
    /// an array, a bitfield and a typedef'd member.
    fn kernel() -> (Btf, Btf) {
        let mut v = Blob::new(1, 0);
        let u32_ = v.int("unsigned int", 4, false, 32); // 1
        let char_ = v.int("char", 1, true, 8); // 2
        let u64_ = v.int("long long unsigned int", 8, false, 64); // 3
        let name = v.array(char_, 32); // 4
        v.compound(
            4,
            "gendisk",
            48,
            &[("major", u32_, 0, 0), ("first_minor", u32_, 32, 0), ("disk_name", name, 64, 0)],
        ); // 5
        v.enumeration("dma_data_direction", &[("DMA_TO_DEVICE", 1), ("DMA_FROM_DEVICE", 2)]); // 6
        let _ = u64_;
        let vmlinux = Btf::parse(&v.bytes(), None).unwrap();
        let mut m = Blob::new(7, vmlinux.string_bytes());
        let disk_ptr = m.ptr(5); // 7
        let anon = m.compound(5, "", 8, &[("x", 1, 0, 0), ("y", 3, 0, 0)]); // 8
        let buf = m.compound(4, "buf", 24, &[("length", 1, 128, 0)]); // 9
        let cdb = m.array(2, 16); // 10
        let typedef = m.rec("u32_t", 8, 0, false, 1); // 11
        let cmd = m.compound(
            4,
            "cmd",
            96,
            &[
                ("disk", disk_ptr, 0, 0),
                ("", anon, 64, 0),
                ("sdb", buf, 128, 0),
                ("cmnd", cdb, 320, 0),
                ("flags", 1, 448, 3),
                ("tag", typedef, 512, 0),
            ],
        ); // 12
        let _ = cmd;
        m.enumeration("", &[("TASK_DONE", 1)]); // 13
        let module = Btf::parse(&m.bytes(), Some(&vmlinux)).unwrap();
        (vmlinux, module)
    }

    fn write(spec: &str) -> Result<KernelTypes> {
        let (vmlinux, module) = kernel();
        let views = [View { base: &vmlinux, split: None }, View { base: &vmlinux, split: Some(&module) }];
        KernelTypes::write(&Spec::parse(spec)?, &views)
    }

    #[test]
    fn member_offsets_in_bytes_through_anonymous_members() {
        let (vmlinux, module) = kernel();
        let views = [View { base: &vmlinux, split: None }, View { base: &vmlinux, split: Some(&module) }];
        assert_eq!(
            offsets(
                &views,
                &[("cmd", "sdb"), ("cmd", "y"), ("cmd", "tag"), ("gendisk", "disk_name"), ("cmd", "sdb.length")]
            ),
            Ok([16, 8, 64, 8, 32])
        );
        assert_eq!(offsets(&views, &[("cmd", "flags")]), Err(Error::kernel_types("cmd.flags is a bitfield")));
        assert_eq!(offsets(&views, &[("cmd", "nope")]), Err(Error::kernel_types("struct cmd has no member nope")));
        assert_eq!(
            offsets(&views[..1], &[("cmd", "sdb")]),
            Err(Error::kernel_types("struct cmd is not in the kernel's BTF"))
        );
    }

    /// NET_MEMBERS are what iscsi_stages.c reads of the socket: its
    /// `@struct` lines list them (so BTF-written types have them) and each
    /// has its placeholder.
    #[test]
    fn net_members_agree_with_the_stage_template() {
        let spec = Spec::parse(crate::bpf::templates::ISCSI_STAGES).unwrap();
        for (ph, st, m) in NET_MEMBERS {
            let s = spec.structs.iter().find(|s| s.name == st).unwrap_or_else(|| panic!("no @struct {st}"));
            let path: Vec<String> = m.split('.').map(String::from).collect();
            assert!(s.members.iter().any(|(p, _)| *p == path), "@struct {st} lacks {m}");
            assert!(crate::bpf::templates::ISCSI_STAGES.contains(&format!("{{{{{ph}}}}}")), "no placeholder {ph}");
        }
    }

    /// BIO_CGROUP_MEMBERS each have their placeholder in iscsi_stages.c,
    /// and the cgroup's ancestors are found under either name: pointers
    /// (`ancestors`) or, before 6.1, their ids (`ancestor_ids`).
    #[test]
    fn bio_cgroup_members_from_btf_with_either_ancestors() {
        for (ph, _, _) in BIO_CGROUP_MEMBERS {
            assert!(crate::bpf::templates::ISCSI_STAGES.contains(&format!("{{{{{ph}}}}}")), "no placeholder {ph}");
        }
        for (name, ids) in [("ancestors", false), ("ancestor_ids", true)] {
            let mut v = Blob::new(1, 0);
            let u32_ = v.int("unsigned int", 4, false, 32); // 1
            let u64_ = v.int("long long unsigned int", 8, false, 64); // 2
            let list = v.array(u64_, 0); // 3
            v.compound(4, "task_struct", 64, &[("flags", u32_, 8 * 44, 0)]);
            v.compound(4, "bio", 96, &[("bi_blkg", u64_, 8 * 72, 0)]);
            v.compound(4, "blkcg_gq", 64, &[("blkcg", u64_, 8 * 40, 0)]);
            let css = v.compound(4, "cgroup_subsys_state", 16, &[("cgroup", u64_, 0, 0)]);
            v.compound(4, "blkcg", 32, &[("css", css, 0, 0)]);
            v.compound(
                4,
                "cgroup",
                512,
                &[("level", u32_, 8 * 212, 0), ("kn", u64_, 8 * 248, 0), (name, list, 8 * 504, 0)],
            );
            v.compound(4, "kernfs_node", 128, &[("id", u64_, 8 * 104, 0)]);
            let vmlinux = Btf::parse(&v.bytes(), None).unwrap();
            let got = bio_cgroup_in(&[View { base: &vmlinux, split: None }]).unwrap();
            let want = BioCgroup { offsets: [44, 72, 40, 0, 248, 104, 212], ancestors: 504, ancestor_ids: ids };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn parses_the_lists_in_template_comments() {
        let s = Spec::parse("/* x\n * @struct cmd disk sdb.length\n * @struct cmd disk opt? \n * @struct other? a\n// @struct regs *\n * @enum A B A\n */").unwrap();
        assert_eq!(s.structs.len(), 3);
        assert_eq!(
            s.structs[0].members,
            vec![
                (vec!["disk".to_string()], false),
                (vec!["sdb".into(), "length".into()], false),
                (vec!["opt".into()], true)
            ]
        );
        assert!(!s.structs[0].optional && s.structs[1].optional && s.structs[2].all);
        assert_eq!(s.constants, vec!["A", "B"]);
        for bad in ["* @struct", "* @struct 9x a", "* @struct x a-b", "* @enum A+B"] {
            assert!(Spec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn writes_members_at_their_offsets() {
        let t = write("@struct cmd disk x y sdb.length cmnd tag\n@struct gendisk major disk_name\n@enum DMA_FROM_DEVICE TASK_DONE").unwrap();
        let text = &t.text;
        for line in [
            "struct cmd {",
            "struct { struct gendisk *disk; };",
            "struct { char __pad1[8]; unsigned int x; };",
            "struct { char __pad2[8]; unsigned long long y; };",
            "struct { char __pad4[16]; unsigned int length; };",
            "struct { char __pad5[40]; char cmnd[16]; };",
            "unsigned int tag; };",
            "char __size[96];",
            "DMA_FROM_DEVICE = 2,",
            "TASK_DONE = 1,",
            "_Static_assert(__builtin_offsetof(struct cmd, sdb.length) == 32, \"offset of cmd.sdb.length\");",
            "_Static_assert(__builtin_offsetof(struct cmd, cmnd) == 40, \"offset of cmd.cmnd\");",
            "_Static_assert(__builtin_offsetof(struct cmd, tag) == 64, \"offset of cmd.tag\");",
            "_Static_assert(__builtin_offsetof(struct gendisk, disk_name) == 8, \"offset of gendisk.disk_name\");",
            "_Static_assert(sizeof(struct cmd) == 96, \"size of struct cmd\");",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
        assert!(text.starts_with("/* Kernel types") && text.contains("#define BTF_TYPES 1\n"));
        assert!(t.has("cmd") && t.has("cmd.sdb.length") && t.has("gendisk.major"));
        assert!(t.is_pointer("cmd.disk") && !t.is_pointer("cmd.cmnd"));
    }

    #[test]
    fn optional_parts_are_left_out_and_said() {
        let t = write("@struct cmd disk gone?\n@struct absent? a").unwrap();
        assert!(t.has("cmd.disk") && !t.has("cmd.gone") && !t.has("absent"));
        assert!(!t.text.contains("gone") && !t.text.contains("absent"));
    }

    #[test]
    fn what_cannot_be_written_is_an_error_with_its_reason() {
        for (spec, why) in [
            ("@struct nothing a", "struct nothing is not in the kernel's BTF"),
            ("@struct cmd gone", "cmd has no member gone"),
            ("@struct cmd flags", "cmd.flags is a bitfield"),
            ("@struct cmd disk.major", "cmd.disk is not a struct"),
            ("@struct cmd sdb sdb.length", "cmd.sdb: read whole and by member"),
            ("@enum NOPE", "NOPE is not in the kernel's BTF"),
        ] {
            assert_eq!(write(spec).err().map(|e| e.to_string()).as_deref(), Some(why), "{spec}");
        }
    }

    /// x86-64's `struct pt_regs` is fixed by the user-space ABI (21 longs,
    /// r15 first, di at 112, ss last), so the running kernel's BTF must
    /// give exactly that.
    #[test]
    fn pt_regs_from_the_running_kernels_btf() {
        if cfg!(not(target_arch = "x86_64")) {
            return;
        }
        let mut btf = match Loaded::open(std::path::Path::new("/sys/kernel/btf")) {
            Ok(b) => b,
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "note: pt_regs_from_the_running_kernels_btf skipped: {e}");
                return;
            }
        };
        let t = KernelTypes::write(&Spec::parse("@struct pt_regs *").unwrap(), &btf.views(&[]).unwrap()).unwrap();
        assert!(t.text.contains("_Static_assert(sizeof(struct pt_regs) == 168,"), "{}", t.text);
        assert!(t.text.contains("struct { unsigned long long r15; };"));
        assert!(t.text.contains("struct { char __pad14[112]; unsigned long long di; };"));
        assert!(t.text.contains("_Static_assert(__builtin_offsetof(struct pt_regs, ss) == 160,"), "{}", t.text);
    }
}
