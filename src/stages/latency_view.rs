//! isclatency's output: one line (or JSON object) per timed command, with
//! the disk and session looked up in the topology.

use crate::bpf::events::{Command, Issuer};
use crate::cli::json;
use crate::cli::output::{push_decimal, Clock, Unit};
use crate::iscsi::topology::{LiveTopology, Topology};
use crate::kernel::cgroup::{self, CgroupPaths};
use crate::stages::StagePlan;
use std::fmt::Write;
use std::path::PathBuf;

/// Which columns a text line has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Columns {
    /// What explains a slow command, in 100 columns.
    Default,
    /// Every column: also the session, LUN, RESP, retransmits and result.
    Wide,
    /// Wide, and the R2T count, target, initiator and portal.
    Extended,
}

impl Columns {
    pub fn from_flags(wide: bool, extended: bool) -> Columns {
        match (wide, extended) {
            (_, true) => Columns::Extended,
            (true, false) => Columns::Wide,
            _ => Columns::Default,
        }
    }
}

/// What the lines show, and how to name disks and sessions.
pub struct LatencyView {
    pub unit: Unit,
    pub timestamp: bool,
    cols: Vec<Column>,
    /// SEND told apart from RESP (else SEND is `-` / null).
    pub have_sent: bool,
    /// R2Ts counted (else `-` / null).
    pub have_r2t: bool,
    /// RESP split into NET and TARGET where the command allows it.
    pub have_rx: bool,
    pub clock: Clock,
    pub topo: LiveTopology,
    /// The issuers' cgroup paths (JSON).
    pub cgroups: CgroupPaths,
}

impl LatencyView {
    pub fn new(
        unit: Unit,
        timestamp: bool,
        set: Columns,
        plan: &StagePlan,
        clock: Clock,
        topo: Topology,
        sysfs: Option<PathBuf>,
    ) -> LatencyView {
        LatencyView {
            unit,
            timestamp,
            cols: columns(unit, timestamp, set),
            have_sent: plan.have_sent,
            have_r2t: plan.have_r2t,
            have_rx: plan.have_rx,
            clock,
            // The machine's cgroups where the topology is the machine's.
            cgroups: CgroupPaths::new(sysfs.is_some().then(cgroup::mount).flatten()),
            topo: LiveTopology::new(topo, sysfs),
        }
    }

    /// A last column, CGROUP: the issuer's cgroup path (isclatency -I with
    /// -W or -e).
    pub fn with_cgroup_column(mut self) -> LatencyView {
        self.cols.push(Column::left(Field::Cgroup, "CGROUP", 0));
        self
    }

    fn time(&self, c: &Command) -> String {
        self.clock.time(c.ts_queue + c.total, self.timestamp)
    }

    pub fn header(&self) -> String {
        let mut line = String::with_capacity(160);
        for (i, col) in self.cols.iter().enumerate() {
            col.push(&mut line, i == 0, &col.name);
        }
        line.truncate(line.trim_end().len());
        line
    }

    /// One command's line.
    pub fn row(&mut self, c: &Command) -> String {
        let mut line = String::with_capacity(160);
        self.write_row(&mut line, c);
        line
    }

    /// One command's line written into `line` (cleared first): each cell
    /// goes straight into it and is padded there, so a reused `line` makes
    /// no allocation per command.
    pub fn write_row(&mut self, line: &mut String, c: &Command) {
        if let Issuer::Known { cgroup, .. } = c.issuer {
            self.cgroups.look_up(cgroup);
        }
        self.topo.learn(c.host, c.channel, c.id, c.lun);
        let disk = self.topo.known_disk(c.host, c.channel, c.id, c.lun);
        line.clear();
        for (i, col) in self.cols.iter().enumerate() {
            if i > 0 {
                line.push(' ');
            }
            let start = line.len();
            self.cell(line, col, c, disk);
            col.pad(line, start);
        }
        line.truncate(line.trim_end().len());
    }

    fn cell(&self, out: &mut String, col: &Column, c: &Command, disk: &str) {
        let u = self.unit;
        let session = || self.topo.session(c.sid);
        let _ = match col.field {
            Field::Time => {
                self.clock.write_time(out, c.ts_queue + c.total, self.timestamp);
                Ok(())
            }
            Field::Comm => {
                match &c.issuer {
                    Issuer::Known { comm, .. } => out.extend(comm.chars().take(col.width)),
                    // Traced and not known: the dispatching context, marked.
                    Issuer::Unknown => {
                        out.push('[');
                        out.extend(c.comm.chars().take(col.width.saturating_sub(2)));
                        out.push(']');
                    }
                    Issuer::NotTraced => out.extend(c.comm.chars().take(col.width)),
                }
                Ok(())
            }
            Field::Pid => {
                let pid = match c.issuer {
                    Issuer::Known { pid, .. } => pid,
                    _ => c.pid,
                };
                push_decimal(out, pid.into(), 0);
                Ok(())
            }
            Field::SidCid => write!(out, "{}:{}", c.sid, c.cid),
            Field::Disk => {
                out.push_str(disk);
                Ok(())
            }
            Field::Lun => write!(out, "{}", c.lun),
            Field::Dir => {
                out.push_str(c.dir.letter());
                Ok(())
            }
            Field::Bytes => {
                push_decimal(out, c.bytes.into(), 0);
                Ok(())
            }
            Field::Wait => u.write(out, Some(c.wait)),
            Field::Send => u.write(out, self.have_sent.then_some(c.send)),
            Field::Resp => u.write(out, Some(c.resp)),
            Field::Net => u.write(out, self.split(c).map(|s| s.0)),
            Field::Target => u.write(out, self.split(c).map(|s| s.1)),
            Field::Total => u.write(out, Some(c.total)),
            Field::Retx => match c.retrans {
                Some(r) => write!(out, "{r}"),
                None => write!(out, "-"),
            },
            Field::Result => write!(out, "{}", c.result_text()),
            Field::R2t if self.have_r2t => write!(out, "{}", c.r2t),
            Field::R2t => write!(out, "-"),
            Field::TargetName => write!(out, "{}", session().map_or("?", |s| s.target.as_str())),
            Field::Initiator => write!(out, "{}", session().map_or("?", |s| s.initiator.as_str())),
            Field::Portal => write!(out, "{}", session().map_or_else(|| "?".to_string(), |s| s.portal())),
            // The path, else (a cgroup gone before it was looked up) the id.
            Field::Cgroup => match c.issuer {
                Issuer::Known { cgroup, .. } => match self.cgroups.known(cgroup) {
                    Some(p) => write!(out, "{p}"),
                    None => write!(out, "{cgroup}"),
                },
                _ => write!(out, "-"),
            },
        };
    }

    fn split(&self, c: &Command) -> Option<(u64, u64)> {
        c.net_target(self.have_rx)
    }

    pub fn json(&mut self, c: &Command) -> String {
        self.topo.learn(c.host, c.channel, c.id, c.lun);
        let disk = self.topo.known_disk(c.host, c.channel, c.id, c.lun);
        let s = self.topo.session(c.sid);
        let traced = c.issuer != Issuer::NotTraced;
        let (comm, pid, cgroup, kernel_thread) = match &c.issuer {
            Issuer::Known { pid, comm, cgroup, kernel_thread } => {
                (comm.as_str(), *pid, Some(*cgroup), Some(*kernel_thread))
            }
            _ => (c.comm.as_str(), c.pid, None, None),
        };
        if let Some(id) = cgroup {
            self.cgroups.look_up(id);
        }
        json::Object::new()
            .str("time", &self.time(c))
            .str("comm", comm)
            .num("pid", pid)
            .num("sid", c.sid)
            .num("cid", c.cid)
            .num("host", c.host)
            .num("lun", c.lun)
            .str("disk", disk)
            .str("dir", c.dir.letter())
            .num("opcode", c.opcode)
            .num("bytes", c.bytes)
            .num("wait_ns", c.wait)
            .opt_num("send_ns", self.have_sent.then_some(c.send))
            .num("resp_ns", c.resp)
            .opt_num("net_ns", self.split(c).map(|s| s.0))
            .opt_num("target_ns", self.split(c).map(|s| s.1))
            .opt_str("net_from", self.split(c).and(c.net_from).map(|f| f.name()))
            .num("total_ns", c.total)
            .opt_num("retrans", c.retrans)
            .opt_num("r2t", self.have_r2t.then_some(c.r2t))
            .num("result", c.result)
            .bool("ok", c.ok())
            .opt_str("target", s.map(|s| s.target.as_str()))
            .opt_str("initiator", s.map(|s| s.initiator.as_str()))
            .str("portal", &s.map(|s| s.portal()).unwrap_or_else(|| "?".into()))
            .opt_bool("issuer", traced.then_some(matches!(c.issuer, Issuer::Known { .. })))
            .opt_bool("kernel_thread", kernel_thread)
            .str("dispatch_comm", &c.comm)
            .num("dispatch_pid", c.pid)
            .opt_num("cgroup_id", cgroup)
            .opt_str("cgroup", cgroup.and_then(|id| self.cgroups.known(id)))
            .finish()
    }
}

/// Padding for a cell: as wide as the widest column.
const SPACES: &str = "                                ";

/// What a column shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Time,
    Comm,
    Pid,
    SidCid,
    Disk,
    Lun,
    Dir,
    Bytes,
    Wait,
    Send,
    Resp,
    Net,
    Target,
    Total,
    Retx,
    Result,
    R2t,
    TargetName,
    Initiator,
    Portal,
    Cgroup,
}

/// A column of isclatency's text output: what it shows, its header, its
/// width (0: as long as the value) and its side.
struct Column {
    field: Field,
    name: String,
    width: usize,
    left: bool,
}

impl Column {
    fn left(field: Field, name: impl Into<String>, width: usize) -> Column {
        Column { field, name: name.into(), width, left: true }
    }
    fn right(field: Field, name: impl Into<String>, width: usize) -> Column {
        Column { field, name: name.into(), width, left: false }
    }

    /// Append `cell` padded to the column's width, a space before it but
    /// for the first column.
    fn push(&self, line: &mut String, first: bool, cell: &str) {
        if !first {
            line.push(' ');
        }
        let start = line.len();
        line.push_str(cell);
        self.pad(line, start);
    }

    /// Pad the cell written at `line[start..]` to the column's width: spaces
    /// after it (left-aligned) or before it (right-aligned).
    fn pad(&self, line: &mut String, start: usize) {
        let pad = self.width.saturating_sub(line[start..].chars().count()).min(SPACES.len());
        if self.left {
            line.push_str(&SPACES[..pad]);
        } else {
            line.insert_str(start, &SPACES[..pad]);
        }
    }
}

/// The columns of a line: the default set fits in 100 columns; wide adds
/// the session, LUN, RESP, retransmits and result; extended adds the R2T
/// count, target, initiator and portal (and implies wide).
fn columns(unit: Unit, timestamp: bool, set: Columns) -> Vec<Column> {
    let u = unit.label();
    let wide = set != Columns::Default;
    let time = if timestamp { Column::left(Field::Time, "TIME", 12) } else { Column::left(Field::Time, "TIME(s)", 11) };
    let mut c =
        vec![time, Column::left(Field::Comm, "COMM", if wide { 16 } else { 14 }), Column::right(Field::Pid, "PID", 7)];
    if wide {
        c.push(Column::right(Field::SidCid, "SID:CID", 7));
    }
    c.push(Column::left(Field::Disk, "DISK", 6));
    if wide {
        c.push(Column::right(Field::Lun, "LUN", 3));
    }
    c.extend([Column::left(Field::Dir, "T", 1), Column::right(Field::Bytes, "BYTES", 7)]);
    c.extend([
        Column::right(Field::Wait, format!("WAIT({u})"), 8),
        Column::right(Field::Send, format!("SEND({u})"), 8),
    ]);
    if wide {
        c.push(Column::right(Field::Resp, format!("RESP({u})"), 10));
    }
    c.extend([
        Column::right(Field::Net, format!("NET({u})"), 8),
        Column::right(Field::Target, format!("TARGET({u})"), 10),
        Column::right(Field::Total, format!("TOTAL({u})"), 9),
    ]);
    if wide {
        c.extend([Column::right(Field::Retx, "RETX", 4), Column::left(Field::Result, "RESULT", 0)]);
    }
    if set == Columns::Extended {
        c.extend([
            Column::right(Field::R2t, "R2T", 3),
            Column::left(Field::TargetName, "TARGETNAME", 0),
            Column::left(Field::Initiator, "INITIATOR", 0),
            Column::left(Field::Portal, "PORTAL", 0),
        ]);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::events::{Direction, NetFrom};
    use crate::kernel::headers::ScsiLayout;
    use std::path::Path;

    fn view(have_sent: bool, wide: bool, extended: bool) -> LatencyView {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let plan = StagePlan {
            have_sent,
            have_r2t: have_sent,
            have_rx: have_sent,
            ..StagePlan::assume_all(ScsiLayout::modern())
        };
        LatencyView::new(Unit::Ms, false, Columns::from_flags(wide, extended), &plan, Clock::start(), topo, None)
    }

    /// The line's cells from a header name on (whitespace-separated).
    fn cells(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    /// The cell under a header's column in a line (by the header's position).
    fn cell(v: &LatencyView, line: &str, name: &str) -> String {
        let h = cells(&v.header());
        let i = h.iter().position(|c| c == name).unwrap_or_else(|| panic!("no column {name}"));
        cells(line)[i].clone()
    }

    fn cmd(send: u64) -> Command {
        Command {
            ts_queue: 0,
            wait: 1_000_000,
            send,
            resp: 5_000_000,
            total: 6_000_000 + send,
            split: Some((1_250_000, 3_750_000)),
            net_from: Some(NetFrom::ReverseDelay),
            lun: 0,
            host: 0,
            channel: 0,
            id: 0,
            sid: 1,
            cid: 0,
            pid: 7,
            bytes: 4096,
            r2t: 0,
            retrans: Some(2),
            result: 0,
            dir: Direction::Read,
            opcode: 0x28,
            comm: "fio".into(),
            issuer: Issuer::NotTraced,
        }
    }

    #[test]
    fn comm_and_pid_are_the_issuer_where_traced_and_known() {
        let mut v = view(true, false, false);
        let dispatched = Command { comm: "kworker/1:1H".into(), pid: 120, ..cmd(0) };
        let known = Command {
            issuer: Issuer::Known { pid: 4242, comm: "fio".into(), cgroup: 7, kernel_thread: false },
            ..dispatched.clone()
        };
        let unknown = Command { issuer: Issuer::Unknown, ..dispatched.clone() };
        let long = Command { comm: "kworker/u16:10H".into(), issuer: Issuer::Unknown, ..dispatched.clone() };
        let shown = |v: &mut LatencyView, c: &Command| {
            let line = v.row(c);
            (cell(v, &line, "COMM"), cell(v, &line, "PID"))
        };
        assert_eq!(shown(&mut v, &dispatched), ("kworker/1:1H".into(), "120".into()));
        assert_eq!(shown(&mut v, &known), ("fio".into(), "4242".into()));
        assert_eq!(shown(&mut v, &unknown), ("[kworker/1:1H]".into(), "120".into()));
        assert_eq!(shown(&mut v, &long).0, "[kworker/u16:]", "marked within COMM's 14 columns");
        let json = |v: &mut LatencyView, c: &Command| -> Vec<String> {
            v.json(c).trim_matches(|b| b == '{' || b == '}').split(',').map(String::from).collect()
        };
        let j = json(&mut v, &known);
        for kv in [
            r#""comm":"fio""#,
            r#""pid":4242"#,
            r#""issuer":true"#,
            r#""dispatch_comm":"kworker/1:1H""#,
            r#""dispatch_pid":120"#,
            r#""cgroup_id":7"#,
            r#""cgroup":null"#,
        ] {
            assert!(j.contains(&kv.to_string()), "{kv} in {j:?}");
        }
        // A cgroup that exists has its path, relative to the mount.
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("app.slice/job")).unwrap();
        let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(t.path().join("app.slice/job")).unwrap());
        v.cgroups = CgroupPaths::new(Some(t.path().to_path_buf()));
        let in_job = Command {
            issuer: Issuer::Known { pid: 4242, comm: "fio".into(), cgroup: id, kernel_thread: false },
            ..dispatched.clone()
        };
        assert!(json(&mut v, &in_job).contains(&r#""cgroup":"/app.slice/job""#.to_string()));
        let j = json(&mut v, &unknown);
        assert!(j.contains(&r#""comm":"kworker/1:1H""#.to_string()) && j.contains(&r#""issuer":false"#.to_string()));
        assert!(j.contains(&r#""cgroup_id":null"#.to_string()));
        // The CGROUP column (-I with -W): the path, the id of a cgroup not
        // found, - where the issuer is not known.
        let mut w = view(true, true, false).with_cgroup_column();
        w.cgroups = CgroupPaths::new(Some(t.path().to_path_buf()));
        assert_eq!(cells(&w.header()).last().unwrap(), "CGROUP");
        for (c, want) in [(&in_job, "/app.slice/job"), (&known, "7"), (&unknown, "-")] {
            let line = w.row(c);
            assert_eq!(cell(&w, &line, "CGROUP"), want, "{line}");
        }
        let j = json(&mut v, &dispatched);
        assert!(j.contains(&r#""pid":120"#.to_string()) && j.contains(&r#""issuer":null"#.to_string()), "{j:?}");
    }

    #[test]
    fn default_line_fits_100_columns_and_lines_up_with_its_header() {
        let mut v = view(true, false, false);
        assert_eq!(
            cells(&v.header()),
            [
                "TIME(s)",
                "COMM",
                "PID",
                "DISK",
                "T",
                "BYTES",
                "WAIT(ms)",
                "SEND(ms)",
                "NET(ms)",
                "TARGET(ms)",
                "TOTAL(ms)"
            ]
        );
        // Typical values at their widest: a 15-character kworker name, an
        // hour into the run, 1 MiB, seconds-long stages.
        let c = Command {
            comm: "kworker/u16:10H".into(),
            pid: 4_194_304,
            bytes: 1 << 20,
            ts_queue: v.clock.start_mono_ns() + 3_600_000_000_000,
            wait: 1_234_567_890,
            send: 1_234_567_890,
            resp: 2_469_135_780,
            split: Some((1_234_567_890, 1_234_567_890)),
            total: 4_938_271_560,
            ..cmd(0)
        };
        let line = v.row(&c);
        assert!(line.len() <= 100, "{} columns: {line}", line.len());
        // Every right-aligned cell ends where its header ends.
        let header = v.header();
        for name in ["PID", "BYTES", "WAIT(ms)", "NET(ms)", "TARGET(ms)", "TOTAL(ms)"] {
            let end = header.find(name).unwrap() + name.len();
            assert!(line.as_bytes()[end - 1].is_ascii_digit(), "{name} misaligned:\n{header}\n{line}");
            assert!(end == line.len() || line.as_bytes()[end] == b' ', "{name} misaligned:\n{header}\n{line}");
        }
        assert_eq!(cell(&v, &line, "COMM"), "kworker/u16:10", "COMM cut to 14 as biosnoop does");
        assert_eq!(cell(&v, &line, "TOTAL(ms)"), "4938.272");
    }

    #[test]
    fn every_column_fits_the_padding() {
        for set in [Columns::Default, Columns::Wide, Columns::Extended] {
            for c in columns(Unit::Us, true, set) {
                assert!(c.width <= SPACES.len(), "{} is {} wide", c.name, c.width);
            }
        }
    }

    #[test]
    fn a_reused_line_holds_only_the_last_command() {
        let mut v = view(true, true, false);
        let mut line = String::new();
        let long = Command { comm: "kworker/u16:10H".into(), result: 0x0007_0000, ..cmd(2_000_000) };
        v.write_row(&mut line, &long);
        v.write_row(&mut line, &cmd(2_000_000));
        assert_eq!(line, v.row(&cmd(2_000_000)));
        assert_eq!(cell(&v, &line, "COMM"), "fio");
        assert_eq!(cell(&v, &line, "RESULT"), "ok");
    }

    #[test]
    fn wide_and_extended_columns() {
        let v = view(true, true, false);
        assert_eq!(
            cells(&v.header()),
            [
                "TIME(s)",
                "COMM",
                "PID",
                "SID:CID",
                "DISK",
                "LUN",
                "T",
                "BYTES",
                "WAIT(ms)",
                "SEND(ms)",
                "RESP(ms)",
                "NET(ms)",
                "TARGET(ms)",
                "TOTAL(ms)",
                "RETX",
                "RESULT"
            ]
        );
        let e = view(true, false, true);
        assert!(cells(&e.header()).ends_with(&["RESULT", "R2T", "TARGETNAME", "INITIATOR", "PORTAL"].map(String::from)));
    }

    #[test]
    fn send_known_and_unknown() {
        let mut v = view(true, false, true);
        let line = v.row(&cmd(2_000_000));
        let got: Vec<String> =
            ["WAIT(ms)", "SEND(ms)", "RESP(ms)", "NET(ms)", "TARGET(ms)", "TOTAL(ms)", "RETX", "RESULT"]
                .iter()
                .map(|n| cell(&v, &line, n))
                .collect();
        assert_eq!(got, ["1.000", "2.000", "5.000", "1.250", "3.750", "8.000", "2", "ok"], "{line}");
        let j: Vec<String> = v.json(&cmd(2_000_000)).split(',').map(String::from).collect();
        assert!(
            j.contains(&"\"send_ns\":2000000".to_string()) && j.contains(&"\"resp_ns\":5000000".to_string()),
            "{j:?}"
        );
        assert!(
            j.contains(&"\"net_ns\":1250000".to_string())
                && j.contains(&"\"target_ns\":3750000".to_string())
                && j.contains(&"\"retrans\":2".to_string())
                && j.contains(&"\"net_from\":\"reverse-delay\"".to_string()),
            "{j:?}"
        );
        // A command that could not be split, and one whose socket was gone.
        let c = Command { split: None, retrans: None, ..cmd(2_000_000) };
        let line = v.row(&c);
        let got: Vec<String> =
            ["RESP(ms)", "NET(ms)", "TARGET(ms)", "TOTAL(ms)", "RETX"].iter().map(|n| cell(&v, &line, n)).collect();
        assert_eq!(got, ["5.000", "-", "-", "8.000", "-"], "{line}");
        let j = v.json(&c);
        assert!(
            j.contains("\"net_ns\":null,\"target_ns\":null,\"net_from\":null") && j.contains("\"retrans\":null"),
            "{j}"
        );
        // A split that does not add up to RESP is never printed.
        let bad = Command { split: Some((4_000_000, 4_000_000)), ..cmd(2_000_000) };
        let line = v.row(&bad);
        assert_eq!((cell(&v, &line, "NET(ms)"), cell(&v, &line, "TARGET(ms)")), ("-".into(), "-".into()), "{line}");

        // Without iscsi_tcp_task_xmit the C side leaves SEND at 0 and RESP
        // counts from PDU preparation: SEND is unknown, never 0.000.
        let mut v = view(false, false, true);
        let line = v.row(&cmd(0));
        let got: Vec<String> =
            ["WAIT(ms)", "SEND(ms)", "RESP(ms)", "NET(ms)", "TARGET(ms)", "TOTAL(ms)", "RETX", "RESULT", "R2T"]
                .iter()
                .map(|n| cell(&v, &line, n))
                .collect();
        assert_eq!(got, ["1.000", "-", "5.000", "-", "-", "6.000", "2", "ok", "-"], "R2T unknown too: {line}");
        let j = v.json(&cmd(0));
        assert!(
            j.contains("\"send_ns\":null") && j.contains("\"resp_ns\":5000000") && j.contains("\"r2t\":null"),
            "{j}"
        );
    }
}
