//! Lock scenarios (`docs/scenarios/locks.md`): replayable descriptions of file-lock
//! activity, run against `vfscale-locks` or against the running kernel so the two result
//! streams can be compared.

mod format;
pub mod kernel;
pub mod library;
pub mod mixed;

pub use kernel::KernelOptions;
pub use library::{LibraryReplay, NamedLock};

pub use format::*;
