//! The per-command stage timing shared by isclatency and iscstat: which
//! kernel functions carry each stage on the running kernel, the template
//! values that say so, and the start-up both tools share (checks, probe
//! choice, compile, attach, or --ebpf). The C side is
//! bpf_templates/iscsi_stages.c.

pub mod exporter;
pub mod filters;
pub mod latency_view;
pub mod prom;
pub mod stat_view;
pub mod stats;
pub mod tur_probe;

use crate::bpf::fentry::{Resolver, Targets};
use crate::bpf::runner::{EventBuffer, Links, Probe, ProbeKind};
use crate::bpf::templates::{self, Template, Value};
use crate::error::{Error, Result};
use crate::iscsi::topology::Topology;
use crate::kernel::headers::{self, ScsiLayout};
use crate::kernel::types::{self as kernel_types, KernelTypes};
use crate::kernel::Kernel;
use crate::stages::filters::{Filters, KernelFilter};
use crate::start::{Program, Startup};

pub const QUEUECOMMAND: &str = "iscsi_queuecommand";
pub const PREP: &str = "iscsi_prep_scsi_cmd_pdu";
pub const TCP_XMIT: &str = "iscsi_tcp_task_xmit";
pub const COMPLETE: &str = "iscsi_complete_task";
pub const R2T: &str = "iscsi_requeue_task";
/// Runs once for each PDU header from the target, before it is dissected:
/// the first PDU back, its task found from the header's ITT.
pub const RX_HDR: &str = "iscsi_tcp_hdr_recv_done";
/// Returns the task of each Data-In, R2T and SCSI Response (a 4 KiB read's
/// one Data-In twice: at its header and again at its status): the first
/// PDU back where RX_HDR cannot be traced.
pub const RX: &str = "iscsi_itt_to_ctask";

/// The raw tracepoint where the issuer of each command's I/O is seen
/// (bpf_templates/iscsi_stages.c ISSUER): it runs in the submitting task.
pub const ISSUER_TRACEPOINT: (&str, &str) = ("block", "block_getrq");

/// Said once at start where a kernel thread's bio's cgroup cannot be read.
const NO_BIO_CGROUP: &str = "the cgroup of I/O a kernel thread submits (writeback) is the thread's own, \
                             not the one its bio is charged to";

/// block_getrq's bio argument from its BTF prototype (`btf_trace_block_getrq`):
/// (q, bio, rw) before 5.11, (bio) since; None where the BTF has no such
/// typedef.
fn getrq_bio_arg_from_btf(btf: &crate::kernel::btf::Loaded) -> Option<u64> {
    let view = crate::kernel::btf::View { base: &btf.vmlinux, split: None };
    view.raw_tracepoint_args(ISSUER_TRACEPOINT.1).map(|n| u64::from(n >= 3))
}

/// The same from the release, where there is no vmlinux BTF.
fn getrq_bio_arg_by_release(release: &str) -> u64 {
    let mut v = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    u64::from((major, minor) < (5, 11) && major > 0)
}

/// Attach the issuer's program where the tool's values ask for it. Its
/// link is kept in `links`, so the hits the kernel skipped are counted:
/// where tracepoints run preemptible (7.x), a task preempted inside the
/// program makes the next task on that CPU skip it, and that task's
/// command has no issuer known.
fn attach_issuer(
    kernel: &Kernel,
    bpf: &mut bcc::BPF,
    links: &mut Links,
    tool_values: &[(&'static str, Value)],
) -> Result<()> {
    if !tool_values.contains(&("ISSUER", Value::Bool(true))) {
        return Ok(());
    }
    let (system, event) = ISSUER_TRACEPOINT;
    if !kernel.has_tracepoint(system, event) {
        return Err(Error::missing_probe("the process that issued a request (-I, --cgroup)", &[event]));
    }
    let fail = |e: String| Error::bpf(format!("cannot attach raw tracepoint {system}:{event}: {e}"));
    let prog: std::os::fd::OwnedFd = bpf
        .load("issuer_getrq", bcc_sys::bccapi::bpf_prog_type_BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0)
        .map_err(|e| fail(e.to_string()))?
        .into();
    let name = std::ffi::CString::new(event).map_err(|e| fail(e.to_string()))?;
    let link = crate::bpf::fentry::attach_raw_tracepoint(&prog, &name).map_err(|e| fail(e.to_string()))?;
    links.push(prog, link);
    Ok(())
}

/// What the running kernel lets us measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    pub probes: Vec<Probe>,
    /// SEND can be told apart from RESP. When false the C side records SEND
    /// as unknown (0, no statistics) and every output shows it as `-`.
    pub have_sent: bool,
    /// R2Ts can be counted.
    pub have_r2t: bool,
    /// The first PDU back for a task is seen: RESP splits into NET and
    /// TARGET (else both show `-`).
    pub have_rx: bool,
    /// The first PDU back is seen at its header (RX_HDR, once per PDU),
    /// else at the task lookup (RX).
    pub rx_at_header: bool,
    pub scsi: ScsiLayout,
    /// The kernel types written from BTF; None: the headers are compiled.
    pub types: Option<KernelTypes>,
    /// fentry/fexit programs (else kprobes/kretprobes).
    pub fentry: bool,
    /// Why kprobes were chosen instead of fentry (said with -v).
    pub why_kprobes: Option<String>,
    /// Why the headers are compiled instead of types from BTF (said with -v).
    pub why_headers: Option<String>,
    /// On the headers path, byte offsets of `kernel_types::NET_MEMBERS`
    /// from vmlinux's BTF; None: the program takes them from the types it
    /// compiles (BTF-written, or the networking headers).
    pub net_offsets: Option<[u32; kernel_types::NET_MEMBERS.len()]>,
    /// One line each for what this kernel cannot give, said once at start.
    pub notes: Vec<String>,
    /// Which argument of block_getrq is the bio (the issuer's program).
    pub getrq_bio_arg: u64,
    /// Where a kernel thread's bio's cgroup is (the issuer's program);
    /// None: not known (no vmlinux BTF), the thread's own cgroup is used.
    pub bio_cgroup: Option<kernel_types::BioCgroup>,
}

/// The kprobe plan: every stage function, and its handler.
fn kprobes(have_sent: bool, have_r2t: bool, have_rx: bool, rx_at_header: bool) -> Vec<Probe> {
    let mut probes = vec![
        Probe::entry(QUEUECOMMAND, "stages_queuecommand"),
        Probe::entry(PREP, "stages_prep"),
        Probe::entry(COMPLETE, "stages_complete"),
    ];
    if have_sent {
        probes.push(Probe::entry(TCP_XMIT, "stages_xmit"));
        probes.push(Probe::ret(TCP_XMIT, "stages_xmit_ret"));
    }
    if have_r2t {
        probes.push(Probe::entry(R2T, "stages_r2t"));
    }
    if rx_at_header {
        probes.push(Probe::entry(RX_HDR, "stages_rx_hdr"));
    } else if have_rx {
        probes.push(Probe::ret(RX, "stages_rx_ret"));
    }
    probes
}

impl StagePlan {
    pub fn choose(kernel: &Kernel, scsi: ScsiLayout) -> Result<StagePlan> {
        for (f, what) in [(QUEUECOMMAND, "command dispatch"), (PREP, "PDU preparation"), (COMPLETE, "task completion")]
        {
            if !kernel.can_probe(f) {
                return Err(Error::missing_probe(what, &[f]));
            }
        }
        let mut notes = Vec::new();
        let have_sent = kernel.can_probe(TCP_XMIT);
        if !have_sent {
            notes.push(format!(
                "{TCP_XMIT} is not traceable (not iscsi_tcp?): SEND shows '-' and RESP counts from PDU preparation"
            ));
        }
        let have_r2t = kernel.can_probe(R2T);
        if !have_r2t {
            notes.push(format!("{R2T} is not traceable: R2T counts show '-'"));
        }
        let rx_at_header = kernel.can_probe(RX_HDR);
        let have_rx = rx_at_header || kernel.can_probe(RX);
        if !have_rx {
            notes.push(format!("neither {RX_HDR} nor {RX} is traceable: NET and TARGET show '-'"));
        }
        Ok(StagePlan {
            probes: kprobes(have_sent, have_r2t, have_rx, rx_at_header),
            have_sent,
            have_r2t,
            have_rx,
            rx_at_header,
            scsi,
            types: None,
            fentry: false,
            why_kprobes: None,
            why_headers: None,
            net_offsets: None,
            notes,
            getrq_bio_arg: getrq_bio_arg_by_release(&kernel.release),
            bio_cgroup: None,
        })
    }

    /// The plan for a kernel that has every probe point (for --ebpf where
    /// the running kernel cannot be read).
    pub fn assume_all(scsi: ScsiLayout) -> StagePlan {
        StagePlan {
            probes: kprobes(true, true, true, true),
            have_sent: true,
            have_r2t: true,
            have_rx: true,
            rx_at_header: true,
            scsi,
            types: None,
            fentry: false,
            why_kprobes: None,
            why_headers: None,
            net_offsets: None,
            notes: Vec::new(),
            getrq_bio_arg: 0,
            bio_cgroup: None,
        }
    }

    pub fn values(&self) -> Vec<(&'static str, Value)> {
        let mut v = vec![
            ("HAVE_SENT", self.have_sent.into()),
            ("HAVE_RX", self.have_rx.into()),
            ("RX_HDR", self.rx_at_header.into()),
            ("HAVE_R2T", self.have_r2t.into()),
            ("CDB_POINTER", self.scsi.cdb_pointer.into()),
            ("FENTRY", self.fentry.into()),
            ("NET_OFFSETS", self.net_offsets.is_some().into()),
            ("GETRQ_BIO_ARG", self.getrq_bio_arg.into()),
        ];
        // Unused by the program (`#if NET_OFFSETS`) when unknown.
        let offsets = self.net_offsets.unwrap_or_default();
        v.extend(kernel_types::NET_MEMBERS.iter().zip(offsets).map(|((name, _, _), o)| (*name, o.into())));
        // Unused by the program (`#if BIO_CGROUP`) when unknown.
        let bio = self.bio_cgroup.as_ref();
        v.push(("BIO_CGROUP", bio.is_some().into()));
        let offsets = bio.map(|b| b.offsets).unwrap_or_default();
        v.extend(kernel_types::BIO_CGROUP_MEMBERS.iter().zip(offsets).map(|((name, _, _), o)| (*name, o.into())));
        v.push(("CGROUP_ANCESTORS_OFF", bio.map_or(0, |b| b.ancestors).into()));
        v.push(("CGROUP_ANCESTOR_IDS", bio.is_some_and(|b| b.ancestor_ids).into()));
        v
    }

    /// The same stages on fentry/fexit: fexit sees arguments and return
    /// value together, so the entry probe of a return pair is not needed.
    pub fn with_fentry(&self, kernel: &Kernel) -> StagePlan {
        let probes = self
            .probes
            .iter()
            .filter_map(|p| {
                let (kind, handler) = match p.handler {
                    "stages_queuecommand" => (ProbeKind::Fentry, "fentry_queuecommand"),
                    "stages_prep" => (ProbeKind::Fentry, "fentry_prep"),
                    "stages_xmit_ret" => (ProbeKind::Fexit, "fexit_xmit"),
                    "stages_r2t" => (ProbeKind::Fentry, "fentry_r2t"),
                    "stages_rx_ret" => (ProbeKind::Fexit, "fexit_rx"),
                    "stages_rx_hdr" => (ProbeKind::Fentry, "fentry_rx_hdr"),
                    "stages_complete" => (ProbeKind::Fentry, "fentry_complete"),
                    _ => return None,
                };
                Some(Probe {
                    kind,
                    function: p.function.clone(),
                    handler,
                    module: kernel.module_of(&p.function).map(str::to_string),
                })
            })
            .collect();
        StagePlan { probes, fentry: true, ..self.clone() }
    }

    /// Why fentry cannot be used on this kernel, judged from files alone
    /// (for --ebpf): BTF for vmlinux and every module, and a ring buffer.
    pub fn fentry_obstacle(&self, kernel: &Kernel) -> Option<String> {
        if !kernel.ringbuf {
            return Some("no BPF ring buffer".into());
        }
        if !kernel.btf {
            return Some("no kernel BTF".into());
        }
        for p in &self.probes {
            if let Some(m) = kernel.module_of(&p.function) {
                if !kernel.btf_dir.join(m).exists() {
                    return Some(format!("module {m} has no BTF"));
                }
            }
        }
        None
    }

    /// fentry where this kernel takes it for every stage function (checked
    /// by attaching an empty program, as libbpf-tools do), else kprobes.
    /// Needs root. Returns the plan, for kprobes why, and for fentry the
    /// probes' BTF targets; the resolver (the parsed BTF) is dropped here.
    pub fn prefer_fentry(self, kernel: &Kernel, resolver: Option<Resolver>) -> (StagePlan, Option<String>, Targets) {
        let none = Targets::default();
        if std::env::var_os("STORPROTOTRACE_KPROBES").is_some() {
            return (self, Some("STORPROTOTRACE_KPROBES is set".into()), none);
        }
        if let Some(why) = self.fentry_obstacle(kernel) {
            return (self, Some(why), none);
        }
        let plan = self.with_fentry(kernel);
        let Some(mut resolver) = resolver else {
            return (self, Some("no kernel BTF".into()), none);
        };
        let mut targets = Targets::default();
        for p in &plan.probes {
            match resolver.target(&p.function, p.module.as_deref()) {
                Ok(t) if crate::bpf::fentry::can_attach(&t) => targets.insert(t),
                Ok(_) => return (self, Some(format!("the kernel refuses fentry on {}", p.function)), none),
                Err(e) => return (self, Some(e.to_string()), none),
            }
        }
        (plan, None, targets)
    }

    /// What -v says of the kernel and of this plan (before the probes).
    pub fn describe(&self, kernel: &Kernel) -> Vec<String> {
        let types = if self.types.is_some() {
            "kernel types from BTF".to_string()
        } else {
            format!(
                "kernel types from the headers ({}){}",
                self.why_headers.as_deref().unwrap_or("no BTF"),
                if self.net_offsets.is_some() { ", the socket's offsets from vmlinux BTF" } else { "" }
            )
        };
        let mechanism = if self.fentry {
            "fentry/fexit".to_string()
        } else {
            format!("kprobes ({})", self.why_kprobes.as_deref().unwrap_or("fentry not tried"))
        };
        vec![format!(
            "kernel {}: functions from {:?}, ring buffer: {}, {types}, CDB {}, {mechanism}",
            kernel.release,
            kernel.source,
            kernel.ringbuf,
            if self.scsi.cdb_pointer { "via sc->cmnd pointer" } else { "in sc->cmnd[]" },
        )]
    }
}

/// The program of a stage tool: common.h, iscsi_stages.c and the tool's
/// own part, with the plan's, the filter's and the tool's values.
pub fn render(
    tool_part: &str,
    plan: &StagePlan,
    filter: &KernelFilter,
    buffer: EventBuffer,
    tool_values: &[(&'static str, Value)],
) -> Result<String> {
    let mut values = buffer.values().to_vec();
    values.extend(plan.values());
    values.extend(filter.values());
    values.extend_from_slice(tool_values);
    let text = Template::new(&parts(tool_part)).render(&values)?;
    Ok(kernel_types::program(plan.types.as_ref(), &text))
}

/// The template parts of a stage tool's program.
pub fn parts(tool_part: &str) -> [&str; 3] {
    [templates::COMMON, templates::ISCSI_STAGES, tool_part]
}

/// What the program's kernel types come from.
struct Layout {
    scsi: ScsiLayout,
    types: Option<KernelTypes>,
    why_headers: Option<String>,
    net_offsets: Option<[u32; kernel_types::NET_MEMBERS.len()]>,
    /// From vmlinux's BTF, where it has the tracepoint's prototype.
    getrq_bio_arg: Option<u64>,
    /// From vmlinux's BTF, else why not.
    bio_cgroup: std::result::Result<kernel_types::BioCgroup, String>,
}

/// The kernel types from BTF and the SCSI layout they give, else the
/// layout from the headers (and why, in `why_headers`) with the socket's
/// offsets from vmlinux's BTF where it has them (the BTF-written types
/// hold the socket's members themselves).
/// `issuer`: the issuer's program is loaded (it alone reads a bio's cgroup).
fn layout(
    kernel: &Kernel,
    mut btf: Option<&mut crate::kernel::btf::Loaded>,
    tool_part: &str,
    issuer: bool,
) -> Result<Layout> {
    let getrq_bio_arg = btf.as_deref().and_then(getrq_bio_arg_from_btf);
    let bio_cgroup = match btf.as_deref_mut() {
        Some(_) if !issuer => Err("not read".into()),
        Some(b) => kernel_types::bio_cgroup(b).map_err(|e| e.to_string()),
        None => Err("no kernel BTF".into()),
    };
    let types = match btf.as_deref_mut() {
        Some(b) => kernel_types::from_btf(b, &parts(tool_part), kernel_types::ISCSI_MODULES),
        None => Err(Error::kernel_types("no kernel BTF")),
    };
    match types {
        Ok(t) => Ok(Layout {
            scsi: ScsiLayout::from_types(&t)?,
            types: Some(t),
            why_headers: None,
            net_offsets: None,
            getrq_bio_arg,
            bio_cgroup,
        }),
        Err(why) => {
            let net_offsets = btf.and_then(|b| kernel_types::net_offsets(b).ok());
            Ok(Layout {
                scsi: ScsiLayout::from_headers(&headers::header_dirs(kernel))?,
                types: None,
                why_headers: Some(why.to_string()),
                net_offsets,
                getrq_bio_arg,
                bio_cgroup,
            })
        }
    }
}

/// A stage tool, compiled, attached and tracing.
pub struct Tracing {
    pub topo: Topology,
    pub plan: StagePlan,
    pub filter: KernelFilter,
    pub bpf: bcc::BPF,
    pub links: Links,
}

/// An `inflight` map value whose slot holds a command: a slot whose command
/// ended keeps its entry with ts_queue, the struct's first u64, zeroed
/// (iscsi_stages.c, `inflight_live`).
fn inflight_live(value: &[u8]) -> bool {
    crate::bpf::maps::first_u64(value) != 0
}

impl Tracing {
    /// One of the program's counters.
    pub fn counter(&self, c: crate::bpf::maps::Counter) -> Result<u64> {
        Ok(crate::bpf::maps::counter(&mut self.bpf.table("counters")?, c))
    }

    /// The exit summary after its first part (what the tool showed or
    /// counted): the commands it did not time and why. `extra_lost`: events
    /// user space could not read (isclatency's malformed records).
    pub fn untimed_summary(&self, extra_lost: u64) -> Result<String> {
        use crate::bpf::maps::{self, Counter};
        let mut counters = self.bpf.table("counters")?;
        let mut c = |k| maps::counter(&mut counters, k);
        let (lost, ended, unseen, not_split, net_unknown) = (
            c(Counter::Lost) + c(Counter::InflightFull) + extra_lost,
            c(Counter::EndedNoResponse),
            c(Counter::EndNotSeen),
            c(Counter::NotSplit),
            c(Counter::NetUnknown),
        );
        let in_flight =
            maps::entries(&mut self.bpf.table("inflight")?, 1 << 16).iter().filter(|(_, v)| inflight_live(v)).count();
        let skipped = self.links.missed();
        let mut line = format!("{lost} events lost, {ended} ended without a response, {in_flight} still in flight");
        if self.plan.have_rx {
            line += &format!(", {not_split} timed without a NET/TARGET split");
            if net_unknown > 0 {
                line += &format!(" ({net_unknown} with the round trip not known)");
            }
        }
        if unseen + skipped > 0 {
            line += &format!(", {unseen} ends not seen, {skipped} probe hits skipped by the kernel");
        }
        Ok(line)
    }

    /// The tracer's own health and cost, for the exporter.
    pub fn health(&self) -> crate::stages::prom::Health {
        use crate::bpf::maps::{self, Counter};
        let lost = match self.bpf.table("counters") {
            Ok(mut c) => Counter::UNCOUNTED.iter().map(|k| (k.reason(), maps::counter(&mut c, *k))).collect(),
            Err(_) => Vec::new(),
        };
        let programs = crate::bpf::progs::stats_enabled().then(|| {
            let mut by_name: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
            for p in crate::bpf::progs::own_programs() {
                let e = by_name.entry(p.name).or_default();
                *e = (e.0 + p.run_time_ns, e.1 + p.run_cnt);
            }
            by_name.into_iter().map(|(n, (ns, cnt))| (n, ns, cnt)).collect()
        });
        crate::stages::prom::Health {
            probe_set: "stages",
            mechanism: if self.plan.fentry { "fentry" } else { "kprobes" },
            lost,
            skipped_hits: self.links.missed(),
            programs,
        }
    }
}

/// The start-up of isclatency and iscstat on [`Startup`]'s path. With
/// --ebpf: print the program and return None (no root, no iSCSI needed).
/// Else the checks (a filter naming nothing is the user's mistake and is
/// said first; then root, headers, modules, sessions), the probe plan,
/// compile and attach: fentry as planned, and if the kernel refuses the
/// real programs, kprobes after all (said once).
pub fn start(
    s: &Startup,
    filters: &Filters,
    tool_part: &str,
    tool_values: &[(&'static str, Value)],
) -> Result<Option<Tracing>> {
    let ebpf = s.ebpf(|kernel| {
        let topo = Topology::read(std::path::Path::new("/sys"))?;
        let (plan, filter) = plan_for_ebpf(kernel, &topo, filters, tool_part)?;
        render(tool_part, &plan, &filter, s.ebpf_buffer(), tool_values)
    })?;
    if ebpf {
        return Ok(None);
    }
    start_tracing(s, filters, tool_part, tool_values).map(Some)
}

/// [`start`] without `--ebpf`, for callers that never print the program.
pub fn start_tracing(
    s: &Startup,
    filters: &Filters,
    tool_part: &str,
    tool_values: &[(&'static str, Value)],
) -> Result<Tracing> {
    let kernel = &s.kernel;
    let topo = Topology::read(std::path::Path::new("/sys"))?;
    if filters.any_session_filter() {
        filters.resolve(&topo)?;
    }
    s.preflight(true)?;
    if topo.sessions.is_empty() {
        return Err(Error::no_sessions());
    }
    let filter = filters.resolve(&topo)?;
    let issuer = tool_values.contains(&("ISSUER", Value::Bool(true)));
    // vmlinux's and the modules' BTF, read once for the types and fentry.
    let mut resolver = if kernel.btf { Resolver::new(&kernel.btf_dir).ok() } else { None };
    let Layout { scsi, types, why_headers, net_offsets, getrq_bio_arg, bio_cgroup } =
        layout(kernel, resolver.as_mut().map(Resolver::btf), tool_part, issuer)?;
    let mut chosen = StagePlan::choose(kernel, scsi)?;
    let getrq_bio_arg = getrq_bio_arg.unwrap_or(chosen.getrq_bio_arg);
    if let (Err(why), true) = (&bio_cgroup, issuer) {
        chosen.notes.push(format!("{NO_BIO_CGROUP} ({why})"));
    }
    let bio_cgroup = bio_cgroup.ok();
    let plan = StagePlan { types, why_headers, net_offsets, getrq_bio_arg, bio_cgroup, ..chosen };
    let (mut plan, why_kprobes, targets) = plan.prefer_fentry(kernel, resolver);
    plan.why_kprobes = why_kprobes;
    let program = |plan: &StagePlan, targets: Targets| -> Result<Program> {
        Ok(Program {
            targets,
            describe: plan.describe(kernel),
            notes: plan.notes.clone(),
            ..Program::new(render(tool_part, plan, &filter, s.event_buffer(), tool_values)?, plan.probes.clone())
        })
    };
    let first = program(&plan, targets)?;
    s.announce(&first);
    let (mut bpf, mut links) = s.try_load(&first, |bpf| filter.load_sets(bpf))?;
    if let (Err(e), true) = (&links, plan.fentry) {
        eprintln!("{}: note: {e}; using kprobes instead", s.tool);
        drop(bpf);
        plan = StagePlan {
            why_kprobes: Some(e.to_string()),
            types: plan.types.clone(),
            why_headers: plan.why_headers.clone(),
            net_offsets: plan.net_offsets,
            getrq_bio_arg: plan.getrq_bio_arg,
            bio_cgroup: plan.bio_cgroup,
            notes: plan.notes.clone(),
            ..StagePlan::choose(kernel, plan.scsi)?
        };
        (bpf, links) = s.try_load(&program(&plan, Targets::default())?, |bpf| filter.load_sets(bpf))?;
    }
    let mut links = links?;
    attach_issuer(kernel, &mut bpf, &mut links, tool_values)?;
    Ok(Tracing { topo, plan, filter, bpf, links })
}

/// What `--ebpf` renders, with neither root nor iSCSI: the plan for the
/// running kernel where it can be read, else for a kernel that has every
/// probe point; filters resolved where sessions exist, else assumed.
pub fn plan_for_ebpf(
    kernel: &Kernel,
    topo: &Topology,
    filters: &Filters,
    tool_part: &str,
) -> Result<(StagePlan, KernelFilter)> {
    let mut btf = crate::kernel::btf::Loaded::open(&kernel.btf_dir).ok();
    let Layout { scsi, types, why_headers, net_offsets, getrq_bio_arg, bio_cgroup } =
        layout(kernel, btf.as_mut(), tool_part, true).unwrap_or(Layout {
            scsi: ScsiLayout::modern(),
            types: None,
            why_headers: None,
            net_offsets: None,
            getrq_bio_arg: None,
            bio_cgroup: Err(String::new()),
        });
    let plan = StagePlan::choose(kernel, scsi).unwrap_or_else(|_| StagePlan::assume_all(scsi));
    let getrq_bio_arg = getrq_bio_arg.unwrap_or(plan.getrq_bio_arg);
    let plan = StagePlan { types, why_headers, net_offsets, getrq_bio_arg, bio_cgroup: bio_cgroup.ok(), ..plan };
    let filter = if topo.sessions.is_empty() { filters.assume_sets() } else { filters.resolve(topo)? };
    let plan = if kernel.function_count() > 0 && plan.fentry_obstacle(kernel).is_none() {
        plan.with_fentry(kernel)
    } else {
        plan
    };
    Ok((plan, filter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Paths;
    use std::fs;

    const ALL: &str = "iscsi_queuecommand [libiscsi]\niscsi_prep_scsi_cmd_pdu [libiscsi]\niscsi_complete_task [libiscsi]\niscsi_tcp_task_xmit [libiscsi_tcp]\niscsi_requeue_task [libiscsi]\niscsi_itt_to_ctask [libiscsi]\niscsi_tcp_hdr_recv_done [libiscsi_tcp]\n";
    const OLD: ScsiLayout = ScsiLayout { cdb_pointer: true };

    fn kernel_with(dir: &tempfile::TempDir, functions: &str) -> Kernel {
        let d = dir.path();
        fs::create_dir_all(d.join("tracing")).unwrap();
        fs::write(d.join("tracing/available_filter_functions"), functions).unwrap();
        Kernel::from_paths(&Paths {
            tracefs: vec![d.join("tracing")],
            kallsyms: d.join("kallsyms"),
            btf: d.join("btf"),
            modules_root: d.join("modules"),
            sys_module: d.join("module"),
            kheaders: d.join("kh"),
            release: "x".into(),
            headers_override: None,
            untraceable: Vec::new(),
        })
    }

    #[test]
    fn full_plan_on_a_kernel_with_everything() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, ALL);
        let p = StagePlan::choose(&k, ScsiLayout::modern()).unwrap();
        assert!(p.have_sent && p.have_r2t && p.notes.is_empty());
        assert_eq!(p.probes.len(), 7);
        assert!(p.values().contains(&("CDB_POINTER", Value::Bool(false))));
        assert_eq!(p, StagePlan::assume_all(ScsiLayout::modern()));
    }

    #[test]
    fn fentry_plan_maps_every_stage_and_needs_module_btf() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, ALL);
        let p = StagePlan::choose(&k, ScsiLayout::modern()).unwrap();
        assert_eq!(p.fentry_obstacle(&k).as_deref(), Some("no BPF ring buffer"));
        let f = p.with_fentry(&k);
        assert!(f.fentry && f.values().contains(&("FENTRY", Value::Bool(true))));
        // fexit sees arguments and return value: no entry probe for xmit.
        let got: Vec<String> = f.probes.iter().map(|p| p.describe()).collect();
        assert_eq!(
            got,
            [
                "fentry:libiscsi:iscsi_queuecommand -> fentry_queuecommand",
                "fentry:libiscsi:iscsi_prep_scsi_cmd_pdu -> fentry_prep",
                "fentry:libiscsi:iscsi_complete_task -> fentry_complete",
                "fexit:libiscsi_tcp:iscsi_tcp_task_xmit -> fexit_xmit",
                "fentry:libiscsi:iscsi_requeue_task -> fentry_r2t",
                "fentry:libiscsi_tcp:iscsi_tcp_hdr_recv_done -> fentry_rx_hdr",
            ]
        );
        assert!(!p.fentry && p.values().contains(&("FENTRY", Value::Bool(false))));
    }

    /// The summary's in-flight count reads ts_queue as the first u64 of
    /// the C struct inflight, as the C side's liveness check does.
    #[test]
    fn inflight_slot_is_live_by_its_first_u64() {
        let c = templates::ISCSI_STAGES;
        assert!(c.contains("struct inflight {\n    u64 ts_queue;\n"), "ts_queue must open struct inflight");
        assert!(c.contains("return f && f->ts_queue ? f : NULL;"));
        let mut v = vec![0u8; 144];
        assert!(!inflight_live(&v));
        v[..8].copy_from_slice(&5u64.to_ne_bytes());
        assert!(inflight_live(&v));
    }

    /// Without iscsi_tcp_hdr_recv_done the first PDU back is taken at the
    /// task lookup's return, and the program says which.
    #[test]
    fn first_pdu_back_falls_back_to_the_task_lookup() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, &ALL.replace("iscsi_tcp_hdr_recv_done [libiscsi_tcp]\n", ""));
        let p = StagePlan::choose(&k, ScsiLayout::modern()).unwrap();
        assert!(p.have_rx && !p.rx_at_header && p.notes.is_empty());
        assert!(p.values().contains(&("RX_HDR", Value::Bool(false))));
        let last = |p: &StagePlan| p.probes.last().map(|p| p.describe()).unwrap();
        assert_eq!(last(&p), "kretprobe:iscsi_itt_to_ctask -> stages_rx_ret");
        assert_eq!(last(&p.with_fentry(&k)), "fexit:libiscsi:iscsi_itt_to_ctask -> fexit_rx");
        let c = render(
            templates::ISCSTAT,
            &p,
            &KernelFilter::default(),
            EventBuffer::new(true),
            &[
                ("PER_LUN", false.into()),
                ("PER_DIR", false.into()),
                ("PROM", false.into()),
                ("FINE_HIST", false.into()),
                ("WHO", false.into()),
                ("ISSUER", false.into()),
                ("PER_CGROUP", false.into()),
                ("CGROUP_ROWS", 1u32.into()),
            ],
        )
        .unwrap();
        assert!(c.contains("#define RX_HDR 0\n") && c.contains("int stages_rx_ret("));
        let full = StagePlan::choose(&kernel_with(&tempfile::tempdir().unwrap(), ALL), ScsiLayout::modern()).unwrap();
        assert!(full.rx_at_header);
        assert_eq!(last(&full), "kprobe:iscsi_tcp_hdr_recv_done -> stages_rx_hdr");
    }

    #[test]
    fn block_getrq_takes_the_bio_first_since_5_11() {
        for (release, want) in [
            ("5.10.0-46-amd64", 1u64),
            ("4.19.0-27-amd64", 1),
            ("5.11.0", 0),
            ("6.1.0-57-amd64", 0),
            ("7.3.4", 0),
            ("", 0),
        ] {
            assert_eq!(getrq_bio_arg_by_release(release), want, "{release}");
        }
    }

    #[test]
    fn missing_xmit_is_said_not_guessed() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, "iscsi_queuecommand\niscsi_prep_scsi_cmd_pdu\niscsi_complete_task\n");
        let p = StagePlan::choose(&k, OLD).unwrap();
        assert!(!p.have_sent && !p.have_r2t && !p.have_rx);
        assert_eq!(p.notes.len(), 3);
        assert!(p.notes[2].contains("NET and TARGET show '-'"));
        assert!(p.notes[0].contains("SEND shows '-'"));
        assert_eq!(p.probes.len(), 3);
        assert!(p.values().contains(&("HAVE_SENT", Value::Bool(false))));
    }

    #[test]
    fn missing_completion_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, "iscsi_queuecommand\niscsi_prep_scsi_cmd_pdu\n");
        let e = StagePlan::choose(&k, OLD).unwrap_err();
        assert!(e.to_string().contains("iscsi_complete_task"));
        assert_eq!(e.exit_code(), 1);
    }

    /// Every probe-choice branch renders completely with the values the
    /// tools pass (bpf_templates/isclatency.c and iscstat.c), and the C
    /// text says what the plan chose.
    #[test]
    fn every_branch_of_both_stage_templates_renders() {
        let t = tempfile::tempdir().unwrap();
        let k = kernel_with(&t, ALL);
        let filters = [
            KernelFilter::default(),
            KernelFilter {
                hosts: Some(vec![1]),
                devices: Some(vec![1]),
                lun: Some(1),
                cid: Some(0),
                pid: Some(9),
                dir: 2,
                cgroup: Some(crate::kernel::cgroup::CgroupFilter { dir: "/sys/fs/cgroup/a".into(), id: 7, level: 1 }),
            },
        ];
        let mut tools: [(&str, Vec<(&'static str, Value)>); 4] = [
            (templates::ISCLATENCY, vec![("MIN_US", 10_000u64.into()), ("WHO", true.into())]),
            (templates::ISCLATENCY, vec![("MIN_US", 0u64.into()), ("WHO", true.into())]),
            (
                templates::ISCSTAT,
                vec![
                    ("PER_LUN", false.into()),
                    ("PER_DIR", true.into()),
                    ("PROM", false.into()),
                    ("FINE_HIST", true.into()),
                    ("WHO", false.into()),
                    ("PER_CGROUP", false.into()),
                    ("CGROUP_ROWS", 1u32.into()),
                ],
            ),
            (
                templates::ISCSTAT,
                vec![
                    ("PER_LUN", true.into()),
                    ("PER_DIR", true.into()),
                    ("PROM", true.into()),
                    ("FINE_HIST", false.into()),
                    ("WHO", false.into()),
                    ("PER_CGROUP", true.into()),
                    ("CGROUP_ROWS", 8u32.into()),
                ],
            ),
        ];
        for (i, (_, values)) in tools.iter_mut().enumerate() {
            values.push(("ISSUER", (i == 1 || i == 3).into()));
        }
        let mut rendered = 0;
        for scsi in [ScsiLayout::modern(), OLD] {
            for have_sent in [true, false] {
                let base = StagePlan { have_sent, ..StagePlan::choose(&k, scsi).unwrap() };
                let bio_cgroup = kernel_types::BioCgroup { offsets: [8; 7], ancestors: 16, ancestor_ids: have_sent };
                let with_bio_cgroup = StagePlan { bio_cgroup: Some(bio_cgroup), ..base.clone() };
                for plan in [base.clone(), base.with_fentry(&k), with_bio_cgroup] {
                    for ringbuf in [true, false] {
                        for f in &filters {
                            for (part, values) in &tools {
                                let c = render(part, &plan, f, EventBuffer::new(ringbuf), values).unwrap();
                                assert!(!c.contains("{{"));
                                assert!(c.contains(&format!("#define HAVE_SENT {}\n", have_sent as u8)));
                                assert!(c.contains("#define HAVE_RX 1\n"));
                                assert!(c.contains(&format!("#define FENTRY {}\n", plan.fentry as u8)));
                                assert!(c.contains(&format!("#define CDB_POINTER {}\n", scsi.cdb_pointer as u8)));
                                assert!(c.contains(&format!("#define USE_RINGBUF {}\n", ringbuf as u8)));
                                for p in &plan.probes {
                                    assert!(c.contains(&format!("int {}(", p.handler)), "{} missing", p.handler);
                                }
                                assert!(c.contains(&format!("#define FILTER_CGROUP {}\n", f.cgroup.is_some() as u8)));
                                let issuer = values.contains(&("ISSUER", Value::Bool(true)));
                                assert!(c.contains(&format!("#define ISSUER {}\n", issuer as u8)));
                                assert!(c.contains(&format!("#define GETRQ_BIO_ARG {}LL\n", plan.getrq_bio_arg)));
                                let bio = plan.bio_cgroup.is_some();
                                assert!(c.contains(&format!("#define BIO_CGROUP {}\n", bio as u8)));
                                rendered += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(rendered, 2 * 2 * 3 * 2 * 2 * 4);
    }
}
