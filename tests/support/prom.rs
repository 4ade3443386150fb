//! Prometheus: a real server scraping the exporter, and the HTTP GET the
//! tests query both with.

use super::json::JsonExt;
use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
