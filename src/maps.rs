//! Reading BPF maps. libbcc 0.26 makes the bcc crate's `Table::iter()` loop
//! forever (it stops only on a return of exactly -1), so keys are walked here
//! with libbcc's key functions, stopping on any negative return.

use bcc::table::Table;
use bcc_sys::bccapi::{bpf_get_first_key, bpf_get_next_key, bpf_lookup_elem};
use std::os::raw::c_void;

/// Slots of the `counters` array every program has (bpf_templates/common.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Lost = 0,
    EndedNoResponse = 1,
    DispatchBusy = 2,
    InflightFull = 3,
    /// A command's memory reused while our map still held it: the kernel
    /// skipped the program that would have seen its end.
    EndNotSeen = 4,
}

/// Every (key, value) pair of a hash map, each key once. Bounded by `limit`
/// so a map that changes under us cannot keep us here.
pub fn entries(table: &mut Table, limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let vsz = table.leaf_size();
    walk(table, vsz, limit)
}

/// Entries of a per-CPU hash map: each value holds `ncpus` copies, each
/// rounded up to 8 bytes.
pub fn percpu_entries(table: &mut Table, ncpus: usize, limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let vsz = table.leaf_size().div_ceil(8) * 8 * ncpus;
    walk(table, vsz, limit)
}

fn walk(table: &mut Table, vsz: usize, limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let fd = table.fd();
    let ksz = table.key_size();
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut key = vec![0u8; ksz];
    let mut rc = unsafe { bpf_get_first_key(fd, key.as_mut_ptr() as *mut c_void, ksz) };
    while rc >= 0 && out.len() < limit {
        let mut val = vec![0u8; vsz];
        let found = unsafe { bpf_lookup_elem(fd, key.as_mut_ptr() as *mut c_void, val.as_mut_ptr() as *mut c_void) } >= 0;
        if found && !out.iter().any(|(k, _)| *k == key) {
            out.push((key.clone(), val));
        }
        let mut next = vec![0u8; ksz];
        rc = unsafe { bpf_get_next_key(fd, key.as_mut_ptr() as *mut c_void, next.as_mut_ptr() as *mut c_void) };
        key = next;
    }
    out
}

pub fn delete(table: &mut Table, key: &[u8]) {
    let mut k = key.to_vec();
    let _ = table.delete(&mut k);
}

pub fn count_entries(table: &mut Table, limit: usize) -> usize {
    entries(table, limit).len()
}

/// The first u64 of a map value; 0 if the value is shorter (never a panic).
pub fn first_u64(value: &[u8]) -> u64 {
    crate::events::Reader::new(value).u64().unwrap_or(0)
}

/// A u64 value by u32 key (array slots, per-id counters); 0 when absent.
pub fn read_u64(table: &mut Table, key: u32) -> u64 {
    let mut k = key.to_ne_bytes().to_vec();
    match table.get(&mut k) {
        Ok(v) => first_u64(&v),
        Err(_) => 0,
    }
}

pub fn counter(table: &mut Table, c: Counter) -> u64 {
    read_u64(table, c as u32)
}

/// Put every key in a set map (value 1).
pub fn fill_set<K: Copy>(table: &mut Table, keys: &[K], to_bytes: impl Fn(K) -> Vec<u8>) -> crate::Result<()> {
    for k in keys {
        let mut kb = to_bytes(*k);
        let mut one = vec![1u8];
        table.set(&mut kb, &mut one).map_err(|e| crate::Error::env(format!("cannot fill filter map: {e}")))?;
    }
    Ok(())
}
