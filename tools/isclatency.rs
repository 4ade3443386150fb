//! isclatency: every slow iSCSI command, with where its time went.
//! WAIT (in the driver's queue), SEND (handing the PDU to TCP), RESP (waiting
//! for the target). Like bcc's ext4slower, for the iSCSI initiator.

use clap::Parser;
use storprototrace::cli::{self, Common, Filters, Threshold};
use storprototrace::events::Command;
use storprototrace::kernel::Kernel;
use storprototrace::maps::{self, Counter};
use storprototrace::output::{self, Clock, Out, Unit};
use storprototrace::runner::{self, Events, Stop};
use storprototrace::stages::{self, KernelFilter, StagePlan};
use storprototrace::templates::{self, Template};
use storprototrace::topology::Topology;
use storprototrace::{error, json, Result};

const ABOUT: &str = "Trace iSCSI commands slower than a threshold, with where their time went.

Stages of each SCSI command in the iSCSI initiator (libiscsi):
  WAIT   iscsi_queuecommand -> the xmit worker prepares its PDU (queued in the driver)
  SEND   PDU preparation -> command PDU and any immediate/unsolicited data handed to TCP
  RESP   handed to TCP -> the response completes the task. For writes this
         includes waiting for R2Ts and sending the solicited Data-Out PDUs.
  TOTAL  = WAIT + SEND + RESP
COMM/PID is the context that dispatched the command to the driver: often the
submitting process, often a kworker (blk-mq runs queues from workqueues).
Commands that are aborted or failed by session recovery are not timed; they
are counted in the summary.";

const EXAMPLES: &str = "examples:
    isclatency                 # iSCSI commands of 10 ms or more, in ms
    isclatency -m 1            # 1 ms or more
    isclatency -u 0            # every command, times in us
    isclatency -m 5 -e         # with R2T count, target, initiator and portal
    isclatency --sid 1 -w      # writes of session 1 only
    isclatency --target 'storage0[12]' --lun 0
    isclatency --disk sdb -T   # one disk, wall-clock timestamps
    isclatency -u 500 --json   # one JSON object per command, times in ns
    isclatency --duration 60 > slow.txt
    isclatency --ebpf          # print the BPF program and exit";

#[derive(Parser, Debug)]
#[command(name = "isclatency", version, about = "Trace slow iSCSI commands with their WAIT/SEND/RESP breakdown", long_about = ABOUT, after_help = EXAMPLES)]
struct Args {
    #[command(flatten)]
    threshold: Threshold,
    #[command(flatten)]
    filters: Filters,
    /// Extended columns: R2Ts waited for (writes), target IQN, initiator, portal
    #[arg(short = 'e', long)]
    extended: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    error::exit_with("isclatency", cli::parse::<Args>().and_then(run));
}

fn run(args: Args) -> Result<()> {
    let (min_us, unit) = args.threshold.resolve(10)?;
    args.filters.validate()?;
    let duration = args.common.duration()?;
    let kernel = Kernel::detect();
    let topo = Topology::read(std::path::Path::new("/sys"))?;

    if args.common.ebpf {
        // No root, no iSCSI needed: for the running kernel where it can be
        // read, else for a kernel that has every probe point.
        let (plan, filter) = stages::plan_for_ebpf(&kernel, &topo, &args.filters)?;
        println!("{}", render(&plan, &filter, min_us, kernel.ringbuf || kernel.function_count() == 0)?);
        return Ok(());
    }

    let (mut plan, filter) = stages::prepare(&kernel, &topo, &args.filters)?;
    plan.announce("isclatency", &kernel, args.common.verbose);
    let (bpf, links) = stages::compile_and_attach("isclatency", &kernel, &mut plan, &filter, |p| render(p, &filter, min_us, kernel.ringbuf))?;
    let mut events = Events::open(&bpf, kernel.ringbuf)?;
    let stop = Stop::install(duration)?;
    let clock = Clock::start();
    let mut out = Out::new();
    let mut view = View { args: &args, unit, topo, plan: &plan, clock, topo_read_at: std::time::Instant::now() };

    let what = if min_us == 0 { "all iSCSI commands".to_string() } else { format!("iSCSI commands slower than {} {}", if unit == Unit::Ms { min_us / 1000 } else { min_us }, unit.label()) };
    output::status(args.common.json, &mut out, &format!("Tracing {what}... Hit Ctrl-C to end."));
    if !args.common.json {
        out.line(&view.header());
    }
    let mut shown: u64 = 0;
    runner::print_events(&mut events, &stop, &mut out, |rec, out| {
        let Some(cmd) = Command::parse(rec) else { return true };
        let line = if args.common.json { view.json(&cmd) } else { view.row(&cmd) };
        let ok = out.line(&line);
        shown += ok as u64;
        ok
    });
    let mut counters = bpf.table("counters")?;
    let lost = maps::counter(&mut counters, Counter::Lost) + maps::counter(&mut counters, Counter::InflightFull);
    let ended = maps::counter(&mut counters, Counter::EndedNoResponse);
    let mut inflight = bpf.table("inflight")?;
    let in_flight = maps::count_entries(&mut inflight, 1 << 16);
    let unseen = maps::counter(&mut counters, Counter::EndNotSeen);
    let skipped = links.missed();
    let mut line = format!("{shown} commands shown, {lost} events lost, {ended} ended without a response, {in_flight} still in flight");
    if unseen + skipped > 0 {
        line += &format!(", {unseen} ends not seen, {skipped} probe hits skipped by the kernel");
    }
    output::summary(args.common.json, &mut out, &[line]);
    Ok(())
}

fn render(plan: &StagePlan, filter: &KernelFilter, min_us: u64, ringbuf: bool) -> Result<String> {
    let mut values = vec![("MIN_US", min_us.into()), ("USE_RINGBUF", ringbuf.into())];
    values.extend(plan.values());
    values.extend(filter.values());
    Template::new(&[templates::COMMON, templates::ISCSI_STAGES, templates::ISCLATENCY]).render(&values)
}

struct View<'a> {
    args: &'a Args,
    unit: Unit,
    topo: Topology,
    plan: &'a StagePlan,
    clock: Clock,
    topo_read_at: std::time::Instant,
}

impl View<'_> {
    fn disk(&mut self, c: &Command) -> String {
        if let Some(d) = self.topo.disk_name(c.host, c.channel, c.id, c.lun) {
            return d.to_string();
        }
        // A session that logged in after we started: read sysfs again (at most once a second).
        if self.topo_read_at.elapsed().as_secs() >= 1 {
            if let Ok(t) = Topology::read(std::path::Path::new("/sys")) {
                self.topo = t;
            }
            self.topo_read_at = std::time::Instant::now();
        }
        self.topo.disk_name(c.host, c.channel, c.id, c.lun).unwrap_or("?").to_string()
    }

    fn time(&self, c: &Command) -> String {
        let done = c.ts_queue + c.total;
        if self.args.common.timestamp { self.clock.wall(done) } else { format!("{:.6}", self.clock.since_start(done)) }
    }

    fn header(&self) -> String {
        let u = self.unit.label();
        let time = if self.args.common.timestamp { "TIME" } else { "TIME(s)" };
        let mut h = format!(
            "{time:<14} {:<16} {:>7} {:>7} {:<6} {:>3} {} {:>7} {:>10} {:>10} {:>10} {:>10} {}",
            "COMM", "PID", "SID:CID", "DISK", "LUN", "T", "BYTES",
            format!("WAIT({u})"), format!("SEND({u})"), format!("RESP({u})"), format!("TOTAL({u})"), "RESULT"
        );
        if self.args.extended {
            h.push_str(&format!(" {:>3} {} {} {}", "R2T", "TARGET", "INITIATOR", "PORTAL"));
        }
        h
    }

    fn row(&mut self, c: &Command) -> String {
        let u = self.unit;
        let send = if self.plan.have_sent { u.fmt(c.send) } else { "-".into() };
        let resp = if self.plan.have_sent { u.fmt(c.resp) } else { u.fmt(c.send + c.resp) };
        let disk = self.disk(c);
        let mut line = format!(
            "{:<14} {:<16} {:>7} {:>7} {:<6} {:>3} {} {:>7} {:>10} {:>10} {:>10} {:>10} {}",
            self.time(c), c.comm, c.pid, format!("{}:{}", c.sid, c.cid), disk, c.lun, c.dir.letter(), c.bytes,
            u.fmt(c.wait), send, resp, u.fmt(c.total), c.result_text()
        );
        if self.args.extended {
            let (target, initiator, portal) = match self.topo.session(c.sid) {
                Some(s) => (s.target.clone(), s.initiator.clone(), s.portal()),
                None => ("?".into(), "?".into(), "?".into()),
            };
            let r2t = if self.plan.have_r2t { c.r2t.to_string() } else { "-".into() };
            line.push_str(&format!(" {r2t:>3} {target} {initiator} {portal}"));
        }
        line
    }

    fn json(&mut self, c: &Command) -> String {
        let disk = self.disk(c);
        let s = self.topo.session(c.sid);
        json::Object::new()
            .str("time", &self.time(c))
            .str("comm", &c.comm)
            .num("pid", c.pid)
            .num("sid", c.sid)
            .num("cid", c.cid)
            .num("host", c.host)
            .num("lun", c.lun)
            .str("disk", &disk)
            .str("dir", c.dir.letter())
            .num("opcode", c.opcode)
            .num("bytes", c.bytes)
            .num("wait_ns", c.wait)
            .opt_num("send_ns", self.plan.have_sent.then_some(c.send))
            .opt_num("resp_ns", self.plan.have_sent.then_some(c.resp))
            .num("total_ns", c.total)
            .opt_num("r2t", self.plan.have_r2t.then_some(c.r2t))
            .num("result", c.result)
            .bool("ok", c.ok())
            .opt_str("target", s.map(|s| s.target.as_str()))
            .opt_str("initiator", s.map(|s| s.initiator.as_str()))
            .str("portal", &s.map(|s| s.portal()).unwrap_or_else(|| "?".into()))
            .finish()
    }
}
