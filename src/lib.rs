//! storprototrace: BCC-style eBPF tools for the Linux iSCSI initiator.
//!
//! The library's API for other programs is [`command_tracer`]: start a
//! tracer of iSCSI commands with isclatency's filters and threshold, and
//! receive each command's record (see `examples/slow_per_target.rs`).
//! [`Error`] says what failed.
//!
//! The other modules serve this package's tools (`tools/`, thin binaries:
//! argument parsing, their plan, a print loop). They are public only
//! because the tools are separate crates, and are hidden from these docs.
//! They are folders by concern, and dependencies run one way, down this
//! list (docs/design.md has the map):
//!
//! - tool families: `stages` (isclatency and iscstat: the per-command
//!   stage plan, filters, statistics, views, Prometheus, exporter),
//!   `freeze` (iscfreeze), `states` (iscstates), `submit` (submitslower);
//! - `start`: the one start-up path every tool takes (checks, `--ebpf`,
//!   compile, attach, signals, the exit summary);
//! - `bpf`: C templates and their substitution, compile/attach/read, maps
//!   and counter slots, the fentry loader, event records;
//! - `iscsi`: sessions, connections, LUNs and disks, from sysfs;
//! - `kernel`: what the running kernel offers (traceable functions,
//!   kallsyms, BTF, headers, the kernel types written for a program);
//! - `cli` and [`error`]: flags every tool shares, output, JSON, textfiles,
//!   the error type and its one printer.
#![deny(missing_docs)]

pub mod command_tracer;
pub mod error;

#[doc(hidden)]
pub mod bpf;
#[doc(hidden)]
pub mod cli;
#[doc(hidden)]
pub mod freeze;
#[doc(hidden)]
pub mod iscsi;
#[doc(hidden)]
pub mod kernel;
#[doc(hidden)]
pub mod stages;
#[doc(hidden)]
pub mod start;
#[doc(hidden)]
pub mod states;
#[doc(hidden)]
pub mod submit;

pub use command_tracer::{CommandRecord, CommandTracer, Options};
pub use error::{Error, Result};
