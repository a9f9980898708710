//! The inode cache ([`InodeCache`]): what every superblock of one cache shares (the hash
//! table, the counters, the wait table), and `mount`.

use std::fmt;
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::counters::{counter_slots, Counter, Counters};
use crate::deferred_free::Domain;
use crate::hash_table::ChainHead;
use crate::superblock::SuperBlock;
use crate::sync::Mutex;
use crate::wait_table::WaitTable;
use crate::{CacheStats, Settings, SuperOperations};

/// What every superblock of one cache shares: the inode hash table and the counters.
pub(crate) struct CacheInner<F: SuperOperations> {
    pub(crate) settings: Settings,
    pub(crate) shards: usize,
    pub(crate) buckets: Box<[ChainHead<F>]>,
    pub(crate) hash_shift: u32,
    /// `inode_hash_lock` (only with [`HashLock::Global`]).
    pub(crate) global_hash_lock: Mutex<()>,
    /// [`OWN_SLOTS`] thread-owned slots and a shared one (normal builds); one shared
    /// slot per shard under the models.
    pub(crate) counters: Box<[CachePadded<Counters>]>,
    pub(crate) waits: WaitTable,
    pub(crate) domain: Domain,
    pub(crate) next_dev: StdAtomicU64,
}

/// An inode cache: the inode hash table and the counters shared by its superblocks.
/// Cloning gives another handle to the same cache.
pub struct InodeCache<F: SuperOperations> {
    inner: Arc<CacheInner<F>>,
}

impl<F: SuperOperations> Clone for InodeCache<F> {
    fn clone(&self) -> Self {
        InodeCache {
            inner: self.inner.clone(),
        }
    }
}

impl<F: SuperOperations> fmt::Debug for InodeCache<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InodeCache")
            .field("settings", &self.inner.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<F: SuperOperations> Default for InodeCache<F> {
    fn default() -> Self {
        Self::new(Settings::default())
    }
}

impl<F: SuperOperations> InodeCache<F> {
    /// A cache with the given settings.
    pub fn new(settings: Settings) -> Self {
        let shards = settings.shard_count();
        let bits = settings.hash_bits.clamp(0, 30);
        InodeCache {
            inner: Arc::new(CacheInner {
                settings,
                shards,
                buckets: (0..1usize << bits).map(|_| ChainHead::new()).collect(),
                hash_shift: 64 - bits,
                global_hash_lock: Mutex::new(()),
                counters: (0..counter_slots(shards))
                    .map(|_| CachePadded::new(Counters::default()))
                    .collect(),
                waits: WaitTable::new(),
                domain: Domain::new(),
                next_dev: StdAtomicU64::new(1),
            }),
        }
    }

    /// The settings.
    pub fn settings(&self) -> Settings {
        self.inner.settings
    }

    /// Mounts a superblock (`SB_ACTIVE`) with these operations.
    pub fn mount(&self, ops: F) -> SuperBlock<F> {
        SuperBlock::mount(&self.inner, ops)
    }

    /// The counters, summed over CPUs (`/proc/sys/fs/inode-nr` and the lock counts).
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats::default();
        // Sums of per-thread slots: a slot alone may go below 0 (an inode counted in on
        // one thread and out on another); the sums are exact.
        let sum = |k: Counter| {
            self.inner
                .counters
                .iter()
                .fold(0i64, |a, c| a.wrapping_add(c.get(k)))
        };
        let (nr, unused) = (sum(Counter::NrInodes), sum(Counter::NrUnused));
        s.global_lock_acquisitions = sum(Counter::GlobalLocks) as u64;
        s.chain_lock_acquisitions = sum(Counter::ChainLocks) as u64;
        s.sb_shard_lock_acquisitions = sum(Counter::SbShardLocks) as u64;
        s.lru_shard_lock_acquisitions = sum(Counter::LruShardLocks) as u64;
        s.loads = sum(Counter::Loads) as u64;
        s.new_waits_spun = sum(Counter::NewWaitsSpun) as u64;
        s.new_waits_slept = sum(Counter::NewWaitsSlept) as u64;
        s.outbox_lock_acquisitions = sum(Counter::OutboxLocks) as u64;
        s.nr_inodes = nr.max(0) as u64;
        s.nr_unused = unused.max(0) as u64;
        s
    }
}
