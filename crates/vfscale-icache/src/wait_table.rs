//! Waiting on an inode: the `__I_NEW` bit waitqueue of `fs/inode.c`.
//!
//! Linux sleeps on a hashed table of wait queues keyed by the inode's address
//! (`inode_bit_waitqueue`), so an inode carries no wait queue of its own. So does this:
//! a waiter registers `(inode address, waiter)` in one of [`WAIT_BUCKETS`] buckets while it
//! holds the inode's `i_lock` and sets the inode's `WAITERS` bit; whoever changes the state
//! (clears `I_NEW`, or unhashes an inode being freed) clears that bit under `i_lock` and,
//! after dropping it, wakes every waiter registered for the address. A waiter that waits
//! for an eviction holds no reference and never touches the inode again: it only rescans.

use crate::sync::Mutex;
use crate::waiter::WaiterRef;

/// Buckets of the wait table (a power of two).
pub(crate) const WAIT_BUCKETS: usize = 64;

type Entry = (usize, WaiterRef);

/// The hashed wait queues (`bit_wait_table`).
pub(crate) struct WaitTable {
    buckets: Box<[Mutex<Vec<Entry>>]>,
}

impl std::fmt::Debug for WaitTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitTable")
    }
}

impl WaitTable {
    pub(crate) fn new() -> Self {
        WaitTable {
            buckets: (0..WAIT_BUCKETS).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    fn bucket(&self, addr: usize) -> &Mutex<Vec<Entry>> {
        let h = (addr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
        &self.buckets[h & (WAIT_BUCKETS - 1)]
    }

    /// Registers `w` for the inode at `addr`. The caller holds that inode's `i_lock` and
    /// sets its `WAITERS` bit, so the waker (which reads the bit under `i_lock`) cannot
    /// miss this entry.
    pub(crate) fn register(&self, addr: usize, w: &WaiterRef) {
        self.bucket(addr).lock().push((addr, w.clone()));
    }

    /// Removes `w`'s entry for `addr`, if it is still there (an abandoned wait).
    pub(crate) fn cancel(&self, addr: usize, w: &WaiterRef) {
        self.bucket(addr)
            .lock()
            .retain(|(a, x)| !(*a == addr && WaiterRef::ptr_eq(x, w)));
    }

    /// Wakes every waiter registered for `addr`, after dropping the bucket lock.
    pub(crate) fn wake_all(&self, addr: usize) {
        let mut woken = Vec::new();
        {
            let mut b = self.bucket(addr).lock();
            let mut i = 0;
            while i < b.len() {
                if b[i].0 == addr {
                    woken.push(b.swap_remove(i).1);
                } else {
                    i += 1;
                }
            }
        }
        for w in woken {
            w.wake();
        }
    }
}
