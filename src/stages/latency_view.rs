//! isclatency's output: one line (or JSON object) per timed command, with
//! the disk and session looked up in the topology.

use crate::bpf::events::Command;
use crate::cli::json;
use crate::cli::output::{Clock, Unit};
use crate::iscsi::topology::Topology;
use crate::stages::StagePlan;
use std::path::PathBuf;
use std::time::Instant;

/// What the lines show, and how to name disks and sessions.
pub struct LatencyView {
    pub unit: Unit,
    pub timestamp: bool,
    pub extended: bool,
    /// SEND told apart from RESP (else SEND is `-` / null).
    pub have_sent: bool,
    /// R2Ts counted (else `-` / null).
    pub have_r2t: bool,
    /// RESP split into NET and TARGET where the command allows it.
    pub have_rx: bool,
    pub clock: Clock,
    pub topo: Topology,
    /// Where to read the topology again for a session that logged in later.
    pub sysfs: Option<PathBuf>,
    topo_read_at: Instant,
}

impl LatencyView {
    pub fn new(
        unit: Unit,
        timestamp: bool,
        extended: bool,
        plan: &StagePlan,
        clock: Clock,
        topo: Topology,
        sysfs: Option<PathBuf>,
    ) -> LatencyView {
        LatencyView {
            unit,
            timestamp,
            extended,
            have_sent: plan.have_sent,
            have_r2t: plan.have_r2t,
            have_rx: plan.have_rx,
            clock,
            topo,
            sysfs,
            topo_read_at: Instant::now(),
        }
    }

    fn disk(&mut self, c: &Command) -> String {
        if let Some(d) = self.topo.disk_name(c.host, c.channel, c.id, c.lun) {
            return d.to_string();
        }
        // A session that logged in after we started: read sysfs again (at most once a second).
        if let Some(sys) = &self.sysfs {
            if self.topo_read_at.elapsed().as_secs() >= 1 {
                if let Ok(t) = Topology::read(sys) {
                    self.topo = t;
                }
                self.topo_read_at = Instant::now();
            }
        }
        self.topo.disk_name(c.host, c.channel, c.id, c.lun).unwrap_or("?").to_string()
    }

    fn time(&self, c: &Command) -> String {
        let done = c.ts_queue + c.total;
        if self.timestamp {
            self.clock.wall(done)
        } else {
            format!("{:.6}", self.clock.since_start(done))
        }
    }

    pub fn header(&self) -> String {
        let u = self.unit.label();
        let time = if self.timestamp { "TIME" } else { "TIME(s)" };
        let mut h = format!(
            "{time:<14} {:<16} {:>7} {:>7} {:<6} {:>3} {} {:>7} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>4} {}",
            "COMM",
            "PID",
            "SID:CID",
            "DISK",
            "LUN",
            "T",
            "BYTES",
            format!("WAIT({u})"),
            format!("SEND({u})"),
            format!("RESP({u})"),
            format!("NET({u})"),
            format!("TARGET({u})"),
            format!("TOTAL({u})"),
            "RETX",
            "RESULT"
        );
        if self.extended {
            h.push_str(&format!(" {:>3} {} {} {}", "R2T", "TARGETNAME", "INITIATOR", "PORTAL"));
        }
        h
    }

    pub fn row(&mut self, c: &Command) -> String {
        let u = self.unit;
        let send = if self.have_sent { u.fmt(c.send) } else { "-".into() };
        let (net, target) = match self.split(c) {
            Some((n, t)) => (u.fmt(n), u.fmt(t)),
            None => ("-".into(), "-".into()),
        };
        let retx = c.retrans.map_or("-".into(), |r| r.to_string());
        let disk = self.disk(c);
        let mut line = format!(
            "{:<14} {:<16} {:>7} {:>7} {:<6} {:>3} {} {:>7} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>4} {}",
            self.time(c),
            c.comm,
            c.pid,
            format!("{}:{}", c.sid, c.cid),
            disk,
            c.lun,
            c.dir.letter(),
            c.bytes,
            u.fmt(c.wait),
            send,
            u.fmt(c.resp),
            net,
            target,
            u.fmt(c.total),
            retx,
            c.result_text()
        );
        if self.extended {
            let (target, initiator, portal) = match self.topo.session(c.sid) {
                Some(s) => (s.target.clone(), s.initiator.clone(), s.portal()),
                None => ("?".into(), "?".into(), "?".into()),
            };
            let r2t = if self.have_r2t { c.r2t.to_string() } else { "-".into() };
            line.push_str(&format!(" {r2t:>3} {target} {initiator} {portal}"));
        }
        line
    }

    /// NET and TARGET where known: never more than RESP (the C side
    /// guarantees it; a record that says otherwise is shown as unknown).
    fn split(&self, c: &Command) -> Option<(u64, u64)> {
        c.split.filter(|(n, t)| self.have_rx && n.checked_add(*t) == Some(c.resp))
    }

    pub fn json(&mut self, c: &Command) -> String {
        let disk = self.disk(c);
        let s = self.topo.session(c.sid);
        json::Object::new()
            .str("time", &self.time(c))
            .str("comm", &c.comm)
            .num("pid", c.pid)
            .num("sid", c.sid)
            .num("cid", c.cid)
            .num("host", c.host)
            .num("lun", c.lun)
            .str("disk", &disk)
            .str("dir", c.dir.letter())
            .num("opcode", c.opcode)
            .num("bytes", c.bytes)
            .num("wait_ns", c.wait)
            .opt_num("send_ns", self.have_sent.then_some(c.send))
            .num("resp_ns", c.resp)
            .opt_num("net_ns", self.split(c).map(|s| s.0))
            .opt_num("target_ns", self.split(c).map(|s| s.1))
            .num("total_ns", c.total)
            .opt_num("retrans", c.retrans)
            .opt_num("r2t", self.have_r2t.then_some(c.r2t))
            .num("result", c.result)
            .bool("ok", c.ok())
            .opt_str("target", s.map(|s| s.target.as_str()))
            .opt_str("initiator", s.map(|s| s.initiator.as_str()))
            .str("portal", &s.map(|s| s.portal()).unwrap_or_else(|| "?".into()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::events::Direction;
    use crate::kernel::headers::ScsiLayout;
    use std::path::Path;

    fn view(have_sent: bool) -> LatencyView {
        let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2")).unwrap();
        let plan = StagePlan {
            have_sent,
            have_r2t: have_sent,
            have_rx: have_sent,
            ..StagePlan::assume_all(ScsiLayout::modern())
        };
        LatencyView::new(Unit::Ms, false, true, &plan, Clock::start(), topo, None)
    }

    fn cmd(send: u64) -> Command {
        Command {
            ts_queue: 0,
            wait: 1_000_000,
            send,
            resp: 5_000_000,
            total: 6_000_000 + send,
            split: Some((1_250_000, 3_750_000)),
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
        }
    }

    #[test]
    fn send_known_and_unknown() {
        let mut v = view(true);
        let line = v.row(&cmd(2_000_000));
        assert!(line.contains(" 1.000      2.000      5.000      1.250       3.750      8.000    2 ok"), "{line}");
        let j: Vec<String> = v.json(&cmd(2_000_000)).split(',').map(String::from).collect();
        assert!(
            j.contains(&"\"send_ns\":2000000".to_string()) && j.contains(&"\"resp_ns\":5000000".to_string()),
            "{j:?}"
        );
        assert!(
            j.contains(&"\"net_ns\":1250000".to_string())
                && j.contains(&"\"target_ns\":3750000".to_string())
                && j.contains(&"\"retrans\":2".to_string()),
            "{j:?}"
        );
        // A command that could not be split, and one whose socket was gone.
        let c = Command { split: None, retrans: None, ..cmd(2_000_000) };
        let line = v.row(&c);
        assert!(line.contains(" 5.000          -           -      8.000    - ok"), "{line}");
        let j = v.json(&c);
        assert!(j.contains("\"net_ns\":null,\"target_ns\":null") && j.contains("\"retrans\":null"), "{j}");
        // A split that does not add up to RESP is never printed.
        let bad = Command { split: Some((4_000_000, 4_000_000)), ..cmd(2_000_000) };
        assert!(v.row(&bad).contains(" 5.000          -           -"));

        // Without iscsi_tcp_task_xmit the C side leaves SEND at 0 and RESP
        // counts from PDU preparation: SEND is unknown, never 0.000.
        let mut v = view(false);
        let line = v.row(&cmd(0));
        assert!(line.contains(" 1.000          -      5.000          -           -      6.000    2 ok"), "{line}");
        assert!(line.contains("   - iqn."), "R2T unknown too: {line}");
        let j = v.json(&cmd(0));
        assert!(
            j.contains("\"send_ns\":null") && j.contains("\"resp_ns\":5000000") && j.contains("\"r2t\":null"),
            "{j}"
        );
    }
}
