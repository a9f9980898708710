//! Linux `fs/file.c` in userspace: one process's table of open descriptors
//! (`struct files_struct`) with Linux 6.x semantics, lock-free lookup, and the
//! scalability design of Mateusz Guzik's 2015 "fs: use a sequence counter instead of
//! file_lock in fd_install" (`fd_install` without `file_lock`, Linux commit
//! 8a81252b774b), plus an optional per-thread allocation policy beyond Linux.
//!
//! ```
//! use std::sync::Arc;
//! use vfscale_fdtable::{Errno, Fd, FdTable, Settings};
//!
//! let t: FdTable<&'static str> = FdTable::new(Settings::default());
//! let a = t.open(Arc::new("a"), false).unwrap();
//! let b = t.open(Arc::new("b"), true).unwrap();
//! assert_eq!((a, b), (Fd(0), Fd(1)));                  // lowest free descriptor
//! assert_eq!(t.dup2(a, Fd(7)), Ok(Fd(7)));             // dup2 onto a free slot
//! assert_eq!(*t.get(Fd(7)).unwrap(), "a");             // lock-free fget
//! let r = t.reserve(Fd(0), false).unwrap();            // alloc_fd, not yet installed
//! assert_eq!(t.dup2(a, r), Err(Errno::EBUSY));         // reserved slot: EBUSY
//! t.install(r, Arc::new("c"));                         // fd_install
//! t.exec();                                            // closes close-on-exec `b`
//! assert_eq!(t.close(b), Err(Errno::EBADF));
//! ```
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | the table (`struct files_struct`): lookup, install, close, dup, resize, allocation, `exec` | `table.rs` |
//! | deferred reclamation (what RCU is to `fs/file.c`) and its model under loom/shuttle | `epoch.rs` |
//! | the word bitmaps `open_fds`, `close_on_exec`, `full_fds_bits` | `bitmap.rs` |
//! | error numbers | `errno.rs` |
//! | the std/loom/shuttle primitives | `sync.rs` |
//! | `Fd`, settings, install modes, allocation policies, statistics | `lib.rs` |
//!
//! # Structure (Linux names)
//!
//! * `fdt` (`files->fdt`): the published `struct fdtable` part readers need: an array
//!   of slots, each an atomic pointer standing for the table's two references to a file
//!   (null = empty): a strong `Arc` reference, which keeps the file open, and a weak one,
//!   which keeps its allocation for lookups (Linux's `struct file` is
//!   `SLAB_TYPESAFE_BY_RCU` for the same reason). Published through a `crossbeam-epoch`
//!   `Atomic`; replaced only by a resize.
//! * `file_lock`: a mutex around the bitmaps (`open_fds`, `close_on_exec`,
//!   `full_fds_bits`), `next_fd`, `max_fds`, the PerThread chunk map, the close hook and
//!   the counters. Unlike Linux the bitmaps are not in the RCU-published part, because
//!   no lock-free path here reads them.
//! * `resize_in_progress`: an atomic flag set while a resize copies the table.
//! * `rlimit`: `RLIMIT_NOFILE`, an atomic (read by lock-free PerThread allocation).
//!
//! # What protects what
//!
//! | data | writers | readers |
//! |---|---|---|
//! | `fdt` pointer | resize, under `file_lock` | anyone, pinned (epoch) |
//! | an installed (non-null) slot | `file_lock` holders (close, dup2, close_range, exec) | anyone, pinned |
//! | an empty, reserved slot | its reserver's `install` (lockless CAS, or under `file_lock`), the resizer's seal CAS | anyone, pinned |
//! | bitmaps, `next_fd`, `max_fds`, chunk map, hook, counters | `file_lock` holders | `file_lock` holders |
//! | a PerThread chunk's `used`/`cloexec` words | owner thread (CAS, no lock), `file_lock` holders (atomic RMW) | both |
//! | a file's `Arc` strong count | table (one per slot), `get`/`with` (increment if not zero), their callers | — |
//! | a file's `Arc` weak count | table (one per slot, released a grace period after the slot is emptied) | — |
//!
//! # Invariants
//!
//! 1. A slot of the current table is non-null only if its `open_fds` bit (or chunk
//!    `used` bit) is set; a set bit with a null slot is a *reserved* descriptor.
//! 2. Bit `w` of `full_fds_bits` is set iff word `w` of `open_fds` is all ones.
//! 3. Every descriptor below `next_fd` is allocated (a hint; `find_next_fd` starts there).
//! 4. A slot pointer that is neither null nor the seal stands for one strong and one weak
//!    reference the table owns. Whoever empties the slot under `file_lock` takes both,
//!    once: the strong one is dropped when the close returns (after the close hook), the
//!    weak one through the epoch, after every reader that could have loaded the pointer.
//!    So a file's strong count is at least one while a slot holds it, and its allocation
//!    outlives every pinned reader that loaded it.
//! 5. Tables only grow, in powers of two (64, 128, 256, ...) capped at `nr_open`
//!    rounded up to a word, like `alloc_fdtable`; a retired table is sealed (every empty
//!    slot holds the seal) and owns no file.
//!
//! # Lock order
//!
//! `file_lock` is the only lock and is never held while calling user code: the close
//! hook and the final drop of a closed file run after it is released (as `filp_close`
//! runs after `spin_unlock(&files->file_lock)`). Epoch pins nest anywhere.
//!
//! # Lookup (`fget`) without locks
//!
//! [`FdTable::get`] is `__fget_files_rcu`: pin the epoch, `Acquire`-load `fdt`,
//! `Acquire`-load the slot, then `get_file_rcu`: increment the file's strong count unless
//! it is zero (`Weak::upgrade` on the slot's weak reference, which the pin keeps alive).
//! A zero count means a closer or a dup2 emptied or replaced the slot after the load and
//! dropped the file: the lookup reads the slot again, as Linux does (dup2 replaces an open
//! descriptor atomically, so "not open" would be wrong for it). Pinning
//! `crossbeam-epoch` writes only the calling thread's own epoch record (and issues a
//! fence); the lookup writes no shared cache line other than the file's own count.
//! [`FdTable::with`] is `fdget` + `fdput` in a table shared by threads: it holds a
//! counted reference while its closure runs.
//!
//! So a close is Linux's: the close hook runs (`filp_close`), then the table's reference
//! is dropped (`fput`), and a file nobody else holds is dropped before `close` returns,
//! in the closing thread; one a lookup still holds goes when that reference does. Only
//! the memory of a file's `Arc` (its counts) waits for a grace period, as `struct file`'s
//! slab memory waits for RCU; [`flush_deferred`] hurries that (tests). Until then the
//! table's weak reference is counted: on a caller's `Arc` of a closed file
//! `Arc::get_mut` answers `None` (and `Arc::make_mut` clones) for that long, while
//! `Arc::try_unwrap` and `Arc::into_inner` succeed at once.
//!
//! # Install without the lock, and resize
//!
//! Linux 8a81252b774b: `fd_install` checks `files->resize_in_progress`; if clear it
//! writes the slot of the table it sees under `rcu_read_lock_sched`, else it takes
//! `file_lock`; `expand_fdtable` sets the flag and calls `synchronize_rcu()` so that every
//! installer either saw the flag or finished before the copy. crossbeam-epoch has no
//! `synchronize_rcu`, so the grace-period wait is replaced by a per-slot handshake that
//! needs no waiting at all:
//!
//! * **install** (`InstallMode::Lockless`): if `resize_in_progress` is clear, pin, load
//!   `fdt`, and `compare_exchange(null -> file)` on the slot (`Release` on success). If
//!   that fails because the slot holds the *seal*, or the flag was set, take `file_lock`
//!   and install into the current table. `InstallMode::UnderLock` always takes the lock
//!   (Linux before that change: two lock acquisitions per allocate + install).
//! * **resize** (`expand_files`, under `file_lock`, never dropped): set the flag; for each
//!   slot of the old table, an installed slot is copied as is (nobody but lock holders
//!   changes it), an empty slot is sealed with `compare_exchange(null -> SEAL)`; if that
//!   CAS fails an installer got there first and its file is copied. Then the new table is
//!   published with a `Release` swap, the old one is retired with `defer_destroy`, the
//!   flag is cleared. Lookups never stop: a reader still on the old table reads the same
//!   values (a sealed slot reads as empty, which it was), and no file can be closed until
//!   the new table is published, because closing needs `file_lock`.
//!
//! Because the seal and the install are RMWs on the same slot, they are totally ordered:
//! either the install is copied or it is redirected, so no install is lost and no stale
//! copy can resurrect a file closed in the new table (the race that sank a plain
//! seqcount retry in the upstream review thread). The flag is only a hint that saves a failed CAS.
//!
//! ## Memory ordering, pair by pair
//!
//! * install's slot CAS (`Release`) -> lookup's slot load (`Acquire`), close's swap
//!   (`AcqRel`), the resizer's load/seal-CAS failure (`Acquire`): the file's contents and
//!   the `Arc` are visible to whoever sees the pointer.
//! * resizer's copy stores (`Relaxed`) -> `fdt` swap (`Release`) -> reader's `fdt` load
//!   (`Acquire`): the copied slots are visible in the new table.
//! * resizer's seal CAS -> installer's failed CAS: same location, modification order
//!   decides; the installer then takes `file_lock`, whose acquisition synchronizes with
//!   the resizer's unlock (after publication), so it loads the new table.
//! * `resize_in_progress`: `Release` clear -> `Acquire` check (hint only).
//! * PerThread: closer's `used` bit clear (`Release`, after emptying the slot) -> owner's
//!   claim CAS (`Acquire`), so the owner installs into an empty slot.
//! * Reclamation: crossbeam-epoch's own pin fence and epoch protocol.
//!
//! # Allocation policies
//!
//! [`AllocPolicy::Lowest`] is POSIX: `reserve` takes `file_lock` once (`alloc_fd`, with
//! `find_next_fd` over `full_fds_bits` and `open_fds`, starting at `next_fd`).
//! [`AllocPolicy::PerThread`] waives the lowest-fd rule for `reserve(0)`/`open`/`dup`:
//! each thread gets a chunk of 64 descriptors (a whole `open_fds` word, marked full)
//! under the lock, then allocates in it with a CAS on the chunk's own word, without the
//! lock, until it is full. A chunk stays with the table (its descriptors can still be
//! closed or dup2'd onto by anyone); when no whole free word is left below the limit,
//! allocation falls back to the lowest free descriptor outside chunks, then to a free
//! descriptor in any chunk, so `EMFILE` still means that none is free below the limit.
//!
//! # Models
//!
//! Under `--cfg vfscale_loom` and `--cfg vfscale_shuttle` the atomics and the mutex
//! come from loom/shuttle (the `sync` shim module), tables start at 2 slots so resizes are
//! cheap to explore, and crossbeam-epoch (no loom support in its released form) is
//! replaced by a small model: a per-table reader count and a garbage list run when a
//! collector observes no readers (see `epoch.rs`). The table pointer is a plain atomic
//! pointer there; retired tables go through the model's garbage list.
//!
//! # Differences from Linux (deliberate)
//!
//! * `close_range(CLOSE_RANGE_UNSHARE)` returns the private copy (see
//!   [`FdTable::close_range`]).
//! * The table lock is held through a resize (userspace allocation does not sleep), so
//!   there is no `resize_wait` queue.
//! * Setting `RLIMIT_NOFILE` above `nr_open` is `EPERM`, as the kernel's `do_prlimit`.
#![warn(missing_docs)]

mod bitmap;
mod epoch;
mod errno;
mod sync;
mod table;

use std::fmt;

pub use errno::Errno;
pub use table::{FdTable, DEFAULT_NR_OPEN, DEFAULT_RLIMIT_NOFILE};

/// Hurries deferred reclamation (closed files' allocations, retired tables): best effort,
/// for tests that count frees. Files themselves are dropped at their last reference and
/// never wait for it.
pub fn flush_deferred() {
    epoch::flush();
}

/// A file descriptor number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fd(pub u32);

impl fmt::Display for Fd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How `install` (Linux `fd_install`) synchronises with a concurrent table resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InstallMode {
    /// The lock-free install (Linux since 8a81252b774b): install takes no table lock
    /// unless a resize is in progress.
    #[default]
    Lockless,
    /// Linux before 8a81252b774b: install takes the table lock again.
    UnderLock,
}

/// Which free descriptor `reserve(0)`/`open`/`dup` hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllocPolicy {
    /// POSIX: the lowest free descriptor.
    #[default]
    Lowest,
    /// Beyond Linux: the process waives the lowest-fd rule; each thread allocates from its
    /// own 64-descriptor chunk, so steady-state allocation takes no shared lock.
    PerThread,
}

/// Table configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Settings {
    /// How install synchronises with resize.
    pub install: InstallMode,
    /// Which free descriptor is handed out.
    pub policy: AllocPolicy,
}

/// `close_range(2)` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CloseRangeFlags {
    /// `CLOSE_RANGE_CLOEXEC`: mark close-on-exec instead of closing.
    pub cloexec: bool,
    /// `CLOSE_RANGE_UNSHARE`: operate on a private copy of the table (returned).
    pub unshare: bool,
}

/// Counters of one table (what the lab reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableStats {
    /// Acquisitions of the table lock (`file_lock`), excluding `stats` itself.
    pub lock_acquisitions: u64,
    /// Table expansions (`expand_fdtable`).
    pub resizes: u64,
    /// Lockless installs that found a resize in progress and took the lock instead.
    pub install_fallbacks: u64,
    /// `AllocPolicy::PerThread`: chunks handed to threads.
    pub chunk_grants: u64,
    /// Current table size (`max_fds`).
    pub max_fds: u32,
}
