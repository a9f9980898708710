//! The inode tables the in-memory filesystem can sit on: vfscale-icache (the upstream
//! design, or every mechanism switched back), and what a Rust user would pick instead:
//! `RwLock<HashMap>` (the virtiofsd / libfuse passthrough pattern), `dashmap`, `moka`;
//! and a control, `partitioned`: one `RwLock<HashMap>` per task, so that tasks working in
//! their own directories share nothing at all.
//!
//! Every table counts, per task, the acquisitions of locks that all tasks share
//! (`global`), of per-shard or per-object locks (`shard`), and the loads from the
//! "disk" on a miss.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::bump;
use vfscale_icache::{Iget, InodeCache, Settings, SuperBlock, SuperOperations};

/// A cached inode's attributes (what `stat` returns).
#[derive(Debug, Default)]
pub struct Attrs {
    pub mode: AtomicU32,
    pub nlink: AtomicU32,
    pub size: AtomicU64,
}

impl Attrs {
    fn load_from(&self, d: &Attrs) {
        self.mode.store(d.mode.load(Ordering::Relaxed), Ordering::Relaxed);
        self.nlink
            .store(d.nlink.load(Ordering::Relaxed), Ordering::Relaxed);
        self.size.store(d.size.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The "disk": one inode table per task, read without locks (each slot written only by
/// its owner task, in phases other tasks do not read it in).
pub struct Disk {
    per_task: Vec<Box<[Attrs]>>,
    files: u64,
}

impl Disk {
    pub fn new(tasks: usize, files: u64) -> Disk {
        Disk {
            per_task: (0..tasks)
                .map(|_| (0..files).map(|_| Attrs::default()).collect())
                .collect(),
            files,
        }
    }

    /// Inode numbers: task `t`'s file `i` is `t * files + i + 1`.
    pub fn ino(&self, task: usize, i: u64) -> u64 {
        task as u64 * self.files + i + 1
    }

    pub fn get(&self, ino: u64) -> &Attrs {
        let i = ino - 1;
        &self.per_task[(i / self.files) as usize][(i % self.files) as usize]
    }
}

/// Per-task counters (each task owns its own; summed between phases).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Counts {
    pub global: AtomicU64,
    pub shard: AtomicU64,
    pub loads: AtomicU64,
}

/// An inode table.
pub trait Table: Send + Sync {
    /// A file was created: cache its new inode.
    fn create(&self, ino: u64, disk: &Disk, c: &Counts);
    /// `stat`/`chmod`: the cached inode (loaded from `disk` on a miss), given to `f`.
    fn with(&self, ino: u64, disk: &Disk, c: &Counts, f: &mut dyn FnMut(&Attrs));
    /// `unlink` of the last link: the inode leaves the cache.
    fn unlink(&self, ino: u64, c: &Counts);
    /// `drop_caches`: forget every unused inode.
    fn drop_caches(&self);
    /// Lock and load counts the table keeps itself: (global, shard, loads), or `None`
    /// when the tasks' [`Counts`] are the whole story.
    fn own_counts(&self) -> Option<(u64, u64, u64)> {
        None
    }
    /// Whether `global` is known (false for moka, whose internal locks we cannot count).
    fn counts_locks(&self) -> bool {
        true
    }
}

// ------------------------------------------------------------------ vfscale-icache

/// The filesystem's operations for vfscale-icache: the inode data is [`Attrs`].
pub struct MemFsOps;

impl SuperOperations for MemFsOps {
    type Data = Attrs;
    fn alloc_inode(&self, _ino: u64) -> Attrs {
        Attrs::default()
    }
}

/// vfscale-icache.
pub struct Icache {
    cache: InodeCache<MemFsOps>,
    sb: SuperBlock<MemFsOps>,
}

impl Icache {
    pub fn new(settings: Settings) -> Icache {
        let cache = InodeCache::new(settings);
        let sb = cache.mount(MemFsOps);
        Icache { cache, sb }
    }
}

impl Table for Icache {
    fn create(&self, ino: u64, disk: &Disk, _c: &Counts) {
        // new_inode + insert_inode_locked + unlock_new_inode; the reference goes (iput):
        // the inode stays cached on the LRU.
        let r = self.sb.new_inode(ino);
        r.data().load_from(disk.get(ino));
        match self.sb.insert_inode_locked(r) {
            Ok(n) => drop(n.unlock_new_inode()),
            Err(b) => panic!("inode {ino} created twice: {:?}", b.inode),
        }
    }

    fn with(&self, ino: u64, disk: &Disk, _c: &Counts, f: &mut dyn FnMut(&Attrs)) {
        match self.sb.iget_locked(ino) {
            Some(Iget::Cached(r)) => f(r.data()),
            Some(Iget::New(n)) => {
                n.data().load_from(disk.get(ino));
                let r = n.unlock_new_inode();
                f(r.data());
            }
            None => panic!("inode {ino} is I_CREATING"),
        }
    }

    fn unlink(&self, ino: u64, _c: &Counts) {
        if let Some(Iget::Cached(r)) = self.sb.iget_locked(ino) {
            r.clear_nlink();
        }
    }

    fn drop_caches(&self) {
        self.sb.evict_inodes();
    }

    fn own_counts(&self) -> Option<(u64, u64, u64)> {
        let s = self.cache.stats();
        // Every lock that is not shared by all tasks: hash chains, superblock list and LRU
        // shards, and each thread's outbox of evictions whose removal from another CPU's
        // shards is batched (taken once per such eviction; only a drain shares it).
        Some((
            s.global_lock_acquisitions,
            s.chain_lock_acquisitions
                + s.sb_shard_lock_acquisitions
                + s.lru_shard_lock_acquisitions
                + s.outbox_lock_acquisitions,
            s.loads,
        ))
    }
}

// ------------------------------------------------------------------ RwLock<HashMap>

/// `RwLock<HashMap<ino, Arc<inode>>>`, on cache lines of its own (128: x86's adjacent-line
/// prefetch pairs lines). A miss loads outside the lock, then inserts under the write
/// lock unless another task got there first (its load is wasted: nothing coalesces
/// loads). Each method counts its acquisitions of the lock in `taken` (the tasks' global
/// or shard counter: who shares the lock is the caller's to say).
#[derive(Default)]
#[repr(align(128))]
struct LockedMap(RwLock<HashMap<u64, Arc<Attrs>>>);

impl LockedMap {
    fn create(&self, ino: u64, disk: &Disk, taken: &AtomicU64) {
        let a = Arc::new(Attrs::default());
        a.load_from(disk.get(ino));
        bump(taken);
        self.0.write().unwrap().insert(ino, a);
    }

    fn with(&self, ino: u64, disk: &Disk, c: &Counts, taken: &AtomicU64, f: &mut dyn FnMut(&Attrs)) {
        bump(taken);
        let hit = self.0.read().unwrap().get(&ino).cloned();
        let a = match hit {
            Some(a) => a,
            None => {
                let a = Arc::new(Attrs::default());
                a.load_from(disk.get(ino));
                bump(&c.loads);
                bump(taken);
                self.0.write().unwrap().entry(ino).or_insert(a).clone()
            }
        };
        f(&a);
    }

    fn unlink(&self, ino: u64, taken: &AtomicU64) {
        bump(taken);
        self.0.write().unwrap().remove(&ino);
    }

    fn drop_caches(&self) {
        self.0.write().unwrap().retain(|_, a| Arc::strong_count(a) > 1);
    }
}

/// `RwLock<HashMap<ino, Arc<inode>>>`: one lock for the whole table, shared by every task.
#[derive(Default)]
pub struct RwlockHashmap {
    map: LockedMap,
}

impl Table for RwlockHashmap {
    fn create(&self, ino: u64, disk: &Disk, c: &Counts) {
        self.map.create(ino, disk, &c.global);
    }

    fn with(&self, ino: u64, disk: &Disk, c: &Counts, f: &mut dyn FnMut(&Attrs)) {
        self.map.with(ino, disk, c, &c.global, f);
    }

    fn unlink(&self, ino: u64, c: &Counts) {
        self.map.unlink(ino, &c.global);
    }

    fn drop_caches(&self) {
        self.map.drop_caches();
    }
}

// ------------------------------------------------------------------ partitioned

/// The control: a [`LockedMap`] per task, holding the inodes of that task's files (inode
/// numbers are given out per task, [`Disk::ino`]). In create, walk, chmod and unlink a
/// task touches only its own partition, its own directory and its own part of the disk:
/// nothing is shared, and nothing is written that another task reads. Its scaling is then
/// the machine's (what its caches, memory and CPUs give two tasks working apart),
/// measured side by side with the designs, not a table's; the cold walk reads every
/// partition from every task, as any table's would. Not a design to compare with: a real
/// filesystem's inodes are not reached only by the task that created them. At 1 task it
/// is `rwlock-hashmap`. Its locks count as shard locks (a partition's lock is its task's,
/// as the directory's is).
pub struct Partitioned {
    parts: Box<[LockedMap]>,
    files: u64,
}

impl Partitioned {
    /// Partitions for `tasks` tasks of `files` files each.
    pub fn new(tasks: usize, files: u64) -> Partitioned {
        Partitioned {
            parts: (0..tasks.max(1)).map(|_| LockedMap::default()).collect(),
            files: files.max(1),
        }
    }

    /// The partition of the task whose file `ino` is.
    fn part(&self, ino: u64) -> &LockedMap {
        let t = (ino.saturating_sub(1) / self.files) as usize;
        &self.parts[t.min(self.parts.len() - 1)]
    }
}

impl Table for Partitioned {
    fn create(&self, ino: u64, disk: &Disk, c: &Counts) {
        self.part(ino).create(ino, disk, &c.shard);
    }

    fn with(&self, ino: u64, disk: &Disk, c: &Counts, f: &mut dyn FnMut(&Attrs)) {
        self.part(ino).with(ino, disk, c, &c.shard, f);
    }

    fn unlink(&self, ino: u64, c: &Counts) {
        self.part(ino).unlink(ino, &c.shard);
    }

    fn drop_caches(&self) {
        for p in self.parts.iter() {
            p.drop_caches();
        }
    }
}

// ------------------------------------------------------------------ dashmap

/// `DashMap<ino, Arc<inode>>`: sharded read-write locks. A miss loads, then inserts with
/// `entry().or_insert` (no coalescing: two tasks may both load).
#[derive(Default)]
pub struct Dashmap {
    map: dashmap::DashMap<u64, Arc<Attrs>>,
}

impl Table for Dashmap {
    fn create(&self, ino: u64, disk: &Disk, c: &Counts) {
        let a = Arc::new(Attrs::default());
        a.load_from(disk.get(ino));
        bump(&c.shard);
        self.map.insert(ino, a);
    }

    fn with(&self, ino: u64, disk: &Disk, c: &Counts, f: &mut dyn FnMut(&Attrs)) {
        bump(&c.shard);
        let hit = self.map.get(&ino).map(|r| r.value().clone());
        let a = match hit {
            Some(a) => a,
            None => {
                let a = Arc::new(Attrs::default());
                a.load_from(disk.get(ino));
                bump(&c.loads);
                bump(&c.shard);
                self.map.entry(ino).or_insert(a).value().clone()
            }
        };
        f(&a);
    }

    fn unlink(&self, ino: u64, c: &Counts) {
        bump(&c.shard);
        self.map.remove(&ino);
    }

    fn drop_caches(&self) {
        self.map.retain(|_, a| Arc::strong_count(a) > 1);
    }
}

// ------------------------------------------------------------------ moka

/// `moka::sync::Cache<ino, Arc<inode>>`: `get_with` coalesces concurrent loads of one key
/// (like `I_NEW`). Its internal locks cannot be counted from outside.
pub struct Moka {
    cache: moka::sync::Cache<u64, Arc<Attrs>>,
}

impl Default for Moka {
    fn default() -> Self {
        Moka {
            cache: moka::sync::Cache::builder().build(),
        }
    }
}

impl Table for Moka {
    fn create(&self, ino: u64, disk: &Disk, _c: &Counts) {
        let a = Arc::new(Attrs::default());
        a.load_from(disk.get(ino));
        self.cache.insert(ino, a);
    }

    fn with(&self, ino: u64, disk: &Disk, c: &Counts, f: &mut dyn FnMut(&Attrs)) {
        let a = self.cache.get_with(ino, || {
            let a = Arc::new(Attrs::default());
            a.load_from(disk.get(ino));
            bump(&c.loads);
            a
        });
        f(&a);
    }

    fn unlink(&self, ino: u64, _c: &Counts) {
        self.cache.invalidate(&ino);
    }

    fn drop_caches(&self) {
        self.cache.invalidate_all();
        self.cache.run_pending_tasks();
    }

    fn counts_locks(&self) -> bool {
        false
    }
}
