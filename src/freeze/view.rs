//! iscfreeze's lines: one per freeze or quiesce that ended, with its
//! stack and the waits matched to it, and the summary per disk.

use crate::bpf::events::FreezeEvent;
use crate::cli::json;
use crate::cli::output::{Clock, Out, Unit};
use crate::freeze::{DiskNamer, DiskSummary, Ended, Matcher};
use crate::kernel::ksyms::{self, Ksyms};
use std::collections::BTreeMap;
use std::time::Instant;

/// What iscfreeze prints, and the state that matches waits to freezes.
pub struct FreezeView {
    pub json: bool,
    pub timestamp: bool,
    pub unit: Unit,
    pub clock: Clock,
    pub ksyms: Ksyms,
    pub namer: DiskNamer,
    pub matcher: Matcher,
    pub shown: u64,
    pub malformed: u64,
}

impl FreezeView {
    /// Take records from the event buffer: waits to match, freezes that ended.
    pub fn take<'a>(&mut self, recs: impl IntoIterator<Item = &'a [u8]>, stacks: &mut bcc::table::Table) {
        let now = Instant::now();
        for b in recs {
            let Some(r) = FreezeEvent::parse(b) else {
                self.malformed += 1;
                continue;
            };
            if r.ty == FreezeEvent::TYPE_WAIT {
                self.matcher.wait(&r, now);
                continue;
            }
            let Some((disk, _)) = self.namer.disk(r.dev, &r.disk) else { continue };
            let mut stack = Vec::new();
            if r.stack >= 0 {
                let mut key = (r.stack as u32).to_ne_bytes().to_vec();
                if let Ok(v) = stacks.get(&mut key) {
                    stack = ksyms::stack_addrs(&v).into_iter().map(|a| self.ksyms.resolve(a)).collect();
                }
            }
            self.matcher.ended(r, disk, stack, now);
        }
    }

    /// Print freezes whose waiters have all reported (or after 1 s, or at the end).
    pub fn print_ready(&mut self, out: &mut Out, all: bool) {
        for (p, waits) in self.matcher.ready(all, Instant::now()) {
            for l in self.lines(&p, &waits) {
                out.line(&l);
            }
            self.shown += 1;
        }
    }

    /// The text header.
    pub fn header(&self) -> String {
        let u = self.unit.label();
        let time = if self.timestamp { "TIME" } else { "TIME(s)" };
        format!(
            "{time:<14} {:<7} {:<8} {:<16} {:>7} {:>12} {:>7} {:>12} {:>12}",
            "KIND",
            "DISK",
            "COMM",
            "PID",
            format!("FROZEN({u})"),
            "WAITERS",
            format!("MAXWAIT({u})"),
            format!("WAITED({u})")
        )
    }

    fn lines(&self, p: &Ended, waits: &[u64]) -> Vec<String> {
        let r = &p.rec;
        let u = self.unit;
        let time = self.clock.time(r.start, self.timestamp);
        let freeze = r.kind == FreezeEvent::KIND_FREEZE;
        let kind = if freeze { "freeze" } else { "quiesce" };
        let frozen = r.end.saturating_sub(r.start);
        let max = waits.iter().copied().max().unwrap_or(0);
        let total: u64 = waits.iter().sum();
        if self.json {
            let o = json::Object::new()
                .str("time", &time)
                .str("kind", kind)
                .str("disk", &p.disk)
                .str("comm", &r.comm)
                .num("pid", r.pid)
                .num("tid", r.tid)
                .num("start_ns", r.start)
                .num("end_ns", r.end)
                .num("frozen_ns", frozen);
            let o = if freeze {
                o.num("waiters", r.value)
                    .num("waits_seen", waits.len())
                    .num("wait_max_ns", max)
                    .num("wait_total_ns", total)
            } else {
                o.null("waiters").null("waits_seen").null("wait_max_ns").null("wait_total_ns")
            };
            return vec![o.str("stack", &p.stack.join(";")).finish()];
        }
        let (n, mx, tot) =
            if freeze { (r.value.to_string(), u.fmt(max), u.fmt(total)) } else { ("-".into(), "-".into(), "-".into()) };
        let mut v = vec![format!(
            "{time:<14} {kind:<7} {:<8} {:<16} {:>7} {:>12} {n:>7} {mx:>12} {tot:>12}",
            p.disk,
            r.comm,
            r.pid,
            u.fmt(frozen)
        )];
        v.extend(p.stack.iter().map(|s| format!("        {s}")));
        v
    }
}

/// The exit summary's table: per disk, every freeze and quiesce the kernel
/// counted (any length).
pub fn summary_table(per_disk: &BTreeMap<String, DiskSummary>, unit: Unit) -> Vec<String> {
    let u = unit;
    let mut lines = vec![format!(
        "{:<8} {:>7} {:>12} {:>8} {:>12} {:>12} {:>8} {:>12}",
        "DISK",
        "FREEZES",
        format!("FROZEN({})", u.label()),
        "DELAYED",
        format!("WAITED({})", u.label()),
        format!("MAXWAIT({})", u.label()),
        "QUIESCES",
        format!("QUIESCED({})", u.label())
    )];
    for (d, r) in per_disk {
        lines.push(format!(
            "{d:<8} {:>7} {:>12} {:>8} {:>12} {:>12} {:>8} {:>12}",
            r.freezes,
            u.fmt(r.frozen_ns),
            r.delayed,
            u.fmt(r.waited_ns),
            u.fmt(r.max_wait_ns),
            r.quiesces,
            u.fmt(r.quiesced_ns)
        ));
    }
    if per_disk.is_empty() {
        lines.push("(no freeze or quiesce seen)".into());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_table_has_a_row_per_disk_or_says_none() {
        let none = summary_table(&BTreeMap::new(), Unit::Ms);
        assert_eq!(none.len(), 2, "{none:?}");
        assert_eq!(none[1], "(no freeze or quiesce seen)");
        let d = DiskSummary { freezes: 2, frozen_ns: 3_000_000, ..Default::default() };
        let t = summary_table(&BTreeMap::from([("sdb".to_string(), d)]), Unit::Ms);
        assert_eq!(t.len(), 2, "{t:?}");
        let cells: Vec<&str> = t[1].split_whitespace().collect();
        assert_eq!(&cells[..3], ["sdb", "2", "3.000"]);
    }
}
