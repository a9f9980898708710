//! The waiter a lookup blocks on: vfscale-sync's shared [`Waiter`], made the way an
//! inode wait needs it. Nothing else lives here: the rest of the crate reaches the waiter
//! through this module only.

use std::time::Instant;

use crate::sync::Arc;

pub use vfscale_sync::Interrupter;
pub(crate) use vfscale_sync::WaitOutcome;

/// One waiting task: a thread on the condition variable, or a future's waker.
pub(crate) type Waiter = vfscale_sync::Waiter<()>;

/// A shared reference to a [`Waiter`]: the sync shim's `Arc` (loom's under loom), which
/// an [`Interrupter`] can hold.
pub(crate) type WaiterRef = Arc<Waiter>;

/// How long a blocking waiter spins before it sleeps: a load (`I_NEW`) in a cache-hot
/// filesystem lasts well under a microsecond, far less than a sleep and a wake-up.
const SPINS: u32 = 4096;

/// A waiter for one lookup. An interrupt ends its wait even when a wake-up arrived too:
/// the caller gives up rather than look at the inode again, as a fatal signal does.
pub(crate) fn new_waiter() -> WaiterRef {
    Arc::new(Waiter::new(vfscale_sync::Precedence::Interrupt, ()))
}

/// Blocks on `waiter` until woken, interrupted or past `deadline`, spinning briefly first.
pub(crate) fn wait(waiter: &Waiter, deadline: Option<Instant>) -> WaitOutcome {
    waiter.spin_then_wait(SPINS, deadline)
}
