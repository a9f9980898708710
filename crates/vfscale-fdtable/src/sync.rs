//! The synchronization primitives this crate runs on: `vfscale-sync`'s (parking_lot and
//! std normally, loom under `--cfg vfscale_loom`, shuttle under `--cfg vfscale_shuttle`).
//! Deferred reclamation is `crossbeam-epoch`, or its model under loom and shuttle (see
//! [`crate::epoch`]).

pub use vfscale_sync::*;
