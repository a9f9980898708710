//! The harness the lab's experiments and the kernel runners share: how a team of
//! workers starts together, how a timed team is driven, where their files go, and the
//! limits raised for them.
//!
//! | concept | file |
//! |---|---|
//! | [`StartGate`]: workers wait, the driver opens (or aborts) once all are there | `start_gate.rs` |
//! | [`drive`]: a timed team of threads counting ops in padded [`Counter`]s | `timed_threads.rs` |
//! | [`Team`]: forked worker processes behind a pipe barrier, slots in shared memory | `fork_team.rs` |
//! | [`SharedArray`]: per-worker records in memory shared with forked workers | `shared_array.rs` |
//! | [`ScratchDir`]: a fresh directory per run, removed on drop; [`check_tmpfs`] | `scratch.rs` |
//! | [`raise_nofile`]: `RLIMIT_NOFILE` for a workload's descriptors | `rlimit.rs` |
//!
//! Errors are `io::Error`s whose message says what failed and where; callers map them
//! (the lab into its `Skip`, the kernel runners into their `String`s).

mod fork_team;
mod rlimit;
mod scratch;
mod shared_array;
mod start_gate;
mod timed_threads;

pub use fork_team::{
    errno, map_shared, mono_ns, probe_fork, ForkedWork, Team, WorkFailed, Worker, WorkerSlot,
};
pub use rlimit::raise_nofile;
pub use scratch::{check_tmpfs, ScratchDir};
pub use shared_array::SharedArray;
pub use start_gate::StartGate;
pub use timed_threads::{drive, Counter, Outcome};
