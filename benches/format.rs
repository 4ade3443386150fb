//! What isclatency's own process spends per event, on the build host (no
//! kernel, no BPF): a record parsed and its line formatted, text and JSON.
//! `cargo bench --bench format`; the lab's cost bench (tests/lab/cost)
//! measures the whole tracer under load. Prints ns per event, median of
//! 7 runs of 200,000 events.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;
use storprototrace::bpf::events::Command;
use storprototrace::cli::output::{Clock, Unit};
use storprototrace::iscsi::topology::Topology;
use storprototrace::kernel::headers::ScsiLayout;
use storprototrace::stages::latency_view::{Columns, LatencyView};
use storprototrace::stages::StagePlan;

/// A record as isclatency.c lays out `struct event`, the fields in order.
fn record(i: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(Command::SIZE);
    let ns = 1_000_000 + (i * 7919) % 9_000_000;
    for v in [i * 1_000_000, ns / 10, ns / 10, ns * 8 / 10, ns, ns / 4, ns * 8 / 10 - ns / 4, i % 2] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [(i % 2) as u32, 0, 0, 1 + (i % 2) as u32, 0, 4242, 4096, 0, 0, 0] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    b.extend_from_slice(&[1 + (i % 2) as u8, 0x28, 2]);
    let mut comm = [0u8; 16];
    comm[..12].copy_from_slice(b"kworker/0:1H");
    b.extend_from_slice(&comm);
    b.resize(Command::SIZE, 0);
    b
}

fn median_ns(mut f: impl FnMut(&[u8]) -> usize, recs: &[Vec<u8>]) -> f64 {
    let mut runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            let mut n = 0;
            for r in recs {
                n += f(r);
            }
            black_box(n);
            t.elapsed().as_nanos() as f64 / recs.len() as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[3]
}

fn main() {
    let topo = Topology::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs-2x2"))
        .expect("tests/fixtures/sysfs-2x2");
    let plan = StagePlan::assume_all(ScsiLayout::modern());
    let mut view = LatencyView::new(Unit::Us, false, Columns::Default, &plan, Clock::start(), topo, None);
    let recs: Vec<Vec<u8>> = (0..200_000).map(record).collect();
    let mut line = String::new();
    let parse = median_ns(|r| Command::parse(r).map_or(0, |c| c.bytes as usize), &recs);
    let text = median_ns(
        |r| {
            let c = Command::parse(r).expect("a whole record");
            view.write_row(&mut line, &c);
            line.len()
        },
        &recs,
    );
    let json = median_ns(|r| view.json(&Command::parse(r).expect("a whole record")).len(), &recs);
    println!(
        "ns per event (median of 7 x 200,000): parse {parse:.0}, parse + text line {text:.0}, parse + JSON {json:.0}"
    );
}
