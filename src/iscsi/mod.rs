//! The iSCSI topology from sysfs: sessions, connections, LUNs and their
//! disks, and block device numbers and names; a TEST UNIT READY to a disk.

pub mod blockdev;
pub mod topology;
pub mod tur;
