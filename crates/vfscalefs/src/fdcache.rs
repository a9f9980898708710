//! The descriptor cache: a bounded set of open source descriptors, reopened on a miss,
//! so that the server's descriptors do not grow with the tree or with the clients' opens
//! (knfsd's file cache does the same for NFS).
//!
//! Two kinds of owners use it: an inode (its `O_PATH` descriptor, reopened by its file
//! handle) and an open handle without kernel passthrough (its file, reopened with the
//! open's flags). Each owner has an [`FdSlot`], a weak reference to its cached
//! descriptor; the cache holds the strong ones.
//!
//! * **Hits take no shared lock.** A hit locks the owner's slot (a line the request
//!   already writes, with the owner's reference count) and upgrades the weak reference;
//!   it marks the entry referenced with a store only when the mark is clear.
//! * **Eviction is CLOCK, per shard.** A miss admits the new descriptor into the shard of
//!   its key; past the shard's capacity the hand passes over referenced entries once
//!   (clearing the mark) and drops the first unreferenced one. A dropped entry's
//!   descriptor closes when the last request still using it lets go, so the server holds
//!   at most the capacity plus what requests in flight hold.
//! * **An owner's end removes its entry** ([`FdCache::remove`]): an evicted inode or a
//!   released handle gives its descriptor up at once (a deleted file's space comes back).
//!
//! Lock order: a shard → an owner's slot. Descriptors are closed after both are released.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Whose descriptor an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FdKey {
    /// The `O_PATH` descriptor of the inode with this node id.
    Inode(u64),
    /// The file of the open handle with this file handle number.
    Handle(u64),
}

impl FdKey {
    fn shard(&self, n: usize) -> usize {
        let (tag, v) = match *self {
            FdKey::Inode(v) => (0u64, v),
            FdKey::Handle(v) => (1u64, v),
        };
        // Fibonacci hashing: node ids and handle numbers are dense.
        ((v ^ tag.rotate_right(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % n
    }
}

/// An open descriptor as the cache hands it out: it stays open while any holder keeps
/// its `Arc`, even if the cache has dropped it meanwhile.
#[derive(Debug)]
pub struct CachedFd {
    fd: OwnedFd,
    referenced: AtomicBool,
}

impl CachedFd {
    /// A descriptor held outside the cache (pinned by its owner).
    pub fn pinned(fd: OwnedFd) -> Arc<CachedFd> {
        Arc::new(CachedFd {
            fd,
            referenced: AtomicBool::new(false),
        })
    }
}

impl AsFd for CachedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for CachedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An owner's descriptor: a weak reference to its cached one, or one it keeps itself
/// (pinned: the cache is never asked for it).
#[derive(Debug)]
pub struct FdSlot(Mutex<Slot>);

#[derive(Debug)]
enum Slot {
    Cached(Weak<CachedFd>),
    Pinned(Arc<CachedFd>),
}

impl Default for FdSlot {
    fn default() -> Self {
        FdSlot(Mutex::new(Slot::Cached(Weak::new())))
    }
}

impl FdSlot {
    /// The owner's descriptor: its own, or the cached one if the cache still holds it.
    pub fn get(&self) -> Option<Arc<CachedFd>> {
        let a = match &*self.0.lock() {
            Slot::Pinned(a) => return Some(a.clone()),
            Slot::Cached(w) => w.upgrade()?,
        };
        if !a.referenced.load(Ordering::Relaxed) {
            a.referenced.store(true, Ordering::Relaxed);
        }
        Some(a)
    }

    /// The descriptor the owner keeps, if it keeps one.
    pub fn pinned(&self) -> Option<Arc<CachedFd>> {
        match &*self.0.lock() {
            Slot::Pinned(a) => Some(a.clone()),
            Slot::Cached(_) => None,
        }
    }

    /// Whether the owner keeps its descriptor.
    pub fn is_pinned(&self) -> bool {
        matches!(&*self.0.lock(), Slot::Pinned(_))
    }

    /// The owner keeps `fd` from now on, unless it keeps one already: whether it took
    /// `fd` (its cached entry, if any, is left to the clock or to [`FdCache::remove`]).
    pub fn pin(&self, fd: Arc<CachedFd>) -> bool {
        let mut s = self.0.lock();
        if matches!(&*s, Slot::Pinned(_)) {
            return false;
        }
        let old = std::mem::replace(&mut *s, Slot::Pinned(fd));
        drop(s);
        drop(old);
        true
    }

    /// Gives up the descriptor the owner keeps, if any.
    pub fn unpin(&self) -> Option<Arc<CachedFd>> {
        let mut s = self.0.lock();
        match std::mem::replace(&mut *s, Slot::Cached(Weak::new())) {
            Slot::Pinned(a) => Some(a),
            Slot::Cached(w) => {
                *s = Slot::Cached(w);
                None
            }
        }
    }
}

struct Shard {
    map: HashMap<FdKey, Arc<CachedFd>>,
    /// The clock: every key admitted, in order; a key no longer in `map` (removed, or
    /// admitted again) is skipped when the hand reaches it.
    clock: VecDeque<FdKey>,
    opened: u64,
    evicted: u64,
}

/// What the cache has done (see [`FdCache::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdCacheStats {
    /// Descriptors it holds now.
    pub cached: u64,
    /// Its capacity.
    pub capacity: u64,
    /// Descriptors admitted (misses) since it was made.
    pub opened: u64,
    /// Entries dropped to make room.
    pub evicted: u64,
}

/// The cache (see the module docs).
pub struct FdCache {
    shards: Box<[crossbeam_utils::CachePadded<Mutex<Shard>>]>,
    /// Capacity of each shard (the total divided among them, at least 1).
    per_shard: AtomicU64,
}

impl FdCache {
    /// A cache of `capacity` descriptors: shards for four times the CPUs, fewer where
    /// each would hold under eight (a shard's share is a whole number, never rounded up).
    pub fn new(capacity: usize) -> FdCache {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let mut n = (4 * cpus).next_power_of_two().min(256);
        while n > 1 && capacity / n < 8 {
            n /= 2;
        }
        let c = FdCache {
            shards: (0..n)
                .map(|_| {
                    crossbeam_utils::CachePadded::new(Mutex::new(Shard {
                        map: HashMap::new(),
                        clock: VecDeque::new(),
                        opened: 0,
                        evicted: 0,
                    }))
                })
                .collect(),
            per_shard: AtomicU64::new(1),
        };
        c.set_capacity(capacity);
        c
    }

    /// Resizes the cache to hold at most `capacity` descriptors (at least one per
    /// shard): each shard gets an equal share. A shrink takes effect at the shards' next
    /// admissions.
    pub fn set_capacity(&self, capacity: usize) {
        let per = (capacity / self.shards.len()).max(1);
        self.per_shard.store(per as u64, Ordering::Relaxed);
    }

    /// The capacity (what the shards hold at most, together).
    pub fn capacity(&self) -> u64 {
        self.per_shard.load(Ordering::Relaxed) * self.shards.len() as u64
    }

    /// `key`'s descriptor: the cached one, or `open`'s, admitted.
    pub fn get_or_open(
        &self,
        key: FdKey,
        slot: &FdSlot,
        open: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<Arc<CachedFd>> {
        if let Some(a) = slot.get() {
            return Ok(a);
        }
        Ok(self.admit(key, slot, open()?))
    }

    /// Admits `fd` as `key`'s descriptor, unless the slot has one already (a racing
    /// miss admitted it first, or the owner keeps one): the descriptor to use.
    pub fn admit(&self, key: FdKey, slot: &FdSlot, fd: OwnedFd) -> Arc<CachedFd> {
        let a = Arc::new(CachedFd {
            fd,
            referenced: AtomicBool::new(false),
        });
        let per = self.per_shard.load(Ordering::Relaxed) as usize;
        let mut dropped = Vec::new();
        let chosen = {
            let mut s = self.shards[key.shard(self.shards.len())].lock();
            let mut w = slot.0.lock();
            let cur = match &*w {
                Slot::Pinned(p) => Some(p.clone()),
                Slot::Cached(c) => c.upgrade(),
            };
            if let Some(cur) = cur {
                drop(w);
                dropped.push(a);
                cur
            } else {
                *w = Slot::Cached(Arc::downgrade(&a));
                drop(w);
                if let Some(old) = s.map.insert(key, a.clone()) {
                    dropped.push(old);
                }
                s.clock.push_back(key);
                s.opened += 1;
                s.make_room(per, &mut dropped);
                a
            }
        };
        drop(dropped); // closed here, outside the locks
        chosen
    }

    /// Drops `key`'s entry, if cached: its descriptor closes once no request uses it.
    pub fn remove(&self, key: FdKey) {
        let old = self.shards[key.shard(self.shards.len())].lock().map.remove(&key);
        drop(old);
    }

    /// Counters, summed over the shards.
    pub fn stats(&self) -> FdCacheStats {
        let mut st = FdCacheStats {
            capacity: self.capacity(),
            ..FdCacheStats::default()
        };
        for s in self.shards.iter() {
            let s = s.lock();
            st.cached += s.map.len() as u64;
            st.opened += s.opened;
            st.evicted += s.evicted;
        }
        st
    }
}

impl Shard {
    /// Drops entries until at most `per` are left: CLOCK, one pass of second chances.
    fn make_room(&mut self, per: usize, dropped: &mut Vec<Arc<CachedFd>>) {
        let mut chances = self.clock.len();
        while self.map.len() > per {
            let Some(k) = self.clock.pop_front() else { break };
            let Some(e) = self.map.get(&k) else { continue };
            if chances > 0 && e.referenced.swap(false, Ordering::Relaxed) {
                chances -= 1;
                self.clock.push_back(k);
                continue;
            }
            dropped.extend(self.map.remove(&k));
            self.evicted += 1;
        }
        // Keys of removed entries pile up in the clock: compact it now and then (a key
        // admitted twice stays twice until then, which only gives it one more look).
        if self.clock.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            let mut seen = std::collections::HashSet::with_capacity(map.len());
            self.clock.retain(|k| map.contains_key(k) && seen.insert(*k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of this test process's own, so that counting its descriptors is not
    /// disturbed by tests running beside.
    fn marker(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("vfscalefs-fdcache-{tag}-{}", std::process::id()));
        std::fs::write(&p, b"").unwrap();
        p
    }

    fn opener(p: &std::path::Path) -> impl Fn() -> OwnedFd + '_ {
        move || std::fs::File::open(p).unwrap().into()
    }

    fn open_fds(p: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t == p)
            .count()
    }

    /// A shard never holds more than its share; a referenced entry survives one pass of
    /// the hand where an unreferenced one goes; a removed entry's descriptor is closed at
    /// once unless a holder still uses it, then when that holder lets go.
    #[test]
    fn bounded_second_chance_and_removal() {
        let m = marker("bounded");
        let devnull = opener(&m);
        let c = FdCache::new(1);
        c.set_capacity(2 * c.shards.len());
        let keys: Vec<FdKey> = (0u64..)
            .map(FdKey::Inode)
            .filter(|k| k.shard(c.shards.len()) == 0)
            .take(50)
            .collect();
        let slots: Vec<FdSlot> = keys.iter().map(|_| FdSlot::default()).collect();
        c.get_or_open(keys[0], &slots[0], || Ok(devnull())).unwrap();
        c.get_or_open(keys[1], &slots[1], || Ok(devnull())).unwrap();
        assert!(slots[0].get().is_some(), "a hit marks it referenced");
        c.get_or_open(keys[2], &slots[2], || Ok(devnull())).unwrap();
        assert!(
            slots[0].get().is_some(),
            "the referenced entry had a second chance"
        );
        assert!(slots[1].get().is_none(), "the unreferenced one went");
        for i in 3..keys.len() {
            c.get_or_open(keys[i], &slots[i], || Ok(devnull())).unwrap();
            assert!(c.stats().cached <= 2, "over the shard's share at {i}");
        }
        let st = c.stats();
        assert_eq!(st.opened as usize, keys.len());
        assert_eq!(st.cached + st.evicted, st.opened);

        // Removal closes the descriptor unless held.
        let c = FdCache::new(64);
        let before = open_fds(&m);
        let s = FdSlot::default();
        let held = c.get_or_open(FdKey::Handle(7), &s, || Ok(devnull())).unwrap();
        assert_eq!(open_fds(&m), before + 1);
        c.remove(FdKey::Handle(7));
        assert_eq!(open_fds(&m), before + 1, "a holder keeps it open");
        assert!(s.get().is_some(), "still reachable while held");
        drop(held);
        assert_eq!(open_fds(&m), before, "closed with its last holder");
        assert!(s.get().is_none());
        std::fs::remove_file(&m).unwrap();
    }

    /// Two misses of one key racing: one descriptor is kept, the other closed.
    #[test]
    fn racing_misses_keep_one_descriptor() {
        let m = marker("race");
        let devnull = opener(&m);
        let c = FdCache::new(64);
        let s = FdSlot::default();
        let before = open_fds(&m);
        let a = c.admit(FdKey::Inode(3), &s, devnull());
        let b = c.admit(FdKey::Inode(3), &s, devnull());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(open_fds(&m), before + 1);
        assert_eq!(c.stats().cached, 1);
        std::fs::remove_file(&m).unwrap();
    }
}
