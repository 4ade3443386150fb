//! Running a tool until it says "Tracing", then stopping it with a signal
//! and collecting everything it printed.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a tool start may take before the test calls it hung: a compile
/// takes 13-25 s under emulation with BTF, 106-141 s on 5.10 (the headers),
/// and more on a slow day or beside another compile. The wait is for a
/// hang, not for speed: CI's budget bounds the run.
const START_WAIT: Duration = Duration::from_secs(900);

/// A tool's process, killed when dropped while it still runs: a test that
/// fails leaves no tool behind to load the next one.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A copy of what a tool printed on stderr so far (the lock is never held
/// across a panic, so a failed wait does not poison it).
fn text(stderr: &std::sync::Mutex<String>) -> String {
    stderr.lock().map(|s| s.clone()).unwrap_or_else(|e| e.into_inner().clone())
}

/// A tool started with --json, running until stopped.
pub struct Traced {
    pub name: String,
    child: Reaped,
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
                .rsplit([' ', ',', '('])
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
        "slow_per_target" => example(name),
        other => panic!("unknown tool {other}"),
    }
}

/// An example program's binary: cargo builds examples beside the test
/// binaries' deps/ directory (tests/all builds them).
fn example(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps");
    let path = dir.join("examples").join(name);
    assert!(path.exists(), "{} not built: cargo build --release --examples", path.display());
    path.to_string_lossy().into_owned()
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
    let limit = START_WAIT * tools.len().div_ceil(2).max(1) as u32;
    starting.into_iter().map(|s| s.ready_within(limit)).collect()
}

/// A tool started but maybe still compiling: start several, then wait for
/// each, so their compilations overlap.
pub struct Starting {
    tool: String,
    args: Vec<String>,
    child: Reaped,
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
                    let mut s = et.lock().unwrap_or_else(|e| e.into_inner());
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
        child: Reaped(child),
        stdout: rx,
        stderr: err_text,
        ready: ready_rx,
    }
}

impl Starting {
    pub fn ready(self) -> Traced {
        self.ready_within(START_WAIT)
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
            if let Ok(Some(st)) = self.child.0.try_wait() {
                panic!("{tool} {args:?} exited with {st} before tracing: {}", text(&self.stderr));
            }
            if Instant::now() >= deadline {
                panic!("{tool} {args:?} did not start tracing in {} s: {}", limit.as_secs(), text(&self.stderr));
            }
        }
        Traced { name: self.tool, child: self.child, stdout: self.stdout, stderr: self.stderr, started: Instant::now() }
    }
}

impl Traced {
    pub fn pid(&self) -> u32 {
        self.child.0.id()
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
        unsafe { libc::kill(self.child.0.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.0.try_wait().expect("wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "{} did not exit within 60 s of signal {signal}", self.name);
            std::thread::sleep(Duration::from_millis(100));
        };
        std::thread::sleep(Duration::from_millis(200));
        let lines: Vec<String> = self.stdout.try_iter().collect();
        let stderr = text(&self.stderr);
        Finished { name: self.name.clone(), status, lines, stderr, elapsed: self.started.elapsed() }
    }
    pub fn stop(self) -> Finished {
        self.stop_with(libc::SIGINT)
    }
}
