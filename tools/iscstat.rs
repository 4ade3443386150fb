//! iscstat: per-session (and per-LUN, per-direction) iSCSI statistics every
//! interval: IOPS, throughput, average and maximum of each stage, and
//! optionally percentiles and histograms. Aggregated in the kernel.

use clap::Parser;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use storprototrace::cli::{self, Common, Filters};
use storprototrace::kernel::Kernel;
use storprototrace::maps::{self, Counter};
use storprototrace::output::{self, Clock, Out, Unit};
use storprototrace::runner::Stop;
use storprototrace::stages::{self, StagePlan};
use storprototrace::stats::{self, Row, RowKey, STAGES};
use storprototrace::templates::{self, Template};
use storprototrace::topology::Topology;
use storprototrace::{error, json, prom, Error, Result};

const EXAMPLES: &str = "examples:
    iscstat              # per session:connection, every second, times in us
    iscstat 5 12         # every 5 s, 12 times
    iscstat -m -L -D     # per LUN, reads and writes apart, times in ms
    iscstat -P           # with p50/p95/p99/max of each stage
    iscstat -H 10 1      # log2 histograms of each stage over 10 s
    iscstat --sid 1 --json";

/// Stages as in isclatency: WAIT (queued in libiscsi), SEND (PDU handed to
/// TCP), RESP (waiting for the target; for writes includes R2T round trips),
/// TOTAL = WAIT + SEND + RESP.
#[derive(Parser, Debug)]
#[command(name = "iscstat", version, about = "Per-session/LUN iSCSI latency statistics by stage (WAIT/SEND/RESP/TOTAL)", after_help = EXAMPLES)]
struct Args {
    /// Seconds between reports
    #[arg(default_value_t = 1)]
    interval: u64,
    /// Number of reports (default: until Ctrl-C)
    count: Option<u64>,
    /// Times in milliseconds (default microseconds)
    #[arg(short = 'm', long = "milliseconds")]
    ms: bool,
    /// One row per LUN
    #[arg(short = 'L', long = "luns")]
    per_lun: bool,
    /// Reads and writes apart
    #[arg(short = 'D', long = "directions")]
    per_dir: bool,
    /// log2 histogram of each stage per row
    #[arg(short = 'H', long = "histograms")]
    histograms: bool,
    /// p50, p95, p99 and max of each stage per row
    #[arg(short = 'P', long = "percentiles")]
    percentiles: bool,
    /// Add initiator and portal to each row
    #[arg(short = 'e', long)]
    extended: bool,
    /// After each interval, atomically replace PATH with node_exporter
    /// textfile-collector metrics (cumulative counters and histograms)
    #[arg(long, value_name = "PATH")]
    prom_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    filters: Filters,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("iscstat", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    if args.interval == 0 {
        return Err(Error::usage("interval must be at least 1 second"));
    }
    if args.count == Some(0) {
        return Err(Error::usage("count must be at least 1"));
    }
    args.filters.validate()?;
    let duration = args.common.duration()?;
    if let Some(p) = &args.prom_file {
        prom::check_writable(p)?;
    }
    let kernel = Kernel::detect();
    let topo = Topology::read(std::path::Path::new("/sys"))?;
    let unit = if args.ms { Unit::Ms } else { Unit::Us };

    if args.common.ebpf {
        let (plan, filter) = stages::plan_for_ebpf(&kernel, &topo, &args.filters)?;
        println!("{}", render(&args, &plan, &filter, kernel.ringbuf || kernel.function_count() == 0)?);
        return Ok(());
    }
    let (mut plan, filter) = stages::prepare(&kernel, &topo, &args.filters)?;
    plan.announce("iscstat", &kernel, args.common.verbose);
    let (bpf, links) = stages::compile_and_attach("iscstat", &kernel, &mut plan, &filter, |p| render(&args, p, &filter, kernel.ringbuf))?;
    let stop = Stop::install(duration)?;
    let clock = Clock::start();
    let mut out = Out::new();
    output::status(args.common.json, &mut out, "Tracing iSCSI commands... Hit Ctrl-C to end.");
    let ncpus = possible_cpus();
    let mut epoch: u32 = 0;
    let mut reports = 0u64;
    let mut topo = topo;
    let mut last = Instant::now();
    let mut last_lost = 0u64;
    let mut exposition = prom::Exposition::default();
    loop {
        let next = last + Duration::from_secs(args.interval);
        while Instant::now() < next && !stop.stopped() {
            std::thread::sleep(Duration::from_millis(stop.poll_ms(100) as u64));
        }
        let elapsed = last.elapsed().as_secs_f64();
        last = Instant::now();
        let rows = collect(&bpf, &mut epoch, ncpus)?;
        if let Ok(t) = Topology::read(std::path::Path::new("/sys")) {
            topo = t;
        }
        if let Some(path) = &args.prom_file {
            accumulate(&mut exposition, &rows, &topo);
            exposition.write(path)?;
        }
        let rows = shown_rows(&args, rows);
        let mut counters = bpf.table("counters")?;
        // Commands not counted: map full, an end the kernel did not let us
        // see, or a program hit the kernel skipped.
        let lost = maps::counter(&mut counters, Counter::Lost) + maps::counter(&mut counters, Counter::InflightFull) + maps::counter(&mut counters, Counter::EndNotSeen) + links.missed();
        let now = output::monotonic_ns();
        let stamp = if args.common.timestamp || !args.common.json { clock.wall(now) } else { format!("{:.3}", clock.since_start(now)) };
        if !report(&args, unit, &topo, &plan, &rows, elapsed, &stamp, lost - last_lost, &mut out) {
            break;
        }
        last_lost = lost;
        reports += 1;
        if stop.stopped() || args.count.map(|c| reports >= c).unwrap_or(false) {
            break;
        }
    }
    Ok(())
}

fn render(args: &Args, plan: &StagePlan, filter: &stages::KernelFilter, ringbuf: bool) -> Result<String> {
    // Prometheus series are always per LUN and direction; the rows shown
    // are merged back to what -L/-D ask for.
    let prom = args.prom_file.is_some();
    let mut values = vec![
        ("USE_RINGBUF", ringbuf.into()),
        ("PER_LUN", (args.per_lun || prom).into()),
        ("PER_DIR", (args.per_dir || prom).into()),
        ("PROM", prom.into()),
    ];
    values.extend(plan.values());
    values.extend(filter.values());
    Template::new(&[templates::COMMON, templates::ISCSI_STAGES, templates::ISCSTAT]).render(&values)
}

/// Rows as -L / -D ask for them (the kernel splits more with --prom-file).
fn shown_rows(args: &Args, rows: BTreeMap<RowKey, Row>) -> BTreeMap<RowKey, Row> {
    let mut out: BTreeMap<RowKey, Row> = BTreeMap::new();
    for (mut k, r) in rows {
        if !args.per_lun {
            k.lun = 0;
        }
        if !args.per_dir {
            k.dir = 0;
        }
        out.entry(k).or_default().merge(&r);
    }
    out
}

fn accumulate(e: &mut prom::Exposition, rows: &BTreeMap<RowKey, Row>, topo: &Topology) {
    for (k, r) in rows {
        let s = topo.session(k.sid);
        let labels = prom::Labels {
            sid: k.sid,
            cid: k.cid,
            lun: k.lun,
            direction: match k.dir {
                1 => "read",
                2 => "write",
                _ => "other",
            },
            target: s.map(|s| s.target.clone()).unwrap_or_default(),
            device: s.and_then(|s| s.luns.iter().find(|l| l.lun == k.lun)).and_then(|l| l.disk.clone()).unwrap_or_default(),
        };
        let series = e.series.entry(labels).or_default();
        series.count += r.count;
        series.bytes += r.bytes;
        for i in 0..4 {
            series.sum_ns[i] += r.sum[i];
            for j in 0..17 {
                series.buckets[i][j] += r.le[i][j];
            }
        }
    }
}

fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    text.trim()
        .split(',')
        .filter_map(|r| {
            let mut it = r.split('-');
            let a: usize = it.next()?.parse().ok()?;
            let b: usize = it.next().map(|b| b.parse().ok()).unwrap_or(Some(a))?;
            Some(b - a + 1)
        })
        .sum::<usize>()
        .max(1)
}

/// Flip the epoch, let programs that read the old one finish, then read and
/// delete every row and histogram bucket of the old epoch.
fn collect(bpf: &bcc::BPF, epoch: &mut u32, ncpus: usize) -> Result<BTreeMap<RowKey, Row>> {
    let old = *epoch;
    *epoch ^= 1;
    let mut ep = bpf.table("epoch")?;
    ep.set(&mut 0u32.to_ne_bytes().to_vec(), &mut epoch.to_ne_bytes().to_vec())
        .map_err(|e| Error::env(format!("cannot switch epoch: {e}")))?;
    std::thread::sleep(Duration::from_millis(20));
    let mut rows: BTreeMap<RowKey, Row> = BTreeMap::new();
    let mut rt = bpf.table("rows")?;
    for (k, v) in maps::percpu_entries(&mut rt, ncpus, 1 << 14) {
        if let Some((e, key)) = stats::parse_row_key(&k) {
            if e == old {
                stats::add_percpu_row(rows.entry(key).or_default(), &v, ncpus);
                maps::delete(&mut rt, &k);
            }
        }
    }
    let mut pt = bpf.table("prom")?;
    for (k, v) in maps::entries(&mut pt, 1 << 15) {
        if let Some((e, key, stage, bucket)) = stats::parse_hist_key(&k) {
            if e == old && stage < 4 && bucket < 17 {
                rows.entry(key).or_default().le[stage as usize][bucket as usize] += maps::first_u64(&v);
                maps::delete(&mut pt, &k);
            }
        }
    }
    let mut ht = bpf.table("hists")?;
    for (k, v) in maps::entries(&mut ht, 1 << 17) {
        if let Some((e, key, stage, bucket)) = stats::parse_hist_key(&k) {
            if e == old && stage < 4 {
                let n = maps::first_u64(&v);
                *rows.entry(key).or_default().hist[stage as usize].entry(bucket).or_default() += n;
                maps::delete(&mut ht, &k);
            }
        }
    }
    Ok(rows)
}

#[allow(clippy::too_many_arguments)]
fn report(args: &Args, unit: Unit, topo: &Topology, plan: &StagePlan, rows: &BTreeMap<RowKey, Row>, secs: f64, stamp: &str, lost: u64, out: &mut Out) -> bool {
    let label = |k: &RowKey| -> (String, String) {
        let s = topo.session(k.sid);
        let disks = match s {
            Some(s) if args.per_lun => s.luns.iter().filter(|l| l.lun == k.lun).filter_map(|l| l.disk.clone()).collect::<Vec<_>>().join(","),
            Some(s) => s.luns.iter().filter_map(|l| l.disk.clone()).collect::<Vec<_>>().join(","),
            None => "?".into(),
        };
        (if disks.is_empty() { "-".into() } else { disks }, s.map(|s| s.target.clone()).unwrap_or_else(|| "?".into()))
    };
    let stage_ok = |i: usize| plan.have_sent || (i != 1 && i != 2);
    if args.common.json {
        for (k, r) in rows {
            let (disks, target) = label(k);
            let mut o = json::Object::new().str("time", stamp).num("interval_s", format!("{secs:.3}")).num("sid", k.sid).num("cid", k.cid);
            if args.per_lun {
                o = o.num("lun", k.lun);
            }
            if args.per_dir {
                o = o.str("dir", stats::dir_name(k.dir, true));
            }
            o = o.str("disks", &disks).str("target", &target).num("count", r.count).num("bytes", r.bytes);
            for (i, st) in STAGES.iter().enumerate() {
                let st = st.to_lowercase();
                o = o.opt_num(&format!("{st}_avg_ns"), stage_ok(i).then(|| r.avg(i))).opt_num(&format!("{st}_max_ns"), stage_ok(i).then_some(r.max[i]));
                if args.percentiles {
                    for p in [50.0, 95.0, 99.0] {
                        o = o.opt_num(&format!("{st}_p{}_ns", p as u32), stage_ok(i).then(|| r.percentile(i, p)));
                    }
                }
            }
            if !out.line(&o.num("lost", lost).finish()) {
                return false;
            }
        }
        return true;
    }
    let u = unit.label();
    let mut lines = vec![format!("{stamp}  interval {secs:.2}s{}", if lost > 0 { format!("  ({lost} events lost)") } else { String::new() })];
    let mut h = format!("{:<7} {:<11}", "SID:CID", "DISKS");
    if args.per_lun {
        h.push_str(&format!(" {:>3}", "LUN"));
    }
    if args.per_dir {
        h.push_str(" D");
    }
    h.push_str(&format!(" {:>8} {:>9}", "IOPS", "KB/s"));
    for st in STAGES {
        h.push_str(&format!(" {:>9} {:>9}", format!("{st}avg"), format!("max({u})")));
    }
    h.push_str(" TARGET");
    lines.push(h);
    for (k, r) in rows {
        let (disks, target) = label(k);
        let mut l = format!("{:<7} {:<11}", format!("{}:{}", k.sid, k.cid), disks);
        if args.per_lun {
            l.push_str(&format!(" {:>3}", k.lun));
        }
        if args.per_dir {
            l.push_str(&format!(" {}", stats::dir_name(k.dir, true)));
        }
        l.push_str(&format!(" {:>8.1} {:>9.1}", r.count as f64 / secs, r.bytes as f64 / 1024.0 / secs));
        for i in 0..4 {
            if stage_ok(i) {
                l.push_str(&format!(" {:>9} {:>9}", unit.fmt(r.avg(i)), unit.fmt(r.max[i])));
            } else {
                l.push_str(&format!(" {:>9} {:>9}", "-", "-"));
            }
        }
        l.push_str(&format!(" {target}"));
        if args.extended {
            let s = topo.session(k.sid);
            l.push_str(&format!(" {} {}", s.map(|s| s.initiator.as_str()).unwrap_or("?"), s.map(|s| s.portal()).unwrap_or_default()));
        }
        lines.push(l);
        if args.percentiles {
            let mut p = String::from("        percentiles");
            for (i, st) in STAGES.iter().enumerate().filter(|(i, _)| stage_ok(*i)) {
                p.push_str(&format!("  {st} p50/p95/p99/max {}/{}/{}/{}", unit.fmt(r.percentile(i, 50.0)), unit.fmt(r.percentile(i, 95.0)), unit.fmt(r.percentile(i, 99.0)), unit.fmt(r.max[i])));
            }
            lines.push(p);
        }
        if args.histograms {
            for (i, st) in STAGES.iter().enumerate().filter(|(i, _)| stage_ok(*i)) {
                lines.push(format!("        {st} (us){:>22} : count", ""));
                let h = r.log2_us(i);
                let peak = h.iter().map(|x| x.2).max().unwrap_or(1).max(1);
                for (lo, hi, n) in h {
                    lines.push(format!("        {lo:>10} -> {hi:<10} : {n:<8} |{:<40}|", "*".repeat((n * 40 / peak) as usize)));
                }
            }
        }
    }
    if rows.is_empty() {
        lines.push("(no iSCSI commands completed)".into());
    }
    lines.push(String::new());
    for l in lines {
        if !out.line(&l) {
            return false;
        }
    }
    out.flush();
    true
}
