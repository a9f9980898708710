//! A hook that decides which of a session's dispatch threads read `/dev/fuse`.
//!
//! Without one, every thread blocks in `read(2)` and the kernel wakes them in FIFO
//! order, so a client that sends one request at a time has each served by the thread
//! that has waited longest. A gate can keep the spare threads parked in userspace and
//! let one thread serve such a stream, waking a spare when requests queue up or when
//! the request in hand may block.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// Decides, around each `read(2)` of `/dev/fuse`, whether a dispatch thread reads.
///
/// `thread` is the thread's index in the session, from 0 to `n_threads - 1`.
pub trait DispatchGate: Send + Sync {
    /// Called before the thread reads the next request. It may park the thread.
    /// Returns false to end the thread (the session is over).
    fn before_read(&self, thread: usize) -> bool;
    /// Called after a read returned a request with `opcode`, before it is dispatched.
    /// `read_time` is how long the read took: a read that found a request already
    /// queued returns at once. `dev` is the `/dev/fuse` descriptor the thread read
    /// (`poll(2)` on it tells whether more requests are queued).
    fn after_read(&self, thread: usize, opcode: u32, read_time: Duration, dev: BorrowedFd<'_>);
    /// Called by a thread that ends because the session is over (`ENODEV` at unmount, or
    /// `DESTROY`): the gate wakes every parked thread so that they end too.
    fn close(&self);
    /// Called by a thread that ends with an error (a failed read, a malformed request)
    /// while the session may go on: it was counted as reading, and another thread
    /// should read in its place.
    fn leave(&self, thread: usize);
}

/// A [`DispatchGate`] in a [`Config`](crate::Config): compared by identity.
#[derive(Clone)]
pub struct GateHandle(pub Arc<dyn DispatchGate>);

impl fmt::Debug for GateHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GateHandle")
    }
}

impl PartialEq for GateHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for GateHandle {}
