//! fio, the ground truth: its command line and what it says it did.

use super::json::JsonExt;
use serde_json::Value;
use std::process::{Command, Stdio};

/// What fio says it did.
#[derive(Debug, Clone)]
pub struct Fio {
    pub reads: u64,
    pub writes: u64,
    pub read_clat_mean_ns: f64,
    pub write_clat_mean_ns: f64,
    pub runtime_ms: f64,
}

impl Fio {
    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }
    pub fn clat_mean_ns(&self) -> f64 {
        (self.read_clat_mean_ns * self.reads as f64 + self.write_clat_mean_ns * self.writes as f64)
            / self.ios().max(1) as f64
    }
}

pub fn fio_cmd(disk: &str, rw: &str, number_ios: u64, iodepth: u32, extra: &[&str]) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=lab",
        &format!("--filename=/dev/{disk}"),
        &format!("--rw={rw}"),
        "--bs=4k",
        "--direct=1",
        "--ioengine=libaio",
        &format!("--iodepth={iodepth}"),
        &format!("--number_ios={number_ios}"),
        "--size=128m",
        "--output-format=json",
        "--randrepeat=0",
    ]);
    c.args(extra);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

pub fn fio_result(out: std::process::Output) -> Fio {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    parse(&text)
}

/// fio's JSON output: its first job.
fn parse(text: &str) -> Fio {
    let start = text.find('{').unwrap_or_else(|| panic!("fio printed no JSON: {text}"));
    let j: Value =
        serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio's JSON does not parse ({e}): {text}"));
    let job = j.path("jobs.0");
    assert_eq!(job.u64("error"), 0, "fio's job failed: {text}");
    Fio {
        reads: job.u64("read.total_ios"),
        writes: job.u64("write.total_ios"),
        read_clat_mean_ns: job.f64("read.clat_ns.mean"),
        write_clat_mean_ns: job.f64("write.clat_ns.mean"),
        runtime_ms: job.f64("job_runtime"),
    }
}

pub fn fio(disk: &str, rw: &str, number_ios: u64, iodepth: u32, extra: &[&str]) -> Fio {
    fio_result(fio_cmd(disk, rw, number_ios, iodepth, extra).output().expect("run fio"))
}

/// Stop a running fio (`fio_cmd(...).spawn()`, time-based) with SIGINT and
/// read what it did until then. fio 3.33 prints its JSON and exits 128 when
/// a signal ends its jobs: the status is not judged; the JSON must be whole
/// and the job without error.
pub fn fio_stop(job: std::process::Child) -> Fio {
    let pid = job.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child, which is not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0, "SIGINT to fio {pid}");
    let out = job.wait_with_output().expect("wait for fio");
    println!("fio stopped by SIGINT: {}", out.status);
    parse(&String::from_utf8_lossy(&out.stdout))
}
