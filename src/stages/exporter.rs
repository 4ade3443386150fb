//! `--listen`: a Prometheus exporter over HTTP (tiny_http). Worker threads
//! take requests; a scrape of `/metrics` is handed to the tool's main
//! thread, which reads the kernel's counters at that moment (Prometheus'
//! exporter guidelines: read at scrape time) and sends back the text.
//! Tracing never waits for a client: a slow or silent client holds at most
//! one connection thread of tiny_http, never the main loop.

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// Threads answering requests: a slow reader holds one, the others go on.
const WORKERS: usize = 4;
/// How long a worker waits for the main thread's answer to a scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `[ADDR:]PORT`: a port alone listens on 127.0.0.1; `0.0.0.0:PORT` or
/// `[::]:PORT` on every address.
pub fn parse_listen(s: &str) -> Result<SocketAddr> {
    let bad = |why: &str| {
        Error::usage(format!("--listen '{s}': {why} (want PORT or ADDR:PORT, e.g. 9464, 0.0.0.0:9464, [::1]:9464)"))
    };
    let addr = if let Ok(port) = s.parse::<u16>() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        s.parse::<SocketAddr>().map_err(|_| bad("not an address and port"))?
    };
    if addr.port() == 0 {
        return Err(bad("port 0"));
    }
    Ok(addr)
}

/// One scrape waiting for the main thread: send the exposition text back.
pub struct Scrape {
    pub reply: SyncSender<String>,
}

pub struct Exporter {
    pub addr: SocketAddr,
    scrapes: Receiver<Scrape>,
    _server: Arc<tiny_http::Server>,
}

impl Exporter {
    /// Listen now (so a taken or privileged port is said before anything
    /// else starts) and start the workers.
    pub fn bind(addr: SocketAddr) -> Result<Exporter> {
        let server = tiny_http::Server::http(addr).map_err(|e| {
            let hint = if addr.port() < 1024 { " (ports below 1024 need root or CAP_NET_BIND_SERVICE)" } else { "" };
            Error::io(format!("--listen {addr}: cannot listen: {e}{hint}"))
        })?;
        let server = Arc::new(server);
        // Scrapes wait here for the main thread; one per worker at most.
        let (tx, scrapes) = sync_channel::<Scrape>(WORKERS);
        for _ in 0..WORKERS {
            let (server, tx) = (server.clone(), tx.clone());
            std::thread::spawn(move || {
                while let Ok(req) = server.recv() {
                    respond(req, &tx);
                }
            });
        }
        Ok(Exporter { addr, scrapes, _server: server })
    }

    /// The next scrape, if one arrives within `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<Scrape> {
        self.scrapes.recv_timeout(timeout).ok()
    }
}

fn respond(req: tiny_http::Request, main: &SyncSender<Scrape>) {
    use tiny_http::{Header, Method, Response};
    let text = |body: String, code: u16| {
        let r = Response::from_string(body).with_status_code(code);
        // The header texts are constants tiny_http accepts: never a panic.
        match Header::from_bytes("Content-Type", if code == 200 { CONTENT_TYPE } else { "text/plain; charset=utf-8" }) {
            Ok(h) => r.with_header(h),
            Err(()) => r,
        }
    };
    let path = req.url().split('?').next().unwrap_or("").to_string();
    let get = matches!(req.method(), Method::Get | Method::Head);
    let resp = match (get, path.as_str()) {
        (false, _) => text("only GET and HEAD are served\n".into(), 405),
        (true, "/metrics") => {
            let (reply, answer) = sync_channel(1);
            let body = main.try_send(Scrape { reply }).ok().and_then(|_| answer.recv_timeout(SCRAPE_TIMEOUT).ok());
            match body {
                Some(b) => text(b, 200),
                None => text("the tracer did not answer in time\n".into(), 503),
            }
        }
        (true, "/") => text("iscstat: Prometheus metrics at /metrics\n".into(), 200),
        (true, _) => text("not found: metrics are at /metrics\n".into(), 404),
    };
    let _ = req.respond(resp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("9464").unwrap(), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(parse_listen("0.0.0.0:9464").unwrap(), "0.0.0.0:9464".parse().unwrap());
        assert_eq!(parse_listen("[::1]:9464").unwrap(), "[::1]:9464".parse().unwrap());
        for bad in ["", "0", "70000", "host:9464", "1.2.3.4", "-1", "9464; rm"] {
            let e = parse_listen(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.to_string().starts_with(&format!("--listen '{bad}': ")), "{e}");
        }
    }

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        s
    }

    /// Scrapes are answered by whoever serves `next` (the tool's main
    /// loop); bad requests are answered by the workers alone, and a silent
    /// client holds nobody up.
    #[test]
    fn serves_metrics_and_survives_bad_clients() {
        // parse_listen refuses port 0; bind takes it: a free port for the test.
        let e = Exporter::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = e._server.server_addr().to_ip().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let main = std::thread::spawn(move || {
            let mut n = 0;
            while !s2.load(std::sync::atomic::Ordering::SeqCst) {
                if let Some(s) = e.next(Duration::from_millis(20)) {
                    n += 1;
                    let _ = s.reply.send(format!("x_total {n}\n"));
                }
            }
            n
        });
        let _silent = std::net::TcpStream::connect(addr).unwrap(); // connects, sends nothing
        let mut garbage = std::net::TcpStream::connect(addr).unwrap();
        garbage.write_all(b"\x00\x01 garbage\r\n\r\n").unwrap();
        let r = get(addr, "POST /metrics HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 405") || r.starts_with("HTTP/1.1 405"), "{r}");
        assert!(get(addr, "GET /nope HTTP/1.0\r\n\r\n").contains(" 404 "));
        assert!(get(addr, "GET / HTTP/1.0\r\n\r\n").contains("/metrics"));
        for i in 1..=50 {
            let r = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
            assert!(r.contains(" 200 ") && r.contains(&format!("x_total {i}\n")) && r.contains("version=0.0.4"), "{r}");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(main.join().unwrap(), 50);
    }
}
