//! /proc/kallsyms: one parser for its lines, used for the traceable
//! functions (src/kernel/mod.rs) and for kernel stack symbols (iscfreeze).

use std::fs;

/// One line of kallsyms: (address, type letter, name, module).
pub fn parse_line(l: &str) -> Option<(u64, char, &str, Option<&str>)> {
    let mut it = l.split_whitespace();
    let addr = u64::from_str_radix(it.next()?, 16).ok()?;
    let kind = it.next()?.chars().next()?;
    let name = it.next()?;
    let module = it.next().and_then(|m| m.strip_prefix('[')).and_then(|m| m.strip_suffix(']'));
    Some((addr, kind, name, module))
}

/// Kernel text symbols by address, for stack addresses.
#[derive(Debug, Clone, Default)]
pub struct Ksyms {
    syms: Vec<(u64, String)>,
}

impl Ksyms {
    pub fn load() -> Ksyms {
        Ksyms::parse(&fs::read_to_string("/proc/kallsyms").unwrap_or_default())
    }

    pub fn parse(text: &str) -> Ksyms {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(parse_line)
            .filter(|&(addr, kind, _, _)| addr != 0 && matches!(kind, 't' | 'T' | 'w' | 'W'))
            .map(|(addr, _, name, _)| (addr, name.to_string()))
            .collect();
        syms.sort();
        Ksyms { syms }
    }

    /// `name+0xoff`, or the address in hex.
    pub fn resolve(&self, addr: u64) -> String {
        let i = self.syms.partition_point(|(a, _)| *a <= addr);
        if i == 0 {
            return format!("0x{addr:x}");
        }
        let (a, n) = &self.syms[i - 1];
        format!("{n}+0x{:x}", addr - a)
    }

    /// Function name only (for matching).
    pub fn name(&self, addr: u64) -> String {
        let s = self.resolve(addr);
        s.split('+').next().unwrap_or("").to_string()
    }
}

/// Addresses of a BPF_STACK_TRACE value (127 u64 slots, zero-terminated).
pub fn stack_addrs(value: &[u8]) -> Vec<u64> {
    value
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .take_while(|&a| a != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksyms_resolve() {
        let k = Ksyms::parse("ffffffff81000000 T _stext\nffffffff81000100 t elevator_switch\nffffffff81000200 d data\nffffffffc0000000 t iscsi_queuecommand\t[libiscsi]\n");
        assert_eq!(k.resolve(0xffffffff81000110), "elevator_switch+0x10");
        assert_eq!(k.name(0xffffffff81000210), "elevator_switch");
        assert_eq!(k.resolve(0x10), "0x10");
        assert_eq!(stack_addrs(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), vec![1]);
        assert_eq!(
            parse_line("ffffffffc0000000 t iscsi_queuecommand\t[libiscsi]"),
            Some((0xffffffffc0000000, 't', "iscsi_queuecommand", Some("libiscsi")))
        );
        assert_eq!(parse_line("garbage"), None);
    }
}
