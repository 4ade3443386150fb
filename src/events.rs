//! Decoding the records BPF programs send: `struct event` of isclatency.c.

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Read,
    Write,
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

/// One timed SCSI command (isclatency's event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub ts_queue: u64,
    pub wait: u64,
    pub send: u64,
    pub resp: u64,
    pub total: u64,
    pub lun: u64,
    pub host: u32,
    pub channel: u32,
    pub id: u32,
    pub sid: u32,
    pub cid: u32,
    pub pid: u32,
    pub bytes: u32,
    pub r2t: u32,
    pub result: i32,
    pub dir: Direction,
    pub opcode: u8,
    pub comm: String,
}

pub const COMMAND_SIZE: usize = 102;

impl Command {
    pub fn parse(data: &[u8]) -> Option<Command> {
        let mut r = Reader::new(data);
        Some(Command {
            ts_queue: r.u64()?,
            wait: r.u64()?,
            send: r.u64()?,
            resp: r.u64()?,
            total: r.u64()?,
            lun: r.u64()?,
            host: r.u32()?,
            channel: r.u32()?,
            id: r.u32()?,
            sid: r.u32()?,
            cid: r.u32()?,
            pid: r.u32()?,
            bytes: r.u32()?,
            r2t: r.u32()?,
            result: r.i32()?,
            dir: Direction::from_code(r.u8()?),
            opcode: r.u8()?,
            comm: r.cstr(16)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    pub fn record(wait: u64, send: u64, resp: u64, result: i32, comm: &str) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [1_000u64, wait, send, resp, wait + send + resp, 1] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        for x in [2u32, 0, 0, 1, 0, 4242, 4096, 3] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        v.extend_from_slice(&result.to_ne_bytes());
        v.push(2);
        v.push(0x2a);
        let mut c = [0u8; 16];
        c[..comm.len()].copy_from_slice(comm.as_bytes());
        v.extend_from_slice(&c);
        v.extend_from_slice(&[0, 0]); // C struct tail padding to 8
        v
    }

    #[test]
    fn parses_a_record() {
        let c = Command::parse(&record(10, 20, 30, 0, "fio")).unwrap();
        assert_eq!((c.wait, c.send, c.resp, c.total), (10, 20, 30, 60));
        assert_eq!((c.host, c.sid, c.pid, c.bytes, c.r2t, c.lun), (2, 1, 4242, 4096, 3, 1));
        assert_eq!(c.dir, Direction::Write);
        assert_eq!(c.opcode, 0x2a);
        assert_eq!(c.comm, "fio");
        assert_eq!(c.result_text(), "ok");
    }

    #[test]
    fn short_record_is_rejected() {
        let r = record(1, 2, 3, 0, "x");
        assert!(Command::parse(&r[..COMMAND_SIZE - 1]).is_none());
        assert!(Command::parse(&r[..COMMAND_SIZE]).is_some());
    }

    #[test]
    fn failed_result_is_named() {
        let c = Command::parse(&record(1, 2, 3, 0x0007_0000, "kworker/0:1")).unwrap();
        assert!(!c.ok());
        assert_eq!(c.result_text(), "ERROR(0x70000)");
        assert_eq!(c.comm, "kworker/0:1");
        let c = Command::parse(&record(1, 2, 3, 0x2, "x")).unwrap();
        assert_eq!(c.result_text(), "0x2");
    }
}
