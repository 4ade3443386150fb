//! The bpf(2) syscall and the byte-level access its attribute unions need,
//! for what libbcc does not do: loading fentry programs against module BTF
//! and reading program info.

pub(crate) fn bpf(cmd: i64, attr: &mut [u8]) -> std::io::Result<i64> {
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub(crate) fn put32(a: &mut [u8], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

pub(crate) fn get32(a: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([a[off], a[off + 1], a[off + 2], a[off + 3]])
}

pub(crate) fn get64(a: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&a[off..off + 8]);
    u64::from_ne_bytes(b)
}

pub(crate) fn put64(a: &mut [u8], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}
