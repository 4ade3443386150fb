//! Helpers for the end-to-end tests that run inside the lab VM
//! (tests/lab/run): the lab's disks, fio as ground truth, and running a tool
//! until it says "Tracing", then stopping it with a signal.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use storprototrace::iscsi::topology::Topology;

/// Typed access to a field of a JSON object (a tool's --json line, fio's
/// output) by a dotted path: `c.u64("wait_ns")`, `j.f64("jobs.0.read.clat_ns.mean")`.
/// Each panics, naming the path and showing the object, when the field is
/// missing or of another type: a test never reads a default.
pub trait JsonExt {
    fn path(&self, p: &str) -> &Value;
    fn str(&self, p: &str) -> &str;
    fn u64(&self, p: &str) -> u64;
    fn f64(&self, p: &str) -> f64;
}

impl JsonExt for Value {
    fn path(&self, p: &str) -> &Value {
        self.pointer(&format!("/{}", p.replace('.', "/"))).unwrap_or_else(|| panic!("no field {p:?} in {self}"))
    }
    fn str(&self, p: &str) -> &str {
        let v = self.path(p);
        v.as_str().unwrap_or_else(|| panic!("field {p:?} is {v}, not a string, in {self}"))
    }
    fn u64(&self, p: &str) -> u64 {
        let v = self.path(p);
        v.as_u64().unwrap_or_else(|| panic!("field {p:?} is {v}, not an unsigned integer, in {self}"))
    }
    fn f64(&self, p: &str) -> f64 {
        let v = self.path(p);
        v.as_f64().unwrap_or_else(|| panic!("field {p:?} is {v}, not a number, in {self}"))
    }
}

pub struct Lab {
    pub disks: Vec<String>,
    pub targets: Vec<String>,
}

/// The lab this test runs in. Outside the VM there is none: the lab tests
/// are #[ignore]d and only run through tests/all.
pub fn lab() -> Lab {
    let disks: Vec<String> = std::env::var("LAB_DISKS")
        .expect("LAB_DISKS unset: run through tests/all")
        .split_whitespace()
        .map(String::from)
        .collect();
    let targets = std::env::var("LAB_TARGETS").unwrap_or_default().split_whitespace().map(String::from).collect();
    assert!(!disks.is_empty(), "the lab has no disks");
    Lab { disks, targets }
}

pub fn topology() -> Topology {
    Topology::read(std::path::Path::new("/sys")).expect("read sysfs")
}

pub fn sid_of(disk: &str) -> u32 {
    let t = topology();
    t.disk(disk).unwrap_or_else(|| panic!("{disk} is not an iSCSI disk: {}", t.describe())).0.sid
}

pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("run sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Make counts exact: no merging of adjacent I/Os, and no udev probing the
/// disks after fio closes them. Stopping udev's exec queue is not enough:
/// udevd's inotify watch itself re-reads the partition table (BLKRRPART) of
/// a disk closed after writing, 18 SCSI commands here. So udevd is stopped.
pub fn quiet_disks(lab: &Lab) {
    for d in &lab.disks {
        sh(&format!("echo 2 > /sys/block/{d}/queue/nomerges"));
    }
    sh("udevadm settle -t 10 || true; udevadm control --exit || true; pkill -x systemd-udevd || true; sleep 1");
}

/// After a login to `target`: wait (30 s at most) until its session has a
/// disk on its first LUN, then set that disk up like quiet_disks does.
pub fn session_disk_after_login(target: &str) -> (storprototrace::iscsi::topology::Session, String) {
    for _ in 0..60 {
        let topo = topology();
        if let Some(s) = topo.sessions.iter().find(|s| s.target == target) {
            if let Some(d) = s.luns.first().and_then(|l| l.disk.clone()) {
                sh(&format!("echo 2 > /sys/block/{d}/queue/nomerges"));
                return (s.clone(), d);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("no disk for {target} 30 s after login");
}

/// A netem qdisc on loopback for as long as the value lives (removed even
/// when a test fails).
pub struct Netem;
impl Netem {
    pub fn add(spec: &str) -> Netem {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
        sh(&format!("tc qdisc add dev lo root netem {spec}"));
        Netem
    }
}
impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).output();
    }
}

/// Round trips over loopback, the lab's ping (the guest has none): `n` UDP
/// echoes of one byte, one at a time, the echo on its own thread; each
/// round trip in ns, sorted. Under netem this is what a configured delay
/// really adds to a round trip in this guest (timer slack under emulation:
/// 2 x 5 ms added 10.5-11.1 ms to the minimum on 6.1).
pub fn udp_round_trips(n: usize) -> Vec<u64> {
    use std::net::UdpSocket;
    let echo = UdpSocket::bind("127.0.0.1:0").expect("bind the echo socket");
    let addr = echo.local_addr().unwrap();
    echo.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        while let Ok((len, from)) = echo.recv_from(&mut buf) {
            if buf[..len] == *b"q" {
                break;
            }
            let _ = echo.send_to(&buf[..len], from);
        }
    });
    let c = UdpSocket::bind("127.0.0.1:0").expect("bind the client socket");
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 16];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.send_to(b"x", addr).unwrap();
        c.recv_from(&mut buf).expect("a UDP echo over lo within 2 s");
        out.push(t.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(2));
    }
    c.send_to(b"q", addr).unwrap();
    server.join().unwrap();
    out.sort_unstable();
    out
}

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
    let start = text.find('{').expect("fio printed no JSON");
    let j: Value =
        serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("fio's JSON does not parse ({e}): {text}"));
    let job = j.path("jobs.0");
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

/// A tool started with --json, running until stopped.
pub struct Traced {
    pub name: String,
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    pub started: Instant,
}

pub struct Finished {
    pub name: String,
    pub status: std::process::ExitStatus,
    pub lines: Vec<String>,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Finished {
    /// Every stdout line parsed; a line that is not JSON fails the test.
    pub fn json(&self) -> Vec<Value> {
        self.lines
            .iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{} printed a line that is not JSON ({e}): {l:?}", self.name))
            })
            .collect()
    }
    /// The summary line's number before `what` (e.g. "events lost").
    pub fn summary(&self, what: &str) -> u64 {
        self.summary_if(what).unwrap_or_else(|| panic!("no summary with {what:?}: {}", self.stderr))
    }
    /// Commands the tool says it did not time or count (isclatency's and
    /// iscstat's exit summary): events lost, still in flight, ends not seen
    /// and probe hits skipped by the kernel. A kprobe program does not run
    /// while another BPF program runs on that CPU, and netem delivers
    /// responses from a timer's softirq, which can come on top of the xmit
    /// worker's programs (5.10 has no fentry for modules): a command whose
    /// end was skipped is counted as an end not seen (its memory reused) or
    /// still in flight; one whose start was skipped, as a skipped hit where
    /// the kernel counts those.
    pub fn untimed(&self) -> u64 {
        self.summary("events lost")
            + self.summary("still in flight")
            + self.summary_if("ends not seen").unwrap_or(0)
            + self.summary_if("probe hits skipped").unwrap_or(0)
    }
    /// The same for a part the summary prints only when it is not zero
    /// (isclatency's "ends not seen"): None when the summary lacks it.
    pub fn summary_if(&self, what: &str) -> Option<u64> {
        let line = self.stderr.lines().chain(self.lines.iter().map(|s| s.as_str())).find(|l| l.contains(what))?;
        let before = &line[..line.find(what).unwrap()];
        Some(
            before
                .trim_end()
                .rsplit([' ', ','])
                .next()
                .unwrap()
                .parse()
                .unwrap_or_else(|_| panic!("no number before {what:?} in {line:?}")),
        )
    }
}

pub fn bin(name: &str) -> String {
    match name {
        "isclatency" => env!("CARGO_BIN_EXE_isclatency").to_string(),
        "iscstat" => env!("CARGO_BIN_EXE_iscstat").to_string(),
        "submitslower" => env!("CARGO_BIN_EXE_submitslower").to_string(),
        "iscfreeze" => env!("CARGO_BIN_EXE_iscfreeze").to_string(),
        "iscstates" => env!("CARGO_BIN_EXE_iscstates").to_string(),
        other => panic!("unknown tool {other}"),
    }
}

/// Start a tool and wait for its "Tracing" line (compiling under emulation
/// takes tens of seconds: wait for the line, never a fixed time).
pub fn start(tool: &str, args: &[&str]) -> Traced {
    spawn(tool, args, &[]).ready()
}

/// Start several tools at once and wait for all: their compilations
/// (a minute or more each under emulation) overlap on the two vCPUs, so
/// each may take up to half as long again per other tool compiling.
pub fn start_together(tools: &[(&str, &[&str])]) -> Vec<Traced> {
    let starting: Vec<Starting> = tools.iter().map(|(t, a)| spawn(t, a, &[])).collect();
    let limit = Duration::from_secs(300 * tools.len().div_ceil(2).max(1) as u64);
    starting.into_iter().map(|s| s.ready_within(limit)).collect()
}

/// A tool started but maybe still compiling: start several, then wait for
/// each, so their compilations overlap.
pub struct Starting {
    tool: String,
    args: Vec<String>,
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    ready: mpsc::Receiver<()>,
}

pub fn spawn(tool: &str, args: &[&str], env: &[(&str, &str)]) -> Starting {
    let mut child = Command::new(bin(tool))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tool");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let err_text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut err = child.stderr.take().unwrap();
    let et = err_text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match err.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut s = et.lock().unwrap();
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if s.contains("Tracing") {
                        let _ = ready_tx.send(());
                    }
                }
            }
        }
    });
    Starting {
        tool: tool.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        child,
        stdout: rx,
        stderr: err_text,
        ready: ready_rx,
    }
}

impl Starting {
    pub fn ready(self) -> Traced {
        self.ready_within(Duration::from_secs(300))
    }

    /// Wait for the Tracing line at most `limit` (compiling under
    /// emulation: tens of seconds alone, longer when others compile too).
    pub fn ready_within(mut self, limit: Duration) -> Traced {
        let (tool, args) = (&self.tool, &self.args);
        let deadline = Instant::now() + limit;
        loop {
            if self.ready.recv_timeout(Duration::from_millis(200)).is_ok() {
                break;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("{tool} {args:?} exited with {st} before tracing: {}", self.stderr.lock().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "{tool} did not start tracing in {} s: {}",
                limit.as_secs(),
                self.stderr.lock().unwrap()
            );
        }
        Traced { name: self.tool, child: self.child, stdout: self.stdout, stderr: self.stderr, started: Instant::now() }
    }
}

impl Traced {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the tool, in kB (VmRSS).
    pub fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("tool still running");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Send a signal, wait for exit (bounded), collect everything it printed.
    pub fn stop_with(mut self, signal: i32) -> Finished {
        // Let the last completions reach the buffer and the poll loop.
        std::thread::sleep(Duration::from_millis(500));
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "{} did not exit within 60 s of signal {signal}", self.name);
            std::thread::sleep(Duration::from_millis(100));
        };
        std::thread::sleep(Duration::from_millis(200));
        let lines: Vec<String> = self.stdout.try_iter().collect();
        let stderr = self.stderr.lock().unwrap().clone();
        Finished { name: self.name.clone(), status, lines, stderr, elapsed: self.started.elapsed() }
    }
    pub fn stop(self) -> Finished {
        self.stop_with(libc::SIGINT)
    }
}

/// One HTTP/1.0 GET on loopback: (status code, body). Fails the test on a
/// connection error or a reply that is not HTTP.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap_or_else(|e| panic!("read {addr}{path}: {e}"));
    let code = reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP from {addr}{path}: {reply:?}"));
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

/// Percent-encode a PromQL query for a URL.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// How often the test Prometheus scrapes, and its scrape timeout (the
/// same): 3 s. With 1 s, a scrape of an exporter on a guest saturated by
/// fio at iodepth 32 on three disks plus `isclatency -u 0` timed out
/// under emulation (1.23 s, CI 2026-12-01); Prometheus' own default
/// timeout is 10 s.
pub const SCRAPE_INTERVAL_S: u64 = 3;

/// A real Prometheus server (Debian's prometheus package) scraping
/// `target` every SCRAPE_INTERVAL_S seconds, stopped when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(target: &str, port: u16) -> Prometheus {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, format!("global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: {SCRAPE_INTERVAL_S}s\nscrape_configs:\n  - job_name: iscstat\n    static_configs:\n      - targets: ['{target}']\n")).unwrap();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus) must be installed: tests/lab/setup");
        Prometheus { child, addr, _dir: dir }
    }

    /// Wait (up to 120 s under emulation) until it answers queries.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(&self.addr).is_ok() && http_get(&self.addr, "/-/ready").0 == 200 {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("prometheus not ready on {} after 120 s", self.addr);
    }

    /// An instant query: each result's labels and value.
    pub fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let (code, body) = http_get(&self.addr, &format!("/api/v1/query?query={}", urlencode(q)));
        assert_eq!(code, 200, "query {q}: {body}");
        let j: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("query {q}: not JSON ({e}): {body}"));
        assert_eq!(j.str("status"), "success", "query {q}: {body}");
        j.path("data.result")
            .as_array()
            .unwrap_or_else(|| panic!("query {q}: no result list: {body}"))
            .iter()
            .map(|r| {
                (
                    r["metric"].clone(),
                    r["value"][1]
                        .as_str()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("query {q}: value {r}")),
                )
            })
            .collect()
    }

    /// What Prometheus says of its targets' last scrapes: health, error,
    /// duration (to tell a timeout from a bad reply when one failed).
    pub fn targets(&self) -> String {
        let (_, body) = http_get(&self.addr, "/api/v1/targets");
        let j: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        j.path("data.activeTargets")
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        format!(
                            "{} health {} lastError {:?} lastScrapeDuration {}",
                            t["scrapeUrl"],
                            t["health"],
                            t["lastError"].as_str().unwrap_or(""),
                            t["lastScrapeDuration"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or(body)
    }

    /// The one value of a query that must give exactly one series.
    pub fn one(&self, q: &str) -> f64 {
        let r = self.query(q);
        assert_eq!(r.len(), 1, "query {q} gave {} series: {r:?}", r.len());
        r[0].1
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// After a login: open-iscsi 2.1.10+ (trixie's iscsid) rescans every LUN
/// of a session that logged in again, freezing each disk's queue for a
/// while: fio latencies taken then are not the path's own. Waits that out.
pub fn settle_after_login() {
    std::thread::sleep(Duration::from_secs(4));
}

/// A LUN whose backing store waits: a RAM disk (brd) under dm-delay,
/// exported by LIO (iblock) as the only LUN of a target of its own, and
/// logged in. The knob inside the target for tests that must tell the
/// target's time from the network's. Removed again when dropped.
pub struct SlowLun {
    pub target: String,
    pub sid: u32,
    pub disk: String,
    /// The dm-delay device in the target (`dm-N`).
    pub dm: String,
    tpg: String,
}

/// I/Os completed and the time they took on one block device, per
/// direction, from its `/sys/block/<dev>/stat` (the kernel's own sums).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskTime {
    pub reads: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_ms: u64,
}
impl DiskTime {
    pub fn read(dev: &str) -> DiskTime {
        let text = sh(&format!("cat /sys/block/{dev}/stat"));
        let f: Vec<u64> = text.split_whitespace().map(|w| w.parse().unwrap()).collect();
        DiskTime { reads: f[0], read_ms: f[3], writes: f[4], write_ms: f[7] }
    }
    /// Mean time per I/O in ns since `before`: (reads, writes).
    pub fn mean_since(&self, before: &DiskTime) -> (f64, f64) {
        let mean = |ms: u64, n: u64| ms as f64 * 1e6 / n.max(1) as f64;
        (
            mean(self.read_ms - before.read_ms, self.reads - before.reads),
            mean(self.write_ms - before.write_ms, self.writes - before.writes),
        )
    }
}

const CFG: &str = "/sys/kernel/config/target";

impl SlowLun {
    /// `delay_ms`: what dm-delay is told; what it really adds is measured
    /// by the caller (it waits in timer ticks).
    pub fn create(lab: &Lab, delay_ms: u32) -> SlowLun {
        let prefix = lab.targets[0].rsplit_once(':').expect("lab target IQN").0.to_string();
        let target = format!("{prefix}:slow");
        sh("modprobe brd rd_nr=1 rd_size=65536 && modprobe dm_delay && modprobe target_core_iblock");
        // udevd is stopped (quiet_disks): dmsetup must not wait for it, and
        // the device node to use is devtmpfs' /dev/dm-N.
        sh(&format!("dmsetup create --noudevsync lab_slow --table \"0 $(blockdev --getsz /dev/ram0) delay /dev/ram0 0 {delay_ms}\""));
        let dm = sh("dmsetup info -c --noheadings -o blkdevname lab_slow").trim().to_string();
        let bs = format!("{CFG}/core/iblock_90/lab_slow");
        let tpg = format!("{CFG}/iscsi/{target}/tpgt_1");
        sh(&format!(
            "mkdir -p {bs} && echo udev_path=/dev/{dm} > {bs}/control && echo 1 > {bs}/enable && \
             mkdir -p {tpg}/lun/lun_0 && ln -s {bs} {tpg}/lun/lun_0/lab_slow && mkdir {tpg}/np/127.0.0.1:3260 && \
             echo 1 > {tpg}/attrib/generate_node_acls && echo 0 > {tpg}/attrib/authentication && \
             echo 0 > {tpg}/attrib/demo_mode_write_protect && echo 1 > {tpg}/attrib/cache_dynamic_acls && echo 1 > {tpg}/enable"
        ));
        sh("iscsiadm -m discovery -t st -p 127.0.0.1 >/dev/null");
        sh(&format!("iscsiadm -m node -T {target} -p 127.0.0.1 -l >/dev/null"));
        let (s, disk) = session_disk_after_login(&target);
        settle_after_login();
        SlowLun { target, sid: s.sid, disk, dm, tpg }
    }
}

impl SlowLun {
    /// Log out and in again: a new connection, with a floor RTT of its own.
    pub fn relogin(&mut self) {
        sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -u >/dev/null", self.target));
        sh(&format!("iscsiadm -m node -T {} -p 127.0.0.1 -l >/dev/null", self.target));
        let (s, disk) = session_disk_after_login(&self.target);
        (self.sid, self.disk) = (s.sid, disk);
        settle_after_login();
    }
}

impl Drop for SlowLun {
    fn drop(&mut self) {
        let t = &self.target;
        let tpg = &self.tpg;
        let _ = Command::new("sh").arg("-c").arg(format!(
            "iscsiadm -m node -T {t} -p 127.0.0.1 -u; iscsiadm -m node -T {t} -o delete; \
             echo 0 > {tpg}/enable; rm -f {tpg}/lun/lun_0/lab_slow; rmdir {tpg}/lun/lun_0 {tpg}/np/127.0.0.1:3260 {tpg} {CFG}/iscsi/{t}; \
             rmdir {CFG}/core/iblock_90/lab_slow {CFG}/core/iblock_90; dmsetup remove --noudevsync lab_slow; rmmod brd"
        )).output();
    }
}

/// `[  123.456789] text` lines of the kernel log containing `what`: (ns
/// since boot, the line).
pub fn kernel_log_lines(what: &str) -> Vec<(u64, String)> {
    sh("dmesg")
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            let ts = l.strip_prefix('[')?.split(']').next()?.trim();
            let (s, frac) = ts.split_once('.')?;
            Some((s.parse::<u64>().ok()? * 1_000_000_000 + frac.parse::<u64>().ok()? * 1000, l.to_string()))
        })
        .collect()
}

/// The times (ns since boot) of the kernel log's lines containing `what`.
pub fn kernel_log(what: &str) -> Vec<u64> {
    kernel_log_lines(what).into_iter().map(|(t, _)| t).collect()
}

/// A session's state as sysfs gives it ("" when the session is gone).
pub fn session_state(sid: u32) -> String {
    std::fs::read_to_string(format!("/sys/class/iscsi_session/session{sid}/state"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// (CLOCK_MONOTONIC time, state) at each change of a session's state.
pub type StateLog = std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>;

/// Poll a session's sysfs state every 50 ms until `stop`.
pub fn poll_state(
    sid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (std::thread::JoinHandle<()>, StateLog) {
    use std::sync::{atomic::Ordering, Arc, Mutex};
    let log = Arc::new(Mutex::new(Vec::<(u64, String)>::new()));
    let l = log.clone();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            let s = session_state(sid);
            let mut v = l.lock().unwrap();
            if v.last().map(|(_, x)| x != &s).unwrap_or(true) {
                v.push((storprototrace::cli::output::monotonic_ns(), s));
            }
            drop(v);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (h, log)
}

/// The `CAPS |` table row of a tool started with -v (tests/all collects the
/// rows into target/lab/capabilities.md): the probe points it named, the
/// kernel facts it detected, its notes; and the probe points alone.
pub fn caps_row(tool: &str, stderr: &str) -> (Vec<String>, String) {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_string();
    let mut probes: Vec<String> = Vec::new();
    for l in stderr.lines().filter_map(|l| l.strip_prefix("probe ")) {
        let f = l.split(" -> ").next().unwrap_or(l).to_string();
        if !probes.contains(&f) {
            probes.push(f);
        }
    }
    let detail: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.split_once(": ").filter(|(k, _)| k.starts_with("kernel ")).map(|(_, v)| v))
        .collect();
    let notes: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix(&format!("{tool}: note: "))).collect();
    let row = format!(
        "CAPS | {kernel} | {tool} | {} | {} | {} |",
        probes.join(", "),
        detail.join("; "),
        if notes.is_empty() { "-".to_string() } else { notes.join("; ") }
    );
    (probes, row)
}
