//! Decoding the records BPF programs send through the ring (or perf)
//! buffer, one Rust type per C `struct event`:
//!
//! | template | C struct | Rust type |
//! |---|---|---|
//! | bpf_templates/isclatency.c | `struct event` | [`Command`] |
//! | bpf_templates/iscfreeze.c | `struct event` | [`FreezeEvent`] |
//! | bpf_templates/submitslower.c | `struct event` | [`Submission`] |
//!
//! The tests below read each C struct from its template (src/bpf/layout.rs) and
//! check that the decoder finds every field where the compiler puts it.

/// Reads native-endian fields in order from a record.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(s)
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.take(8)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn i32(&mut self) -> Option<i32> {
        Some(i32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub fn cstr(&mut self, n: usize) -> Option<String> {
        let b = self.take(n)?;
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        Some(String::from_utf8_lossy(&b[..end]).into_owned())
    }
}

/// A SCSI command's data direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Data from the target (READ and the like).
    Read,
    /// Data to the target (WRITE and the like).
    Write,
    /// No data, or both ways (TEST UNIT READY, SYNCHRONIZE CACHE, ...).
    Other,
}

impl Direction {
    pub fn from_code(c: u8) -> Direction {
        match c {
            1 => Direction::Read,
            2 => Direction::Write,
            _ => Direction::Other,
        }
    }
    pub fn letter(self) -> &'static str {
        match self {
            Direction::Read => "R",
            Direction::Write => "W",
            Direction::Other => "-",
        }
    }
}

/// What a command's NET counted as the connection's round trip
/// (`NET_FROM_*` of iscsi_stages.c, `net_round_trip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFrom {
    /// The least clean round trip (command PDU to R2T) of the last 4-8 s.
    RoundTrip,
    /// The last clean round trip (or TCP's minimum RTT before one) plus
    /// twice the change of the target-to-initiator delay since, measured
    /// with the target's TCP timestamps: the path assumed symmetric.
    ReverseDelay,
    /// TCP's minimum RTT: no timestamp rate measured yet on the connection,
    /// or the target sends no TCP timestamps.
    TcpMinRtt,
}

impl NetFrom {
    pub fn from_code(c: u8) -> Option<NetFrom> {
        match c {
            1 => Some(NetFrom::RoundTrip),
            2 => Some(NetFrom::ReverseDelay),
            3 => Some(NetFrom::TcpMinRtt),
            _ => None,
        }
    }
    /// The name JSON gives it.
    pub fn name(self) -> &'static str {
        match self {
            NetFrom::RoundTrip => "round-trip",
            NetFrom::ReverseDelay => "reverse-delay",
            NetFrom::TcpMinRtt => "tcp-min-rtt",
        }
    }
}

/// One timed SCSI command (isclatency's event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub ts_queue: u64,
    pub wait: u64,
    pub send: u64,
    pub resp: u64,
    pub total: u64,
    /// RESP's network and target shares (NET + TARGET = RESP), or None
    /// where the command could not be split.
    pub split: Option<(u64, u64)>,
    /// What NET counted as a round trip, where split.
    pub net_from: Option<NetFrom>,
    pub lun: u64,
    pub host: u32,
    pub channel: u32,
    pub id: u32,
    pub sid: u32,
    pub cid: u32,
    pub pid: u32,
    pub bytes: u32,
    pub r2t: u32,
    /// TCP segments retransmitted on the connection while in flight; None:
    /// no TCP socket (not iscsi_tcp, or the connection was going down).
    pub retrans: Option<u32>,
    pub result: i32,
    pub dir: Direction,
    pub opcode: u8,
    /// The context that dispatched the command to the iSCSI driver
    /// (often a kworker), with `pid`.
    pub comm: String,
    /// The process that submitted the command's I/O, where traced.
    pub issuer: Issuer,
}

/// Who submitted a command's I/O to the block layer (`ISSUER_*` of
/// iscsi_stages.c: NOT_TRACED 0, KNOWN 1, UNKNOWN 2, KERNEL_THREAD 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issuer {
    /// Not traced (isclatency without --issuer).
    NotTraced,
    /// The submitting process: its pid (thread group), name and cgroup v2
    /// id. For a kernel thread (`kernel_thread`: the writeback flusher, a
    /// journal) the cgroup is the one its bio is charged to: for writeback,
    /// the cgroup that dirtied the pages where the memory and io
    /// controllers are on for it, else the root.
    Known { pid: u32, comm: String, cgroup: u64, kernel_thread: bool },
    /// Traced, and not known: no bio of the command's request was seen
    /// starting a request (the kernel's own commands, passthrough, a
    /// request whose first bio was merged in front of it).
    Unknown,
}

impl Issuer {
    fn from_record(code: u8, pid: u32, comm: String, cgroup: u64) -> Option<Issuer> {
        match code {
            0 => Some(Issuer::NotTraced),
            1 | 3 => Some(Issuer::Known { pid, comm, cgroup, kernel_thread: code == 3 }),
            2 => Some(Issuer::Unknown),
            _ => None,
        }
    }
}

/// RETX_UNKNOWN of iscsi_stages.c.
pub const RETX_UNKNOWN: u32 = u32::MAX;

impl Command {
    /// NET and TARGET where known (`have_rx`: the kernel gives the first
    /// PDU back): never more than RESP. The C side guarantees it; a record
    /// that says otherwise is treated as unknown.
    pub fn net_target(&self, have_rx: bool) -> Option<(u64, u64)> {
        self.split.filter(|(n, t)| have_rx && n.checked_add(*t) == Some(self.resp))
    }

    /// sizeof(struct event) of isclatency.c (a test checks it).
    pub const SIZE: usize = 152;

    pub fn parse(data: &[u8]) -> Option<Command> {
        let mut r = Reader::new(data);
        let (ts_queue, wait, send, resp, total) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (net, target) = (r.u64()?, r.u64()?);
        let (lun, cgroup) = (r.u64()?, r.u64()?);
        let (host, channel, id, sid, cid, pid, bytes, r2t) =
            (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let retrans = r.u32()?;
        let result = r.i32()?;
        let (dir, opcode, split, issuer) = (Direction::from_code(r.u8()?), r.u8()?, r.u8()?, r.u8()?);
        let comm = r.cstr(16)?;
        let issuer_comm = r.cstr(16)?;
        let issuer = Issuer::from_record(issuer, r.u32()?, issuer_comm, cgroup)?;
        Some(Command {
            ts_queue,
            wait,
            send,
            resp,
            total,
            split: (split != 0).then_some((net, target)),
            net_from: NetFrom::from_code(split),
            lun,
            host,
            channel,
            id,
            sid,
            cid,
            pid,
            bytes,
            r2t,
            retrans: (retrans != RETX_UNKNOWN).then_some(retrans),
            result,
            dir,
            opcode,
            comm,
            issuer,
        })
    }

    pub fn ok(&self) -> bool {
        self.result == 0
    }

    /// `ok`, or the SCSI result with its host byte named where known.
    pub fn result_text(&self) -> String {
        if self.ok() {
            return "ok".to_string();
        }
        let host_byte = (self.result >> 16) & 0xff;
        let name = match host_byte {
            0x01 => "NO_CONNECT",
            0x02 => "BUS_BUSY",
            0x03 => "TIME_OUT",
            0x05 => "ABORT",
            0x07 => "ERROR",
            0x08 => "RESET",
            0x0c => "IMM_RETRY",
            0x0d => "REQUEUE",
            0x0e => "TRANSPORT_DISRUPTED",
            0x0f => "TRANSPORT_FAILFAST",
            _ => "",
        };
        if name.is_empty() {
            format!("0x{:x}", self.result)
        } else {
            format!("{name}(0x{:x})", self.result)
        }
    }
}

/// A freeze or quiesce that ended (`TYPE_END`), or a submitter's wait for
/// one (`TYPE_WAIT`): `struct event` of iscfreeze.c.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezeEvent {
    pub ty: u64,
    pub q: u64,
    /// Freeze start (for a wait: of the freeze waited for).
    pub start: u64,
    /// Unfreeze (for a wait: when the wait ended).
    pub end: u64,
    /// End: submitters that blocked; wait: wait ns.
    pub value: u64,
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub dev: u32,
    pub stack: i32,
    pub comm: String,
    pub disk: String,
}

impl FreezeEvent {
    pub const SIZE: usize = 112;
    pub const TYPE_END: u64 = 0;
    pub const TYPE_WAIT: u64 = 1;
    pub const KIND_FREEZE: u32 = 0;
    pub const KIND_QUIESCE: u32 = 1;

    pub fn parse(b: &[u8]) -> Option<FreezeEvent> {
        let mut r = Reader::new(b);
        let (ty, q, start, end, value) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let (kind, pid, tid, dev, stack, _pad) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.i32()?, r.u32()?);
        Some(FreezeEvent { ty, q, start, end, value, kind, pid, tid, dev, stack, comm: r.cstr(16)?, disk: r.cstr(32)? })
    }
}

/// A bio submission that took at least the threshold: `struct event` of
/// submitslower.c.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// When the submission returned.
    pub ts: u64,
    pub lat: u64,
    pub pid: u32,
    pub tid: u32,
    /// The bio's device (a partition if it targets one) and its whole disk.
    pub dev: u32,
    pub disk: u32,
    pub comm: String,
}

impl Submission {
    pub const SIZE: usize = 48;

    pub fn parse(rec: &[u8]) -> Option<Submission> {
        let mut r = Reader::new(rec);
        Some(Submission {
            ts: r.u64()?,
            lat: r.u64()?,
            pid: r.u32()?,
            tid: r.u32()?,
            dev: r.u32()?,
            disk: r.u32()?,
            comm: r.cstr(16)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::layout::{self, Sample};
    use crate::bpf::templates;

    fn sample(template: &str) -> Sample {
        Sample::new(layout::parse(template, "event").unwrap())
    }

    /// NetFrom's codes are iscsi_stages.c's NET_FROM_* values.
    #[test]
    fn net_from_codes_match_iscsi_stages_c() {
        let d = crate::bpf::layout::defines(crate::bpf::templates::ISCSI_STAGES);
        for (name, want) in [
            ("NET_FROM_ROUND_TRIP", NetFrom::RoundTrip),
            ("NET_FROM_REVERSE", NetFrom::ReverseDelay),
            ("NET_FROM_TCP_MIN", NetFrom::TcpMinRtt),
        ] {
            let code = *d.get(name).unwrap_or_else(|| panic!("no #define {name}"));
            assert_eq!(NetFrom::from_code(code as u8), Some(want), "{name}");
        }
        assert_eq!(NetFrom::from_code(0), None);
    }

    #[test]
    fn command_matches_isclatency_c() {
        let mut s = sample(templates::ISCLATENCY);
        assert_eq!(s.layout.size, Command::SIZE);
        let issuer_at = s.layout.field("issuer").offset;
        s.bytes[issuer_at] = 1;
        let c = Command::parse(&s.bytes).unwrap();
        assert_eq!(
            c.issuer,
            Issuer::Known {
                pid: s.int("issuer_pid", 0) as u32,
                comm: s.string("issuer_comm"),
                cgroup: s.int("issuer_cgroup", 0),
                kernel_thread: false,
            }
        );
        assert!(s.int("split", 0) != 0 && s.int("retrans", 0) != RETX_UNKNOWN as u64);
        let (net, target) = c.split.unwrap();
        let got = [
            c.ts_queue,
            c.wait,
            c.send,
            c.resp,
            c.total,
            net,
            target,
            c.lun,
            c.host as u64,
            c.channel as u64,
            c.id as u64,
            c.sid as u64,
            c.cid as u64,
            c.pid as u64,
            c.bytes as u64,
            c.r2t as u64,
            c.retrans.unwrap() as u64,
            c.result as u64,
            c.opcode as u64,
        ];
        let names = [
            "ts_queue", "wait", "send", "resp", "total", "net", "target", "lun", "host", "channel", "id", "sid", "cid",
            "pid", "bytes", "r2t", "retrans", "result", "opcode",
        ];
        for (g, n) in got.iter().zip(names) {
            assert_eq!(*g, s.int(n, 0), "field {n}");
        }
        assert_eq!(c.dir, Direction::from_code(s.int("dir", 0) as u8));
        assert_eq!(c.comm, s.string("comm"));
        assert_eq!(s.layout.fields.len(), names.len() + 7, "every C field is decoded");
        let d = crate::bpf::layout::defines(templates::ISCSI_STAGES);
        for (code, name) in [(0u8, "ISSUER_NOT_TRACED"), (2, "ISSUER_UNKNOWN")] {
            assert_eq!(d.get(name).copied(), Some(code as usize), "{name}");
            s.bytes[issuer_at] = code;
            let want = if code == 0 { Issuer::NotTraced } else { Issuer::Unknown };
            assert_eq!(Command::parse(&s.bytes).unwrap().issuer, want);
        }
        assert_eq!(d.get("ISSUER_KNOWN").copied(), Some(1));
        assert_eq!(d.get("ISSUER_KERNEL_THREAD").copied(), Some(3));
        s.bytes[issuer_at] = 3;
        let thread = Command::parse(&s.bytes).unwrap().issuer;
        assert!(matches!(thread, Issuer::Known { kernel_thread: true, .. }), "{thread:?}");
        s.bytes[issuer_at] = 4;
        assert!(Command::parse(&s.bytes).is_none(), "an issuer code the C side does not define");
        s.bytes[issuer_at] = 1;
        assert!(templates::ISCSI_STAGES.contains(&format!("#define RETX_UNKNOWN {RETX_UNKNOWN:#x}\n")));
        let end = s.layout.field("issuer_pid").offset + 4;
        assert!(Command::parse(&s.bytes[..end - 1]).is_none());
    }

    #[test]
    fn freeze_event_matches_iscfreeze_c() {
        let s = sample(templates::ISCFREEZE);
        assert_eq!(s.layout.size, FreezeEvent::SIZE);
        let e = FreezeEvent::parse(&s.bytes).unwrap();
        let got = [
            e.ty,
            e.q,
            e.start,
            e.end,
            e.value,
            e.kind as u64,
            e.pid as u64,
            e.tid as u64,
            e.dev as u64,
            e.stack as u64,
        ];
        let names = ["type", "q", "start", "end", "value", "kind", "pid", "tid", "dev", "stack"];
        for (g, n) in got.iter().zip(names) {
            assert_eq!(*g, s.int(n, 0), "field {n}");
        }
        assert_eq!((e.comm, e.disk), (s.string("comm"), s.string("disk")));
        assert_eq!(s.layout.fields.len(), names.len() + 3, "every C field but pad is decoded");
        for (name, v) in [
            ("TYPE_END", FreezeEvent::TYPE_END),
            ("TYPE_WAIT", FreezeEvent::TYPE_WAIT),
            ("KIND_FREEZE", FreezeEvent::KIND_FREEZE as u64),
            ("KIND_QUIESCE", FreezeEvent::KIND_QUIESCE as u64),
        ] {
            assert!(templates::ISCFREEZE.contains(&format!("#define {name} {v}\n")), "{name}");
        }
    }

    #[test]
    fn submission_matches_submitslower_c() {
        let s = sample(templates::SUBMITSLOWER);
        assert_eq!(s.layout.size, Submission::SIZE);
        let e = Submission::parse(&s.bytes).unwrap();
        let got = [e.ts, e.lat, e.pid as u64, e.tid as u64, e.dev as u64, e.disk as u64];
        let names = ["ts", "lat", "pid", "tid", "dev", "disk"];
        for (g, n) in got.iter().zip(names) {
            assert_eq!(*g, s.int(n, 0), "field {n}");
        }
        assert_eq!(e.comm, s.string("comm"));
        assert_eq!(s.layout.fields.len(), names.len() + 1);
    }

    #[test]
    fn failed_result_is_named() {
        let mut s = sample(templates::ISCLATENCY);
        let issuer_at = s.layout.field("issuer").offset;
        s.bytes[issuer_at] = 0;
        let off = s.layout.field("result").offset;
        s.bytes[off..off + 4].copy_from_slice(&0x0007_0000i32.to_ne_bytes());
        let c = Command::parse(&s.bytes).unwrap();
        assert!(!c.ok());
        assert_eq!(c.result_text(), "ERROR(0x70000)");
        s.bytes[off..off + 4].copy_from_slice(&0x2i32.to_ne_bytes());
        assert_eq!(Command::parse(&s.bytes).unwrap().result_text(), "0x2");
        s.bytes[off..off + 4].copy_from_slice(&0i32.to_ne_bytes());
        assert_eq!(Command::parse(&s.bytes).unwrap().result_text(), "ok");
    }
}
