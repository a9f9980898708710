//! Remote calls in flight, by home and inode, so that when a home dies or an inode
//! loses its home the calls waiting there are re-sent at once. Only those sent to the
//! home that went: a call cancelled here may still reach its home and be applied after
//! the one re-sent (an unlock after the next lock), which is harmless only at a home
//! that no longer serves the token it carries.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::{Home, InodeId};

/// A remote call in flight: the home it was sent to (member, with its lease, and
/// token), its inode, and what cancels it.
type Flight = (Home, InodeId, Arc<Notify>);

/// Remote calls in flight, so that a home's death re-sends them at once.
#[derive(Default)]
pub(crate) struct InFlight {
    map: Mutex<HashMap<u64, Flight>>,
}

impl InFlight {
    pub fn add(&self, id: u64, home: &Home, ino: InodeId) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.map.lock().insert(id, (home.clone(), ino, n.clone()));
        n
    }

    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// Makes the calls `pick` (given the home each was sent to, and its inode) selects
    /// re-send. `pick` runs under the registry's mutex, which is a leaf but for the
    /// directory's view (`cached_home`), never held while this is called.
    pub fn cancel_where(&self, pick: impl Fn(&Home, InodeId) -> bool) {
        for (home, ino, n) in self.map.lock().values() {
            if pick(home, *ino) {
                n.notify_one();
            }
        }
    }
}
