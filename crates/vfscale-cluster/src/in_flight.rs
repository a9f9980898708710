//! Remote calls in flight, by home and inode, so that when a home dies or an inode
//! loses its home the calls waiting there are re-sent at once.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::InodeId;

/// A remote call in flight: its home's node, its inode, and what cancels it.
type Flight = (String, InodeId, Arc<Notify>);

/// Remote calls in flight, so that a home's death re-sends them at once.
#[derive(Default)]
pub(crate) struct InFlight {
    map: Mutex<HashMap<u64, Flight>>,
}

impl InFlight {
    pub fn add(&self, id: u64, node: &str, ino: InodeId) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.map.lock().insert(id, (node.to_string(), ino, n.clone()));
        n
    }

    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// Makes the calls `pick` selects re-send.
    pub fn cancel_where(&self, pick: impl Fn(&str, InodeId) -> bool) {
        for (node, ino, n) in self.map.lock().values() {
            if pick(node, *ino) {
                n.notify_one();
            }
        }
    }
}
