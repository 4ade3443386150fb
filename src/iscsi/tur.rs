//! TEST UNIT READY through SG_IO, as sg_turs sends it: a command the target
//! answers from memory, so its exchange is a clean round trip of the
//! connection it crosses (bpf_templates/iscsi_stages.c, NO_MEDIA_OP).

use crate::{Error, Result};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;

/// include/uapi/scsi/sg.h
const SG_IO: libc::c_ulong = 0x2285;
const SG_DXFER_NONE: libc::c_int = -1;

/// struct sg_io_hdr (include/uapi/scsi/sg.h).
#[repr(C)]
struct SgIoHdr {
    interface_id: libc::c_int,
    dxfer_direction: libc::c_int,
    cmd_len: u8,
    mx_sb_len: u8,
    iovec_count: u16,
    dxfer_len: libc::c_uint,
    dxferp: *mut libc::c_void,
    cmdp: *const u8,
    sbp: *mut u8,
    timeout: libc::c_uint,
    flags: libc::c_uint,
    pack_id: libc::c_int,
    usr_ptr: *mut libc::c_void,
    status: u8,
    masked_status: u8,
    msg_status: u8,
    sb_len_wr: u8,
    host_status: u16,
    driver_status: u16,
    resid: libc::c_int,
    duration: libc::c_uint,
    info: libc::c_uint,
}

/// Send one TEST UNIT READY to `disk` (a name under /dev, e.g. `sdb`) and
/// return the SCSI status the target answered (0: GOOD; 2: CHECK
/// CONDITION, a round trip all the same). Times out after `timeout_ms`.
pub fn test_unit_ready(disk: &str, timeout_ms: u32) -> Result<u8> {
    let path = format!("/dev/{disk}");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| Error::io(format!("{path}: {e}")))?;
    let cdb = [0u8; 6];
    let mut sense = [0u8; 32];
    let mut hdr = SgIoHdr {
        interface_id: b'S' as libc::c_int,
        dxfer_direction: SG_DXFER_NONE,
        cmd_len: cdb.len() as u8,
        mx_sb_len: sense.len() as u8,
        iovec_count: 0,
        dxfer_len: 0,
        dxferp: std::ptr::null_mut(),
        cmdp: cdb.as_ptr(),
        sbp: sense.as_mut_ptr(),
        timeout: timeout_ms,
        flags: 0,
        pack_id: 0,
        usr_ptr: std::ptr::null_mut(),
        status: 0,
        masked_status: 0,
        msg_status: 0,
        sb_len_wr: 0,
        host_status: 0,
        driver_status: 0,
        resid: 0,
        duration: 0,
        info: 0,
    };
    // SAFETY: hdr and the buffers it points to live across the call, and
    // their lengths are the ones given in it.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), SG_IO as _, &mut hdr as *mut SgIoHdr) };
    if rc < 0 {
        return Err(Error::io(format!("{path}: SG_IO: {}", std::io::Error::last_os_error())));
    }
    if hdr.host_status != 0 || hdr.driver_status & 0x0f != 0 {
        return Err(Error::io(format!(
            "{path}: TEST UNIT READY not answered (host status {:#x}, driver status {:#x})",
            hdr.host_status, hdr.driver_status
        )));
    }
    Ok(hdr.status)
}

#[cfg(test)]
mod tests {
    /// sizeof(struct sg_io_hdr) on x86-64 and arm64 (64-bit pointers): the
    /// kernel copies that many bytes in and out.
    #[test]
    fn sg_io_hdr_has_the_kernel_size() {
        assert_eq!(std::mem::size_of::<super::SgIoHdr>(), 88);
    }
}
