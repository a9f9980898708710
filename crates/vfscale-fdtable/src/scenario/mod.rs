//! Descriptor scenarios (`shared/specs/fd-scenarios.md`): replayable descriptions of
//! descriptor-table activity, run against this library or against the running kernel
//! so that the two result streams can be compared.

pub mod kernel;
pub mod library;
mod model;

pub use model::*;
