//! The calls waiting in this member's wait trees (its own clients' and those served
//! for peers), so that the service can end them: fencing, a dead caller, an interrupt
//! from a peer, `EDEADLK` across members.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfscale_locks::{Errno, PosixWaitId};

use crate::call::CallCtl;
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::InodeId;

/// One waiting call.
pub(crate) struct WaitingCall {
    pub ino: InodeId,
    /// For a peer's call: its node, the lease it called under, and its call id.
    pub peer: Option<(String, i64, u64)>,
    /// The wait in this member's lock manager (`None` for a call not waiting there).
    pub wait: Option<PosixWaitId>,
    pub ctl: Arc<CallCtl>,
}

/// How long an interrupt that arrived before its call is kept.
const TOMBSTONE_TTL: Duration = Duration::from_secs(30);

/// The registry. Lock order: `map` → `early`; nothing else is called under them but
/// [`CallCtl::interrupt`], whose own lock is a leaf.
#[derive(Default)]
pub(crate) struct Waiting {
    next: AtomicU64,
    map: Mutex<HashMap<u64, WaitingCall>>,
    /// Interrupts of peers' calls that had not arrived yet (another HTTP/2 stream may
    /// overtake the call's).
    early: Mutex<HashMap<(String, u64), Instant>>,
}

/// Removes its call from the registry when dropped.
pub(crate) struct WaitingGuard<'a> {
    reg: &'a Waiting,
    key: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.reg.map.lock().remove(&self.key);
    }
}

impl Waiting {
    pub fn add(&self, call: WaitingCall) -> WaitingGuard<'_> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        // Under the map's lock, as `interrupt_peer` looks: an interrupt is either found
        // in `early` here or finds the call in the map, never neither.
        let mut m = self.map.lock();
        let early = call
            .peer
            .as_ref()
            .is_some_and(|(n, _, id)| self.early.lock().remove(&(n.clone(), *id)).is_some());
        if early {
            call.ctl.interrupt(Errno::EINTR);
        }
        m.insert(key, call);
        WaitingGuard { reg: self, key }
    }

    /// How many calls wait here now.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Interrupts a peer's call; remembered for a while if it has not arrived.
    pub fn interrupt_peer(&self, node: &str, call_id: u64) {
        let m = self.map.lock();
        if let Some(c) = m.values().find(|c| {
            c.peer
                .as_ref()
                .is_some_and(|(n, _, id)| n == node && *id == call_id)
        }) {
            c.ctl.interrupt(Errno::EINTR);
            return;
        }
        // Still under the map's lock: a call that arrives now finds the tombstone.
        let mut e = self.early.lock();
        let now = Instant::now();
        e.retain(|_, t| now.duration_since(*t) < TOMBSTONE_TTL);
        e.insert((node.to_string(), call_id), now);
    }

    /// Ends every call that `pick` selects with `why`; returns how many.
    pub fn interrupt_where(&self, why: Errno, pick: impl Fn(&WaitingCall) -> bool) -> usize {
        let m = self.map.lock();
        let mut n = 0;
        for c in m.values().filter(|c| pick(c)) {
            c.ctl.interrupt(why);
            n += 1;
        }
        n
    }
}

#[cfg(all(test, vfscale_loom))]
mod loom_models {
    use super::*;

    fn peer_call(ctl: &Arc<CallCtl>) -> WaitingCall {
        WaitingCall {
            ino: InodeId(1),
            peer: Some(("b".to_string(), 1, 1)),
            wait: None,
            ctl: ctl.clone(),
        }
    }

    /// A peer's interrupt and its call arrive on two streams in either order, or at
    /// once: the call ends interrupted in every interleaving.
    #[test]
    fn loom_an_interrupt_racing_its_call_is_never_lost() {
        loom::model(|| {
            let reg = Arc::new(Waiting::default());
            let ctl = CallCtl::new();
            let r = reg.clone();
            let t = loom::thread::spawn(move || r.interrupt_peer("b", 1));
            let guard = reg.add(peer_call(&ctl));
            t.join().unwrap();
            assert_eq!(ctl.reason(), Some(Errno::EINTR));
            drop(guard);
        });
    }
}
