//! The synchronization primitives of the pieces the loom models check (`waiting.rs`,
//! `call.rs`): `vfscale-sync`'s, so that under `--cfg vfscale_loom` they are loom's.

pub(crate) use vfscale_sync::{AtomicU64, Mutex, Ordering};
