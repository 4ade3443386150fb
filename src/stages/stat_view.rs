//! iscstat's reports: per interval, one row (or JSON object) per
//! session:connection (LUN, direction), with the stages' averages, maxima,
//! percentiles and histograms.

use crate::cli::json;
use crate::cli::output::Unit;
use crate::iscsi::topology::Topology;
use crate::kernel::cgroup::CgroupPaths;
use crate::stages::stats::{self, Conn, Row, RowKey, NET, SEND, STAGES, TARGET, TOTAL, WAIT};
use std::collections::BTreeMap;

/// What a report shows.
#[derive(Debug, Clone)]
pub struct StatView {
    pub unit: Unit,
    pub per_lun: bool,
    pub per_dir: bool,
    pub percentiles: bool,
    pub histograms: bool,
    /// Every stage's average and maximum, and the target's name (else the
    /// averages that explain TOTAL, TOTAL's maximum and RETX, in 100 columns).
    pub wide: bool,
    /// Wide, and the initiator and portal.
    pub extended: bool,
    pub json: bool,
    /// SEND told apart from RESP: else SEND is `-` / null, and has no
    /// percentiles or histogram (the kernel keeps none).
    pub have_sent: bool,
    /// RESP split into NET and TARGET (else both are `-` / null).
    pub have_rx: bool,
}

impl StatView {
    /// Whether the kernel gives this stage at all.
    fn stage_known(&self, i: usize) -> bool {
        (self.have_sent || i != SEND) && (self.have_rx || (i != NET && i != TARGET))
    }

    /// Whether a row has this stage: NET and TARGET only where some of its
    /// commands were split.
    fn row_has(&self, r: &Row, i: usize) -> bool {
        self.stage_known(i) && r.count_of(i) > 0
    }

    /// The lines of one interval's report.
    /// `retrans`: TCP segments retransmitted per connection in the interval.
    /// `cgroups`: where rows are per cgroup, their paths (every row's
    /// looked up): a last column CGROUP, `cgroup` and `cgroup_id` in JSON.
    #[allow(clippy::too_many_arguments)]
    pub fn report(
        &self,
        topo: &Topology,
        rows: &BTreeMap<RowKey, Row>,
        retrans: &BTreeMap<Conn, u64>,
        cgroups: Option<&CgroupPaths>,
        secs: f64,
        stamp: &str,
        lost: u64,
    ) -> Vec<String> {
        let retx = |k: &RowKey| retrans.get(&(k.sid, k.cid)).copied().unwrap_or(0);
        let unit = self.unit;
        let label = |k: &RowKey| -> (String, String) {
            let s = topo.session(k.sid);
            let disks = match s {
                Some(s) if self.per_lun => s
                    .luns
                    .iter()
                    .filter(|l| l.lun == k.lun)
                    .filter_map(|l| l.disk.clone())
                    .collect::<Vec<_>>()
                    .join(","),
                Some(s) => s.luns.iter().filter_map(|l| l.disk.clone()).collect::<Vec<_>>().join(","),
                None => "?".into(),
            };
            (
                if disks.is_empty() { "-".into() } else { disks },
                s.map(|s| s.target.clone()).unwrap_or_else(|| "?".into()),
            )
        };
        let mut lines = Vec::new();
        if self.json {
            for (k, r) in rows {
                let (disks, target) = label(k);
                let mut o = json::Object::new()
                    .str("time", stamp)
                    .float("interval_s", secs, 3)
                    .num("sid", k.sid)
                    .num("cid", k.cid);
                if self.per_lun {
                    o = o.num("lun", k.lun);
                }
                if self.per_dir {
                    o = o.str("dir", stats::dir_name(k.dir, true));
                }
                if let Some(paths) = cgroups {
                    // null: no issuer known; "other": past --cgroup-rows.
                    let named = k.cgroup != stats::CGROUP_NOT_KNOWN && k.cgroup != stats::CGROUP_OTHER;
                    o = o
                        .opt_num("cgroup_id", named.then_some(k.cgroup))
                        .opt_str("cgroup", stats::cgroup_path(k.cgroup, paths));
                }
                o = o
                    .str("disks", &disks)
                    .str("target", &target)
                    .num("count", r.count)
                    .num("bytes", r.bytes)
                    .num("retrans", retx(k));
                if self.have_rx {
                    o = o.num("split", r.split);
                }
                for (i, st) in STAGES.iter().enumerate() {
                    let st = st.to_lowercase();
                    let known = self.row_has(r, i);
                    o = o
                        .opt_num(&format!("{st}_avg_ns"), known.then(|| r.avg(i)))
                        .opt_num(&format!("{st}_max_ns"), known.then_some(r.max[i]));
                    if self.percentiles {
                        for p in [50.0, 95.0, 99.0] {
                            o = o.opt_num(&format!("{st}_p{}_ns", p as u32), known.then(|| r.percentile(i, p)));
                        }
                    }
                }
                lines.push(o.num("lost", lost).finish());
            }
            return lines;
        }
        let u = unit.label();
        lines.push(format!(
            "{stamp}  interval {secs:.2}s{}",
            if lost > 0 { format!("  ({lost} events lost)") } else { String::new() }
        ));
        let wide = self.wide || self.extended;
        let disks_w = if wide { 11 } else { 8 };
        // The default columns: the averages of the stages that add up to
        // TOTAL, then TOTAL's maximum.
        let narrow = [(WAIT, 8), (SEND, 8), (NET, 8), (TARGET, 10), (TOTAL, 9)];
        let mut h = format!("{:<7} {:<disks_w$}", "SID:CID", "DISKS");
        if self.per_lun {
            h.push_str(&format!(" {:>3}", "LUN"));
        }
        if self.per_dir {
            h.push_str(" D");
        }
        h.push_str(&format!(" {:>8} {:>9}", "IOPS", "KB/s"));
        if wide {
            for st in STAGES {
                h.push_str(&format!(" {:>9} {:>9}", format!("{st}avg"), format!("max({u})")));
            }
            h.push_str(&format!(" {:>5} TARGETNAME", "RETX"));
            if self.extended {
                h.push_str(" INITIATOR PORTAL");
            }
        } else {
            for (i, w) in narrow {
                h.push_str(&format!(" {:>w$}", format!("{}({u})", STAGES[i])));
            }
            h.push_str(&format!(" {:>8} {:>4}", format!("MAX({u})"), "RETX"));
        }
        if cgroups.is_some() {
            h.push_str(" CGROUP");
        }
        lines.push(h);
        for (k, r) in rows {
            let (disks, target) = label(k);
            let mut l = format!("{:<7} {:<disks_w$}", format!("{}:{}", k.sid, k.cid), disks);
            if self.per_lun {
                l.push_str(&format!(" {:>3}", k.lun));
            }
            if self.per_dir {
                l.push_str(&format!(" {}", stats::dir_name(k.dir, true)));
            }
            l.push_str(&format!(" {:>8.1} {:>9.1}", r.count as f64 / secs, r.bytes as f64 / 1024.0 / secs));
            let avg = |i: usize| if self.row_has(r, i) { unit.fmt(r.avg(i)) } else { "-".into() };
            if wide {
                for i in 0..STAGES.len() {
                    let max = if self.row_has(r, i) { unit.fmt(r.max[i]) } else { "-".into() };
                    l.push_str(&format!(" {:>9} {max:>9}", avg(i)));
                }
                l.push_str(&format!(" {:>5} {target}", retx(k)));
            } else {
                for (i, w) in narrow {
                    l.push_str(&format!(" {:>w$}", avg(i)));
                }
                let max = if self.row_has(r, TOTAL) { unit.fmt(r.max[TOTAL]) } else { "-".into() };
                l.push_str(&format!(" {max:>8} {:>4}", retx(k)));
            }
            if self.extended {
                let s = topo.session(k.sid);
                l.push_str(&format!(
                    " {} {}",
                    s.map(|s| s.initiator.as_str()).unwrap_or("?"),
                    s.map(|s| s.portal()).unwrap_or_default()
                ));
            }
            if let Some(paths) = cgroups {
                l.push(' ');
                l.push_str(&stats::cgroup_name(k.cgroup, paths));
            }
            lines.push(l);
            if self.percentiles {
                let mut p = String::from("        percentiles");
                for (i, st) in STAGES.iter().enumerate().filter(|(i, _)| self.row_has(r, *i)) {
                    p.push_str(&format!(
                        "  {st} p50/p95/p99/max {}/{}/{}/{}",
                        unit.fmt(r.percentile(i, 50.0)),
                        unit.fmt(r.percentile(i, 95.0)),
                        unit.fmt(r.percentile(i, 99.0)),
                        unit.fmt(r.max[i])
                    ));
                }
                lines.push(p);
            }
            if self.histograms {
                for (i, st) in STAGES.iter().enumerate().filter(|(i, _)| self.row_has(r, *i)) {
                    lines.push(format!("        {st} (us){:>22} : count", ""));
                    let h = r.log2_us(i);
                    let peak = h.iter().map(|x| x.2).max().unwrap_or(1).max(1);
                    for (lo, hi, n) in h {
                        lines.push(format!(
                            "        {lo:>10} -> {hi:<10} : {n:<8} |{:<40}|",
                            "*".repeat((n * 40 / peak) as usize)
                        ));
                    }
                }
            }
        }
        if rows.is_empty() {
            lines.push("(no iSCSI commands completed)".into());
        }
        lines.push(String::new());
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn rows() -> BTreeMap<RowKey, Row> {
        let mut r = Row { count: 2, bytes: 8192, split: 2, ..Default::default() };
        for i in 0..STAGES.len() {
            r.sum[i] = 2_000 * (i as u64 + 1);
            r.max[i] = 1_500 * (i as u64 + 1);
            r.hist[i].insert(stats::fine_bucket(1_000 * (i as u64 + 1)), 2);
        }
        BTreeMap::from([(RowKey { sid: 1, cid: 0, host: 6, lun: 0, dir: 0, cgroup: 0 }, r)])
    }

    fn view(have_sent: bool, json: bool) -> StatView {
        StatView {
            unit: Unit::Us,
            per_lun: false,
            per_dir: false,
            percentiles: true,
            histograms: true,
            wide: true,
            extended: false,
            json,
            have_sent,
            have_rx: true,
        }
    }

    fn retx() -> BTreeMap<Conn, u64> {
        BTreeMap::from([((1, 0), 3)])
    }

    #[test]
    fn send_unknown_is_dashes_and_null_while_resp_is_shown() {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let text = view(false, false).report(&topo, &rows(), &retx(), None, 2.0, "t", 0).join("\n");
        assert!(text.contains("      1.0       1.5         -         -       3.0       4.5       4.0       6.0       5.0       7.5       6.0       9.0     3 iqn."), "{text}");
        assert!(
            !text.contains("SEND p50")
                && !text.contains("SEND (us)")
                && text.contains("RESP p50")
                && text.contains("TARGET p50"),
            "{text}"
        );
        let j = view(false, true).report(&topo, &rows(), &retx(), None, 2.0, "t", 0).join("\n");
        assert!(
            j.contains("\"send_avg_ns\":null")
                && j.contains("\"send_p99_ns\":null")
                && j.contains("\"resp_avg_ns\":3000"),
            "{j}"
        );
        assert!(
            j.contains("\"interval_s\":2.000")
                && j.contains("\"retrans\":3")
                && j.contains("\"net_avg_ns\":4000")
                && j.contains("\"target_max_ns\":7500"),
            "{j}"
        );
        let known = view(true, false).report(&topo, &rows(), &retx(), None, 2.0, "t", 0).join("\n");
        assert!(
            known.contains("      1.0       1.5       2.0       3.0       3.0       4.5") && known.contains("SEND p50"),
            "{known}"
        );
    }

    #[test]
    fn default_report_fits_100_columns_with_the_stages_that_explain_total() {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let v = StatView { wide: false, per_dir: true, percentiles: false, histograms: false, ..view(true, false) };
        let text = v.report(&topo, &rows(), &retx(), None, 2.0, "t", 0);
        let header: Vec<&str> = text[1].split_whitespace().collect();
        assert_eq!(
            header,
            [
                "SID:CID",
                "DISKS",
                "D",
                "IOPS",
                "KB/s",
                "WAIT(us)",
                "SEND(us)",
                "NET(us)",
                "TARGET(us)",
                "TOTAL(us)",
                "MAX(us)",
                "RETX"
            ]
        );
        let row: Vec<&str> = text[2].split_whitespace().collect();
        assert_eq!(&row[3..], ["1.0", "4.0", "1.0", "2.0", "4.0", "5.0", "6.0", "9.0", "3"], "{}", text[2]);
        for l in &text {
            assert!(l.len() <= 100, "{} columns: {l}", l.len());
        }
        // Each value ends under its header.
        for name in ["IOPS", "KB/s", "TARGET(us)", "MAX(us)", "RETX"] {
            let end = text[1].find(name).unwrap() + name.len();
            assert!(text[2].as_bytes()[end - 1].is_ascii_digit(), "{name}:\n{}\n{}", text[1], text[2]);
        }
    }

    #[test]
    fn a_row_without_split_commands_has_no_net_or_target() {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let mut rows = rows();
        for r in rows.values_mut() {
            r.split = 0;
            for i in [NET, TARGET] {
                (r.sum[i], r.max[i]) = (0, 0);
                r.hist[i].clear();
            }
        }
        let text = view(true, false).report(&topo, &rows, &BTreeMap::new(), None, 2.0, "t", 0).join("\n");
        assert!(
            text.contains(
                "       3.0       4.5         -         -         -         -       6.0       9.0     0 iqn."
            ),
            "{text}"
        );
        assert!(!text.contains("NET p50") && !text.contains("NET (us)"), "{text}");
        let j = view(true, true).report(&topo, &rows, &BTreeMap::new(), None, 2.0, "t", 0).join("\n");
        assert!(
            j.contains("\"net_avg_ns\":null") && j.contains("\"target_p50_ns\":null") && j.contains("\"split\":0"),
            "{j}"
        );
    }

    /// Rows per cgroup: a last CGROUP column with the path, `-` (no issuer
    /// known), `other` (past --cgroup-rows) or the id of a cgroup gone
    /// before it was looked up; JSON `cgroup` and `cgroup_id`.
    #[test]
    fn rows_per_cgroup_name_their_cgroup() {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("lab-a/job")).unwrap();
        let job = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(t.path().join("lab-a/job")).unwrap());
        let mut paths = CgroupPaths::new(Some(t.path().to_path_buf()));
        let r = rows().into_values().next().unwrap();
        let key = RowKey { sid: 1, cid: 0, host: 6, lun: 0, dir: 0, cgroup: 0 };
        let gone = job + 1_000_000;
        let rows: BTreeMap<RowKey, Row> = [job, stats::CGROUP_NOT_KNOWN, stats::CGROUP_OTHER, gone]
            .into_iter()
            .map(|cgroup| (RowKey { cgroup, ..key }, r.clone()))
            .collect();
        for k in rows.keys() {
            paths.look_up(k.cgroup);
        }
        let v = StatView { wide: false, percentiles: false, histograms: false, ..view(true, false) };
        let text = v.report(&topo, &rows, &retx(), Some(&paths), 2.0, "t", 0);
        assert!(text[1].ends_with(" RETX CGROUP"), "{}", text[1]);
        let last: Vec<&str> = text[2..6].iter().map(|l| l.rsplit(' ').next().unwrap()).collect();
        // Ordered by id: not known (0), the job, the gone one, other (all ones).
        assert_eq!(last, ["-", "/lab-a/job", gone.to_string().as_str(), "other"], "{text:?}");
        let j = v.report(&topo, &rows, &retx(), None, 2.0, "t", 0).join("\n");
        assert!(!j.contains("CGROUP"), "{j}");
        let j = StatView { json: true, ..v }.report(&topo, &rows, &retx(), Some(&paths), 2.0, "t", 0);
        assert!(j[0].contains(r#""cgroup_id":null,"cgroup":null"#), "{}", j[0]);
        assert!(j[1].contains(&format!(r#""cgroup_id":{job},"cgroup":"/lab-a/job""#)), "{}", j[1]);
        assert!(j[2].contains(&format!(r#""cgroup_id":{gone},"cgroup":null"#)), "{}", j[2]);
        assert!(j[3].contains(r#""cgroup_id":null,"cgroup":"other""#), "{}", j[3]);
    }
}
