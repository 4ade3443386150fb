//! storprototrace: BCC-style eBPF tools for the Linux iSCSI initiator.
//!
//! The binaries in `tools/` are thin: argument parsing, their plan, a print
//! loop. Everything two tools share lives here, in folders by concern.
//! Dependencies run one way, down this list:
//!
//! - tool families: [`stages`] (isclatency and iscstat: the per-command
//!   stage plan, filters, statistics, views, Prometheus, exporter),
//!   [`freeze`] (iscfreeze), [`states`] (iscstates), [`submit`]
//!   (submitslower);
//! - [`start`]: the one start-up path every tool takes (checks, `--ebpf`,
//!   compile, attach, signals);
//! - [`bpf`]: C templates and their substitution, compile/attach/read,
//!   maps and counter slots, the fentry loader, event records;
//! - [`iscsi`]: sessions, connections, LUNs and disks, from sysfs;
//! - [`kernel`]: what the running kernel offers (traceable functions,
//!   kallsyms, BTF, headers, the kernel types written for a program);
//! - [`cli`] and [`error`]: flags every tool shares, output, JSON, the
//!   error type and its one printer.

pub mod bpf;
pub mod cli;
pub mod error;
pub mod freeze;
pub mod iscsi;
pub mod kernel;
pub mod stages;
pub mod start;
pub mod states;
pub mod submit;

pub use error::{Error, Result};
