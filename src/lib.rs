//! storprototrace: BCC-style eBPF tools for the Linux iSCSI initiator.
//!
//! The binaries in `tools/` are thin: argument parsing, a template, a print
//! loop. Everything two tools share lives here, one small module per job.

pub mod btf;
pub mod cli;
pub mod error;
pub mod events;
pub mod fentry;
pub mod freeze;
pub mod json;
pub mod kernel;
pub mod maps;
pub mod output;
pub mod prom;
pub mod runner;
pub mod stages;
pub mod stats;
pub mod templates;
pub mod topology;

pub use error::{Error, Result};
