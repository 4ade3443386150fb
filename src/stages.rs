//! The per-command stage timing shared by isclatency and iscstat: which
//! kernel functions carry each stage on the running kernel, and the template
//! values that say so. The C side is bpf_templates/iscsi_stages.c.

use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::runner::{Probe, ProbeKind};
use crate::templates::Value;
use std::path::PathBuf;

pub const QUEUECOMMAND: &str = "iscsi_queuecommand";
pub const PREP: &str = "iscsi_prep_scsi_cmd_pdu";
pub const TCP_XMIT: &str = "iscsi_tcp_task_xmit";
pub const COMPLETE: &str = "iscsi_complete_task";
pub const R2T: &str = "iscsi_requeue_task";

/// How to get from a `struct scsi_cmnd` to its `struct iscsi_task`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskLookup {
    /// `sc->SCp.ptr` (kernels before 5.18)
    ScsiPointer,
    /// `((struct iscsi_cmd *)(sc + 1))->task` (5.18 and later)
    PrivateData,
}

impl TaskLookup {
    pub fn macro_name(self) -> &'static str {
        match self {
            TaskLookup::ScsiPointer => "SC_TASK_SCP",
            TaskLookup::PrivateData => "SC_TASK_PRIV",
        }
    }

    /// Decide from the kernel headers: `struct iscsi_cmd` exists from 5.18.
    pub fn from_headers(dirs: &[PathBuf]) -> Result<TaskLookup> {
        for d in dirs {
            let f = d.join("include/scsi/libiscsi.h");
            if let Ok(text) = std::fs::read_to_string(&f) {
                return Ok(if text.contains("struct iscsi_cmd {") { TaskLookup::PrivateData } else { TaskLookup::ScsiPointer });
            }
        }
        Err(Error::env(format!(
            "kernel headers lack include/scsi/libiscsi.h (looked in {}): install the full linux-headers package",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        )))
    }
}

/// Header trees to search: the build dir, and Debian's `source` sibling.
pub fn header_dirs(kernel: &Kernel) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(h) = &kernel.headers {
        v.push(h.clone());
        if let Some(parent) = h.parent() {
            v.push(parent.join("source"));
        }
    }
    v
}

/// What the running kernel lets us measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    pub probes: Vec<Probe>,
    /// SEND can be told apart from RESP.
    pub have_sent: bool,
    /// R2Ts can be counted.
    pub have_r2t: bool,
    pub task_lookup: TaskLookup,
    /// fentry/fexit programs (else kprobes/kretprobes).
    pub fentry: bool,
    /// Why kprobes were chosen instead of fentry (said with -v).
    pub why_kprobes: Option<String>,
    /// One line each for what this kernel cannot give, said once at start.
    pub notes: Vec<String>,
}

impl StagePlan {
    pub fn choose(kernel: &Kernel, task_lookup: TaskLookup) -> Result<StagePlan> {
        for (f, what) in [(QUEUECOMMAND, "command dispatch"), (PREP, "PDU preparation"), (COMPLETE, "task completion")] {
            if !kernel.can_probe(f) {
                return Err(Error::missing_probe(what, &[f]));
            }
        }
        let mut probes = vec![
            Probe::entry(QUEUECOMMAND, "stages_queuecommand"),
            Probe::ret(QUEUECOMMAND, "stages_queuecommand_ret"),
            Probe::entry(PREP, "stages_prep"),
            Probe::entry(COMPLETE, "stages_complete"),
        ];
        let mut notes = Vec::new();
        let have_sent = kernel.can_probe(TCP_XMIT);
        if have_sent {
            probes.push(Probe::entry(TCP_XMIT, "stages_xmit"));
            probes.push(Probe::ret(TCP_XMIT, "stages_xmit_ret"));
        } else {
            notes.push(format!("{TCP_XMIT} is not traceable (not iscsi_tcp?): SEND shows '-' and RESP counts from PDU preparation"));
        }
        let have_r2t = kernel.can_probe(R2T);
        if have_r2t {
            probes.push(Probe::entry(R2T, "stages_r2t"));
        } else {
            notes.push(format!("{R2T} is not traceable: R2T counts show '-'"));
        }
        Ok(StagePlan { probes, have_sent, have_r2t, task_lookup, fentry: false, why_kprobes: None, notes })
    }

    /// The plan for a kernel that has every probe point (for --ebpf where
    /// the running kernel cannot be read).
    pub fn assume_all(task_lookup: TaskLookup) -> StagePlan {
        let mut p = StagePlan { probes: Vec::new(), have_sent: true, have_r2t: true, task_lookup, fentry: false, why_kprobes: None, notes: Vec::new() };
        p.probes = vec![
            Probe::entry(QUEUECOMMAND, "stages_queuecommand"),
            Probe::ret(QUEUECOMMAND, "stages_queuecommand_ret"),
            Probe::entry(PREP, "stages_prep"),
            Probe::entry(COMPLETE, "stages_complete"),
            Probe::entry(TCP_XMIT, "stages_xmit"),
            Probe::ret(TCP_XMIT, "stages_xmit_ret"),
            Probe::entry(R2T, "stages_r2t"),
        ];
        p
    }

    pub fn values(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("HAVE_SENT", self.have_sent.into()),
            ("TASK_FROM_SC", Value::Ident(self.task_lookup.macro_name())),
            ("FENTRY", self.fentry.into()),
        ]
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
                    "stages_queuecommand_ret" => (ProbeKind::Fexit, "fexit_queuecommand"),
                    "stages_prep" => (ProbeKind::Fentry, "fentry_prep"),
                    "stages_xmit_ret" => (ProbeKind::Fexit, "fexit_xmit"),
                    "stages_r2t" => (ProbeKind::Fentry, "fentry_r2t"),
                    "stages_complete" => (ProbeKind::Fentry, "fentry_complete"),
                    _ => return None,
                };
                Some(Probe { kind, function: p.function.clone(), handler, module: kernel.module_of(&p.function).map(str::to_string) })
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
    /// Needs root. Returns the plan and, for kprobes, why.
    pub fn prefer_fentry(self, kernel: &Kernel) -> (StagePlan, Option<String>) {
        if std::env::var_os("STORPROTOTRACE_KPROBES").is_some() {
            return (self, Some("STORPROTOTRACE_KPROBES is set".into()));
        }
        if let Some(why) = self.fentry_obstacle(kernel) {
            return (self, Some(why));
        }
        let plan = self.with_fentry(kernel);
        let mut resolver = match crate::fentry::Resolver::new(&kernel.btf_dir) {
            Ok(r) => r,
            Err(e) => return (self, Some(e.to_string())),
        };
        for p in &plan.probes {
            match resolver.target(&p.function, p.module.as_deref()) {
                Ok(t) if crate::fentry::can_attach(&t) => {}
                Ok(_) => return (self, Some(format!("the kernel refuses fentry on {}", p.function))),
                Err(e) => return (self, Some(e.to_string())),
            }
        }
        (plan, None)
    }
}

/// Compile the stage programs and attach them: fentry as planned, and if the
/// kernel refuses the real programs, kprobes after all (said once).
pub fn compile_and_attach(
    tool: &str,
    kernel: &Kernel,
    plan: &mut StagePlan,
    filter: &KernelFilter,
    render: impl Fn(&StagePlan) -> Result<String>,
) -> Result<(bcc::BPF, crate::runner::Links)> {
    let mut bpf = crate::runner::compile(kernel, &render(plan)?)?;
    filter.load_sets(&bpf)?;
    match crate::runner::attach(&mut bpf, &plan.probes) {
        Ok(links) => Ok((bpf, links)),
        Err(e) if plan.fentry => {
            eprintln!("{tool}: note: {e}; using kprobes instead");
            drop(bpf);
            *plan = StagePlan { why_kprobes: Some(e.to_string()), ..StagePlan::choose(kernel, plan.task_lookup)? };
            let mut bpf = crate::runner::compile(kernel, &render(plan)?)?;
            filter.load_sets(&bpf)?;
            let links = crate::runner::attach(&mut bpf, &plan.probes)?;
            Ok((bpf, links))
        }
        Err(e) => Err(e),
    }
}

/// What `--ebpf` renders, with neither root nor iSCSI: the plan for the
/// running kernel where it can be read, else for a kernel that has every
/// probe point; filters resolved where sessions exist, else assumed.
pub fn plan_for_ebpf(kernel: &Kernel, topo: &crate::topology::Topology, filters: &crate::cli::Filters) -> Result<(StagePlan, KernelFilter)> {
    let plan = StagePlan::choose(kernel, TaskLookup::PrivateData).unwrap_or_else(|_| StagePlan::assume_all(TaskLookup::PrivateData));
    let task_lookup = TaskLookup::from_headers(&header_dirs(kernel)).unwrap_or(plan.task_lookup);
    let filter = if topo.sessions.is_empty() { filters.assume_sets() } else { filters.resolve(topo)? };
    let plan = StagePlan { task_lookup, ..plan };
    let plan = if kernel.function_count() > 0 && plan.fentry_obstacle(kernel).is_none() { plan.with_fentry(kernel) } else { plan };
    Ok((plan, filter))
}

/// The checks and choices before tracing iSCSI commands for real: a filter
/// naming something that does not exist is the user's mistake and is said
/// first; then root, headers, modules and sessions; then the probe plan.
pub fn prepare(kernel: &Kernel, topo: &crate::topology::Topology, filters: &crate::cli::Filters) -> Result<(StagePlan, KernelFilter)> {
    if filters.any_session_filter() {
        filters.resolve(topo)?;
    }
    crate::runner::preflight(kernel, true)?;
    if topo.sessions.is_empty() {
        return Err(Error::no_sessions());
    }
    let filter = filters.resolve(topo)?;
    let plan = StagePlan::choose(kernel, TaskLookup::from_headers(&header_dirs(kernel))?)?;
    let (plan, why_kprobes) = plan.prefer_fentry(kernel);
    Ok((StagePlan { why_kprobes, ..plan }, filter))
}

impl StagePlan {
    /// Say once at start what this kernel cannot give; with -v, every probe.
    pub fn announce(&self, tool: &str, kernel: &Kernel, verbose: bool) {
        if verbose {
            eprintln!(
                "kernel {}: functions from {:?}, ring buffer: {}, task lookup: {:?}, {}",
                kernel.release,
                kernel.source,
                kernel.ringbuf,
                self.task_lookup,
                if self.fentry { "fentry/fexit".to_string() } else { format!("kprobes ({})", self.why_kprobes.as_deref().unwrap_or("fentry not tried")) }
            );
            for p in &self.probes {
                eprintln!("probe {}", p.describe());
            }
        }
        for n in &self.notes {
            eprintln!("{tool}: note: {n}");
        }
    }
}

/// Filters every stage program applies in the kernel, resolved to numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFilter {
    /// SCSI hosts (one per iSCSI session) to keep; None = all.
    pub hosts: Option<Vec<u32>>,
    /// host<<32 | lun pairs to keep; None = all.
    pub devices: Option<Vec<u64>>,
    pub lun: Option<u64>,
    pub cid: Option<u32>,
    pub pid: Option<u32>,
    /// 0 all, 1 reads, 2 writes
    pub dir: u8,
}

impl KernelFilter {
    pub fn values(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("FILTER_HOST", self.hosts.is_some().into()),
            ("FILTER_DEV", self.devices.is_some().into()),
            ("FILTER_LUN", self.lun.is_some().into()),
            ("LUN", self.lun.unwrap_or(0).into()),
            ("FILTER_CID", self.cid.is_some().into()),
            ("CID", self.cid.unwrap_or(0).into()),
            ("FILTER_PID", self.pid.is_some().into()),
            ("PID", self.pid.unwrap_or(0).into()),
            ("FILTER_DIR", Value::Int(self.dir as i64)),
        ]
    }

    /// Fill the filter sets of a loaded program.
    pub fn load_sets(&self, bpf: &bcc::BPF) -> Result<()> {
        if let Some(hosts) = &self.hosts {
            let mut t = bpf.table("host_filter")?;
            crate::maps::fill_set(&mut t, hosts, |h: u32| h.to_ne_bytes().to_vec())?;
        }
        if let Some(devs) = &self.devices {
            let mut t = bpf.table("dev_filter")?;
            crate::maps::fill_set(&mut t, devs, |d: u64| d.to_ne_bytes().to_vec())?;
        }
        Ok(())
    }
}

pub fn device_key(host: u32, lun: u64) -> u64 {
    ((host as u64) << 32) | (lun as u32 as u64)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{Kernel, Paths};
    use std::fs;

    fn kernel_with(functions: &str) -> Kernel {
        let d = std::env::temp_dir().join(format!("stpt-stages-{}-{}", std::process::id(), functions.len()));
        let _ = fs::remove_dir_all(&d);
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
        })
    }

    #[test]
    fn full_plan_on_a_kernel_with_everything() {
        let k = kernel_with("iscsi_queuecommand [libiscsi]\niscsi_prep_scsi_cmd_pdu [libiscsi]\niscsi_complete_task [libiscsi]\niscsi_tcp_task_xmit [libiscsi_tcp]\niscsi_requeue_task [libiscsi]\n");
        let p = StagePlan::choose(&k, TaskLookup::PrivateData).unwrap();
        assert!(p.have_sent && p.have_r2t && p.notes.is_empty());
        assert_eq!(p.probes.len(), 7);
        assert!(p.values().contains(&("TASK_FROM_SC", Value::Ident("SC_TASK_PRIV"))));
    }

    #[test]
    fn fentry_plan_maps_every_stage_and_needs_module_btf() {
        let k = kernel_with("iscsi_queuecommand [libiscsi]\niscsi_prep_scsi_cmd_pdu [libiscsi]\niscsi_complete_task [libiscsi]\niscsi_tcp_task_xmit [libiscsi_tcp]\niscsi_requeue_task [libiscsi]\n");
        let p = StagePlan::choose(&k, TaskLookup::PrivateData).unwrap();
        assert_eq!(p.fentry_obstacle(&k).as_deref(), Some("no BPF ring buffer"));
        let f = p.with_fentry(&k);
        assert!(f.fentry && f.values().contains(&("FENTRY", Value::Bool(true))));
        // fexit sees arguments and return value: no entry probe for xmit.
        let got: Vec<String> = f.probes.iter().map(|p| p.describe()).collect();
        assert_eq!(got, [
            "fentry:libiscsi:iscsi_queuecommand -> fentry_queuecommand",
            "fexit:libiscsi:iscsi_queuecommand -> fexit_queuecommand",
            "fentry:libiscsi:iscsi_prep_scsi_cmd_pdu -> fentry_prep",
            "fentry:libiscsi:iscsi_complete_task -> fentry_complete",
            "fexit:libiscsi_tcp:iscsi_tcp_task_xmit -> fexit_xmit",
            "fentry:libiscsi:iscsi_requeue_task -> fentry_r2t",
        ]);
        assert!(!p.fentry && p.values().contains(&("FENTRY", Value::Bool(false))));
    }

    #[test]
    fn missing_xmit_is_said_not_guessed() {
        let k = kernel_with("iscsi_queuecommand\niscsi_prep_scsi_cmd_pdu\niscsi_complete_task\n");
        let p = StagePlan::choose(&k, TaskLookup::ScsiPointer).unwrap();
        assert!(!p.have_sent && !p.have_r2t);
        assert_eq!(p.notes.len(), 2);
        assert!(p.notes[0].contains("SEND shows '-'"));
    }

    #[test]
    fn missing_completion_is_an_error() {
        let k = kernel_with("iscsi_queuecommand\niscsi_prep_scsi_cmd_pdu\n");
        let e = StagePlan::choose(&k, TaskLookup::ScsiPointer).unwrap_err();
        assert!(e.to_string().contains("iscsi_complete_task"));
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn task_lookup_from_headers() {
        let d = std::env::temp_dir().join(format!("stpt-hdr-{}", std::process::id()));
        fs::create_dir_all(d.join("old/include/scsi")).unwrap();
        fs::create_dir_all(d.join("new/include/scsi")).unwrap();
        fs::write(d.join("old/include/scsi/libiscsi.h"), "struct iscsi_task {\n};\n").unwrap();
        fs::write(d.join("new/include/scsi/libiscsi.h"), "struct iscsi_cmd {\n\tstruct iscsi_task *task;\n};\n").unwrap();
        assert_eq!(TaskLookup::from_headers(&[d.join("nothing"), d.join("old")]).unwrap(), TaskLookup::ScsiPointer);
        assert_eq!(TaskLookup::from_headers(&[d.join("new")]).unwrap(), TaskLookup::PrivateData);
        assert!(TaskLookup::from_headers(&[d.join("nothing")]).is_err());
    }

    #[test]
    fn filter_values_are_numbers() {
        let f = KernelFilter { hosts: Some(vec![2]), lun: Some(1), dir: 2, ..Default::default() };
        let v = f.values();
        assert!(v.contains(&("FILTER_HOST", Value::Bool(true))));
        assert!(v.contains(&("LUN", Value::Int(1))));
        assert!(v.contains(&("FILTER_DIR", Value::Int(2))));
        assert!(v.contains(&("FILTER_PID", Value::Bool(false))));
        assert_eq!(device_key(3, 1), (3u64 << 32) | 1);
    }
}
