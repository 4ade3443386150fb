//! Reading BPF maps. libbcc 0.26 makes the bcc crate's `Table::iter()` loop
//! forever (it stops only on a return of exactly -1), so keys are walked here
//! with libbcc's key functions, stopping on any negative return.

use bcc::table::Table;
use bcc_sys::bccapi::{bpf_get_first_key, bpf_get_next_key, bpf_lookup_elem};
use std::os::raw::c_void;

/// Slots of the `counters` array every program has: the `CTR_*` defines of
/// bpf_templates/common.h, one name per slot (a test checks they agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// An event or row that did not fit (buffer or map full).
    Lost = 0,
    /// Commands aborted, failed by session recovery, or never sent.
    EndedNoResponse = 1,
    /// A command dispatched again after a dispatch that got no task
    /// (iscsi_queuecommand refused it as busy, or failed it at once).
    DispatchBusy = 2,
    /// The in-flight map could not take the command (its insert failed):
    /// command not timed.
    InflightFull = 3,
    /// A command's memory reused while our map still held it: the kernel
    /// skipped the program that would have seen its end.
    EndNotSeen = 4,
    /// iscfreeze: freezes and quiesces of disks not traced.
    FreezeUnfiltered = 5,
    /// submitslower: submissions timed (any length).
    SubmitTimed = 6,
    /// Commands timed whose RESP could not be split into NET and TARGET
    /// (no PDU back seen, not iscsi_tcp, no RTT sample yet, or the first
    /// PDU back came before the send call returned).
    NotSplit = 7,
    /// Of the commands not split: those whose connection's round trip was
    /// not known (no clean round trip, and TCP's minimum RTT not held by
    /// the exchanges seen: network or target cannot be told apart).
    NetUnknown = 8,
}

impl Counter {
    pub const ALL: [Counter; 9] = [
        Counter::Lost,
        Counter::EndedNoResponse,
        Counter::DispatchBusy,
        Counter::InflightFull,
        Counter::EndNotSeen,
        Counter::FreezeUnfiltered,
        Counter::SubmitTimed,
        Counter::NotSplit,
        Counter::NetUnknown,
    ];
    /// The commands a stage tool did not count, each by its reason (the
    /// exporter's lost commands, iscstat's per-interval lost).
    pub const UNCOUNTED: [Counter; 3] = [Counter::Lost, Counter::InflightFull, Counter::EndNotSeen];

    /// Why a command was not counted, for the exporter's label.
    pub fn reason(self) -> &'static str {
        match self {
            Counter::Lost => "buffer_full",
            Counter::EndedNoResponse => "ended_without_response",
            Counter::DispatchBusy => "dispatch_busy",
            Counter::InflightFull => "inflight_map_full",
            Counter::EndNotSeen => "end_not_seen",
            Counter::FreezeUnfiltered => "freeze_unfiltered",
            Counter::SubmitTimed => "submit_timed",
            Counter::NotSplit => "resp_not_split",
            Counter::NetUnknown => "resp_net_unknown",
        }
    }

    /// The name of its slot in common.h.
    pub fn c_name(self) -> &'static str {
        match self {
            Counter::Lost => "CTR_LOST",
            Counter::EndedNoResponse => "CTR_ENDED_NO_RESPONSE",
            Counter::DispatchBusy => "CTR_DISPATCH_BUSY",
            Counter::InflightFull => "CTR_INFLIGHT_FULL",
            Counter::EndNotSeen => "CTR_END_NOT_SEEN",
            Counter::FreezeUnfiltered => "CTR_FREEZE_UNFILTERED",
            Counter::SubmitTimed => "CTR_SUBMIT_TIMED",
            Counter::NotSplit => "CTR_NOT_SPLIT",
            Counter::NetUnknown => "CTR_NET_UNKNOWN",
        }
    }
}

/// CPUs a per-CPU map holds a value for: `/sys/devices/system/cpu/possible`
/// ("0-3", "0,2-5"). Unreadable or odd content is an error, never a guess
/// (the kernel writes one value per possible CPU into our buffer).
pub fn possible_cpus() -> crate::Result<usize> {
    let path = "/sys/devices/system/cpu/possible";
    let text = std::fs::read_to_string(path).map_err(|e| crate::Error::io(format!("{path}: {e}")))?;
    parse_cpu_list(&text).ok_or_else(|| crate::Error::io(format!("{path}: cannot read CPU list {:?}", text.trim())))
}

/// Count the CPUs of a list such as "0-3,5"; None if any part is malformed.
pub fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut n = 0;
    for part in text.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// A loaded map's key and value sizes must be what its decoder reads.
pub fn check_sizes(mut table: Table, name: &str, key: usize, value: usize) -> crate::Result<()> {
    let (k, v) = (table.key_size(), table.leaf_size());
    if (k, v) != (key, value) {
        return Err(crate::Error::bpf(format!(
            "map {name}: key {k} / value {v} bytes, the decoder expects {key} / {value} (the template and its Rust decoder disagree)"
        )));
    }
    Ok(())
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
    let vsz = percpu_value_size(table, ncpus);
    walk(table, vsz, limit)
}

/// The bytes a lookup in a per-CPU map writes: `ncpus` copies of the value,
/// each rounded up to 8 bytes (the bcc crate's `Table::get` allocates one
/// copy only: the kernel would write past it).
fn percpu_value_size(table: &mut Table, ncpus: usize) -> usize {
    table.leaf_size().div_ceil(8) * 8 * ncpus
}

/// One key's value in a per-CPU hash map: every CPU's copy, as
/// `percpu_entries` gives them; None when the key is absent.
pub fn percpu_get(table: &mut Table, key: &[u8], ncpus: usize) -> Option<Vec<u8>> {
    let mut k = key.to_vec();
    let mut val = vec![0u8; percpu_value_size(table, ncpus)];
    let found =
        unsafe { bpf_lookup_elem(table.fd(), k.as_mut_ptr() as *mut c_void, val.as_mut_ptr() as *mut c_void) } >= 0;
    found.then_some(val)
}

fn walk(table: &mut Table, vsz: usize, limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let fd = table.fd();
    let ksz = table.key_size();
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut key = vec![0u8; ksz];
    let mut rc = unsafe { bpf_get_first_key(fd, key.as_mut_ptr() as *mut c_void, ksz) };
    while rc >= 0 && out.len() < limit {
        let mut val = vec![0u8; vsz];
        let found =
            unsafe { bpf_lookup_elem(fd, key.as_mut_ptr() as *mut c_void, val.as_mut_ptr() as *mut c_void) } >= 0;
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
    crate::bpf::events::Reader::new(value).u64().unwrap_or(0)
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
        table.set(&mut kb, &mut one).map_err(|e| crate::Error::bpf(format!("cannot fill filter map: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_agree_with_common_h() {
        let defines: Vec<(String, u32)> = crate::bpf::templates::COMMON
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                (it.next() == Some("#define")).then_some(())?;
                let name = it.next()?.strip_prefix("CTR_")?;
                Some((format!("CTR_{name}"), it.next()?.parse().ok()?))
            })
            .filter(|(n, _)| n != "CTR_SLOTS")
            .collect();
        let ours: Vec<(String, u32)> = Counter::ALL.iter().map(|c| (c.c_name().to_string(), *c as u32)).collect();
        assert_eq!(defines, ours);
        let slots: u32 = crate::bpf::templates::COMMON
            .lines()
            .find_map(|l| l.strip_prefix("#define CTR_SLOTS "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ours.iter().all(|(_, v)| *v < slots));
        for t in [
            crate::bpf::templates::ISCSI_STAGES,
            crate::bpf::templates::ISCFREEZE,
            crate::bpf::templates::SUBMITSLOWER,
            crate::bpf::templates::ISCSTAT,
        ] {
            assert!(!t.contains("#define CTR_"), "counter slots are defined in common.h only");
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3\n"), Some(4));
        assert_eq!(parse_cpu_list("0,2-5"), Some(5));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("0-x"), None);
        assert!(possible_cpus().unwrap() >= 1, "this machine's own list reads");
    }
}
