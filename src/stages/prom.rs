//! node_exporter textfile-collector output for iscstat: counters and
//! Prometheus histograms, cumulative since the tool started, written to a
//! temporary file and renamed over the target so readers never see half.

use crate::cli::textfile::{escape_label, seconds, write_atomically};
use crate::error::Result;
use crate::iscsi::topology::Topology;
use crate::kernel::cgroup::CgroupPaths;
#[cfg(test)]
use crate::stages::stats::TOTAL;
use crate::stages::stats::{self, Conn, Retransmits, Row, RowKey, LE_BUCKETS, LE_NS, NET, SEND, TARGET};
use std::collections::BTreeMap;
use std::path::Path;

/// The `stage` label of each stage of src/stages/stats.rs STAGES, in order.
pub const STAGE_LABELS: [&str; crate::stages::stats::NSTAGES] = ["wait", "send", "resp", "net", "target", "total"];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Labels {
    pub sid: u32,
    pub cid: u32,
    pub lun: u64,
    pub direction: &'static str,
    pub target: String,
    pub device: String,
    /// The issuer's cgroup (iscstat --by-cgroup): its path, `other` or `-`
    /// (stats::cgroup_name); no label without it.
    pub cgroup: Option<String>,
}

/// Every series since start: one [`Row`] per label set (its `le` counts
/// per LE_NS index, last = +Inf, are the histogram; `hist` is not used).
#[derive(Debug, Default)]
pub struct Exposition {
    pub series: BTreeMap<Labels, Row>,
    /// SEND can be told apart (else its series are left out: unknown).
    pub have_sent: bool,
    /// RESP splits into NET and TARGET (else their series are left out).
    pub have_rx: bool,
    /// TCP segments retransmitted per connection since start, with the
    /// connection's target.
    pub retransmits: BTreeMap<Conn, (String, u64)>,
    /// The tracer's own health, when known.
    pub health: Option<Health>,
}

/// What the tracer itself does and costs, as the exporter's own series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// e.g. "stages"
    pub probe_set: &'static str,
    /// "fentry" or "kprobes"
    pub mechanism: &'static str,
    /// Commands not counted, by reason (counter slot names, lower case).
    pub lost: Vec<(&'static str, u64)>,
    /// Probe hits the kernel skipped (fentry: program already running).
    pub skipped_hits: u64,
    /// Per BPF program: (name, run time ns, run count), when the kernel
    /// keeps them (kernel.bpf_stats_enabled=1); None when it does not.
    pub programs: Option<Vec<(String, u64, u64)>>,
}

impl Health {
    fn render(&self, o: &mut String) {
        o.push_str("# HELP iscsi_tracer_up Whether the tracer's probes are attached, by probe set and mechanism.\n# TYPE iscsi_tracer_up gauge\n");
        o.push_str(&format!(
            "iscsi_tracer_up{{probe_set=\"{}\",mechanism=\"{}\"}} 1\n",
            self.probe_set, self.mechanism
        ));
        o.push_str("# HELP iscsi_tracer_lost_commands_total Commands the tracer did not count, by reason.\n# TYPE iscsi_tracer_lost_commands_total counter\n");
        for (reason, n) in &self.lost {
            o.push_str(&format!("iscsi_tracer_lost_commands_total{{reason=\"{reason}\"}} {n}\n"));
        }
        o.push_str("# HELP iscsi_tracer_skipped_probe_hits_total Probe hits the kernel skipped because the program was already running on that CPU.\n# TYPE iscsi_tracer_skipped_probe_hits_total counter\n");
        o.push_str(&format!("iscsi_tracer_skipped_probe_hits_total {}\n", self.skipped_hits));
        o.push_str("# HELP iscsi_tracer_bpf_stats_enabled Whether the kernel counts BPF programs' run time (sysctl kernel.bpf_stats_enabled).\n# TYPE iscsi_tracer_bpf_stats_enabled gauge\n");
        o.push_str(&format!("iscsi_tracer_bpf_stats_enabled {}\n", self.programs.is_some() as u8));
        if let Some(progs) = &self.programs {
            o.push_str("# HELP iscsi_tracer_bpf_run_seconds_total Time the kernel spent running each of the tracer's BPF programs.\n# TYPE iscsi_tracer_bpf_run_seconds_total counter\n");
            for (name, ns, _) in progs {
                o.push_str(&format!(
                    "iscsi_tracer_bpf_run_seconds_total{{program=\"{}\"}} {}\n",
                    escape_label(name),
                    seconds(*ns)
                ));
            }
            o.push_str("# HELP iscsi_tracer_bpf_runs_total Times each of the tracer's BPF programs ran.\n# TYPE iscsi_tracer_bpf_runs_total counter\n");
            for (name, _, n) in progs {
                o.push_str(&format!("iscsi_tracer_bpf_runs_total{{program=\"{}\"}} {n}\n", escape_label(name)));
            }
        }
    }
}

/// iscstat's rows as they are collected (every interval, and at every
/// scrape with --listen): kept for the next report, and added to the
/// cumulative exposition when there is one.
#[derive(Debug, Default)]
pub struct Tally {
    /// Rows since the last report.
    pub interval: BTreeMap<RowKey, Row>,
    /// TCP retransmits per connection (read by the caller before `add`).
    pub retrans: Retransmits,
    pub exposition: Option<Exposition>,
    /// The paths of the rows' cgroups, where rows are per cgroup.
    pub cgroups: Option<CgroupPaths>,
}

impl Tally {
    pub fn new(exposition: Option<Exposition>) -> Tally {
        Tally { interval: BTreeMap::new(), retrans: Default::default(), exposition, cgroups: None }
    }

    /// Rows per cgroup, named from `paths`.
    pub fn with_cgroups(self, paths: CgroupPaths) -> Tally {
        Tally { cgroups: Some(paths), ..self }
    }

    /// Add rows collected from the kernel, labelled from `topo` (read just
    /// now); `health` is asked for only when there is an exposition.
    pub fn add(&mut self, rows: BTreeMap<RowKey, Row>, topo: &Topology, health: impl FnOnce() -> Health) {
        if let Some(paths) = &mut self.cgroups {
            for k in rows.keys() {
                paths.look_up(k.cgroup);
            }
        }
        if let Some(e) = &mut self.exposition {
            e.add_rows(&rows, topo, self.cgroups.as_ref());
            e.set_retransmits(&self.retrans.total, topo);
            e.keep_sessions(topo);
            e.health = Some(health());
        }
        for (k, r) in rows {
            self.interval.entry(k).or_default().merge(&r);
        }
    }

    pub fn render(&self) -> String {
        self.exposition.as_ref().map(Exposition::render).unwrap_or_default()
    }
}

fn label_text(l: &Labels, extra: &str) -> String {
    let cgroup = l.cgroup.as_deref().map(|c| format!(",cgroup=\"{}\"", escape_label(c))).unwrap_or_default();
    format!(
        "sid=\"{}\",cid=\"{}\",lun=\"{}\",direction=\"{}\",target=\"{}\",device=\"{}\"{cgroup}{extra}",
        l.sid,
        l.cid,
        l.lun,
        l.direction,
        escape_label(&l.target),
        escape_label(&l.device)
    )
}

impl Exposition {
    pub fn new(have_sent: bool, have_rx: bool) -> Exposition {
        Exposition { series: BTreeMap::new(), have_sent, have_rx, retransmits: BTreeMap::new(), health: None }
    }

    /// The retransmits since start, labelled with the sessions as they are now.
    pub fn set_retransmits(&mut self, total: &BTreeMap<Conn, u64>, topo: &Topology) {
        for (c, n) in total {
            if let Some(s) = topo.session(c.0) {
                self.retransmits.insert(*c, (s.target.clone(), *n));
            }
        }
    }

    /// Drop the series of sessions that are gone (logged out): their
    /// counters stop; a session logged in again has series of its own.
    pub fn keep_sessions(&mut self, topo: &Topology) {
        self.series.retain(|l, _| topo.session(l.sid).map(|s| s.target == l.target).unwrap_or(false));
        self.retransmits.retain(|c, (target, _)| topo.session(c.0).map(|s| &s.target == target).unwrap_or(false));
    }

    /// Add one interval's rows (per LUN and direction), labelled from the
    /// sessions as they are now, and with their cgroups where rows are per
    /// cgroup (`cgroups` has looked every row's up).
    pub fn add_rows(&mut self, rows: &BTreeMap<RowKey, Row>, topo: &Topology, cgroups: Option<&CgroupPaths>) {
        for (k, r) in rows {
            let s = topo.session(k.sid);
            let labels = Labels {
                sid: k.sid,
                cid: k.cid,
                lun: k.lun,
                direction: match k.dir {
                    1 => "read",
                    2 => "write",
                    _ => "other",
                },
                target: s.map(|s| s.target.clone()).unwrap_or_default(),
                device: s
                    .and_then(|s| s.luns.iter().find(|l| l.lun == k.lun))
                    .and_then(|l| l.disk.clone())
                    .unwrap_or_default(),
                cgroup: cgroups.map(|p| stats::cgroup_name(k.cgroup, p)),
            };
            self.series.entry(labels).or_default().merge(r);
        }
    }

    pub fn render(&self) -> String {
        let mut o = String::new();
        o.push_str("# HELP iscsi_commands_total SCSI commands completed with a response by the iSCSI initiator.\n# TYPE iscsi_commands_total counter\n");
        for (l, s) in &self.series {
            o.push_str(&format!("iscsi_commands_total{{{}}} {}\n", label_text(l, ""), s.count));
        }
        o.push_str("# HELP iscsi_bytes_total Bytes transferred by those commands.\n# TYPE iscsi_bytes_total counter\n");
        for (l, s) in &self.series {
            o.push_str(&format!("iscsi_bytes_total{{{}}} {}\n", label_text(l, ""), s.bytes));
        }
        o.push_str("# HELP iscsi_command_stage_seconds Time of each stage of iSCSI commands: wait (queued in libiscsi), send (handed to TCP), resp (waiting for the target), total.\n# TYPE iscsi_command_stage_seconds histogram\n");
        for (l, s) in &self.series {
            for (i, stage) in STAGE_LABELS.iter().enumerate() {
                if (i == SEND && !self.have_sent) || ((i == NET || i == TARGET) && !self.have_rx) {
                    continue;
                }
                let mut cum = 0;
                for (j, le) in LE_NS.iter().enumerate() {
                    cum += s.le[i][j];
                    o.push_str(&format!(
                        "iscsi_command_stage_seconds_bucket{{{}}} {cum}\n",
                        label_text(l, &format!(",stage=\"{stage}\",le=\"{}\"", seconds(*le)))
                    ));
                }
                cum += s.le[i][LE_BUCKETS - 1];
                o.push_str(&format!(
                    "iscsi_command_stage_seconds_bucket{{{}}} {cum}\n",
                    label_text(l, &format!(",stage=\"{stage}\",le=\"+Inf\""))
                ));
                o.push_str(&format!(
                    "iscsi_command_stage_seconds_sum{{{}}} {}\n",
                    label_text(l, &format!(",stage=\"{stage}\"")),
                    seconds(s.sum[i])
                ));
                o.push_str(&format!(
                    "iscsi_command_stage_seconds_count{{{}}} {cum}\n",
                    label_text(l, &format!(",stage=\"{stage}\""))
                ));
            }
        }
        o.push_str("# HELP iscsi_tcp_retransmits_total TCP segments retransmitted on the iSCSI connection's socket (its total_retrans) since the tracer started.\n# TYPE iscsi_tcp_retransmits_total counter\n");
        for ((sid, cid), (target, n)) in &self.retransmits {
            o.push_str(&format!(
                "iscsi_tcp_retransmits_total{{sid=\"{sid}\",cid=\"{cid}\",target=\"{}\"}} {n}\n",
                escape_label(target)
            ));
        }
        if let Some(h) = &self.health {
            h.render(&mut o);
        }
        o
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cumulative_buckets() {
        let mut e = Exposition::new(true, true);
        let mut s = Row { count: 3, bytes: 12288, ..Default::default() };
        s.sum[TOTAL] = 1_500_000;
        s.le[TOTAL][0] = 1; // <= 100us
        s.le[TOTAL][3] = 1; // <= 1ms
        s.le[TOTAL][16] = 1; // > 10s
        s.le[NET][1] = 1;
        let l = Labels {
            sid: 1,
            cid: 0,
            lun: 0,
            direction: "read",
            target: "iqn.x:\"t\"".into(),
            device: "sda".into(),
            cgroup: None,
        };
        e.series.insert(l, s);
        let t = e.render();
        assert!(
            t.contains(
                r#"iscsi_commands_total{sid="1",cid="0",lun="0",direction="read",target="iqn.x:\"t\"",device="sda"} 3"#
            ),
            "{t}"
        );
        assert!(t.contains(r#"stage="total",le="0.0001"} 1"#));
        assert!(t.contains(r#"stage="total",le="0.001"} 2"#));
        assert!(t.contains(r#"stage="total",le="10"} 2"#));
        assert!(t.contains(r#"stage="total",le="+Inf"} 3"#));
        assert!(t.contains(r#"iscsi_command_stage_seconds_sum{sid="1",cid="0",lun="0",direction="read",target="iqn.x:\"t\"",device="sda",stage="total"} 0.0015"#));
        assert!(t.contains(r#"iscsi_command_stage_seconds_count{sid="1",cid="0",lun="0",direction="read",target="iqn.x:\"t\"",device="sda",stage="wait"} 0"#));
        assert!(
            t.contains(r#"device="sda",stage="net",le="0.00025"} 1"#)
                && t.contains(r#"device="sda",stage="target",le="+Inf"} 0"#),
            "{t}"
        );
        e.retransmits.insert((1, 0), ("iqn.x".into(), 4));
        assert!(e.render().contains("# TYPE iscsi_tcp_retransmits_total counter\niscsi_tcp_retransmits_total{sid=\"1\",cid=\"0\",target=\"iqn.x\"} 4\n"));
    }

    #[test]
    fn template_has_the_same_bounds() {
        for le in LE_NS {
            assert!(crate::bpf::templates::ISCSTAT.contains(&format!("ns <= {le}ULL")), "{le} missing from iscstat.c");
        }
    }

    #[test]
    fn writes_atomically_and_checks_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let p = d.join("iscsi.prom");
        crate::cli::textfile::check_writable(&p).unwrap();
        Exposition::new(true, true).write(&p).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("# TYPE iscsi_commands_total counter"));
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 1, "no temporary file left");
        let e = crate::cli::textfile::check_writable(Path::new("/nonexistent-dir/x.prom")).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().starts_with("--prom-file /nonexistent-dir/x.prom: cannot write in /nonexistent-dir"));
    }

    fn odd_labels() -> Exposition {
        let mut e = Exposition::new(false, false);
        let l = Labels {
            sid: 1,
            cid: 0,
            lun: 0,
            direction: "read",
            target: "iqn.x:a\\b\"c\nd\te\u{e9}\u{1f4be}".into(),
            device: "sda".into(),
            cgroup: Some("/app.slice/a\"b\".scope".into()),
        };
        e.series.insert(l, Row { count: 1, ..Default::default() });
        e
    }

    #[test]
    fn label_values_escape_only_what_the_format_allows() {
        assert_eq!(escape_label("a\\b\"c\nd\te\u{e9}"), "a\\\\b\\\"c\\nd\te\u{e9}");
        let t = odd_labels().render();
        assert!(t.contains("target=\"iqn.x:a\\\\b\\\"c\\nd\te\u{e9}\u{1f4be}\""), "{t}");
        assert!(!t.contains("\\t") && !t.contains("\\u"), "no JSON escapes: {t}");
        assert!(t.contains(",device=\"sda\",cgroup=\"/app.slice/a\\\"b\\\".scope\"}"), "{t}");
    }

    #[test]
    fn unknown_send_has_no_series() {
        let t = odd_labels().render();
        assert!(
            !t.contains("stage=\"send\"") && !t.contains("stage=\"net\"") && !t.contains("stage=\"target\""),
            "{t}"
        );
        assert!(t.contains("stage=\"resp\"") && t.contains("stage=\"wait\""));
    }

    /// The real parser: promtool (Debian's prometheus package, installed by
    /// tests/lab/setup) must accept the odd labels.
    #[test]
    fn promtool_accepts_the_exposition() {
        use std::process::{Command, Stdio};
        let mut e = odd_labels();
        e.have_sent = true;
        e.health = Some(Health {
            probe_set: "stages",
            mechanism: "fentry",
            lost: vec![("buffer_full", 0), ("end_not_seen", 2)],
            skipped_hits: 1,
            programs: Some(vec![("fentry_complete".into(), 1_500, 3), ("fexit_xmit".into(), 20, 1)]),
        });
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool (Debian package prometheus) must be installed: run tests/lab/setup");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), e.render().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "promtool check metrics: {text}");
        assert!(!text.contains("error"), "{text}");
        let t = e.render();
        assert!(t.contains("iscsi_tracer_bpf_run_seconds_total{program=\"fentry_complete\"} 0.0000015\n"), "{t}");
        assert!(t.contains("iscsi_tracer_lost_commands_total{reason=\"end_not_seen\"} 2\n"));
    }

    #[test]
    fn tally_keeps_the_interval_and_the_cumulative_series() {
        let topo =
            Topology::read(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let key = RowKey { sid: 2, cid: 0, host: topo.session(2).unwrap().host, lun: 1, dir: 2, cgroup: 0 };
        let rows = || BTreeMap::from([(key, Row { count: 3, bytes: 12288, ..Default::default() })]);
        let mut t = Tally::new(Some(Exposition::new(true, true)));
        t.add(rows(), &topo, Health::default);
        t.add(rows(), &topo, Health::default);
        assert_eq!(t.interval[&key].count, 6, "a scrape's rows still reach the next report");
        std::mem::take(&mut t.interval);
        t.add(rows(), &topo, Health::default);
        assert_eq!(t.interval[&key].count, 3);
        assert!(
            t.render().contains(",direction=\"write\",") && t.render().contains("} 9\n"),
            "cumulative: {}",
            t.render()
        );
        let mut none = Tally::new(None);
        none.add(rows(), &topo, || unreachable!("no exposition: health is not read"));
        assert_eq!(none.render(), "");
    }

    #[test]
    fn gone_sessions_lose_their_series() {
        let topo =
            Topology::read(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let mut e = Exposition::new(true, true);
        let s1 = topo.session(1).unwrap();
        let key = RowKey { sid: 1, cid: 0, host: s1.host, lun: 0, dir: 1, cgroup: 0 };
        e.add_rows(&BTreeMap::from([(key, Row { count: 4, ..Default::default() })]), &topo, None);
        e.add_rows(
            &BTreeMap::from([
                (key, Row { count: 1, ..Default::default() }),
                (RowKey { sid: 9, ..key }, Row { count: 1, ..Default::default() }),
            ]),
            &topo,
            None,
        );
        assert_eq!(e.series.len(), 2);
        e.keep_sessions(&topo);
        assert_eq!(e.series.len(), 1, "session 9 does not exist");
        let (l, r) = e.series.iter().next().unwrap();
        assert_eq!((l.sid, l.direction, l.target.as_str(), r.count), (1, "read", s1.target.as_str(), 5));
        assert!(e.render().contains(&format!(
            "iscsi_commands_total{{sid=\"1\",cid=\"0\",lun=\"0\",direction=\"read\",target=\"{}\"",
            s1.target
        )));
        e.keep_sessions(&Topology::default());
        assert!(e.series.is_empty());
    }
}
