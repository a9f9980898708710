//! The synchronization primitives this crate runs on: `vfscale-sync`'s (parking_lot and
//! std normally, loom under `--cfg vfscale_loom`, shuttle under `--cfg vfscale_shuttle`).

pub use vfscale_sync::*;
