//! iscfreeze's logic: which functions carry a freeze, a quiesce and a wait
//! on the running kernel, the template values, naming the disk of a queue,
//! matching the submitters that waited to the freeze they waited for, and
//! the per-disk summary from the kernel's totals. The C side is
//! bpf_templates/iscfreeze.c; its event record is
//! [`crate::bpf::events::FreezeEvent`]; its lines are in [`view`].

pub mod view;

use crate::bpf::events::{FreezeEvent, Reader};
use crate::bpf::runner::{EventBuffer, Probe};
use crate::bpf::templates::{self, Template, Value};
use crate::error::{Error, Result};
use crate::iscsi::blockdev::{self, BlockDevs};
use crate::kernel::headers::BlockLayout;
use crate::kernel::Kernel;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

pub const FREEZE_BEGIN: &[&str] = &[
    "blk_freeze_queue_start",
    "__blk_freeze_queue_start",
    "blk_freeze_queue_start_non_owner",
    "blk_freeze_queue",
    "blk_mq_freeze_queue",
    "blk_mq_freeze_queue_nomemsave",
];
pub const FREEZE_END: &[&str] = &[
    "blk_mq_unfreeze_queue",
    "__blk_mq_unfreeze_queue",
    "blk_mq_unfreeze_queue_nomemrestore",
    "blk_mq_unfreeze_queue_non_owner",
];
pub const QUIESCE_BEGIN: &[&str] = &["blk_mq_quiesce_queue", "blk_mq_quiesce_queue_nowait"];
pub const QUIESCE_END: &[&str] = &["blk_mq_unquiesce_queue"];

/// The template parts of iscfreeze's program (what `render` renders, and
/// where the kernel types it reads are listed).
pub const PARTS: &[&str] = &[templates::COMMON, templates::ISCFREEZE];

/// The probes iscfreeze attaches on this kernel, and what it cannot see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezePlan {
    pub probes: Vec<Probe>,
    pub notes: Vec<String>,
    pub layout: BlockLayout,
}

impl FreezePlan {
    pub fn choose(kernel: &Kernel, layout: BlockLayout) -> Result<FreezePlan> {
        let have =
            |c: &[&'static str]| -> Vec<&'static str> { c.iter().copied().filter(|f| kernel.can_probe(f)).collect() };
        let mut probes = Vec::new();
        let mut notes = Vec::new();
        let (fb, fe) = (have(FREEZE_BEGIN), have(FREEZE_END));
        if fb.is_empty() {
            return Err(Error::missing_probe("a queue freeze", FREEZE_BEGIN));
        }
        if fe.is_empty() {
            return Err(Error::missing_probe("a queue unfreeze", FREEZE_END));
        }
        probes.extend(fb.iter().map(|f| Probe::entry(f, "freeze_begin")));
        probes.extend(fe.iter().map(|f| Probe::entry(f, "freeze_end")));
        let (qb, qe) = (have(QUIESCE_BEGIN), have(QUIESCE_END));
        if qb.is_empty() || qe.is_empty() {
            notes.push(format!(
                "no traceable {} / {}: quiesces (iSCSI recovery stalls) are not shown",
                QUIESCE_BEGIN.join(", "),
                QUIESCE_END.join(", ")
            ));
        } else {
            probes.extend(qb.iter().map(|f| Probe::entry(f, "quiesce_begin")));
            probes.extend(qe.iter().map(|f| Probe::entry(f, "quiesce_end")));
        }
        if kernel.can_probe("blk_queue_enter") {
            probes.push(Probe::entry("blk_queue_enter", "wait_enter_queue"));
            probes.push(Probe::ret("blk_queue_enter", "wait_return"));
        } else {
            notes.push(
                "blk_queue_enter is not traceable: waits for request allocation (passthrough commands) are not counted"
                    .into(),
            );
        }
        if kernel.can_probe("__bio_queue_enter") {
            probes.push(Probe::entry("__bio_queue_enter", "wait_enter_bio"));
            probes.push(Probe::ret("__bio_queue_enter", "wait_return"));
        } else {
            notes.push("__bio_queue_enter is not traceable (bio_queue_enter is inline before 6.1): bios that wait for an unfreeze are not counted".into());
        }
        if !layout.queue_disk {
            notes.push("struct request_queue has no disk pointer (before 5.15): disks are named from the queue's bdi, filtered in user space".into());
        }
        Ok(FreezePlan { probes, notes, layout })
    }

    /// The program, sending through `buffer`; `filter_set`: only the disks
    /// put in the `disks` map (filtered in user space where the queue has no
    /// disk pointer).
    pub fn render(&self, buffer: EventBuffer, min_us: u64, filter_set: bool) -> Result<String> {
        let mut values: Vec<(&str, Value)> = buffer.values().to_vec();
        values.extend([
            ("MIN_US", min_us.into()),
            ("FILTER_SET", (filter_set && self.layout.queue_disk).into()),
            ("QUEUE_DISK", self.layout.queue_disk.into()),
            ("QUIESCE_DEPTH", self.layout.quiesce_depth.into()),
        ]);
        Template::new(PARTS).render(&values)
    }

    pub fn describe(&self, kernel: &Kernel) -> String {
        format!(
            "kernel {}: functions from {:?}, ring buffer: {}, queue disk via {}, nested quiesce depth: {}",
            kernel.release,
            kernel.source,
            kernel.ringbuf,
            if self.layout.queue_disk { "q->disk" } else { "q->backing_dev_info" },
            self.layout.quiesce_depth
        )
    }
}

/// Names the disk of a queue from what the program recorded: the gendisk's
/// name (q->disk), or the bdi's "major:minor" on kernels without it, where
/// the disk filter is applied here.
pub struct DiskNamer {
    pub layout: BlockLayout,
    pub devs: BlockDevs,
    /// Whole-disk dev_t numbers traced; None: every disk.
    pub wanted: Option<HashSet<u32>>,
}

impl DiskNamer {
    /// (name, dev) of a queue's disk, or None when the filter excludes it.
    pub fn disk(&mut self, dev: u32, name: &str) -> Option<(String, u32)> {
        let (name, dev) = if self.layout.queue_disk {
            (if name.is_empty() { "-".to_string() } else { name.to_string() }, dev)
        } else {
            let dev = blockdev::parse_dev(name).unwrap_or(0);
            (self.devs.name(dev), dev)
        };
        match &self.wanted {
            Some(w) if !self.layout.queue_disk && !w.contains(&dev) => None,
            _ => Some((name, dev)),
        }
    }
}

/// A freeze or quiesce that ended, waiting for its waiters' reports.
#[derive(Debug, Clone)]
pub struct Ended {
    pub rec: FreezeEvent,
    pub disk: String,
    /// Kernel stack of the starter, symbolised.
    pub stack: Vec<String>,
    arrived: Instant,
}

/// Matches waits to the freeze they waited for. Waiters wake after the
/// unfreeze, so their reports arrive after the freeze's: a freeze is ready
/// when as many waits as it counted have come, or after `patience`.
#[derive(Debug)]
pub struct Matcher {
    pending: Vec<Ended>,
    /// (queue, freeze start) -> (wait ns of each waiter seen, first arrival)
    waits: HashMap<(u64, u64), (Vec<u64>, Instant)>,
    patience: Duration,
}

impl Default for Matcher {
    fn default() -> Self {
        Matcher { pending: Vec::new(), waits: HashMap::new(), patience: Duration::from_secs(1) }
    }
}

impl Matcher {
    pub fn wait(&mut self, rec: &FreezeEvent, now: Instant) {
        self.waits.entry((rec.q, rec.start)).or_insert_with(|| (Vec::new(), now)).0.push(rec.value);
    }

    pub fn ended(&mut self, rec: FreezeEvent, disk: String, stack: Vec<String>, now: Instant) {
        self.pending.push(Ended { rec, disk, stack, arrived: now });
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Freezes ready to print (all of them with `all`), each with the wait
    /// times of its waiters, in arrival order. Waits of freezes never
    /// shown (under the threshold, another disk) are dropped after twice
    /// the patience.
    pub fn ready(&mut self, all: bool, now: Instant) -> Vec<(Ended, Vec<u64>)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let p = &self.pending[i];
            let got = self.waits.get(&(p.rec.q, p.rec.start)).map(|w| w.0.len() as u64).unwrap_or(0);
            if all || got >= p.rec.value || now.duration_since(p.arrived) >= self.patience {
                let p = self.pending.remove(i);
                let w = self.waits.remove(&(p.rec.q, p.rec.start)).map(|w| w.0).unwrap_or_default();
                out.push((p, w));
            } else {
                i += 1;
            }
        }
        let keep = self.patience * 2;
        self.waits.retain(|_, (_, t)| now.duration_since(*t) < keep);
        out
    }
}

/// `struct total_t` of iscfreeze.c, keyed by `struct qkey`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Total {
    pub kind: u32,
    pub count: u64,
    pub time_ns: u64,
    pub waits: u64,
    pub wait_ns: u64,
    pub max_wait_ns: u64,
    pub dev: u32,
    pub disk: String,
}

impl Total {
    pub const KEY_SIZE: usize = 16;
    pub const SIZE: usize = 80;

    pub fn parse(key: &[u8], value: &[u8]) -> Option<Total> {
        let mut k = Reader::new(key);
        let (_queue, kind) = (k.u64()?, k.u32()?);
        let mut r = Reader::new(value);
        let (count, time_ns, waits, wait_ns, max_wait_ns, dev, _pad, disk) =
            (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u32()?, r.u32()?, r.cstr(32)?);
        Some(Total { kind, count, time_ns, waits, wait_ns, max_wait_ns, dev, disk })
    }
}

/// Per disk: every freeze and quiesce, whatever the threshold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskSummary {
    pub freezes: u64,
    pub frozen_ns: u64,
    pub delayed: u64,
    pub waited_ns: u64,
    pub max_wait_ns: u64,
    pub quiesces: u64,
    pub quiesced_ns: u64,
}

/// Fold the kernel's totals (one per queue and kind) into one row per disk.
pub fn summarise(totals: &[Total], namer: &mut DiskNamer) -> BTreeMap<String, DiskSummary> {
    let mut per_disk: BTreeMap<String, DiskSummary> = BTreeMap::new();
    for t in totals {
        let Some((disk, _)) = namer.disk(t.dev, &t.disk) else { continue };
        let row = per_disk.entry(disk).or_default();
        if t.kind == FreezeEvent::KIND_FREEZE {
            row.freezes += t.count;
            row.frozen_ns += t.time_ns;
            row.delayed += t.waits;
            row.waited_ns += t.wait_ns;
            row.max_wait_ns = row.max_wait_ns.max(t.max_wait_ns);
        } else {
            row.quiesces += t.count;
            row.quiesced_ns += t.time_ns;
        }
    }
    per_disk
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::layout::{self, Sample};

    fn ev(ty: u64, q: u64, start: u64, value: u64) -> FreezeEvent {
        FreezeEvent {
            ty,
            q,
            start,
            end: start + 10,
            value,
            kind: 0,
            pid: 1,
            tid: 1,
            dev: 0,
            stack: -1,
            comm: "x".into(),
            disk: "sda".into(),
        }
    }

    #[test]
    fn a_freeze_waits_for_its_waiters_then_for_patience() {
        let t0 = Instant::now();
        let mut m = Matcher::default();
        m.ended(ev(0, 7, 100, 2), "sda".into(), vec![], t0);
        m.ended(ev(0, 8, 100, 0), "sdb".into(), vec![], t0);
        m.wait(&ev(1, 7, 100, 500), t0);
        m.wait(&ev(1, 9, 555, 1), t0); // a freeze never shown
        let r = m.ready(false, t0);
        assert_eq!(r.len(), 1, "sdb counted no waiter: ready at once; sda has 1 of 2");
        assert_eq!(r[0].0.disk, "sdb");
        m.wait(&ev(1, 7, 100, 700), t0);
        let r = m.ready(false, t0);
        assert_eq!((r[0].0.disk.as_str(), r[0].1.clone()), ("sda", vec![500, 700]));
        // A freeze whose waiters never all report is shown after patience.
        m.ended(ev(0, 7, 200, 3), "sda".into(), vec![], t0);
        assert!(m.ready(false, t0 + Duration::from_millis(999)).is_empty());
        assert_eq!(m.ready(false, t0 + Duration::from_secs(1)).len(), 1);
        assert!(m.is_empty());
        assert_eq!(m.waits.len(), 1, "the wait of a freeze never shown is kept a while");
        assert!(m.ready(false, t0 + Duration::from_secs(2)).is_empty());
        assert!(m.waits.is_empty(), "stale waits dropped after twice the patience");
    }

    #[test]
    fn totals_match_iscfreeze_c_and_fold_per_disk() {
        let key = Sample::new(layout::parse(templates::ISCFREEZE, "qkey").unwrap());
        let val = Sample::new(layout::parse(templates::ISCFREEZE, "total_t").unwrap());
        assert_eq!((key.layout.size, val.layout.size), (Total::KEY_SIZE, Total::SIZE));
        let t = Total::parse(&key.bytes, &val.bytes).unwrap();
        assert_eq!(t.kind as u64, key.int("kind", 0));
        assert_eq!(
            [t.count, t.time_ns, t.waits, t.wait_ns, t.max_wait_ns, t.dev as u64],
            ["count", "time_ns", "waits", "wait_ns", "max_wait_ns", "dev"].map(|n| val.int(n, 0))
        );
        assert_eq!(t.disk, val.string("disk"));

        let mut namer = DiskNamer { layout: BlockLayout::modern(), devs: BlockDevs::default(), wanted: None };
        let f = |kind, count, max| Total {
            kind,
            count,
            time_ns: 10 * count,
            waits: count,
            wait_ns: count,
            max_wait_ns: max,
            dev: 1,
            disk: "sda".into(),
        };
        let s = summarise(&[f(0, 2, 5), f(0, 1, 9), f(1, 4, 0)], &mut namer);
        assert_eq!(
            s["sda"],
            DiskSummary {
                freezes: 3,
                frozen_ns: 30,
                delayed: 3,
                waited_ns: 3,
                max_wait_ns: 9,
                quiesces: 4,
                quiesced_ns: 40
            }
        );
    }

    #[test]
    fn old_kernels_name_and_filter_disks_in_user_space() {
        let old = BlockLayout { bio_bdev: false, queue_disk: false, quiesce_depth: false };
        let mut namer =
            DiskNamer { layout: old, devs: BlockDevs::default(), wanted: Some(HashSet::from([blockdev::kdev(8, 0)])) };
        assert_eq!(namer.disk(0, "8:0"), Some(("8:0".to_string(), blockdev::kdev(8, 0))));
        assert_eq!(namer.disk(0, "8:16"), None);
        let mut namer =
            DiskNamer { layout: BlockLayout::modern(), devs: BlockDevs::default(), wanted: Some(HashSet::new()) };
        assert_eq!(namer.disk(5, ""), Some(("-".to_string(), 5)), "filtered in the kernel already");
    }

    #[test]
    fn every_branch_renders() {
        for queue_disk in [true, false] {
            for quiesce_depth in [true, false] {
                for ringbuf in [true, false] {
                    for filter in [true, false] {
                        let p = FreezePlan {
                            probes: vec![],
                            notes: vec![],
                            layout: BlockLayout { bio_bdev: true, queue_disk, quiesce_depth },
                        };
                        let c = p.render(EventBuffer { ring: ringbuf, pages: 8 }, 5, filter).unwrap();
                        assert!(c.contains(&format!("#define FILTER_SET {}\n", (filter && queue_disk) as u8)));
                        assert!(c.contains(&format!("#define QUEUE_DISK {}\n", queue_disk as u8)) && !c.contains("{{"));
                        assert!(c.contains(&format!("#define USE_RINGBUF {}\n", ringbuf as u8)));
                        assert!(c.contains("#define EVENT_PAGES 8LL "));
                    }
                }
            }
        }
    }
}
