//! What the running kernel offers: traceable functions, tracepoints, BTF,
//! the BPF ring buffer, kernel headers, loaded iSCSI modules. Tools choose
//! their attach points from this, never from a version number.

pub mod btf;
pub mod cgroup;
pub mod headers;
pub mod ksyms;
pub mod types;

use crate::error::{Error, Result};
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionSource {
    /// tracefs `available_filter_functions`: exactly what kprobes can attach to.
    FilterFunctions,
    /// `/proc/kallsyms` text symbols: a fallback when tracefs is not mounted.
    Kallsyms,
    None,
}

#[derive(Debug, Clone)]
pub struct Kernel {
    pub release: String,
    pub source: FunctionSource,
    /// Traceable functions and the module each is in (None: vmlinux).
    functions: Functions,
    /// `/sys/kernel/btf`: vmlinux's BTF and each module's.
    pub btf_dir: PathBuf,
    tracefs: Option<PathBuf>,
    pub btf: bool,
    pub ringbuf: bool,
    /// Directory BCC takes headers from (has `include/`), if any.
    pub headers: Option<PathBuf>,
    pub headers_wanted: PathBuf,
    pub kheaders: bool,
    /// Compiler flags the kernel itself was built with that its headers
    /// need (7.x headers use anonymous struct members: -fms-extensions).
    pub cflags: Vec<String>,
    /// Functions taken as not traceable although they are (Paths).
    untraceable: Vec<String>,
}

/// Where to look; `Paths::system()` for the running kernel, a fixture in tests.
#[derive(Debug, Clone)]
pub struct Paths {
    pub tracefs: Vec<PathBuf>,
    pub kallsyms: PathBuf,
    pub btf: PathBuf,
    pub modules_root: PathBuf,
    pub sys_module: PathBuf,
    pub kheaders: PathBuf,
    pub release: String,
    /// BCC_KERNEL_SOURCE, honoured as BCC itself does.
    pub headers_override: Option<PathBuf>,
    /// STORPROTOTRACE_UNTRACEABLE (comma-separated function names): taken
    /// as not traceable, to run a tool as on a kernel that lacks them.
    pub untraceable: Vec<String>,
}

impl Paths {
    pub fn system() -> Paths {
        Paths {
            tracefs: vec!["/sys/kernel/tracing".into(), "/sys/kernel/debug/tracing".into()],
            kallsyms: "/proc/kallsyms".into(),
            btf: "/sys/kernel/btf/vmlinux".into(),
            modules_root: "/lib/modules".into(),
            sys_module: "/sys/module".into(),
            kheaders: "/sys/kernel/kheaders.tar.xz".into(),
            release: uname_release(),
            headers_override: std::env::var_os("BCC_KERNEL_SOURCE").map(PathBuf::from),
            untraceable: std::env::var("STORPROTOTRACE_UNTRACEABLE")
                .map(|v| v.split(',').map(str::trim).filter(|f| !f.is_empty()).map(str::to_string).collect())
                .unwrap_or_default(),
        }
    }
}

/// Where the running kernel publishes its BTF (vmlinux and one per module).
pub const BTF_DIR: &str = "/sys/kernel/btf";

pub fn uname_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

impl Kernel {
    pub fn detect() -> Kernel {
        Kernel::from_paths(&Paths::system())
    }

    pub fn from_paths(p: &Paths) -> Kernel {
        let tracefs = p.tracefs.iter().find(|d| d.join("available_filter_functions").exists()).cloned();
        // kallsyms is read once: for the ring buffer, and for the functions
        // where tracefs cannot say.
        let kallsyms = fs::read_to_string(&p.kallsyms).ok();
        let ringbuf = kallsyms
            .as_deref()
            .unwrap_or("")
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some("bpf_ringbuf_output"));
        let (source, functions) =
            match tracefs.as_ref().and_then(|d| fs::read_to_string(d.join("available_filter_functions")).ok()) {
                Some(text) if !text.is_empty() => (FunctionSource::FilterFunctions, parse_filter_functions(&text)),
                _ => match &kallsyms {
                    Some(text) => (FunctionSource::Kallsyms, parse_kallsyms(text)),
                    None => (FunctionSource::None, Functions::default()),
                },
            };
        let headers_wanted =
            p.headers_override.clone().unwrap_or_else(|| p.modules_root.join(&p.release).join("build"));
        let headers = if headers_wanted.join("include").is_dir() { Some(headers_wanted.clone()) } else { None };
        let cflags = headers_wanted_cflags(&headers_wanted);
        Kernel {
            release: p.release.clone(),
            cflags,
            source,
            functions,
            tracefs,
            btf: p.btf.exists(),
            btf_dir: p.btf.parent().map(Path::to_path_buf).unwrap_or_default(),
            ringbuf,
            headers,
            headers_wanted,
            kheaders: p.kheaders.exists() && p.headers_override.is_none(),
            untraceable: p.untraceable.clone(),
        }
    }

    pub fn can_probe(&self, function: &str) -> bool {
        self.functions.get(function).is_some() && !self.untraceable.iter().any(|f| f == function)
    }

    /// The module a traceable function is in; None for vmlinux or unknown.
    pub fn module_of(&self, function: &str) -> Option<&str> {
        self.functions.get(function).flatten()
    }

    /// The first candidate the kernel can probe.
    pub fn first_of<'a>(&self, candidates: &[&'a str]) -> Option<&'a str> {
        candidates.iter().copied().find(|f| self.can_probe(f))
    }

    pub fn has_tracepoint(&self, system: &str, event: &str) -> bool {
        self.tracefs.as_ref().map(|d| d.join("events").join(system).join(event).is_dir()).unwrap_or(false)
    }

    /// Headers BCC can compile against, or the error that says what to do.
    pub fn require_headers(&self) -> Result<()> {
        if self.headers.is_some() || self.kheaders {
            Ok(())
        } else {
            Err(Error::no_headers(&self.headers_wanted.display().to_string()))
        }
    }

    pub fn function_count(&self) -> usize {
        self.functions.len()
    }
}

/// Flags from the headers' generated autoconf.h; only known ones are passed.
fn headers_wanted_cflags(build: &Path) -> Vec<String> {
    let text = fs::read_to_string(build.join("include/generated/autoconf.h")).unwrap_or_default();
    cflags_from_autoconf(&text)
}

pub fn cflags_from_autoconf(autoconf: &str) -> Vec<String> {
    let mut v = Vec::new();
    if autoconf.lines().any(|l| l.trim() == "#define CONFIG_CC_MS_EXTENSIONS \"-fms-extensions\"") {
        v.push("-fms-extensions".to_string());
    }
    v
}

pub fn module_loaded(sys_module: &Path, name: &str) -> bool {
    sys_module.join(name).is_dir()
}

pub fn require_root() -> Result<()> {
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(Error::NotRoot)
    }
}

/// Traceable functions and the module of each (None: vmlinux), sorted by
/// name in one string: about 30 bytes per function where a map of owned
/// strings took about 100 (50,000-120,000 functions, held while clang
/// compiles, it is part of the peak RSS). A name listed twice keeps its last module.
#[derive(Debug, Clone, Default)]
pub struct Functions {
    text: String,
    /// (start in `text`, name length, module length; 0: vmlinux)
    entries: Vec<(u32, u16, u16)>,
}

impl Functions {
    fn from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> Functions {
        let mut v: Vec<(&str, Option<&str>)> = pairs.collect();
        v.sort_by(|a, b| a.0.cmp(b.0)); // stable: duplicates stay in file order
        let mut f = Functions::default();
        for (name, module) in v {
            let m = module.unwrap_or("");
            let (Ok(nl), Ok(ml), Ok(start)) =
                (u16::try_from(name.len()), u16::try_from(m.len()), u32::try_from(f.text.len()))
            else {
                continue;
            };
            if f.entries.last().is_some_and(|e| f.name(e) == name) {
                f.entries.pop();
            }
            f.text.push_str(name);
            f.text.push_str(m);
            f.entries.push((start, nl, ml));
        }
        f.text.shrink_to_fit();
        f.entries.shrink_to_fit();
        f
    }

    fn name(&self, &(start, n, _): &(u32, u16, u16)) -> &str {
        &self.text[start as usize..start as usize + n as usize]
    }

    /// None: not traceable; Some(None): in vmlinux; Some(Some(m)): in module m.
    pub fn get(&self, function: &str) -> Option<Option<&str>> {
        let i = self.entries.binary_search_by(|e| self.name(e).cmp(function)).ok()?;
        let (start, n, m) = self.entries[i];
        let from = start as usize + n as usize;
        Some((m > 0).then(|| &self.text[from..from + m as usize]))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `name [module]` per line; notrace duplicates and `__ftrace_invalid_address___`
/// entries are kept as names (they never match a real function).
pub fn parse_filter_functions(text: &str) -> Functions {
    Functions::from_pairs(text.lines().filter_map(|l| {
        let mut it = l.split_whitespace();
        let name = it.next()?;
        Some((name, module_field(it.next())))
    }))
}

fn module_field(f: Option<&str>) -> Option<&str> {
    f.and_then(|m| m.strip_prefix('[')).and_then(|m| m.strip_suffix(']'))
}

/// `address type name [module]`; text symbols (t/T) only.
pub fn parse_kallsyms(text: &str) -> Functions {
    Functions::from_pairs(
        text.lines()
            .filter_map(crate::kernel::ksyms::parse_line)
            .filter(|&(_, kind, _, _)| matches!(kind, 't' | 'T'))
            .map(|(_, _, name, module)| (name, module)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(dir: &Path, filter_functions: Option<&str>, kallsyms: &str) -> Paths {
        fs::create_dir_all(dir).unwrap();
        let tracing = dir.join("tracing");
        fs::create_dir_all(tracing.join("events/scsi/scsi_dispatch_cmd_start")).unwrap();
        if let Some(ff) = filter_functions {
            fs::write(tracing.join("available_filter_functions"), ff).unwrap();
        }
        fs::write(dir.join("kallsyms"), kallsyms).unwrap();
        Paths {
            tracefs: vec![tracing],
            kallsyms: dir.join("kallsyms"),
            btf: dir.join("btf-vmlinux"),
            modules_root: dir.join("modules"),
            sys_module: dir.join("module"),
            kheaders: dir.join("kheaders.tar.xz"),
            release: "6.1.0-57-amd64".into(),
            headers_override: None,
            untraceable: Vec::new(),
        }
    }

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn functions_sorted_in_one_string() {
        let f = parse_filter_functions(
            "zeta [m1]\nalpha\nmid [libiscsi]\nalpha [later]\n\n__ftrace_invalid_address___12\n",
        );
        assert_eq!(f.len(), 4);
        assert_eq!(f.get("zeta"), Some(Some("m1")));
        assert_eq!(f.get("mid"), Some(Some("libiscsi")));
        assert_eq!(f.get("alpha"), Some(Some("later")), "a name listed twice keeps its last module, as the map did");
        assert_eq!(f.get("alph"), None);
        assert_eq!(f.get("zzz"), None);
        assert_eq!(f.get(""), None);
        let k = parse_kallsyms(
            "ffffffff81000000 T start_x\nffffffff81000010 d data_x\nffffffffc0000000 t mod_fn [libiscsi]\n",
        );
        assert_eq!(
            (k.len(), k.get("start_x"), k.get("mod_fn"), k.get("data_x")),
            (2, Some(None), Some(Some("libiscsi")), None)
        );
        assert!(Functions::default().is_empty());
    }

    #[test]
    fn filter_functions_win_over_kallsyms() {
        let t = tmp();
        let p = fixture(
            t.path(),
            Some("iscsi_queuecommand [libiscsi]\niscsi_tcp_task_xmit [libiscsi_tcp]\nsubmit_bio_noacct\n"),
            "ffffffff81000000 T bpf_ringbuf_output\nffffffffc0000000 t iscsi_requeue_task [libiscsi]\n",
        );
        let k = Kernel::from_paths(&p);
        assert_eq!(k.source, FunctionSource::FilterFunctions);
        assert!(k.can_probe("iscsi_queuecommand"));
        assert_eq!(k.module_of("iscsi_tcp_task_xmit"), Some("libiscsi_tcp"));
        assert_eq!(k.module_of("submit_bio_noacct"), None);
        assert!(!k.can_probe("iscsi_requeue_task"), "kallsyms is not consulted when tracefs answers");
        assert_eq!(k.first_of(&["generic_make_request", "submit_bio_noacct"]), Some("submit_bio_noacct"));
        assert!(k.ringbuf);
        assert!(k.has_tracepoint("scsi", "scsi_dispatch_cmd_start"));
        assert!(!k.has_tracepoint("scsi", "scsi_dispatch_cmd_done"));
        assert!(!k.btf);
        let k = Kernel::from_paths(&Paths { untraceable: vec!["iscsi_tcp_task_xmit".into()], ..p });
        assert!(!k.can_probe("iscsi_tcp_task_xmit"), "taken as not traceable");
        assert!(k.can_probe("iscsi_queuecommand"));
    }

    #[test]
    fn ms_extensions_follow_the_kernel_config() {
        assert_eq!(
            cflags_from_autoconf("#define CONFIG_X 1\n#define CONFIG_CC_MS_EXTENSIONS \"-fms-extensions\"\n"),
            vec!["-fms-extensions"]
        );
        assert!(cflags_from_autoconf("#define CONFIG_CC_MS_EXTENSIONS \"-fevil; rm\"\n").is_empty());
        assert!(cflags_from_autoconf("").is_empty());
    }

    #[test]
    fn kallsyms_fallback_takes_text_symbols_only() {
        let t = tmp();
        let p = fixture(
            t.path(),
            None,
            "0000000000000000 T iscsi_queuecommand [libiscsi]\n0000000000000000 d iscsi_data [libiscsi]\n",
        );
        let k = Kernel::from_paths(&p);
        assert_eq!(k.source, FunctionSource::Kallsyms);
        assert!(k.can_probe("iscsi_queuecommand"));
        assert!(!k.can_probe("iscsi_data"));
        assert_eq!(k.module_of("iscsi_queuecommand"), Some("libiscsi"));
        assert!(!k.ringbuf);
    }

    #[test]
    fn missing_headers_name_the_path() {
        let t = tmp();
        let d = t.path();
        let mut p = fixture(d, Some(""), "");
        let k = Kernel::from_paths(&p);
        let e = k.require_headers().unwrap_err();
        assert!(e.to_string().contains("modules/6.1.0-57-amd64/build"), "{e}");
        fs::create_dir_all(d.join("modules/6.1.0-57-amd64/build/include")).unwrap();
        assert!(Kernel::from_paths(&p).require_headers().is_ok());
        p.headers_override = Some(d.join("nowhere"));
        let e = Kernel::from_paths(&p).require_headers().unwrap_err();
        assert!(e.to_string().contains("nowhere"));
    }
}
