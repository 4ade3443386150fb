//! Interval statistics of the per-command stages (iscstat): rows read from
//! the kernel's aggregates (bpf_templates/iscstat.c: `struct row_key`,
//! `struct row_val`, `struct hist_key`), fine log-linear histograms,
//! percentiles.

use crate::bpf::events::{Direction, Reader};
use crate::bpf::maps;
use crate::bpf::templates::Value;
use crate::error::{Error, Result};
use crate::kernel::cgroup::CgroupPaths;
use std::collections::BTreeMap;
use std::time::Duration;

/// Stage numbers of iscstat.c (STAGE_WAIT .. STAGE_TOTAL), in order.
pub const STAGES: [&str; NSTAGES] = ["WAIT", "SEND", "RESP", "NET", "TARGET", "TOTAL"];
pub const NSTAGES: usize = 6;
pub const WAIT: usize = 0;
pub const SEND: usize = 1;
pub const RESP: usize = 2;
pub const NET: usize = 3;
pub const TARGET: usize = 4;
pub const TOTAL: usize = 5;
/// Bucket bounds in ns; bpf_templates/iscstat.c `le_index` has the same.
pub const LE_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];
/// Buckets of the Prometheus histogram: LE_NS and +Inf.
pub const LE_BUCKETS: usize = LE_NS.len() + 1;

/// sizeof the C structs (tests check them against the template; the tool
/// checks them against the loaded maps at start).
pub const ROW_KEY_SIZE: usize = 40;
pub const ROW_VAL_SIZE: usize = 120;
pub const HIST_KEY_SIZE: usize = 48;
pub const CONN_KEY_SIZE: usize = 8;
pub const CONN_TCP_SIZE: usize = 16;

/// Bounds [low, high) in ns of a fine bucket of bpf_templates/iscstat.c.
pub fn bucket_bounds(b: u32) -> (u64, u64) {
    if b < 16 {
        return (b as u64 * 1000, (b as u64 + 1) * 1000);
    }
    let msb = b / 16 + 3;
    let sub = (b % 16) as u64;
    let shift = msb - 4;
    (((16 + sub) << shift) * 1000, ((17 + sub) << shift) * 1000)
}

/// The bucket a value falls in (the same function as the C side; used to test it).
pub fn fine_bucket(ns: u64) -> u32 {
    let v = ns / 1000;
    if v < 16 {
        return v as u32;
    }
    let msb = 63 - v.leading_zeros();
    (msb - 3) * 16 + ((v >> (msb - 4)) & 15) as u32
}

/// `row_key.cgroup` of the commands with no issuer known (iscstat.c
/// CGROUP_NOT_KNOWN), and of those of the cgroups past the first
/// `--cgroup-rows` seen (CGROUP_OTHER).
pub const CGROUP_NOT_KNOWN: u64 = 0;
pub const CGROUP_OTHER: u64 = u64::MAX;

/// Cgroups with rows of their own when --cgroup-rows is not given.
pub const DEFAULT_CGROUP_ROWS: u32 = 32;

/// The template values of rows per cgroup: `rows` is how many cgroups
/// get rows of their own, None for the default (`per_cgroup` false: rows
/// are not per cgroup).
pub fn cgroup_values(per_cgroup: bool, rows: Option<u32>) -> [(&'static str, Value); 2] {
    let rows = if per_cgroup { rows.unwrap_or(DEFAULT_CGROUP_ROWS) } else { 1 };
    [("PER_CGROUP", per_cgroup.into()), ("CGROUP_ROWS", rows.into())]
}

/// A row's cgroup as its path, or `other`; None where no issuer is known
/// and for a cgroup gone before its path was read (JSON's null). `paths`
/// must have looked the id up.
pub fn cgroup_path(id: u64, paths: &CgroupPaths) -> Option<&str> {
    match id {
        CGROUP_NOT_KNOWN => None,
        CGROUP_OTHER => Some("other"),
        id => paths.known(id),
    }
}

/// A row's cgroup as the CGROUP column and the Prometheus label show it:
/// [`cgroup_path`], `-` where no issuer is known, else the id of a cgroup
/// gone before its path was read.
pub fn cgroup_name(id: u64, paths: &CgroupPaths) -> String {
    match (id, cgroup_path(id, paths)) {
        (CGROUP_NOT_KNOWN, _) => "-".into(),
        (_, Some(p)) => p.to_string(),
        (id, None) => id.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    pub sid: u32,
    pub cid: u32,
    pub host: u32,
    pub lun: u64,
    pub dir: u32,
    /// The issuer's cgroup id, or CGROUP_*; 0 where rows are not per cgroup.
    pub cgroup: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Row {
    pub count: u64,
    pub bytes: u64,
    /// Commands whose RESP was split into NET and TARGET (the count their
    /// sums and histograms are of).
    pub split: u64,
    pub sum: [u64; NSTAGES],
    pub max: [u64; NSTAGES],
    /// per stage: bucket -> count
    pub hist: [BTreeMap<u32, u64>; NSTAGES],
    /// per stage: Prometheus bucket counts (LE_NS, last = +Inf)
    pub le: [[u64; LE_BUCKETS]; NSTAGES],
}

/// `struct row_key` bytes -> (epoch, key)
pub fn parse_row_key(b: &[u8]) -> Option<(u32, RowKey)> {
    let mut r = Reader::new(b);
    let epoch = r.u32()?;
    let sid = r.u32()?;
    let cid = r.u32()?;
    let host = r.u32()?;
    let lun = r.u64()?;
    let dir = r.u32()?;
    let _pad = r.u32()?;
    let cgroup = r.u64()?;
    Some((epoch, RowKey { sid, cid, host, lun, dir, cgroup }))
}

/// Sum the per-CPU copies of `struct row_val` (each 8-aligned).
pub fn add_percpu_row(row: &mut Row, values: &[u8], ncpus: usize) {
    const SZ: usize = ROW_VAL_SIZE.div_ceil(8) * 8;
    for cpu in 0..ncpus {
        let Some(chunk) = values.get(cpu * SZ..(cpu + 1) * SZ) else { break };
        let mut r = Reader::new(chunk);
        row.count += r.u64().unwrap_or(0);
        row.bytes += r.u64().unwrap_or(0);
        row.split += r.u64().unwrap_or(0);
        for i in 0..NSTAGES {
            row.sum[i] += r.u64().unwrap_or(0);
        }
        for i in 0..NSTAGES {
            row.max[i] = row.max[i].max(r.u64().unwrap_or(0));
        }
    }
}

/// `struct hist_key` bytes -> (epoch, row, stage, bucket)
pub fn parse_hist_key(b: &[u8]) -> Option<(u32, RowKey, u32, u32)> {
    let (epoch, key) = parse_row_key(b.get(..ROW_KEY_SIZE)?)?;
    let mut r = Reader::new(b.get(ROW_KEY_SIZE..)?);
    Some((epoch, key, r.u32()?, r.u32()?))
}

impl Row {
    /// Fold another row's interval into this one.
    pub fn merge(&mut self, o: &Row) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.split += o.split;
        for i in 0..NSTAGES {
            self.sum[i] += o.sum[i];
            self.max[i] = self.max[i].max(o.max[i]);
            for (b, n) in &o.hist[i] {
                *self.hist[i].entry(*b).or_default() += n;
            }
            for j in 0..LE_BUCKETS {
                self.le[i][j] += o.le[i][j];
            }
        }
    }

    /// Commands a stage's statistics are of: NET and TARGET only those split.
    pub fn count_of(&self, stage: usize) -> u64 {
        if stage == NET || stage == TARGET {
            self.split
        } else {
            self.count
        }
    }

    pub fn avg(&self, stage: usize) -> u64 {
        self.sum[stage].checked_div(self.count_of(stage)).unwrap_or(0)
    }

    /// The p-th percentile (0 < p <= 100) of a stage: the midpoint of the
    /// bucket holding it, clamped to the exact maximum.
    pub fn percentile(&self, stage: usize, p: f64) -> u64 {
        let total: u64 = self.hist[stage].values().sum();
        if total == 0 {
            return 0;
        }
        if p >= 100.0 {
            return self.max[stage];
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (&b, &n) in &self.hist[stage] {
            seen += n;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(b);
                return ((lo + hi) / 2).min(self.max[stage]).max(lo.min(self.max[stage]));
            }
        }
        self.max[stage]
    }

    /// log2 histogram in microseconds (biolatency style): (low_us, high_us,
    /// count), from the first non-empty slot to the last.
    pub fn log2_us(&self, stage: usize) -> Vec<(u64, u64, u64)> {
        let mut slots: BTreeMap<u32, u64> = BTreeMap::new();
        for (&b, &n) in &self.hist[stage] {
            let (lo, _) = bucket_bounds(b);
            let us = lo / 1000;
            let slot = if us <= 1 { 0 } else { 63 - us.leading_zeros() };
            *slots.entry(slot).or_default() += n;
        }
        let (Some(&first), Some(&last)) = (slots.keys().next(), slots.keys().last()) else { return Vec::new() };
        (first..=last)
            .map(|s| {
                let (lo, hi) = if s == 0 { (0, 1) } else { (1u64 << s, (1u64 << (s + 1)) - 1) };
                (lo, hi, slots.get(&s).copied().unwrap_or(0))
            })
            .collect()
    }
}

/// Rows as -L / -D ask for them: the kernel may split more finely (per LUN
/// and direction for Prometheus); merge back to what is shown.
pub fn regroup(rows: &BTreeMap<RowKey, Row>, per_lun: bool, per_dir: bool) -> BTreeMap<RowKey, Row> {
    let mut out: BTreeMap<RowKey, Row> = BTreeMap::new();
    for (k, r) in rows {
        let mut k = *k;
        if !per_lun {
            k.lun = 0;
        }
        if !per_dir {
            k.dir = 0;
        }
        out.entry(k).or_default().merge(r);
    }
    out
}

/// Check that the loaded program's maps have the layouts this module
/// decodes: a mismatch is an error, never garbage numbers.
pub fn check_maps(bpf: &bcc::BPF) -> Result<()> {
    for (name, key, value) in [
        ("rows", ROW_KEY_SIZE, ROW_VAL_SIZE),
        ("hists", HIST_KEY_SIZE, 8),
        ("prom", HIST_KEY_SIZE, 8),
        ("conns", CONN_KEY_SIZE, CONN_TCP_SIZE),
    ] {
        maps::check_sizes(bpf.table(name)?, name, key, value)?;
    }
    Ok(())
}

/// The epochs the programs write to (iscstat.c `epoch[]`): the rows and
/// Prometheus buckets' flips at every collection, the fine histograms' at
/// every report only (a scrape never walks them).
pub struct Collector {
    rows_epoch: u32,
    fine_epoch: u32,
    ncpus: usize,
}

const EPOCH_ROWS: u32 = 0;
const EPOCH_FINE: u32 = 1;

impl Collector {
    pub fn new() -> Result<Collector> {
        Ok(Collector { rows_epoch: 0, fine_epoch: 0, ncpus: maps::possible_cpus()? })
    }

    fn flip(bpf: &bcc::BPF, slot: u32, epoch: &mut u32) -> Result<u32> {
        let old = *epoch;
        *epoch ^= 1;
        let mut ep = bpf.table("epoch")?;
        ep.set(&mut slot.to_ne_bytes().to_vec(), &mut epoch.to_ne_bytes().to_vec())
            .map_err(|e| Error::bpf(format!("cannot switch epoch: {e}")))?;
        Ok(old)
    }

    /// Flip the epoch(s), let programs that read the old one finish, then
    /// read and delete every entry of the old epoch. `fine`: the fine
    /// histograms too (at a report with -P/-H; not at a scrape).
    pub fn collect(&mut self, bpf: &bcc::BPF, fine: bool) -> Result<BTreeMap<RowKey, Row>> {
        let old = Self::flip(bpf, EPOCH_ROWS, &mut self.rows_epoch)?;
        let old_fine = if fine { Some(Self::flip(bpf, EPOCH_FINE, &mut self.fine_epoch)?) } else { None };
        std::thread::sleep(Duration::from_millis(20));
        let mut rows: BTreeMap<RowKey, Row> = BTreeMap::new();
        let mut rt = bpf.table("rows")?;
        for (k, v) in maps::percpu_entries(&mut rt, self.ncpus, 1 << 14) {
            if let Some((e, key)) = parse_row_key(&k) {
                if e == old {
                    add_percpu_row(rows.entry(key).or_default(), &v, self.ncpus);
                    maps::delete(&mut rt, &k);
                }
            }
        }
        let mut pt = bpf.table("prom")?;
        for (k, v) in maps::entries(&mut pt, 1 << 15) {
            if let Some((e, key, stage, bucket)) = parse_hist_key(&k) {
                if e == old && (stage as usize) < STAGES.len() && (bucket as usize) < LE_BUCKETS {
                    rows.entry(key).or_default().le[stage as usize][bucket as usize] += maps::first_u64(&v);
                    maps::delete(&mut pt, &k);
                }
            }
        }
        if let Some(old_fine) = old_fine {
            let mut ht = bpf.table("hists")?;
            for (k, v) in maps::entries(&mut ht, 1 << 17) {
                if let Some((e, key, stage, bucket)) = parse_hist_key(&k) {
                    if e == old_fine && (stage as usize) < STAGES.len() {
                        // A row's fine buckets may come without its counts
                        // (a scrape took those): the report merges them.
                        *rows.entry(key).or_default().hist[stage as usize].entry(bucket).or_default() +=
                            maps::first_u64(&v);
                        maps::delete(&mut ht, &k);
                    }
                }
            }
        }
        Ok(rows)
    }
}

/// A connection: (sid, cid).
pub type Conn = (u32, u32);

/// TCP segments retransmitted per connection, from the socket's own
/// counter (total_retrans, what `ss -ti` shows) as iscstat.c's `conns` map
/// last saw it: its growth since the previous reading, counted from the
/// first command timed on each socket (a relogin brings a new socket).
#[derive(Debug, Default)]
pub struct Retransmits {
    seen: BTreeMap<Conn, (u64, u32)>,
    /// Since the last report.
    pub interval: BTreeMap<Conn, u64>,
    /// Since start.
    pub total: BTreeMap<Conn, u64>,
}

/// `struct conn_key` and `struct conn_tcp` bytes -> (conn, sk, first, retrans)
pub fn parse_conn(key: &[u8], val: &[u8]) -> Option<(Conn, u64, u32, u32)> {
    let (mut k, mut v) = (Reader::new(key), Reader::new(val));
    Some(((k.u32()?, k.u32()?), v.u64()?, v.u32()?, v.u32()?))
}

impl Retransmits {
    /// One reading of a connection's socket.
    pub fn add(&mut self, conn: Conn, sk: u64, first: u32, now: u32) {
        let delta = match self.seen.get(&conn) {
            Some(&(s, last)) if s == sk => now.saturating_sub(last),
            _ => now.saturating_sub(first),
        };
        let last = self.seen.get(&conn).filter(|(s, _)| *s == sk).map_or(now, |(_, l)| now.max(*l));
        self.seen.insert(conn, (sk, last));
        *self.interval.entry(conn).or_default() += delta as u64;
        *self.total.entry(conn).or_default() += delta as u64;
    }

    pub fn read(&mut self, bpf: &bcc::BPF) -> Result<()> {
        let mut t = bpf.table("conns")?;
        for (k, v) in maps::entries(&mut t, 1 << 12) {
            if let Some((conn, sk, first, now)) = parse_conn(&k, &v) {
                self.add(conn, sk, first, now);
            }
        }
        Ok(())
    }
}

pub fn dir_name(d: u32, split: bool) -> &'static str {
    if !split {
        return "*";
    }
    Direction::from_code(d as u8).letter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_fine_and_consistent() {
        for ns in [0u64, 1023, 1024, 15 * 1024, 16 * 1024, 17_000, 1_000_000, 1_300_000, 12_345_678, 40_000_000_000] {
            let b = fine_bucket(ns);
            let (lo, hi) = bucket_bounds(b);
            assert!(lo <= ns && ns < hi, "{ns} not in bucket {b} [{lo}, {hi})");
            if ns >= 16_000 {
                assert!((hi - lo) as f64 / lo as f64 <= 1.0 / 16.0 + 1e-9, "bucket {b} too wide");
            }
        }
        assert_ne!(fine_bucket(1_000_000), fine_bucket(1_300_000), "1.0 ms and 1.3 ms must differ");
    }

    fn row_with(stage_values: &[u64]) -> Row {
        let mut r = Row::default();
        for &v in stage_values {
            r.count += 1;
            r.sum[TOTAL] += v;
            r.max[TOTAL] = r.max[TOTAL].max(v);
            *r.hist[TOTAL].entry(fine_bucket(v)).or_default() += 1;
        }
        r
    }

    #[test]
    fn percentiles_tell_1_0_from_1_3_ms() {
        let mut vals = vec![1_000_000u64; 50];
        vals.extend(vec![1_300_000u64; 50]);
        let r = row_with(&vals);
        let p50 = r.percentile(TOTAL, 50.0) as f64 / 1e6;
        let p99 = r.percentile(TOTAL, 99.0) as f64 / 1e6;
        assert!((p50 - 1.0).abs() < 0.04, "p50 {p50}");
        assert!((p99 - 1.3).abs() < 0.04, "p99 {p99}");
        assert_eq!(r.percentile(TOTAL, 100.0), 1_300_000);
        assert_eq!(r.avg(TOTAL), 1_150_000);
    }

    #[test]
    fn log2_histogram_counts_everything() {
        let r = row_with(&[500, 1_500, 3_000, 3_500, 1_000_000]);
        let h = r.log2_us(TOTAL);
        assert_eq!(h.iter().map(|x| x.2).sum::<u64>(), 5);
        assert_eq!(h[0], (0, 1, 2), "500 ns and 1.5 us are in 0 -> 1: {h:?}");
        assert_eq!(h[1], (2, 3, 2), "{h:?}");
        assert!(
            h.iter().any(|&(lo, hi, n)| lo == 512 && hi == 1023 && n == 1),
            "1 ms is in 512 -> 1023 (as 1000 us): {h:?}"
        );
        for w in h.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0, "slots are contiguous: {h:?}");
        }
        let r = row_with(&[40_000, 50_000]);
        assert_eq!(r.log2_us(TOTAL)[0].0, 32, "leading empty slots are left out");
    }

    #[test]
    fn percpu_rows_sum_and_max() {
        let mut vals = Vec::new();
        for cpu in 0..2u64 {
            for x in [3 + cpu, 4096, 2, 10, 20, 30, 1, 2, 60, 5 + cpu, 6, 7, 3, 4, 8] {
                vals.extend_from_slice(&x.to_ne_bytes());
            }
        }
        let mut r = Row::default();
        add_percpu_row(&mut r, &vals, 2);
        assert_eq!((r.count, r.bytes, r.split), (7, 8192, 4));
        assert_eq!(r.sum, [20, 40, 60, 2, 4, 120]);
        assert_eq!(r.max, [6, 6, 7, 3, 4, 8]);
        // NET and TARGET averages are over the split commands only.
        assert_eq!((r.avg(NET), r.avg(TARGET), r.avg(TOTAL)), (0, 1, 17));
    }

    #[test]
    fn merge_adds_and_keeps_max() {
        let mut a = row_with(&[1_000, 2_000]);
        let b = row_with(&[5_000_000]);
        a.merge(&b);
        assert_eq!(a.count, 3);
        assert_eq!(a.max[TOTAL], 5_000_000);
        assert_eq!(a.sum[TOTAL], 5_003_000);
        assert_eq!(a.hist[TOTAL].values().sum::<u64>(), 3);
    }

    #[test]
    fn layouts_match_iscstat_c() {
        use crate::bpf::layout::{self, Sample};
        use crate::bpf::templates::ISCSTAT;
        let key = Sample::new(layout::parse(ISCSTAT, "row_key").unwrap());
        let val = Sample::new(layout::parse(ISCSTAT, "row_val").unwrap());
        let hist = Sample::new(layout::parse(ISCSTAT, "hist_key").unwrap());
        assert_eq!((key.layout.size, val.layout.size, hist.layout.size), (ROW_KEY_SIZE, ROW_VAL_SIZE, HIST_KEY_SIZE));
        let (epoch, k) = parse_row_key(&key.bytes).unwrap();
        assert_eq!(
            [epoch as u64, k.sid as u64, k.cid as u64, k.host as u64, k.lun, k.dir as u64, k.cgroup],
            ["epoch", "sid", "cid", "host", "lun", "dir", "cgroup"].map(|n| key.int(n, 0))
        );
        assert!(ISCSTAT.contains(&format!("#define CGROUP_NOT_KNOWN {CGROUP_NOT_KNOWN}\n")));
        assert_eq!(CGROUP_OTHER, u64::MAX);
        assert!(ISCSTAT.contains("#define CGROUP_OTHER 0xffffffffffffffffULL\n"));
        let mut r = Row::default();
        add_percpu_row(&mut r, &val.bytes, 1);
        assert_eq!((r.count, r.bytes, r.split), (val.int("count", 0), val.int("bytes", 0), val.int("split", 0)));
        assert_eq!(val.layout.fields.len(), 5, "every field of row_val is decoded");
        for i in 0..NSTAGES {
            assert_eq!((r.sum[i], r.max[i]), (val.int("sum", i), val.int("max", i)), "stage {i}");
        }
        // hist_key = row_key + stage + bucket: the row part is a row_key.
        let mut hb = hist.bytes.clone();
        hb[..ROW_KEY_SIZE].copy_from_slice(&key.bytes);
        let (_, hk, stage, bucket) = parse_hist_key(&hb).unwrap();
        assert_eq!((hk, stage as u64, bucket as u64), (k, hist.int("stage", 0), hist.int("bucket", 0)));
        assert_eq!(hist.layout.field("stage").offset, ROW_KEY_SIZE);
        for (i, st) in STAGES.iter().enumerate() {
            assert!(ISCSTAT.contains(&format!("#define STAGE_{st} {i}\n")), "stage {st} is {i} in iscstat.c");
        }
        assert!(ISCSTAT.contains(&format!("#define STAGES {}\n", STAGES.len())));
        let named = [WAIT, SEND, RESP, NET, TARGET, TOTAL].map(|i| STAGES[i]);
        assert_eq!(named, ["WAIT", "SEND", "RESP", "NET", "TARGET", "TOTAL"]);
    }

    #[test]
    fn conn_layouts_match_iscstat_c() {
        use crate::bpf::layout::{self, Sample};
        use crate::bpf::templates::ISCSTAT;
        let key = Sample::new(layout::parse(ISCSTAT, "conn_key").unwrap());
        let val = Sample::new(layout::parse(ISCSTAT, "conn_tcp").unwrap());
        assert_eq!((key.layout.size, val.layout.size), (CONN_KEY_SIZE, CONN_TCP_SIZE));
        let (conn, sk, first, retrans) = parse_conn(&key.bytes, &val.bytes).unwrap();
        assert_eq!([conn.0 as u64, conn.1 as u64], ["sid", "cid"].map(|n| key.int(n, 0)));
        assert_eq!([sk, first as u64, retrans as u64], ["sk", "first", "retrans"].map(|n| val.int(n, 0)));
    }

    #[test]
    fn retransmits_grow_per_socket() {
        let mut r = Retransmits::default();
        r.add((1, 0), 0xa, 5, 7); // first reading: counted from the first command's 5
        r.add((1, 0), 0xa, 5, 7); // no change
        r.add((1, 0), 0xa, 5, 10);
        assert_eq!(r.interval[&(1, 0)], 5);
        r.interval.clear();
        r.add((1, 0), 0xb, 0, 2); // relogin: a new socket, counted from its own start
        r.add((2, 0), 0xc, 9, 9);
        assert_eq!((r.interval[&(1, 0)], r.total[&(1, 0)], r.total[&(2, 0)]), (2, 7, 0));
    }

    #[test]
    fn regroup_merges_what_is_not_shown() {
        let k = |lun, dir| RowKey { sid: 1, cid: 0, host: 2, lun, dir, cgroup: 0 };
        let mut rows = BTreeMap::new();
        rows.insert(k(0, 1), row_with(&[1_000]));
        rows.insert(k(1, 2), row_with(&[3_000, 5_000]));
        let all = regroup(&rows, false, false);
        assert_eq!(all.len(), 1);
        assert_eq!((all[&k(0, 0)].count, all[&k(0, 0)].max[TOTAL]), (3, 5_000));
        assert_eq!(regroup(&rows, true, false).len(), 2);
        assert_eq!(regroup(&rows, true, true), rows);
    }

    #[test]
    fn keys_parse() {
        let mut b = Vec::new();
        for x in [1u32, 2, 0, 6] {
            b.extend_from_slice(&x.to_ne_bytes());
        }
        b.extend_from_slice(&1u64.to_ne_bytes());
        b.extend_from_slice(&2u32.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&4242u64.to_ne_bytes());
        b.extend_from_slice(&3u32.to_ne_bytes());
        b.extend_from_slice(&77u32.to_ne_bytes());
        let (e, k, st, bk) = parse_hist_key(&b).unwrap();
        assert_eq!((e, k.sid, k.host, k.lun, k.dir, k.cgroup, st, bk), (1, 2, 6, 1, 2, 4242, 3, 77));
        assert_eq!(dir_name(2, true), "W");
        assert_eq!(dir_name(2, false), "*");
    }
}
