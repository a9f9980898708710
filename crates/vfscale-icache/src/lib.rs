//! Linux `fs/inode.c` (v6.18) in userspace: an inode cache with Linux's names and rules
//! (`iget_locked` and its `I_NEW` hand-off, `ilookup`, `insert_inode_locked`, `iput`
//! with `iput_final`, the LRU with second chance, `evict_inodes`), finished with the
//! scalable design of Dave Chinner's 2023 "vfs: inode cache scalability improvements": a
//! lock per hash chain, lock-free lookup (Linux 6.11, 7180f8d91fcb) and per-CPU
//! superblock inode lists.
//!
//! A filesystem implements [`SuperOperations`] (what `super_operations` gives Linux:
//! `alloc_inode`, `drop_inode`, `write_inode`, `evict_inode`, `destroy_inode`) over its
//! own inode data, mounts a [`SuperBlock`] on an [`InodeCache`], and asks it for inodes.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use vfscale_icache::*;
//!
//! /// The filesystem's in-memory inode: filled while the inode is `I_NEW`.
//! #[derive(Default)]
//! struct MyInode { mode: AtomicU32 }
//!
//! struct MyFs;
//! impl SuperOperations for MyFs {
//!     type Data = MyInode;
//!     fn alloc_inode(&self, _ino: u64) -> MyInode { MyInode::default() }
//! }
//!
//! let cache = InodeCache::new(Settings::default());
//! let sb = cache.mount(MyFs);
//!
//! // A miss: the caller gets the I_NEW inode, loads it, and unlocks it.
//! let Some(Iget::New(new)) = sb.iget_locked(12) else { unreachable!() };
//! new.data().mode.store(0o100644, Ordering::Relaxed); // "read from disk"
//! let a = new.unlock_new_inode();
//!
//! // A hit: the same inode, one more reference (lock-free lookup).
//! let Some(Iget::Cached(b)) = sb.iget_locked(12) else { unreachable!() };
//! assert_eq!(a, b);
//! assert_eq!(b.state().count, 2);
//!
//! // The last iput keeps a linked inode cached, on the LRU; the shrinker evicts it.
//! drop((a, b));
//! assert_eq!(sb.lru_inos(), vec![12]);
//! assert_eq!(cache.stats().nr_unused, 1);
//! assert_eq!(sb.prune_icache_sb(10), 1);
//! assert!(sb.ilookup(12).is_none());
//! assert_eq!(cache.stats().nr_inodes, 0);
//! ```
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | [`InodeCache`], what its superblocks share (hash table, counters, wait table) | `cache.rs` |
//! | [`SuperBlock`]: its lists and LRU, live count and lifetime, the public API | `superblock.rs` |
//! | an inode, its `i_state` bits, [`InodeRef`], [`NewInode`], [`Iget`] | `inode.rs` |
//! | the hash chains (bit lock per chain, `inode_hash_lock`), link and unlink | `hash_table.rs` |
//! | lookups: the general path (`find_inode`, the miss, waiting while `I_NEW`) | `lookup.rs` |
//! | lookups: the fast paths by inode number | `lookup_fast.rs` |
//! | `iput`, `iput_final` | `iput.rs` |
//! | the LRU, its shards and the shrinker's walk | `lru.rs` |
//! | the superblock inode list (`s_inodes`) and its walks | `sb_list.rs` |
//! | batched removal: parking, outboxes, flushes | `outbox.rs` |
//! | `evict` (and the filesystem's panics during it) | `evict.rs` |
//! | `alloc_inode`, `destroy_inode`, the superblock's live-inode count | `inode_alloc.rs` |
//! | per-CPU counters, a thread's slot and shard | `counters.rs` |
//! | waiting lookups: [`Started`], [`InodeWait`], [`WaitError`] | `inode_wait.rs` |
//! | the waiter a lookup blocks on, [`Interrupter`] | `waiter.rs` |
//! | the hashed wait queues (`bit_wait_table`) | `wait_table.rs` |
//! | grace periods: the epoch protocol (with its loom models) | `epoch.rs` |
//! | deferred frees: per-thread batches of retired inodes (and the models' stand-in) | `deferred_free.rs` |
//! | the orphan list of batches (a lock-free stack) | `orphan_list.rs` |
//! | `i_lock`, the spinlock, the backends (std, loom, shuttle) | `sync.rs` |
//!
//! # The state machine (`i_state`)
//!
//! ```text
//!   iget_locked miss ─┐                    unlock_new_inode / discard_new_inode
//!   insert_inode_     ├──► I_NEW ─────────────────────────────────────────────► live
//!   locked (+CREATING)┘      │  iget_failed: unhash, clear I_NEW, iput              │
//!                            └──────────────────────────────────────────► (unhashed) │
//!                                                                                   │
//!   live, i_count 0: on the LRU (I_REFERENCED = used again since) ◄── last iput ─────┤
//!                                                                                   │
//!   last iput that drops (nlink 0, unhashed, I_DONTCACHE, sb unmounted) ────────────┤
//!   prune_icache_sb / evict_inodes of an unused inode ──────────────────────────────┤
//!                                                                                   ▼
//!                    I_WILL_FREE (->write_inode, only when not dropped) ──► I_FREEING
//!   I_FREEING: off the LRU, off the sb list, ->evict_inode, then under the chain lock
//!   and one i_lock hold: I_CLEAR, unhashed, waiters taken (woken after both locks
//!   drop); ->destroy_inode; the memory is freed a grace period later (epoch).
//!   Listed on another CPU's LRU or sb list shard: the same, but still linked there
//!   (PARKED, set in the unhash hold) until a batch takes it off; then freed.
//! ```
//!
//! * **`I_NEW`**: set by a lookup that misses (`iget_locked`, `iget5_locked`) or by
//!   `insert_inode_locked` (with `I_CREATING`). The loader holds a [`NewInode`] guard;
//!   every other task that finds the inode takes a reference and waits (blocking, with a
//!   deadline, interruptibly, or as a `Future`: [`InodeWait`]). A waiter first spins a
//!   bounded while on `i_state` (a load lasts far less than a sleep and a wake-up, and
//!   the loader is most likely running, as Linux's mutexes bet on a running owner):
//!   if `I_NEW` clears meanwhile it goes on without registering, its Acquire load of
//!   `i_state` paired with the loader's Release store under `i_lock`, so it never sees a
//!   half-loaded inode; otherwise it registers under `i_lock`, which looks again
//!   ([`CacheStats::new_waits_spun`] / [`CacheStats::new_waits_slept`] count the two;
//!   loom model `i_new_spin_or_sleep`). `unlock_new_inode` and
//!   `discard_new_inode` leave it hashed: the waiters take it. `iget_failed` (and a
//!   dropped guard, Linux's error path) unhashes it: the waiters put it and look again,
//!   and one of them becomes the loader.
//! * **`I_CREATING`**: a lookup that meets it returns `None` (Linux `-ESTALE`/`NULL`);
//!   `insert_inode_locked` fails with `EBUSY`.
//! * **`I_FREEING` / `I_WILL_FREE`**: a lookup that meets it waits until `evict()` has
//!   unhashed it and looks again (`__wait_on_freeing_inode`), so no lookup ever returns an
//!   inode being evicted; `insert_inode_locked` passes over it; `igrab` fails.
//! * **LRU**: removal is lazy, as in Linux: an inode taken again stays on the LRU (and in
//!   `nr_unused`) until a prune meets it; a last `iput` of an inode still on the LRU sets
//!   `I_REFERENCED` (second chance: the prune rotates it once instead of evicting it).
//! * **`PARKED`** (bookkeeping, not a Linux bit): evicted (`I_FREEING | I_CLEAR`,
//!   unhashed, `->evict_inode` and `->destroy_inode` done) but still linked on another
//!   CPU's superblock list shard and maybe LRU shard, in an outbox ("Batched removal"
//!   below). Every walker of those lists passes over it as over any `I_FREEING` inode; it
//!   is already counted out of `nr_unused` and `nr_inodes`.
//!
//! # What protects what
//!
//! | data | protected by | read without it by |
//! |---|---|---|
//! | a hash chain's links (the head word, `i_hash`) | the chain's bit lock (bit 0 of its 8-byte `hlist_bl_head`), or one `inode_hash_lock` (`Settings::hash_lock`) | lock-free lookups, pinned (epoch), masking bit 0 off |
//! | `i_state` (all flags, `HASHED`, `ON_LRU`, `WAITERS`) | the inode's `i_lock` (writes) | anyone (racy snapshots, `inode_generic_drop`) |
//! | `i_count` 0 → 1 and 1 → 0 | `i_lock` (`__iget` under it, `atomic_dec_and_lock` in `iput`) | other changes are atomic |
//! | `i_nlink` | atomic (the filesystem serializes its own link changes, like `i_rwsem`) | |
//! | a superblock list shard (`s_inodes`), an inode's place in it | that shard's lock (`s_inode_list_lock`) | |
//! | an LRU shard (`s_inode_lru`: `list_lru_one`'s head, tail, length), the `i_lru` links (`lru_prev`, `lru_next`) of every inode on it, an inode's `lru_shard` | that shard's lock (`list_lru` lock) | `count_objects` (a length mirror); `lru_shard` by the inode's evictor (`I_FREEING`: it cannot move) |
//! | `SB_ACTIVE` | atomic; read by `iput_final` under `i_lock` (and again under the LRU lock and `i_lock` before it adds to the LRU); `evict_inodes` reads `i_count` under each `i_lock` after clearing it | |
//! | a wait-table bucket | its lock | |
//! | a superblock's outbox of a counter slot (the parked inodes, their count) | the outbox's lock (a spinlock with its data): its slot's thread to park and flush, a drain (`evict_inodes`, `umount`, `nr_inodes`, `lru_inos`, `count_objects`) for every slot | |
//! | a parked inode's list links, `sb_index` | its lists' shard locks, as for any inode; it is the outbox's (whoever flushes it) until freed | |
//! | a thread's batches of retired inodes (the one filling, the stamped ones) | thread-local | |
//! | the orphan list (stamped batches of exited threads, and a thread's beyond its 64 newest) | none: a lock-free stack, pushed by any thread, emptied whole by whichever thread reclaims | |
//! | the epoch; a thread's record (its section's epoch) | atomic: the epoch moves on by compare-exchange, a record is written only by its thread | advancers read every record |
//! | counters | per CPU, atomic; an operation looks up its thread's slot once and passes it down (`CpuCounters`: counters, live-inode slot, shard) | `stats` sums them |
//!
//! # Lock order
//!
//! hash chain lock (or `inode_hash_lock`) → superblock list shard → LRU shard → `i_lock` →
//! wait-table bucket; an outbox lock is taken with no other lock held (one at a time),
//! and under it a flush takes superblock list shards, then LRU shards → `i_lock`, one
//! shard at a time: outbox → superblock list shard → LRU shard → `i_lock`. Unlike Linux (which takes the `list_lru` lock under `i_lock` and
//! `spin_trylock`s the other way in `inode_lru_isolate`), the LRU lock is always taken
//! first. A last `iput` guesses (racily, from `i_state`, `i_nlink` and `SB_ACTIVE`)
//! what `iput_final` will do with an LRU and takes that LRU shard's lock before `i_lock`:
//! this CPU's shard for an inode it will keep and that is on no LRU (it is added under the
//! one `i_lock` hold that decides), or the inode's `lru_shard` for an inode on this CPU's
//! LRU shard that it will evict (`I_FREEING` and off the LRU under one hold; checked
//! under both locks: loom model `unlink_own_shard_races_prune`); an inode on
//! another CPU's LRU shard is evicted without that lock and parked ("Batched removal"
//! below; loom model `unlink_last_iput_races_prune`). Otherwise, or when the guess was
//! wrong, `iput_final` drops `i_lock`, takes the LRU shard's lock and `i_lock` again and
//! checks again (staying pinned so the inode cannot be freed meanwhile); if `SB_ACTIVE`
//! went meanwhile it evicts the inode there (as `iput_final` would have). No lock is held
//! while calling `->evict_inode`, `->write_inode`, `->destroy_inode` or `alloc_inode`;
//! `i_lock` is a one-byte spinlock, as Linux's (`spinlock_t`): one compare-exchange to
//! take it, a plain Release store to drop it (a parking mutex's unlock is a second locked
//! read-modify-write; `i_lock` is taken two or three times per lookup, create and
//! unlink); a waiter spins read-only with backoff, then yields. Every hold is a few loads
//! and stores (at most a wait-table bucket lock inside). Under loom and shuttle `i_lock`
//! is the shim's mutex (spin loops at every use exceed loom's branch limit); the
//! spinlock has its own loom model. The superblock list and LRU shard locks are the
//! same spinlock with their data (`spinlock_t` in Linux too), the shim's mutex under the
//! models.
//! `->drop_inode` runs under `i_lock` and must only use lock-free accessors (all of
//! [`Inode`]'s getters are).
//!
//! **Umount against a last `iput`**: the 1 → 0 of `i_count` and the `SB_ACTIVE` read
//! that decides keep-or-evict happen under one `i_lock` hold, and `evict_inodes` (after
//! clearing `SB_ACTIVE`) reads `i_count` only under `i_lock`, so the lock orders them:
//! either `evict_inodes` sees 0 and evicts, or the `iput` sees `SB_ACTIVE` clear and
//! evicts. Linux's `evict_inodes` skips on an unlocked `atomic_read(&i_count)` first; here
//! that skip let both read stale values and leave one unused inode on an unmounted
//! superblock's LRU (loom model `umount_races_last_iput`).
//!
//! # Scalability (Dave Chinner's 2023 series and after)
//!
//! * **Hash**: a lock per chain (`hlist_bl`) for insert and remove: each chain head is
//!   one word, the first inode's address with the lock in bit 0 (a bit spinlock: a
//!   compare-exchange of the free word, Acquire, to take it, spinning read-only with
//!   backoff and then yielding while another holds it, a plain Release store of the word
//!   without the bit to drop it, as Linux's `__bit_spin_unlock`: nobody else writes the
//!   word while the bit is set;
//!   the chain-lock acquisition counter counts takes), so the table costs 8 bytes
//!   per chain. The chain-lock holder may take an `i_lock` or a superblock list lock
//!   (never sleeps otherwise); lookups take no lock
//!   at all: they pin the epoch (a read-side section writes only the thread's own record),
//!   walk the chain, and take the found inode's own `i_lock` to check its state and take
//!   a reference. Inodes are freed a grace period after eviction. An iget hit writes
//!   only the inode's own cache lines.
//! * **Shards** stand for CPUs: a thread takes a shard (its counter slot, see below) the
//!   first time it needs one and keeps it (asking the kernel for the current CPU on every operation
//!   costs more than it saves, and a thread may migrate anyway); there are as many
//!   shards as CPUs ([`Settings::shards`]).
//! * **Superblock lists**: one list per CPU shard, each with its own lock (the
//!   `dlist` of Chinner's series); an inode remembers its shard, so create and evict on different CPUs do not
//!   meet. A shard is an array of slots with a free list threaded through the empty
//!   ones: an inode knows its slot, so removal writes only that slot (no other inode's
//!   line under a lock another CPU may want). `evict_inodes` and [`SuperBlock::for_each_inode`] visit every shard,
//!   at most 128 inodes per hold of a shard's (spin)lock, going on from the next slot
//!   (slots do not move), as Linux's `evict_inodes` drops `s_inode_list_lock` to
//!   reschedule: a create waiting on that shard never spins for a whole walk.
//! * **LRU**: one list per CPU shard (the shard of the `iput` that put the inode there),
//!   each a `list_lru_one`: an intrusive doubly-linked list through the inodes (O(1) add,
//!   delete and second-chance rotation, no allocation); a prune scans from the oldest.
//!   Linux's `list_lru` is split per NUMA node; per CPU goes further, so two CPUs'
//!   `iput`s never meet on one lock. The shrinker splits a scan over the shards in
//!   proportion to their lengths, as `shrink_slab` splits it over nodes. The order within
//!   a shard is exact; [`Lru::Single`] (one list, Linux on one node, what the scenario
//!   replay uses) keeps the spec's single-list order exactly.
//! * **Batched removal**: when threads share inodes, many an inode is listed by another
//!   thread (superblock list shard: the loader's; LRU shard: the last `iput`'s), and
//!   taking it off there would take two locks whose lines are on the other CPU. An
//!   eviction whose inode is listed on another CPU's shard (by the evicting
//!   thread's shard: `CpuCounters::shard`) does at once all that can be observed:
//!   `->evict_inode`; under the chain lock and `i_lock`, `I_CLEAR`, the unhash, the
//!   waiters taken (woken right after) and `PARKED`, which counts it out of `nr_unused`
//!   if it is on an LRU; `->destroy_inode` and `nr_inodes`. Then it parks the inode in its
//!   slot's outbox for the superblock (per superblock and counter slot, beside the slot's
//!   live count, under a spinlock of its own). When the outbox holds 32 (`OUTBOX_CAPACITY`
//!   in `outbox.rs`, why 32 there) it takes each shard's lock once for all of its inodes:
//!   off the superblock lists, off the LRU where still on it (a prune may have taken it
//!   off: it met it `I_FREEING`; checked under the LRU lock and `i_lock`; `nr_unused` is
//!   not counted twice: `PARKED`), and only then frees them (memory a grace period
//!   later, the superblock's live count). Inodes on this CPU's shards keep the direct
//!   path (their lines are local), list by list: an inode on this CPU's LRU shard leaves
//!   it before `->evict_inode` even when its superblock list shard parks the eviction;
//!   with one shard, [`SbList::Global`] or [`Lru::Single`] nothing is parked on that
//!   list (the replay's LRU order is untouched). The
//!   observers of the lists, [`SuperBlock::nr_inodes`], [`SuperBlock::lru_inos`] and
//!   [`SuperBlock::count_objects`], and [`SuperBlock::evict_inodes`] and
//!   [`SuperBlock::umount`] drain every outbox first (or last, after the walk), so they
//!   never show an evicted inode, as Linux's lists do not (there it is off them before
//!   `->evict_inode`); [`CacheStats`] counts it out when it is parked; a prune passes
//!   over it (taking it off its LRU lazily, as any busy inode). A thread's outbox is
//!   also flushed by [`SuperBlock::flush_evictions`]. `umount` against a park: the park
//!   reads `SB_ACTIVE` under its outbox lock, and `umount` clears it before it drains
//!   every outbox under its lock, so either the drain finds the inode or the park sees
//!   the superblock inactive and takes the inode off the lists itself (loom model
//!   `umount_races_remote_park`; `flush_races_prune`, `flush_races_lookup`). Threads
//!   beyond 64 share one slot and so one outbox: the lock makes that correct (any
//!   holder may flush any entry), at the price of a shared lock line for them.
//! * **Counters** (`nr_inodes`, `nr_unused`, lock acquisitions, loads, waits): per
//!   thread, on their own cache lines; [`InodeCache::stats`] sums them. A thread claims
//!   the lowest free slot the first time it counts and gives it back at exit (up to 64
//!   slots a cache; more threads share one more slot with atomic adds), so a slot has one
//!   writer and an add is a plain load and store: no locked read-modify-write on a
//!   create, load or eviction for counting. The same slot, modulo the
//!   shard count, is the thread's CPU shard. Under the models: per shard, atomic adds.
//! * **Fast paths**: `iget_locked`/`ilookup` by inode number walk the chain directly
//!   (pinned; the first match decides, `__iget` under its `i_lock` when hashed and not
//!   `I_CREATING` or freeing): a cached hit returns at once, an `I_NEW` one goes straight
//!   to the wait (spin, then register), with the reference `find_inode` would have taken.
//!   A match seen `I_NEW` without the lock is spun on read-only first, before its
//!   `i_lock` and reference are taken (the same lookup, started later): a follower no
//!   longer writes the line its loader is filling.
//!   `iget_locked` also takes a miss directly (allocate, chain lock, look again: none →
//!   hash it `I_NEW`; one → destroy the new inode unpublished and use that one, as the
//!   general path does); `insert_inode_locked` hashes directly when the chain holds no
//!   inode with the number. Anything else (`I_CREATING`, an inode being freed, a live or
//!   dying inode with the number being inserted) takes the general path, which looks
//!   again from the start; the fast paths change nothing before they give up.
//! * **`i_sb` is not counted**: creating or evicting an inode writes no superblock-wide
//!   line (see "Lifetimes"); the live-inode count that keeps the superblock is per
//!   thread (per counter slot).
//!
//! # Lifetimes
//!
//! * An inode's memory: freed a grace period after `->destroy_inode`, so a lock-free
//!   walker that reached it from a chain may still read it. The grace periods are the
//!   crate's own (`epoch.rs`: Fraser's epochs, as crossbeam-epoch, with loom models): a
//!   read-side section publishes the epoch in the thread's own record; the epoch moves on
//!   when every thread inside a section has seen it; what was unlinked before a stamp is
//!   freed two epochs later. Retired inodes are kept per thread, in batches of 60, as
//!   RCU keeps per-CPU callback lists for `call_rcu`: a full batch is stamped and queued
//!   on its thread, which frees its expired batches itself when its next batch fills
//!   (and every 128 pins while it has some) and fills the empty batch again. So an
//!   eviction allocates nothing and synchronizes with nobody, memory goes back to the
//!   glibc arena of the thread that evicted it (a free into another thread's arena takes
//!   that arena's lock), and nothing of 1 KB or more is ever allocated (crossbeam-epoch
//!   allocates a ~2 KB node every 64 deferred functions, and a request that large makes
//!   glibc consolidate every fastbin chunk of the process). A batch is stamped after its last inode was retired, so its grace period
//!   covers every inode in it (freeing later than needed is always safe). A thread keeps
//!   its 64 newest stamped batches; older ones, and those of a thread that exits, go to
//!   a shared orphan list (a lock-free stack, `orphan_list.rs`) that any thread frees from. So
//!   a thread that stops evicting but lives on (a pooled thread) keeps up to 64 batches
//!   (3,840 inodes, and the superblock if its last free was among them) and its partial
//!   batch until it pins or evicts again, calls [`flush_deferred`], or exits (test
//!   `an_idle_thread_holds_a_bounded_number_and_frees_all_at_exit`).
//! * A superblock (`i_sb`, as in Linux: a plain pointer in every inode): counted handles
//!   are only [`SuperBlock`] and a waiting lookup ([`InodeWait`]). Each inode is counted
//!   in a live count per counter slot (`+1` at allocation on the allocating thread's
//!   slot, a load and a store when the thread owns it; `-1` at the end of `destroy_inode`
//!   on the destroying thread's, a SeqCst RMW; per shard under the models). When the last handle goes the
//!   superblock is *detached*; it is freed (a grace period later, through the epoch) by
//!   whoever then sees the slots sum to 0: the detacher, or the destroyer of its last
//!   inode. The decrement/`detached` pair is a SeqCst Dekker, so exactly one of them sees
//!   the sum reach 0 (a `freed` flag claims the free once); no inode is allocated after
//!   detaching (allocating takes a handle), so a sum can only overstate the live count.
//!   Every use of `i_sb` after an inode's decrement is pinned since before it. So an
//!   [`InodeRef`] may outlive its [`SuperBlock`]: its last `iput` evicts it (the
//!   superblock is no longer active) and, being the last, frees the superblock.
//! * A parked inode (batched removal): `->destroy_inode` has run, but it is still on the
//!   superblock's lists and counted live, so it keeps the superblock until it is
//!   flushed. Nothing is parked on an inactive superblock, and `umount` (also the one a
//!   dropped [`SuperBlock`] runs) drains every outbox after clearing `SB_ACTIVE`, so no
//!   parked inode outlives the umount, and a detached superblock has none. A thread
//!   that stops evicting (idle, or exited: its slot and the outbox go to the next thread
//!   that claims the slot) leaves at most 32 parked inodes per superblock, whose memory
//!   comes back when that slot's outbox next fills, at [`SuperBlock::flush_evictions`],
//!   at a drain by an observer, or at the umount at the latest. Threads do not flush at
//!   exit: a thread-local would have to name the superblocks, which a drain and a free
//!   may end meanwhile, and every parked inode is already through `->destroy_inode`.
//!
//! # Experiment settings
//!
//! [`Settings`] switch each mechanism back: [`HashLock::Global`] (one `inode_hash_lock`),
//! [`SbList::Global`] (one `s_inode_list_lock`), [`Lookup::Locked`] (lookups under the
//! hash lock, before Linux 6.11), [`Lru::Single`] (one LRU list per superblock).
//! [`Settings::prepatch`] sets all four. [`CacheStats::global_lock_acquisitions`] counts
//! acquisitions of every lock that all tasks share (only those settings create one).
//!
//! # Bad input
//!
//! References are RAII ([`InodeRef`]: `Clone` is `ihold`, `Drop` is `iput`), so an `iput`
//! of a freed inode or a double `iput` cannot be written. What the types cannot prevent
//! panics with a message naming the inode, where Linux would `WARN`: a second
//! `unlock_new_inode` (through [`InodeRef::unlock_new_inode`]), `drop_nlink` at 0, the last
//! `iput` of an `I_NEW` inode, `insert_inode_locked` of an inode hashed before.
//!
//! A filesystem's inode data whose `Drop` panics: the panic reaches the caller of the
//! operation whose reclaim freed that inode's memory (any thread's, a grace period after
//! the eviction), and nothing else leaks. The cache frees retired memory only where its
//! own bookkeeping is done: the pins and retires inside an eviction are quiet, and the
//! frees they leave run at the eviction's end; a prune or `evict_inodes` evicts every
//! inode of its list before it passes a panic on. So does a panic in the filesystem's own
//! `write_inode`, `evict_inode` or `destroy_inode`: the eviction finishes (the inode is
//! unhashed, its waiters woken, its memory and its superblock's count given back), then
//! the panic goes on to the caller; a later lookup of the number loads it afresh.
//!
//! # Models
//!
//! Under `--cfg vfscale_loom` and `--cfg vfscale_shuttle` the locks and atomics come from
//! loom/shuttle (the `vfscale-sync` shim), and the grace periods are replaced by a small
//! model the schedulers can see (see `deferred_free.rs`); the epoch scheme itself has loom
//! models of its own (`epoch.rs`).
#![warn(missing_docs)]

mod cache;
mod counters;
mod deferred_free;
mod epoch;
mod evict;
mod hash_table;
mod inode;
mod inode_alloc;
mod inode_wait;
mod iput;
mod lookup;
mod lookup_fast;
mod lru;
mod orphan_list;
mod outbox;
mod sb_list;
mod superblock;
mod sync;
mod wait_table;
mod waiter;

pub use cache::InodeCache;
pub use inode::{Iget, Inode, InodeFlags, InodeRef, InodeState, NewInode};
pub use inode_wait::{FromOutcome, InodeWait, Started, WaitError};
#[doc(hidden)]
pub use lookup::Outcome;
pub use superblock::{InsertBusy, Match, SuperBlock};
pub use waiter::Interrupter;

/// Hurries the deferred freeing of evicted inodes' memory (best effort; for tests that
/// count drops of the filesystem's data). `->destroy_inode` itself runs at eviction.
/// It stamps the calling thread's partial batch and frees what of this thread's and the
/// orphan list has expired; another live thread's batches wait for that thread to pin or
/// evict again, call this, or exit (the crate docs, "Lifetimes").
pub fn flush_deferred() {
    deferred_free::flush();
}

/// A read-side section of the cache's grace periods (`rcu_read_lock`): while one is held
/// on any thread, no evicted inode's memory is freed. For tests that check deferred frees;
/// a cache operation takes its own.
#[doc(hidden)]
pub struct RcuReadLock(#[allow(dead_code)] deferred_free::Guard);

/// Enters a read-side section (see [`RcuReadLock`]).
#[doc(hidden)]
pub fn rcu_read_lock() -> RcuReadLock {
    RcuReadLock(deferred_free::Domain::new().pin())
}

/// What a filesystem gives the cache (`struct super_operations`). Every method but
/// `alloc_inode` has Linux's default.
pub trait SuperOperations: Send + Sync + Sized + 'static {
    /// The filesystem's in-memory inode (`container_of` the VFS inode in Linux). Filled
    /// while the inode is `I_NEW`, through interior mutability.
    ///
    /// Its `Drop` runs when the inode's memory is freed, a grace period after
    /// `->destroy_inode`, on the thread that evicted it (or, for a thread that exited,
    /// whichever thread frees the orphans): possibly inside another
    /// operation of the cache with one of its locks held (a last `iput` pins the epoch
    /// under an `i_lock`, and a pin may collect garbage). So it must not call into the
    /// cache (no `iget`, `iput` or lookup of any inode) or take a lock that a caller of the
    /// cache may hold; release what needs the cache in `->evict_inode` or `->destroy_inode`
    /// instead, as Linux's `->free_inode` (an RCU callback) may only free memory.
    type Data: Send + Sync + 'static;

    /// `->alloc_inode`: the data of a new inode numbered `ino` (`iget_locked`, `new_inode`).
    fn alloc_inode(&self, ino: u64) -> Self::Data;

    /// `->drop_inode`: whether the last `iput` evicts the inode now. Runs under `i_lock`:
    /// use only [`Inode`]'s getters. The default is [`inode_generic_drop`].
    fn drop_inode(&self, inode: &Inode<Self>) -> bool {
        inode_generic_drop(inode)
    }

    /// `->write_inode` before an inode that is not dropped is evicted anyway (unmounted
    /// superblock, `I_DONTCACHE`); the inode is `I_WILL_FREE` meanwhile.
    fn write_inode(&self, _inode: &Inode<Self>) {}

    /// `->evict_inode`: the inode is `I_FREEING`, off the LRU and the superblock list as
    /// far as any walker can see (a prune, `evict_inodes`, [`SuperBlock::for_each_inode`]
    /// pass over it; an inode that another CPU listed may still be linked there until a
    /// batch takes it off: the crate docs, "Batched removal"), still hashed (lookups of
    /// its key wait). No lock is held.
    fn evict_inode(&self, _inode: &Inode<Self>) {}

    /// `->destroy_inode`: right after `->evict_inode` and the unhash, on the evicting
    /// thread: the inode is unhashed and off the lists as far as any walker can see (as
    /// for `->evict_inode`); its data is dropped a grace period after it is off them
    /// all. No lock is held.
    fn destroy_inode(&self, _inode: &Inode<Self>) {}
}

/// `inode_generic_drop` (Linux 6.18's name for `generic_drop_inode`): drop an inode with
/// no links or that is unhashed.
pub fn inode_generic_drop<F: SuperOperations>(inode: &Inode<F>) -> bool {
    inode.nlink() == 0 || !inode.is_hashed()
}

/// Who serializes insert and remove on the inode hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HashLock {
    /// A lock per chain (the `hlist_bl` of Chinner's 2023 series).
    #[default]
    PerChain,
    /// One `inode_hash_lock` for the whole table (Linux before that series).
    Global,
}

/// How a superblock keeps its inode list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SbList {
    /// One list and lock per CPU shard (the `dlist` of Chinner's 2023 series).
    #[default]
    PerCpu,
    /// One list under one `s_inode_list_lock` (Linux).
    Global,
}

/// How lookups walk a hash chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Lookup {
    /// No lock: pinned epoch (Linux 6.11, 7180f8d91fcb).
    #[default]
    Lockless,
    /// Under the hash lock (Linux before 6.11).
    Locked,
}

/// How a superblock keeps its LRU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Lru {
    /// One list and lock per CPU shard.
    #[default]
    PerCpu,
    /// One list (Linux's `list_lru` on one NUMA node); exact single-list order.
    Single,
}

/// Cache configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Settings {
    /// Hash locking.
    pub hash_lock: HashLock,
    /// Superblock lists.
    pub sb_list: SbList,
    /// Lookup.
    pub lookup: Lookup,
    /// LRU.
    pub lru: Lru,
    /// log2 of the number of hash chains (`ihash_entries`); at most 30.
    pub hash_bits: u32,
    /// Shards of the per-CPU structures (rounded up to a power of two); 0: one per CPU.
    pub shards: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            hash_lock: HashLock::PerChain,
            sb_list: SbList::PerCpu,
            lookup: Lookup::Lockless,
            lru: Lru::PerCpu,
            hash_bits: if cfg!(any(vfscale_loom, vfscale_shuttle)) {
                2
            } else {
                16
            },
            shards: 0,
        }
    }
}

impl Settings {
    /// Every mechanism switched back: one hash lock, one superblock list, locked lookups,
    /// one LRU (the lab's `library-prepatch`).
    pub fn prepatch() -> Self {
        Settings {
            hash_lock: HashLock::Global,
            sb_list: SbList::Global,
            lookup: Lookup::Locked,
            lru: Lru::Single,
            ..Settings::default()
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        let n = if self.shards > 0 {
            self.shards
        } else if cfg!(any(vfscale_loom, vfscale_shuttle)) {
            2
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        n.clamp(1, 1 << 16).next_power_of_two()
    }
}

/// The counters of a cache, summed over CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Inodes allocated and not yet destroyed (`nr_inodes` of `/proc/sys/fs/inode-nr`).
    pub nr_inodes: u64,
    /// Inodes on LRU lists (`nr_unused`).
    pub nr_unused: u64,
    /// Acquisitions of locks that every task shares: `inode_hash_lock`
    /// ([`HashLock::Global`]), a superblock's single list lock ([`SbList::Global`]), a
    /// superblock's single LRU lock ([`Lru::Single`]). 0 with the default settings.
    pub global_lock_acquisitions: u64,
    /// Acquisitions of per-chain hash locks.
    pub chain_lock_acquisitions: u64,
    /// Acquisitions of per-CPU superblock list locks.
    pub sb_shard_lock_acquisitions: u64,
    /// Acquisitions of per-CPU LRU locks.
    pub lru_shard_lock_acquisitions: u64,
    /// Inodes inserted `I_NEW` (`iget` misses and `insert_inode_locked`): loads.
    pub loads: u64,
    /// Lookups that found an inode `I_NEW` and saw its load end while spinning on it
    /// (no registration, no sleep).
    pub new_waits_spun: u64,
    /// Lookups that found an inode `I_NEW` and registered in the wait table (the load
    /// outlasted the spin): each blocks unless the wake-up comes first.
    pub new_waits_slept: u64,
    /// Acquisitions of outbox locks (per superblock and thread: an eviction that parks
    /// its inode, a flush, a drain of every outbox; see "Batched removal"). The thread's
    /// own lock, which only a drain shares.
    pub outbox_lock_acquisitions: u64,
}
