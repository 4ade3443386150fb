//! submitslower: the bio submission it times on the running kernel, its
//! program's values, and its lines. The C side is
//! bpf_templates/submitslower.c; the record is [`Submission`].

use crate::bpf::events::Submission;
use crate::bpf::runner::EventBuffer;
use crate::bpf::templates::{self, Template, Value};
use crate::cli::json;
use crate::cli::output::Unit;
use crate::error::Result;
use crate::iscsi::blockdev::{self, BlockDevs};
use crate::kernel::headers::BlockLayout;

/// The submission entry point, newest name first (generic_make_request
/// before 5.9).
pub const SUBMIT: &[&str] = &["submit_bio_noacct", "generic_make_request"];

/// The template parts of the program.
pub const PARTS: &[&str] = &[templates::COMMON, templates::SUBMITSLOWER];

/// What the program is compiled with.
#[derive(Debug, Clone, Copy)]
pub struct SubmitPlan {
    pub layout: BlockLayout,
    pub buffer: EventBuffer,
    /// Submissions of at least this long are sent to user space.
    pub min_us: u64,
    pub pid: Option<u32>,
    /// One whole disk's dev_t.
    pub dev: Option<u32>,
    /// Only the disks user space puts in the `disks` map.
    pub disk_set: bool,
}

impl SubmitPlan {
    pub fn render(&self) -> Result<String> {
        let mut values: Vec<(&str, Value)> = self.buffer.values().to_vec();
        values.extend([
            ("MIN_US", self.min_us.into()),
            ("FILTER_PID", self.pid.is_some().into()),
            ("PID", self.pid.unwrap_or(0).into()),
            ("FILTER_DEV", self.dev.is_some().into()),
            ("DEV", self.dev.unwrap_or(0).into()),
            ("FILTER_SET", self.disk_set.into()),
            ("BIO_BDEV", self.layout.bio_bdev.into()),
        ]);
        Template::new(PARTS).render(&values)
    }
}

/// The text header.
pub fn header(timestamp: bool, unit: Unit) -> String {
    let time = if timestamp { "TIME" } else { "TIME(s)" };
    format!("{time:<14} {:<16} {:>7} {:>10} DISK", "COMM", "PID", format!("LAT({})", unit.label()))
}

/// One submission: a text line or a JSON object (times in ns).
pub fn line(e: &Submission, time: &str, unit: Unit, devs: &mut BlockDevs, json: bool) -> String {
    let disk = devs.name(e.dev);
    if !json {
        return format!("{time:<14} {:<16} {:>7} {:>10} {disk}", e.comm, e.pid, unit.fmt(e.lat));
    }
    let (ma, mi) = blockdev::kdev_split(e.dev);
    json::Object::new()
        .str("time", time)
        .str("comm", &e.comm)
        .num("pid", e.pid)
        .num("tid", e.tid)
        .num("lat_ns", e.lat)
        .str("disk", &disk)
        .str("whole_disk", &devs.name(e.disk))
        .str("dev", &format!("{ma}:{mi}"))
        .num("end_ns", e.ts)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every branch of the template with the values the tool passes.
    #[test]
    fn every_branch_renders() {
        for (pid, dev, disk_set) in
            [(None, None, false), (Some(42), None, true), (None, Some(blockdev::kdev(8, 0)), false)]
        {
            for bio_bdev in [true, false] {
                for ringbuf in [true, false] {
                    let layout = BlockLayout { bio_bdev, ..BlockLayout::modern() };
                    let c = SubmitPlan { layout, buffer: EventBuffer::new(ringbuf), min_us: 1000, pid, dev, disk_set }
                        .render()
                        .unwrap();
                    assert!(!c.contains("{{"));
                    assert!(c.contains(&format!("#define BIO_BDEV {}\n", bio_bdev as u8)));
                    assert!(c.contains(&format!("#define FILTER_SET {}\n", disk_set as u8)));
                    assert!(c.contains(&format!("#define FILTER_DEV {}\n", dev.is_some() as u8)));
                    assert!(c.contains(&format!("#define FILTER_PID {}\n", pid.is_some() as u8)));
                    assert!(c.contains(&format!("#define USE_RINGBUF {}\n", ringbuf as u8)));
                }
            }
        }
    }
}
