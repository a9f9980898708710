//! The record store: one inode's granted locks and blocked requests, in an arena of
//! line-sized slots, with their wait-tree links in a side table.

use crate::index::IndexLinks;
use crate::lock::FileLock;
use crate::wait_cell::WaitCell;

/// Index of a record in a context's arena.
pub(crate) type NodeId = u32;
/// No record (an empty tree link).
pub(crate) const NIL: NodeId = NodeId::MAX;

/// A record's part in a wait tree: present (boxed) only on a blocked request and on a
/// lock or request that others wait on, so a lock nobody waits for stays small.
#[derive(Debug, Default)]
pub(crate) struct WaitLinks {
    /// `flc_blocker`: the record this request waits on; `None` for a granted lock and
    /// for a request that was woken and has not tried again yet.
    pub blocker: Option<NodeId>,
    /// `flc_blocked_requests`, oldest first. Each conflicts with this record and with
    /// every record above it; siblings never conflict with each other.
    pub children: Vec<NodeId>,
    /// The wait cell, for a request; `None` for a granted lock.
    pub waiter: Option<crate::sync::Arc<WaitCell>>,
    /// In the blocked hash (its blocker was a process-owned POSIX record when it was
    /// inserted, as `__locks_insert_block` decides).
    pub hashed: bool,
}

/// A granted lock or a blocked request, with its place, for a granted POSIX or OFD
/// lock under [`LockIndex::Tree`](crate::LockIndex::Tree), in the index. Its part in a wait tree is in
/// [`Arena`]'s side table, so that the record is exactly one cache line: a conflict
/// check or `F_GETLK` reads one line per record.
///
/// `repr(C)`: the index links end where the record's range begins, so an overlap scan
/// reads one stretch of the node.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct Node {
    pub ix: IndexLinks,
    pub fl: FileLock,
}

const _: () = assert!(std::mem::size_of::<Option<Node>>() == 64);

/// The records of one inode: slots reused through a free list. Grows by an eighth at a
/// time, so that an inode holding many locks wastes little on spare capacity. A
/// record's wait links (boxed, present only on a blocked request and on a record that
/// others wait on) sit in `waits`, indexed like `slots`: the rarely used part of a
/// record stays off its cache line. `waits` is made on the inode's first wait (until
/// then it is empty, and a lock costs 8 bytes less); from then on it is as long as
/// `slots`.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    pub(super) slots: Vec<Option<Node>>,
    /// Empty, or one entry per slot.
    pub(super) waits: Vec<Option<Box<WaitLinks>>>,
    pub(super) free: Vec<NodeId>,
}

impl Arena {
    #[inline]
    pub fn node(&self, id: NodeId) -> &Node {
        self.slots[id as usize].as_ref().expect("live node")
    }

    #[inline]
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.slots[id as usize].as_mut().expect("live node")
    }

    #[inline]
    pub(super) fn wait(&self, id: NodeId) -> Option<&WaitLinks> {
        self.waits.get(id as usize).and_then(|w| w.as_deref())
    }

    /// `flc_blocker` of record `id`.
    #[inline]
    pub fn blocker(&self, id: NodeId) -> Option<NodeId> {
        self.wait(id).and_then(|w| w.blocker)
    }

    /// The direct waiters of record `id`, oldest first.
    #[inline]
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        self.wait(id).map_or(&[], |w| &w.children)
    }

    /// The wait cell of request `id`; `None` for a granted lock.
    #[inline]
    pub fn waiter(&self, id: NodeId) -> Option<&crate::sync::Arc<WaitCell>> {
        self.wait(id).and_then(|w| w.waiter.as_ref())
    }

    /// The wait links of record `id`, made on first use.
    #[inline]
    pub(super) fn wait_mut(&mut self, id: NodeId) -> &mut WaitLinks {
        if self.waits.is_empty() {
            self.waits.reserve_exact(self.slots.capacity());
            self.waits.resize_with(self.slots.len(), || None);
        }
        self.waits[id as usize].get_or_insert_with(Default::default)
    }

    /// The wait links of record `id`, if it has any.
    #[inline]
    pub(super) fn wait_links(&mut self, id: NodeId) -> Option<&mut WaitLinks> {
        self.waits.get_mut(id as usize).and_then(|w| w.as_deref_mut())
    }

    #[inline]
    pub(super) fn take_children(&mut self, id: NodeId) -> Vec<NodeId> {
        self.wait_links(id)
            .map(|w| std::mem::take(&mut w.children))
            .unwrap_or_default()
    }

    /// Frees the wait links of record `id` once they hold nothing.
    #[inline]
    pub(super) fn shrink(&mut self, id: NodeId) {
        if let Some(w) = self.waits.get_mut(id as usize) {
            if w.as_ref()
                .is_some_and(|w| w.blocker.is_none() && w.children.is_empty() && w.waiter.is_none())
            {
                *w = None;
            }
        }
    }

    #[inline]
    pub(super) fn alloc(&mut self, fl: FileLock) -> NodeId {
        let n = Node {
            fl,
            ix: IndexLinks::default(),
        };
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(n);
                id
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    let more = (self.slots.len() / 8).max(4);
                    self.slots.reserve_exact(more);
                    if !self.waits.is_empty() {
                        self.waits.reserve_exact(self.slots.capacity() - self.waits.len());
                    }
                }
                let id = NodeId::try_from(self.slots.len())
                    .ok()
                    .filter(|&id| id != NIL)
                    .expect("fewer than 2^32 - 1 lock records on one inode");
                self.slots.push(Some(n));
                if !self.waits.is_empty() {
                    self.waits.push(None);
                }
                id
            }
        }
    }

    #[inline]
    pub(super) fn release(&mut self, id: NodeId) {
        self.slots[id as usize] = None;
        if let Some(w) = self.waits.get_mut(id as usize) {
            *w = None;
        }
        self.free.push(id);
    }
}
