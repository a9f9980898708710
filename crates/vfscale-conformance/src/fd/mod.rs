//! Descriptor scenarios (`docs/scenarios/fd.md`): replayable descriptions of
//! descriptor-table activity, run against `vfscale-fdtable` or against the running kernel
//! so that the two result streams can be compared.

mod format;
pub mod kernel;
pub mod library;

pub use format::*;
