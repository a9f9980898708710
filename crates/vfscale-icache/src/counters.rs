//! The per-CPU counters (`/proc/sys/fs/inode-nr` and the lock and wait counts) and the
//! thread's slot that picks both its counters and its CPU shard.

use std::sync::atomic::AtomicI64;

use crate::cache::CacheInner;
use crate::sync::Ordering;
use crate::SuperOperations;

/// The shard a thread uses for per-CPU structures: its slot ([`thread_slot`], the lowest
/// free one when it first asks, kept until it exits) modulo the shard count. Linux
/// indexes per-CPU data by the current CPU; in userspace a thread may migrate at any time
/// and asking the kernel (`sched_getcpu`) on every operation costs more than it saves,
/// while a fixed slot per thread spreads threads over the shards just as well (live
/// threads have dense slots, so no two share a shard while threads ≤ shards).
///
/// Under the models: the model thread's index (loom's and shuttle's thread ids count from
/// 0, the main thread, in spawn order, the same in every execution), so the models'
/// threads use different shards (two under the models: the main thread and the second
/// spawned one share shard 0, the first spawned one has shard 1) and exercise the
/// cross-shard paths (an inode on another thread's LRU shard; `live` and the counters
/// summed over shards). A process-wide counter would hand a thread another shard in
/// each execution, which a model checker must not see.
///
/// (Normal builds compute it in [`CacheInner::counters`], from the one slot lookup that
/// gives the counters too.)
#[cfg(any(vfscale_loom, vfscale_shuttle))]
fn shard_hint() -> usize {
    #[cfg(vfscale_loom)]
    {
        // loom's `ThreadId` shows its index only through `Debug` ("ThreadId(3)").
        let id = format!("{:?}", loom::thread::current().id());
        id.trim_start_matches("ThreadId(")
            .trim_end_matches(')')
            .parse()
            .expect("loom ThreadId(n)")
    }
    #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
    {
        usize::from(shuttle::thread::current().id())
    }
}

/// The calling thread's slot: an index no other live thread has, the lowest free one
/// when the thread first asks (so live threads have dense slots, and consecutive ones
/// fall on different shards), given back when the thread exits. `None` once this
/// thread's slot was given back (in its other thread-local destructors).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
#[inline]
fn thread_slot() -> Option<usize> {
    use std::sync::Mutex as StdMutex;
    /// Slots in use are `0..next` minus `free`.
    struct Pool {
        next: usize,
        free: Vec<usize>,
    }
    static POOL: StdMutex<Pool> = StdMutex::new(Pool {
        next: 0,
        free: Vec::new(),
    });
    struct Slot(usize);
    impl Slot {
        fn claim() -> Slot {
            let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
            let lowest = p.free.iter().enumerate().min_by_key(|(_, v)| **v).map(|(i, _)| i);
            Slot(match lowest {
                Some(i) => p.free.swap_remove(i),
                None => {
                    p.next += 1;
                    p.next - 1
                }
            })
        }
    }
    impl Drop for Slot {
        fn drop(&mut self) {
            let _ = CACHED.try_with(|c| c.set(GONE));
            // The pool's lock orders this thread's last counter stores before the next
            // owner's first load of the slot.
            POOL.lock().unwrap_or_else(|e| e.into_inner()).free.push(self.0);
        }
    }
    // The slot, cached where a read is one thread-local load (no lazy-init or
    // destructor state to check): `usize::MAX` before the claim, [`GONE`] after the
    // release.
    thread_local!(static CACHED: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) });
    const GONE: usize = usize::MAX - 1;
    thread_local!(static SLOT: Slot = Slot::claim());
    let v = CACHED.with(|c| c.get());
    if v < GONE {
        return Some(v);
    }
    if v == GONE {
        return None;
    }
    let v = SLOT.try_with(|s| s.0).ok()?;
    CACHED.with(|c| c.set(v));
    Some(v)
}

/// The counters of `/proc/sys/fs/inode-nr` and the lock and wait counts.
#[derive(Clone, Copy)]
pub(crate) enum Counter {
    NrInodes,
    NrUnused,
    GlobalLocks,
    ChainLocks,
    SbShardLocks,
    LruShardLocks,
    Loads,
    NewWaitsSpun,
    NewWaitsSlept,
    OutboxLocks,
}

const NR_COUNTERS: usize = 10;

/// One thread's (or, under the models, one shard's) counters, on their own cache lines.
#[derive(Default)]
pub(crate) struct Counters([AtomicI64; NR_COUNTERS]);

impl Counters {
    pub(crate) fn get(&self, k: Counter) -> i64 {
        self.0[k as usize].load(Ordering::Relaxed)
    }
}

/// The counters the calling thread adds to: its own slot (`own`: no other thread writes
/// it, so an add is a plain load and store, no locked read-modify-write), or a shared
/// one (atomic adds); with the slot's index (its live-inode count's too) and the
/// thread's shard (`shard_hint`). Taken once per operation and passed
/// down (what `this_cpu_ptr` is to Linux): each lookup reads the thread's slot again.
pub(crate) struct CpuCounters<'a> {
    pub(crate) c: &'a Counters,
    pub(crate) own: bool,
    pub(crate) slot: usize,
    pub(crate) shard: usize,
}

impl CpuCounters<'_> {
    #[inline]
    pub(crate) fn add(&self, k: Counter, d: i64) {
        let a = &self.c.0[k as usize];
        if self.own {
            a.store(a.load(Ordering::Relaxed).wrapping_add(d), Ordering::Relaxed);
        } else {
            a.fetch_add(d, Ordering::Relaxed);
        }
    }
}

/// How many counter slots a cache has.
pub(crate) fn counter_slots(shards: usize) -> usize {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    {
        shards
    }
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    {
        let _ = shards;
        OWN_SLOTS + 1
    }
}

/// Counter slots owned by one thread each (normal builds): a thread claims the lowest
/// free slot the first time it counts and gives it back when it exits, so the slot's
/// counters have a single writer. Threads beyond this many share one more slot, with
/// atomic adds.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const OWN_SLOTS: usize = 64;

impl<F: SuperOperations> CacheInner<F> {
    /// The calling thread's counters (and its slot and shard): looked up once per
    /// operation and passed down.
    #[inline]
    pub(crate) fn counters(&self) -> CpuCounters<'_> {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            let shard = shard_hint() & (self.shards - 1);
            CpuCounters {
                c: &self.counters[shard],
                own: false,
                slot: shard,
                shard,
            }
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            let t = thread_slot();
            // `shard_hint` of normal builds: the slot modulo the shard count; a thread
            // whose slot is gone (it is exiting) may use any shard.
            let shard = t.unwrap_or(0) & (self.shards - 1);
            let (slot, own) = match t {
                Some(i) if i < OWN_SLOTS => (i, true),
                _ => (OWN_SLOTS, false),
            };
            CpuCounters {
                c: &self.counters[slot],
                own,
                slot,
                shard,
            }
        }
    }
}
