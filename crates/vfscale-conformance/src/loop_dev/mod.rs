//! Loop scenarios (`docs/scenarios/loop.md`): replayable descriptions of loop-device
//! activity (backing files, device handles, the loop ioctls, block I/O, the registry),
//! run against `vfscale-loop` or against the running kernel's `/dev/loop*` so the two
//! result streams can be compared.

mod format;
pub mod kernel;
pub mod library;
pub mod reference;

pub use format::*;
/// The library's settings, for the runners' callers.
pub use vfscale_loop::{CtlLock, Settings};
