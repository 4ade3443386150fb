//! The iSCSI topology from sysfs: sessions, connections, LUNs and their
//! disks, and block device numbers and names.

pub mod blockdev;
pub mod topology;
