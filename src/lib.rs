//! storprototrace: BCC-style eBPF tools for the Linux iSCSI initiator.
//!
//! The binaries in `tools/` are thin: argument parsing, template values, a
//! print loop. Everything two tools share lives here, one small module per
//! job, with one-way dependencies (lower modules never import higher ones):
//!
//! - what the machine offers: `kernel` (traceable functions, ring buffer,
//!   headers), `ksyms` (kallsyms), `headers` (struct layouts from the kernel
//!   headers), `btf` and `fentry` (fentry/fexit on module functions),
//!   `topology` (iSCSI sessions from sysfs), `blockdev` (dev_t and names);
//! - the programs: `templates` (C text and substitution), `runner`
//!   (compile, attach, read events), `maps` (map walks, counter slots);
//! - records: `events` (ring-buffer records), `stats` (iscstat's rows),
//!   `layout` (C struct layouts, for the tests that check the decoders);
//! - what the tools choose: `filters` (session/LUN/disk filters), `stages`
//!   (isclatency's and iscstat's probe plan and start-up), `freeze`
//!   (iscfreeze's plan and freeze/waiter matching);
//!   `states` (iscstates' probes, session episodes);
//! - output: `output`, `json`, `prom`, `latency_view` (isclatency's lines),
//!   `stat_view` (iscstat's reports); `cli` and `error` for every tool.

pub mod blockdev;
pub mod btf;
pub mod cli;
pub mod error;
pub mod events;
pub mod exporter;
pub mod fentry;
pub mod filters;
pub mod freeze;
pub mod headers;
pub mod json;
pub mod kernel;
pub mod kernel_types;
pub mod ksyms;
pub mod latency_view;
pub mod layout;
pub mod maps;
pub mod output;
pub mod progs;
pub mod prom;
pub mod runner;
pub mod stages;
pub mod stat_view;
pub mod states;
pub mod stats;
pub mod templates;
pub mod topology;

pub use error::{Error, Result};
