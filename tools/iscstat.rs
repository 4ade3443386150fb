//! iscstat: per-session (and per-LUN, per-direction) iSCSI statistics every
//! interval: IOPS, throughput, average and maximum of each stage, and
//! optionally percentiles and histograms. Aggregated in the kernel.

use clap::Parser;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use storprototrace::bpf::maps::{self, Counter};
use storprototrace::bpf::templates;
use storprototrace::cli::output::{self, Clock, Unit};
use storprototrace::cli::textfile;
use storprototrace::cli::{self, Common};
use storprototrace::iscsi::topology::Topology;
use storprototrace::kernel::cgroup::{self, CgroupPaths};
use storprototrace::stages::exporter::{self, Exporter};
use storprototrace::stages::filters::Filters;
use storprototrace::stages::prom;
use storprototrace::stages::stat_view::StatView;
use storprototrace::stages::stats::{self, Collector, Row, RowKey};
use storprototrace::stages::tur_probe::{TurFlag, TurProbe};
use storprototrace::start::{Startup, Tracer};
use storprototrace::{error, stages, Error, Result};

const EXAMPLES: &str = "examples:
    iscstat              # per session:connection, every second, times in us
    iscstat 5 12         # every 5 s, 12 times
    iscstat -m -L -D     # per LUN, reads and writes apart, times in ms
    iscstat -W           # every stage's average and maximum, and the target
    iscstat -P           # with p50/p95/p99/max of each stage
    iscstat -H 10 1      # log2 histograms of each stage over 10 s
    iscstat --by-cgroup  # rows per cgroup of the processes that issued the I/O
    iscstat --sid 1 --json
    iscstat 10 --listen 9464 --quiet      # Prometheus exporter on 127.0.0.1:9464/metrics
    iscstat --listen 0.0.0.0:9464 -q      # the same on every address (firewall it)";

const ABOUT: &str = "Per-session/LUN iSCSI latency statistics by stage, every interval.

Each row: IOPS, throughput, and the averages of the stages of the commands
that completed in the interval (WAIT + SEND + NET + TARGET = TOTAL), TOTAL's
maximum and the TCP segments retransmitted on the connection; -W adds every
stage's maximum, RESP and the target's name. The stages are isclatency's.
Every field, and when a field shows '-': man 8 iscstat.";

#[derive(Parser, Debug)]
#[command(name = "iscstat", version, mut_arg("timestamp", |a| a.help("With --json: wall-clock timestamps (HH:MM:SS.mmm) instead of seconds since start (reports on the terminal always show the wall clock)")), about = "Per-session/LUN iSCSI latency statistics by stage (WAIT/SEND/RESP/NET/TARGET/TOTAL)", long_about = ABOUT, after_help = EXAMPLES)]
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
    /// Every stage's average and maximum, RESP and the target's name
    #[arg(short = 'W', long)]
    wide: bool,
    /// Wide, and the initiator and portal of each row
    #[arg(short = 'e', long)]
    extended: bool,
    /// Rows per cgroup of the process that issued the I/O (a last column
    /// CGROUP; a `cgroup` label on the Prometheus series)
    #[arg(long)]
    by_cgroup: bool,
    /// With --by-cgroup: rows for the first N cgroups seen (default 32), the
    /// commands of any other counted under `other`
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    cgroup_rows: Option<u32>,
    /// After each interval, atomically replace PATH with node_exporter
    /// textfile-collector metrics (cumulative counters and histograms)
    #[arg(long, value_name = "PATH")]
    prom_file: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics, read from the
    /// kernel at each scrape (the --prom-file series, plus the tracer's own
    /// health and cost). A port alone listens on 127.0.0.1 only; give
    /// 0.0.0.0:PORT or [::]:PORT to be scraped from other hosts
    #[arg(long, value_name = "[ADDR:]PORT")]
    listen: Option<String>,
    /// No reports on the terminal (for a daemon with --listen or --prom-file)
    #[arg(short = 'q', long)]
    quiet: bool,
    #[command(flatten)]
    filters: Filters,
    #[command(flatten)]
    tur: TurFlag,
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
    if args.cgroup_rows.is_some() && !args.by_cgroup {
        return Err(Error::usage("--cgroup-rows needs --by-cgroup"));
    }
    let tur_every = args.tur.interval(&args.filters)?;
    let mut s = Startup::new("iscstat", &args.common)?;
    s.quiet = args.common.json || args.quiet;
    if let Some(p) = &args.prom_file {
        textfile::check_writable(p)?;
    }
    let listen = args.listen.as_deref().map(exporter::parse_listen).transpose()?;
    let exporter = match listen {
        Some(addr) if !args.common.ebpf => Some(Exporter::bind(addr)?),
        _ => None,
    };
    // Prometheus series are always per LUN and direction; the rows shown
    // are merged back to what -L/-D ask for.
    let prom = args.prom_file.is_some() || exporter.is_some();
    let fine = args.percentiles || args.histograms;
    let mut values = vec![
        ("PER_LUN", (args.per_lun || prom).into()),
        ("PER_DIR", (args.per_dir || prom).into()),
        ("PROM", prom.into()),
        ("FINE_HIST", fine.into()),
        ("WHO", false.into()),
    ];
    values.push(("ISSUER", args.filters.issuer_needed(args.by_cgroup).into()));
    values.extend(stats::cgroup_values(args.by_cgroup, args.cgroup_rows));
    let Some(t) = stages::start(&s, &args.filters, templates::ISCSTAT, &values)? else {
        return Ok(());
    };
    stats::check_maps(&t.bpf)?;
    let mut collector = Collector::new()?;
    let clock = Clock::start();
    let listening = exporter.as_ref().map(|e| format!(", metrics at http://{}/metrics", e.addr)).unwrap_or_default();
    let mut tracer = s.trace(&format!("iSCSI commands{listening}"))?;
    let probe = tur_every.map(|every| TurProbe::start(&t.topo, t.filter.clone(), "/sys".into(), every));
    let Tracer { stop, out, .. } = &mut tracer;
    let view = StatView {
        unit: if args.ms { Unit::Ms } else { Unit::Us },
        per_lun: args.per_lun,
        per_dir: args.per_dir,
        percentiles: args.percentiles,
        histograms: args.histograms,
        wide: args.wide,
        extended: args.extended,
        json: args.common.json,
        have_sent: t.plan.have_sent,
        have_rx: t.plan.have_rx,
    };
    let mut topo = t.topo.clone();
    let mut tally = prom::Tally::new(prom.then(|| prom::Exposition::new(t.plan.have_sent, t.plan.have_rx)));
    if args.by_cgroup {
        tally = tally.with_cgroups(CgroupPaths::new(cgroup::mount()));
    }
    let take = |rows: BTreeMap<RowKey, Row>, topo: &mut Topology, tally: &mut prom::Tally| -> Result<()> {
        // sysfs is read again only for a row it does not describe (a
        // login since): walking it every interval cost iscstat more CPU
        // than its own rows under emulation.
        if rows.keys().any(|k| !topo.knows(k.sid, k.host, k.lun)) {
            if let Ok(now) = Topology::read(std::path::Path::new("/sys")) {
                *topo = now;
            }
        }
        tally.retrans.read(&t.bpf)?;
        tally.add(rows, topo, || t.health());
        Ok(())
    };
    let (mut reports, mut counted, mut last, mut last_lost) = (0u64, 0u64, Instant::now(), 0u64);
    loop {
        let next = last + Duration::from_secs(args.interval);
        while Instant::now() < next && !stop.stopped() {
            let wait =
                Duration::from_millis(stop.poll_ms(100) as u64).min(next.saturating_duration_since(Instant::now()));
            match &exporter {
                Some(x) => {
                    if let Some(scrape) = x.next(wait) {
                        take(collector.collect(&t.bpf, false)?, &mut topo, &mut tally)?;
                        let _ = scrape.reply.send(tally.render());
                    }
                }
                None => std::thread::sleep(wait),
            }
        }
        let elapsed = last.elapsed().as_secs_f64();
        last = Instant::now();
        take(collector.collect(&t.bpf, fine)?, &mut topo, &mut tally)?;
        if let (Some(path), Some(e)) = (&args.prom_file, &tally.exposition) {
            e.write(path)?;
        }
        let rows = stats::regroup(&std::mem::take(&mut tally.interval), args.per_lun, args.per_dir);
        counted += rows.values().map(|r| r.count).sum::<u64>();
        let mut counters = t.bpf.table("counters")?;
        // Commands not counted: map full, an end the kernel did not let us
        // see, or a program hit the kernel skipped.
        let lost = Counter::UNCOUNTED.iter().map(|c| maps::counter(&mut counters, *c)).sum::<u64>() + t.links.missed();
        let now = output::monotonic_ns();
        let stamp = if args.common.timestamp || !args.common.json {
            clock.wall(now)
        } else {
            format!("{:.3}", clock.since_start(now))
        };
        if !args.quiet {
            let lines = view.report(
                &topo,
                &rows,
                &tally.retrans.interval,
                tally.cgroups.as_ref(),
                elapsed,
                &stamp,
                lost - last_lost,
            );
            if !lines.iter().all(|l| out.line(l)) {
                break;
            }
            out.flush();
        }
        tally.retrans.interval.clear();
        last_lost = lost;
        reports += 1;
        if stop.stopped() || args.count.map(|c| reports >= c).unwrap_or(false) {
            break;
        }
    }
    // Said on stderr where stdout is JSON or off (-q).
    let mut summary = vec![format!("{counted} commands counted, {}", t.untimed_summary(0)?)];
    summary.extend(probe.map(TurProbe::finish));
    tracer.finish(&summary);
    Ok(())
}
