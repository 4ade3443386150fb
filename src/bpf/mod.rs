//! BPF plumbing: the C templates and their substitution, compiling,
//! attaching and reading events, maps and counter slots, the fentry
//! loader, and the records the programs send.

pub mod events;
pub mod fentry;
#[cfg(test)]
pub(crate) mod layout;
pub mod maps;
pub mod progs;
pub mod runner;
pub(crate) mod syscall;
pub mod templates;
