//! usage: kfunc-probe DISK IOS
//! Compiles one program with four handlers on two libiscsi functions:
//! `kfunc__libiscsi__iscsi_queuecommand` / `kretfunc__libiscsi__iscsi_complete_task`
//! loaded by libbcc itself (`bcc_prog_load`, which on bcc 0.28+ parses the
//! module out of the name and finds its BTF), and the same two loaded by
//! src/bpf/fentry.rs; runs fio for IOS reads on DISK and prints each program's
//! hits beside the disk's own count of completed reads (/sys/block/DISK/stat).
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::time::Instant;
use storprototrace::bpf::runner::{self, Probe, ProbeKind};

#[link(name = "bcc")]
extern "C" {
    fn bcc_prog_load(prog_type: c_int, name: *const c_char, insns: *const c_void, prog_len: c_int, license: *const c_char,
                     kern_version: c_uint, log_level: c_int, log_buf: *mut c_char, log_buf_size: c_uint) -> c_int;
    fn bpf_attach_kfunc(prog_fd: c_int) -> c_int;
}

const TEXT: &str = r#"
BPF_ARRAY(hits, u64, 4);
static __always_inline void bump(u32 k) { u64 *v = hits.lookup(&k); if (v) __sync_fetch_and_add(v, 1); }
int kfunc__libiscsi__iscsi_queuecommand(u64 *ctx) { bump(0); return 0; }
int kretfunc__libiscsi__iscsi_complete_task(u64 *ctx) { bump(1); return 0; }
int ours_queuecommand(u64 *ctx) { bump(2); return 0; }
int ours_complete_task(u64 *ctx) { bump(3); return 0; }
"#;

fn reads(disk: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/block/{disk}/stat")).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (disk, ios) = (&a[1], &a[2]);
    let kernel = storprototrace::kernel::Kernel::detect();
    let t = Instant::now();
    let mut bpf = runner::compile(&kernel, TEXT).expect("compile");
    println!("compile: {:.1} s", t.elapsed().as_secs_f64());
    // libbcc's own path
    let mut bcc_links = Vec::new();
    for name in ["kfunc__libiscsi__iscsi_queuecommand", "kretfunc__libiscsi__iscsi_complete_task"] {
        let insns = bpf.dump_func(CString::new(name).unwrap()).expect("dump_func");
        let cname = CString::new(name).unwrap();
        let t = Instant::now();
        let mut log = vec![0u8; 1 << 16];
        let fd = unsafe {
            bcc_prog_load(26, cname.as_ptr(), insns.as_ptr() as *const c_void, insns.len() as c_int, c"GPL".as_ptr(), 0, 1,
                          log.as_mut_ptr() as *mut c_char, log.len() as c_uint)
        };
        if fd < 0 {
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&c| c == 0).unwrap_or(0)]).into_owned();
            println!("libbcc load {name}: FAILED ({}): {}", std::io::Error::last_os_error(), text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("(no log)"));
            continue;
        }
        let link = unsafe { bpf_attach_kfunc(fd) };
        println!("libbcc load {name}: prog fd {fd}, attach {} ({:.1} ms)", if link >= 0 { "ok".to_string() } else { std::io::Error::last_os_error().to_string() }, t.elapsed().as_secs_f64() * 1e3);
        bcc_links.push((fd, link));
    }
    // src/bpf/fentry.rs
    let probes = [
        Probe { kind: ProbeKind::Fentry, function: "iscsi_queuecommand".into(), handler: "ours_queuecommand", module: Some("libiscsi".into()) },
        Probe { kind: ProbeKind::Fexit, function: "iscsi_complete_task".into(), handler: "ours_complete_task", module: Some("libiscsi".into()) },
    ];
    let t = Instant::now();
    let mut resolver = storprototrace::bpf::fentry::Resolver::new(std::path::Path::new(storprototrace::kernel::BTF_DIR)).expect("kernel BTF");
    let mut targets = storprototrace::bpf::fentry::Targets::default();
    for p in &probes {
        targets.insert(resolver.target(&p.function, p.module.as_deref()).expect("BTF target"));
    }
    let _links = runner::attach(&mut bpf, &probes, &targets).expect("src/bpf/fentry.rs attach");
    println!("src/bpf/fentry.rs load+attach (BTF read included): {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let before = reads(disk);
    let st = std::process::Command::new("fio")
        .args(["--name=k", &format!("--filename=/dev/{disk}"), "--rw=randread", "--bs=4k", "--direct=1", "--ioengine=psync",
               &format!("--number_ios={ios}"), "--size=64m", "--output-format=terse"])
        .stdout(std::process::Stdio::null()).status().unwrap();
    assert!(st.success());
    let disk_reads = reads(disk) - before;
    let mut hits = bpf.table("hits").unwrap();
    let mut get = |k: u32| -> u64 {
        let v = hits.get(&mut k.to_ne_bytes()).unwrap();
        u64::from_ne_bytes(v[..8].try_into().unwrap())
    };
    let h: Vec<u64> = (0..4).map(&mut get).collect();
    println!("fio reads {ios}; disk's completed reads {disk_reads}");
    println!("libbcc kfunc   queuecommand {} complete_task(fexit) {}", h[0], h[1]);
    println!("src/bpf/fentry.rs  queuecommand {} complete_task(fexit) {}", h[2], h[3]);
}
