//! `struct files_struct` and the operations of `fs/file.c` on it.

use std::cell::RefCell;
use std::ptr;
use std::sync::{Arc, Weak};

use crate::bitmap::{self, BITS};
use crate::epoch::{Domain, Guard, TablePtr};
use crate::sync::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};
use crate::{AllocPolicy, CloseRangeFlags, Errno, Fd, InstallMode, Settings, TableStats};

/// Slots in a new table (`NR_OPEN_DEFAULT` = `BITS_PER_LONG`). The models start tiny so
/// a resize is a handful of atomic steps.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const NR_OPEN_DEFAULT: u32 = 64;
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const NR_OPEN_DEFAULT: u32 = 2;

/// Default `RLIMIT_NOFILE` (soft and hard here).
pub const DEFAULT_RLIMIT_NOFILE: u32 = 1024;
/// Default `fs.nr_open`.
pub const DEFAULT_NR_OPEN: u32 = 1 << 20;

/// The address the resizer writes into an empty slot of a table it is retiring ("moved").
/// A static's address is never that of an `Arc` allocation; it is compared, never read.
static SEAL_BYTE: u8 = 0;

fn sealed<F>() -> *mut F {
    ptr::addr_of!(SEAL_BYTE) as *mut F
}

/// Whether a loaded slot value is a file (not empty, not sealed).
fn is_file<F>(p: *mut F) -> bool {
    !p.is_null() && p != sealed::<F>()
}

/// `struct fdtable`, the RCU-published part: the array of slots. `max_fds` is its length.
/// Each slot holds a slot reference to the file ([`slot_ref`]), null, or (only in a table
/// already replaced by a resize) the seal.
struct Slots<F> {
    fd: Box<[AtomicPtr<F>]>,
}

impl<F> Slots<F> {
    fn new(n: u32) -> Self {
        Slots {
            fd: (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect(),
        }
    }
}

/// A slot's reference to `file`, as the pointer the slot stores: one strong reference
/// (`Arc::into_raw`: it keeps the file open) and one weak reference (`Arc::downgrade`,
/// forgotten: it keeps the allocation, not the file, for lookups that loaded the pointer).
/// Both are the table's; a closer drops the strong one at once and the weak one a grace
/// period later ([`drop_slot_ref`]). One pointer stands for both: `Arc::into_raw` and
/// `Weak::into_raw` of one allocation return the same pointer to the same `F`, derived
/// the same way from the allocation. std shows the equality (`Weak::as_ptr`'s example:
/// "Both point to the same object") but its `from_raw` contracts name only their own
/// `into_raw`: this relies on std's implementation, as every std release has it (tested
/// by `close_rcu` on the one the workspace builds with).
fn slot_ref<F>(file: Arc<F>) -> *mut F {
    std::mem::forget(Arc::downgrade(&file));
    Arc::into_raw(file) as *mut F
}

/// Another slot reference to the file of slot pointer `p` (`get_file` for dup2 and fork).
///
/// # Safety
/// `p` is a slot reference whose strong reference is alive for the call (the caller holds
/// `file_lock`, so nobody empties the slot).
unsafe fn slot_ref_clone<F>(p: *mut F) -> *mut F {
    // SAFETY: by the contract the strong count is at least one.
    let file = unsafe {
        Arc::increment_strong_count(p as *const F);
        Arc::from_raw(p as *const F)
    };
    slot_ref(file)
}

/// `get_file_rcu`: a new strong reference to the file of slot pointer `p`, unless its
/// last strong reference is gone (a closer emptied the slot and dropped it):
/// `Weak::upgrade` is an increment-if-not-zero of the strong count.
///
/// # Safety
/// `p` was loaded from a slot while the caller was pinned, and the caller is still
/// pinned: the slot's weak reference, which keeps the allocation, goes only a grace period
/// after the slot was emptied.
unsafe fn get_file_rcu<F>(p: *mut F) -> Option<Arc<F>> {
    // SAFETY: the allocation is alive by the contract; the `Weak` is borrowed (never
    // dropped), so the table's weak count is left as it was.
    let w = std::mem::ManuallyDrop::new(unsafe { Weak::from_raw(p as *const F) });
    w.upgrade()
}

/// Takes a slot reference apart once its slot is empty (or was never stored): the strong
/// reference, to drop now (the file's last one closes it, as Linux's last `fput`), and
/// the weak one, to drop once no lookup can still hold the pointer.
///
/// # Safety
/// `p` is a slot reference that no slot holds any more, owned by the caller (dropped once).
unsafe fn drop_slot_ref<F>(p: *mut F) -> (Arc<F>, Weak<F>) {
    // SAFETY: the slot reference's two references are the caller's (the contract).
    unsafe { (Arc::from_raw(p as *const F), Weak::from_raw(p as *const F)) }
}

/// `AllocPolicy::PerThread`: 64 descriptors (one bitmap word) owned by one thread.
/// `used`/`cloexec` replace that word of `open_fds`/`close_on_exec`.
struct Chunk {
    base: u32,
    used: AtomicU64,
    cloexec: AtomicU64,
}

impl Chunk {
    /// The owner's lock-free allocation: the lowest free bit below `limit`.
    fn claim(&self, limit: u32) -> Option<u32> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let free = !cur;
            if free == 0 {
                return None;
            }
            let bit = free.trailing_zeros();
            let fd = self.base + bit;
            if fd >= limit {
                return None;
            }
            // Acquire: pairs with the Release of `release_bit` in close, so the closer's
            // emptying of the slot happens-before our install into it.
            match self
                .used
                .compare_exchange_weak(cur, cur | (1 << bit), Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(fd),
                Err(v) => cur = v,
            }
        }
    }
}

thread_local! {
    /// PerThread: this thread's current chunk in each table (by table id).
    static MY_CHUNKS: RefCell<Vec<(u64, Weak<Chunk>)>> = const { RefCell::new(Vec::new()) };
}

static NEXT_TABLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

type Hook<F> = Arc<dyn Fn(Fd, &Arc<F>) + Send + Sync>;

/// What `file_lock` protects (`struct fdtable` bitmaps + `files_struct` written part).
struct Inner<F> {
    /// `max_fds`: length of the current table and of the bitmaps.
    max_fds: u32,
    open_fds: Vec<u64>,
    close_on_exec: Vec<u64>,
    full_fds_bits: Vec<u64>,
    /// Lowest descriptor that may be free (a hint, as `files->next_fd`).
    next_fd: u32,
    /// PerThread: the chunk owning each bitmap word, if any (its `open_fds` word is `!0`).
    chunks: Vec<Option<Arc<Chunk>>>,
    hook: Option<Hook<F>>,
    lock_acquisitions: u64,
    resizes: u64,
    install_fallbacks: u64,
    chunk_grants: u64,
}

impl<F> Inner<F> {
    fn new(max_fds: u32) -> Self {
        let words = bitmap::words_for(max_fds as usize);
        Inner {
            max_fds,
            open_fds: vec![0; words],
            close_on_exec: vec![0; words],
            full_fds_bits: vec![0; bitmap::words_for(words)],
            next_fd: 0,
            chunks: vec![None; words],
            hook: None,
            lock_acquisitions: 0,
            resizes: 0,
            install_fallbacks: 0,
            chunk_grants: 0,
        }
    }

    fn grow(&mut self, max_fds: u32) {
        let words = bitmap::words_for(max_fds as usize);
        self.max_fds = max_fds;
        self.open_fds.resize(words, 0);
        self.close_on_exec.resize(words, 0);
        self.full_fds_bits.resize(bitmap::words_for(words), 0);
        self.chunks.resize(words, None);
    }

    fn chunk(&self, fd: u32) -> Option<&Arc<Chunk>> {
        self.chunks.get(fd as usize / BITS).and_then(|c| c.as_ref())
    }

    /// `fd_is_open`: allocated (installed or reserved).
    fn is_open(&self, fd: u32) -> bool {
        match self.chunk(fd) {
            Some(c) => c.used.load(Ordering::Relaxed) & (1 << (fd % 64)) != 0,
            None => bitmap::test(&self.open_fds, fd as usize),
        }
    }

    /// `__set_open_fd`; returns whether it was already set (atomically for chunk words,
    /// whose owner allocates without the lock).
    fn set_open(&mut self, fd: u32) -> bool {
        if let Some(c) = self.chunk(fd) {
            return c.used.fetch_or(1 << (fd % 64), Ordering::Acquire) & (1 << (fd % 64)) != 0;
        }
        let was = bitmap::test(&self.open_fds, fd as usize);
        bitmap::set(&mut self.open_fds, fd as usize);
        let w = fd as usize / BITS;
        if self.open_fds[w] == !0 {
            bitmap::set(&mut self.full_fds_bits, w);
        }
        was
    }

    /// `__put_unused_fd`: `__clear_open_fd` and lower `next_fd`.
    fn put_unused(&mut self, fd: u32) {
        if let Some(c) = self.chunk(fd) {
            // Release: pairs with the owner's Acquire claim (the slot is empty by now).
            c.used.fetch_and(!(1 << (fd % 64)), Ordering::Release);
            return;
        }
        bitmap::clear(&mut self.open_fds, fd as usize);
        bitmap::clear(&mut self.full_fds_bits, fd as usize / BITS);
        if fd < self.next_fd {
            self.next_fd = fd;
        }
    }

    fn cloexec(&self, fd: u32) -> bool {
        match self.chunk(fd) {
            Some(c) => c.cloexec.load(Ordering::Relaxed) & (1 << (fd % 64)) != 0,
            None => bitmap::test(&self.close_on_exec, fd as usize),
        }
    }

    fn set_cloexec(&mut self, fd: u32, on: bool) {
        if let Some(c) = self.chunk(fd) {
            set_chunk_cloexec(c, fd, on);
        } else if on {
            bitmap::set(&mut self.close_on_exec, fd as usize);
        } else {
            bitmap::clear(&mut self.close_on_exec, fd as usize);
        }
    }

    /// `find_next_fd`: the lowest clear bit of `open_fds` at or after `start`, skipping
    /// full words through `full_fds_bits`; `max_fds` if none.
    fn find_next_fd(&self, start: u32) -> u32 {
        let maxfd = self.max_fds as usize;
        let maxbit = maxfd / BITS;
        let mut start = start as usize;
        let bitbit = bitmap::find_next_zero_bit(&self.full_fds_bits, maxbit, start / BITS) * BITS;
        if bitbit >= maxfd {
            return maxfd as u32;
        }
        if bitbit > start {
            start = bitbit;
        }
        bitmap::find_next_zero_bit(&self.open_fds, maxfd, start) as u32
    }
}

fn set_chunk_cloexec(c: &Chunk, fd: u32, on: bool) {
    if on {
        c.cloexec.fetch_or(1 << (fd % 64), Ordering::Relaxed);
    } else {
        c.cloexec.fetch_and(!(1 << (fd % 64)), Ordering::Relaxed);
    }
}

/// The size `expand_files` grows to so that `nr` fits (`alloc_fdtable`): the next power
/// of two above `nr`, capped at `nr_open` rounded up to a whole word.
fn table_size_for(nr: u32, nr_open: u32) -> u32 {
    let n = (nr as u64 + 1).next_power_of_two();
    let cap = ((nr_open.max(1) as u64 - 1) | (BITS as u64 - 1)) + 1;
    n.min(cap) as u32
}

/// One process's table of open descriptors (Linux `struct files_struct`).
///
/// Share it between threads by reference or `Arc` (as `CLONE_FILES` threads share
/// `files_struct`); [`fork`](Self::fork) makes a copy. See the crate docs for the design.
pub struct FdTable<F: Send + Sync + 'static> {
    /// `files->fdt`: the published slot array.
    fdt: TablePtr<Slots<F>>,
    /// `files->file_lock` and what it protects.
    file_lock: Mutex<Inner<F>>,
    /// `files->resize_in_progress`: a hint for lockless installers (correctness comes from
    /// the seal; see the crate docs).
    resize_in_progress: AtomicBool,
    /// `RLIMIT_NOFILE` (soft = hard here). Read without the lock.
    rlimit: AtomicU32,
    nr_open: u32,
    settings: Settings,
    id: u64,
    domain: Domain,
}

impl<F: Send + Sync + 'static> FdTable<F> {
    /// An empty table with the default limits (`RLIMIT_NOFILE` 1024, `nr_open` 1048576).
    pub fn new(settings: Settings) -> FdTable<F> {
        Self::with_limits(settings, DEFAULT_RLIMIT_NOFILE, DEFAULT_NR_OPEN)
    }

    /// An empty table with the given `RLIMIT_NOFILE` and `fs.nr_open` (`rlimit_nofile` is
    /// capped at `nr_open`).
    pub fn with_limits(settings: Settings, rlimit_nofile: u32, nr_open: u32) -> FdTable<F> {
        let nr_open = nr_open.max(1);
        FdTable {
            fdt: TablePtr::new(Slots::new(NR_OPEN_DEFAULT)),
            file_lock: Mutex::new(Inner::new(NR_OPEN_DEFAULT)),
            resize_in_progress: AtomicBool::new(false),
            rlimit: AtomicU32::new(rlimit_nofile.min(nr_open)),
            nr_open,
            settings,
            id: NEXT_TABLE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            domain: Domain::new(),
        }
    }

    /// The settings the table was made with.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// `setrlimit(RLIMIT_NOFILE)`, soft and hard. Above `nr_open`: `EPERM`, as Linux's
    /// `do_prlimit`. Lowering it closes nothing.
    pub fn set_rlimit_nofile(&self, n: u32) -> Result<(), Errno> {
        if n > self.nr_open {
            return Err(Errno::EPERM);
        }
        self.rlimit.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// The current `RLIMIT_NOFILE`.
    pub fn rlimit_nofile(&self) -> u32 {
        self.rlimit.load(Ordering::Relaxed)
    }

    /// `fs.nr_open`.
    pub fn nr_open(&self) -> u32 {
        self.nr_open
    }

    /// Takes `file_lock`, counting the acquisition.
    fn lock(&self) -> MutexGuard<'_, Inner<F>> {
        let mut g = self.file_lock.lock();
        g.lock_acquisitions += 1;
        g
    }

    /// `expand_files`: makes `nr` a valid index. Called with `file_lock` held (`inner`).
    /// Grows by publishing a larger copy; the old table is retired through the epoch.
    fn expand(&self, inner: &mut Inner<F>, nr: u32, g: &Guard<'_>) -> Result<(), Errno> {
        if nr < inner.max_fds {
            return Ok(());
        }
        if nr >= self.nr_open {
            return Err(Errno::EMFILE);
        }
        let size = table_size_for(nr, self.nr_open).max(nr + 1);
        let new = Slots::new(size);
        // A hint only: lockless installers that see it go straight to the lock.
        self.resize_in_progress.store(true, Ordering::Relaxed);
        let old = self.fdt.load(g);
        for (i, s) in old.fd.iter().enumerate() {
            // Non-empty slots change only under file_lock, which we hold. An empty slot
            // may be filled concurrently by a lockless install, so it is sealed with a CAS:
            // either the installer's CAS came first (we read its file, Acquire pairing with
            // its Release, and copy it), or ours did and its CAS fails and it retries under
            // file_lock, after we publish.
            let mut v = s.load(Ordering::Acquire);
            if v.is_null() {
                match s.compare_exchange(ptr::null_mut(), sealed(), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => continue,
                    Err(cur) => v = cur,
                }
            }
            debug_assert!(is_file(v), "live table holds a seal");
            new.fd[i].store(v, Ordering::Relaxed);
        }
        // SAFETY: file_lock is held (single replacer); the old table's slots were moved
        // (its file pointers are now owned by `new`), and the old table's drop frees only
        // the array, never the files.
        unsafe { self.fdt.replace(new, g) };
        // Release pairs with the installer's Acquire load of the flag (hint only).
        self.resize_in_progress.store(false, Ordering::Release);
        inner.grow(size);
        inner.resizes += 1;
        Ok(())
    }

    /// `alloc_fd(start, end, flags)` under `file_lock`.
    fn alloc_fd(&self, start: u32, end: u32, cloexec: bool) -> Result<Fd, Errno> {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let mut inner = self.lock();
        let mut fd = start.max(inner.next_fd);
        if fd < inner.max_fds {
            fd = inner.find_next_fd(fd);
        }
        if fd >= end {
            return Err(Errno::EMFILE);
        }
        self.expand(&mut inner, fd, &g)?;
        if start <= inner.next_fd {
            inner.next_fd = fd + 1;
        }
        inner.set_open(fd);
        inner.set_cloexec(fd, cloexec);
        Ok(Fd(fd))
    }

    /// PerThread: allocate from this thread's chunk; a new chunk under the lock when it
    /// is full; the shared lowest-fd path when no whole free word is left.
    fn alloc_per_thread(&self, cloexec: bool) -> Result<Fd, Errno> {
        let limit = self.rlimit_nofile();
        let mine = MY_CHUNKS.with(|m| {
            let mut m = m.borrow_mut();
            m.retain(|(_, w)| w.strong_count() > 0);
            m.iter()
                .find(|(id, _)| *id == self.id)
                .and_then(|(_, w)| w.upgrade())
        });
        if let Some(c) = mine.as_ref() {
            if let Some(fd) = c.claim(limit) {
                set_chunk_cloexec(c, fd, cloexec);
                return Ok(Fd(fd));
            }
        }
        let chunk = {
            // Pin first: an outermost pin may run deferred drops (user code), never under
            // `file_lock`.
            let g = self.domain.pin();
            let mut inner = self.lock();
            let top = limit.min(self.nr_open) as usize;
            let words = top.div_ceil(BITS);
            let free = (0..words).find(|&w| {
                inner.chunks.get(w).is_none_or(|c| c.is_none())
                    && inner.open_fds.get(w).is_none_or(|&x| x == 0)
            });
            let Some(w) = free else {
                drop(inner);
                return match self.alloc_fd(0, limit, cloexec) {
                    Err(Errno::EMFILE) => self.claim_any_chunk(limit, cloexec),
                    r => r,
                };
            };
            let last = ((w + 1) * BITS - 1).min(self.nr_open as usize - 1) as u32;
            self.expand(&mut inner, last, &g)?;
            let c = Arc::new(Chunk {
                base: (w * BITS) as u32,
                used: AtomicU64::new(0),
                cloexec: AtomicU64::new(0),
            });
            inner.open_fds[w] = !0;
            bitmap::set(&mut inner.full_fds_bits, w);
            inner.chunks[w] = Some(c.clone());
            inner.chunk_grants += 1;
            c
        };
        MY_CHUNKS.with(|m| {
            let mut m = m.borrow_mut();
            m.retain(|(id, _)| *id != self.id);
            m.push((self.id, Arc::downgrade(&chunk)));
        });
        match chunk.claim(limit) {
            Some(fd) => {
                set_chunk_cloexec(&chunk, fd, cloexec);
                Ok(Fd(fd))
            }
            None => self.claim_any_chunk(limit, cloexec),
        }
    }

    /// PerThread, last resort: a free descriptor in any thread's chunk, so that `EMFILE`
    /// means no descriptor below the limit is free at all.
    fn claim_any_chunk(&self, limit: u32, cloexec: bool) -> Result<Fd, Errno> {
        let inner = self.lock();
        for c in inner.chunks.iter().flatten() {
            if let Some(fd) = c.claim(limit) {
                set_chunk_cloexec(c, fd, cloexec);
                return Ok(Fd(fd));
            }
        }
        Err(Errno::EMFILE)
    }

    /// `alloc_fd`/`get_unused_fd_flags`: reserves the lowest free descriptor `>= start`
    /// (with `AllocPolicy::PerThread` and `start == 0`: a free descriptor of this thread's
    /// chunk). `EMFILE` when none is below `RLIMIT_NOFILE` (or `nr_open`). The slot stays
    /// empty until [`install`](Self::install) or [`unreserve`](Self::unreserve).
    pub fn reserve(&self, start: Fd, cloexec: bool) -> Result<Fd, Errno> {
        if self.settings.policy == AllocPolicy::PerThread && start.0 == 0 {
            return self.alloc_per_thread(cloexec);
        }
        self.alloc_fd(start.0, self.rlimit_nofile(), cloexec)
    }

    /// `fd_install`: fills a slot [`reserve`](Self::reserve) returned. With
    /// `InstallMode::Lockless` this takes no lock unless a resize is in progress.
    ///
    /// # Panics
    /// If `fd` was not reserved or is already installed (Linux: `BUG_ON`), when detected.
    pub fn install(&self, fd: Fd, file: Arc<F>) {
        let p = slot_ref(file);
        if self.settings.install == InstallMode::Lockless && !self.resize_in_progress.load(Ordering::Acquire)
        {
            let g = self.domain.pin();
            let t = self.fdt.load(&g);
            let slot = t.fd.get(fd.0 as usize).unwrap_or_else(|| bad_install(fd, p));
            // Release: pairs with the Acquire loads of lookups (`get`, `with`), of close
            // and of the resizer's copy, publishing the file behind the pointer.
            match slot.compare_exchange(ptr::null_mut(), p, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return,
                Err(cur) if cur == sealed() => {}
                Err(_) => bad_install(fd, p),
            }
            // The table was sealed by a resize: retry under the lock, which the resizer
            // holds until the new table is published.
            let stored = {
                let mut inner = self.lock();
                inner.install_fallbacks += 1;
                self.install_locked(&g, fd, p)
            };
            if !stored {
                bad_install(fd, p);
            }
            return;
        }
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let stored = {
            let mut inner = self.lock();
            if self.settings.install == InstallMode::Lockless {
                inner.install_fallbacks += 1;
            }
            self.install_locked(&g, fd, p)
        };
        if !stored {
            bad_install(fd, p);
        }
    }

    /// Install with `file_lock` held: the current table cannot be sealed under us.
    /// Returns false, storing nothing, if `fd` is not a reserved slot; the caller panics
    /// once the lock is released (the panic drops the caller's file).
    fn install_locked(&self, g: &Guard<'_>, fd: Fd, p: *mut F) -> bool {
        let t = self.fdt.load(g);
        let Some(slot) = t.fd.get(fd.0 as usize) else {
            return false;
        };
        slot.compare_exchange(ptr::null_mut(), p, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// `put_unused_fd`: gives back a reserved, never-installed descriptor.
    pub fn unreserve(&self, fd: Fd) {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let mut inner = self.lock();
        let t = self.fdt.load(&g);
        let empty =
            t.fd.get(fd.0 as usize)
                .is_some_and(|s| s.load(Ordering::Relaxed).is_null());
        if empty && inner.is_open(fd.0) {
            inner.put_unused(fd.0);
        }
    }

    /// `reserve(0)` + `install`: what `open(2)` does.
    pub fn open(&self, file: Arc<F>, cloexec: bool) -> Result<Fd, Errno> {
        let fd = self.reserve(Fd(0), cloexec)?;
        self.install(fd, file);
        Ok(fd)
    }

    /// The raw file pointer of `fd` in the table `g` sees (null if none).
    fn lookup_raw(&self, g: &Guard<'_>, fd: Fd) -> *mut F {
        let t = self.fdt.load(g);
        match t.fd.get(fd.0 as usize) {
            // Acquire: pairs with install's Release (and the resizer's publication).
            Some(s) => {
                let p = s.load(Ordering::Acquire);
                if is_file(p) {
                    p
                } else {
                    ptr::null_mut()
                }
            }
            None => ptr::null_mut(),
        }
    }

    /// `fget` (`__fget_files_rcu`): a new reference to the file at `fd`. Takes no lock
    /// and writes no shared memory other than the file's own reference count.
    ///
    /// If the file's last reference went after the slot was read (a close, or a dup2 that
    /// replaced it), the slot no longer holds it: the lookup reads the slot again, as
    /// Linux retries when `get_file_rcu` fails. Answering `None` instead would be wrong
    /// for dup2, which replaces an open descriptor atomically: `fd` was open throughout.
    pub fn get(&self, fd: Fd) -> Option<Arc<F>> {
        let g = self.domain.pin();
        loop {
            let p = self.lookup_raw(&g, fd);
            if p.is_null() {
                return None;
            }
            // SAFETY: `p` was loaded from a slot under `g`, which is still pinned.
            if let Some(f) = unsafe { get_file_rcu(p) } {
                return Some(f);
            }
            // The slot was emptied or replaced before the file's last reference went,
            // so the next load reads null or a newer file (a loop on the models, which
            // must be told to let the writer run).
            crate::sync::spin_hint();
        }
    }

    /// `fdget`: runs `f` on the file at `fd`, holding a reference for the call (what
    /// `fdget` does in a table shared by threads; the file is counted, so a concurrent
    /// close leaves it open until `f` returns, and if that close dropped the table's
    /// reference, the file is closed here, after `f`, as Linux's `fdput` does).
    pub fn with<R>(&self, fd: Fd, f: impl FnOnce(&F) -> R) -> Option<R> {
        let file = self.get(fd)?;
        Some(f(&file))
    }

    /// Finishes closes begun under the lock (`filp_close` + `fput`): hands each slot's
    /// weak reference to the epoch (lookups that loaded the pointer may still upgrade
    /// it, and fail), runs the hook on the file, then drops the slot's strong reference:
    /// a file nobody else holds is closed here, before `close` returns.
    fn finish_close(&self, hook: Option<Hook<F>>, files: Vec<(Fd, *mut F)>) {
        if files.is_empty() {
            return;
        }
        // First every weak reference to the epoch, keeping the strong ones: whatever a
        // hook does (panic included), no allocation is freed before the lookups that
        // could still see it are done, and no file is leaked (the vector's unwinding
        // drops the strong references the hooks did not reach).
        let mut closed = Vec::with_capacity(files.len());
        {
            let g = self.domain.pin();
            for (fd, p) in files {
                // SAFETY: the slot held this slot reference and was emptied under the lock
                // by our caller, so it is ours to take apart (once, here).
                let (file, weak) = unsafe { drop_slot_ref(p) };
                g.defer_drop(weak);
                closed.push((fd, file));
            }
        }
        // Then the hooks, unpinned, so a slow hook does not hold back reclamation.
        if let Some(h) = hook.as_ref() {
            for (fd, file) in &closed {
                h(*fd, file);
            }
        }
        drop(closed);
    }

    /// `pick_file` under `file_lock`: empties an installed slot.
    fn pick_file(&self, inner: &mut Inner<F>, g: &Guard<'_>, fd: u32) -> *mut F {
        let t = self.fdt.load(g);
        let Some(s) = t.fd.get(fd as usize) else {
            return ptr::null_mut();
        };
        if !is_file(s.load(Ordering::Relaxed)) {
            return ptr::null_mut();
        }
        // Under file_lock no one else writes an installed slot. Acquire pairs with the
        // installer's Release.
        let p = s.swap(ptr::null_mut(), Ordering::AcqRel);
        inner.put_unused(fd);
        p
    }

    /// `close(2)`: `EBADF` unless `fd` is installed (a reserved slot is not).
    pub fn close(&self, fd: Fd) -> Result<(), Errno> {
        let (hook, p) = {
            // Pin first: an outermost pin may run deferred drops (user code), never under
            // `file_lock`.
            let g = self.domain.pin();
            let mut inner = self.lock();
            let p = self.pick_file(&mut inner, &g, fd.0);
            (inner.hook.clone(), p)
        };
        if p.is_null() {
            return Err(Errno::EBADF);
        }
        self.finish_close(hook, vec![(fd, p)]);
        Ok(())
    }

    /// `dup(2)`: the lowest free descriptor (or a PerThread one), not close-on-exec.
    pub fn dup(&self, fd: Fd) -> Result<Fd, Errno> {
        let file = self.get(fd).ok_or(Errno::EBADF)?;
        let nfd = self.reserve(Fd(0), false)?;
        self.install(nfd, file);
        Ok(nfd)
    }

    /// `dup2(2)`. `old == new`: only checks that `old` is open. Otherwise as `dup3`
    /// without flags: replaces an open `new` atomically (closing the file it held).
    pub fn dup2(&self, old: Fd, new: Fd) -> Result<Fd, Errno> {
        if old == new {
            let g = self.domain.pin();
            return if self.lookup_raw(&g, old).is_null() {
                Err(Errno::EBADF)
            } else {
                Ok(new)
            };
        }
        self.do_dup3(old, new, false)
    }

    /// `dup3(2)`: `EINVAL` if `old == new`; `EBADF` if `old` is not open or
    /// `new >= RLIMIT_NOFILE`; `EBUSY` if `new` is reserved but not installed.
    pub fn dup3(&self, old: Fd, new: Fd, cloexec: bool) -> Result<Fd, Errno> {
        if old == new {
            return Err(Errno::EINVAL);
        }
        self.do_dup3(old, new, cloexec)
    }

    /// `ksys_dup3` + `do_dup2`.
    fn do_dup3(&self, old: Fd, new: Fd, cloexec: bool) -> Result<Fd, Errno> {
        if new.0 >= self.rlimit_nofile() {
            return Err(Errno::EBADF);
        }
        let (hook, tofree) = {
            // Pin first: an outermost pin may run deferred drops (user code), never under
            // `file_lock`.
            let g = self.domain.pin();
            let mut inner = self.lock();
            let err = self.expand(&mut inner, new.0, &g);
            let t = self.fdt.load(&g);
            let file =
                t.fd.get(old.0 as usize)
                    .map_or(ptr::null_mut(), |s| s.load(Ordering::Acquire));
            if !is_file(file) || err.is_err() {
                // expand's EMFILE (new >= nr_open) is EBADF too, as in ksys_dup3.
                return Err(Errno::EBADF);
            }
            let slot = &t.fd[new.0 as usize];
            let was_open = inner.set_open(new.0);
            let tofree = slot.load(Ordering::Acquire);
            if tofree.is_null() && was_open {
                return Err(Errno::EBUSY);
            }
            // SAFETY: `file` is the table's reference at `old`, kept alive by file_lock
            // (only lock holders empty installed slots); this is `get_file`.
            let file = unsafe { slot_ref_clone(file) };
            // Release: publishes to lookups, as install does. Nobody else writes this slot:
            // it is either installed (lock holders only) or was free (we just claimed it).
            slot.store(file, Ordering::Release);
            inner.set_cloexec(new.0, cloexec);
            (inner.hook.clone(), tofree)
        };
        if !tofree.is_null() {
            self.finish_close(hook, vec![(new, tofree)]);
        }
        Ok(new)
    }

    /// `fcntl(F_DUPFD[_CLOEXEC])`: the lowest free descriptor `>= min`. `EBADF` if `fd`
    /// is not open, then `EINVAL` if `min >= RLIMIT_NOFILE`, `EMFILE` if none is free.
    pub fn dupfd(&self, fd: Fd, min: u32, cloexec: bool) -> Result<Fd, Errno> {
        let file = self.get(fd).ok_or(Errno::EBADF)?;
        let limit = self.rlimit_nofile();
        if min >= limit {
            return Err(Errno::EINVAL);
        }
        let nfd = if min == 0 {
            self.reserve(Fd(0), cloexec)?
        } else {
            self.alloc_fd(min, limit, cloexec)?
        };
        self.install(nfd, file);
        Ok(nfd)
    }

    /// `fcntl(F_GETFD) & FD_CLOEXEC`.
    pub fn get_cloexec(&self, fd: Fd) -> Result<bool, Errno> {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let inner = self.lock();
        if self.lookup_raw(&g, fd).is_null() {
            return Err(Errno::EBADF);
        }
        Ok(inner.cloexec(fd.0))
    }

    /// `fcntl(F_SETFD, on ? FD_CLOEXEC : 0)`.
    pub fn set_cloexec(&self, fd: Fd, on: bool) -> Result<(), Errno> {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let mut inner = self.lock();
        if self.lookup_raw(&g, fd).is_null() {
            return Err(Errno::EBADF);
        }
        inner.set_cloexec(fd.0, on);
        Ok(())
    }

    /// `close_range(2)` over `[first, last]` (`last` may be `u32::MAX`); `EINVAL` if
    /// `first > last`. Reserved, not installed slots are left alone.
    ///
    /// `flags.cloexec`: only marks close-on-exec. `flags.unshare`: this API cannot swap
    /// the caller's `files_struct`, so the operation is applied to a private copy, which
    /// is returned (`Ok(Some(copy))`), and `self` is left untouched; the caller uses the
    /// copy from then on, as the thread would after `unshare(CLONE_FILES)`. As Linux, when
    /// closing (not `cloexec`) a range reaching past the end of the table, descriptors from
    /// `first` up are simply not copied (their close hook does not run). Without
    /// `unshare`, `Ok(None)`.
    pub fn close_range(
        &self,
        first: u32,
        last: u32,
        flags: CloseRangeFlags,
    ) -> Result<Option<FdTable<F>>, Errno> {
        if first > last {
            return Err(Errno::EINVAL);
        }
        if flags.unshare {
            let max_fds = self.file_lock.lock().max_fds;
            let copy_below = if !flags.cloexec && last >= max_fds - 1 {
                first
            } else {
                u32::MAX
            };
            let copy = self.dup_fd(copy_below);
            copy.range_op(first, last, flags.cloexec);
            return Ok(Some(copy));
        }
        self.range_op(first, last, flags.cloexec);
        Ok(None)
    }

    /// `__range_cloexec` / `__range_close`.
    fn range_op(&self, first: u32, last: u32, cloexec: bool) {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let mut inner = self.lock();
        if inner.max_fds == 0 || first > inner.max_fds - 1 {
            return;
        }
        let last = last.min(inner.max_fds - 1);
        if cloexec {
            for fd in first..=last {
                inner.set_cloexec(fd, true);
            }
            return;
        }
        let mut files = Vec::new();
        // Installed descriptors are a subset of the open bits (chunk words are all ones).
        let end = last as usize + 1;
        let mut fd = bitmap::find_next_bit(&inner.open_fds, end, first as usize);
        while fd < end {
            let p = self.pick_file(&mut inner, &g, fd as u32);
            if !p.is_null() {
                files.push((Fd(fd as u32), p));
            }
            fd = bitmap::find_next_bit(&inner.open_fds, end, fd + 1);
        }
        let hook = inner.hook.clone();
        drop(inner);
        drop(g);
        self.finish_close(hook, files);
    }

    /// `do_close_on_exec`: closes every installed close-on-exec descriptor and clears
    /// the close-on-exec bits.
    pub fn exec(&self) {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let mut inner = self.lock();
        let mut files = Vec::new();
        for w in 0..inner.close_on_exec.len() {
            let set = match inner.chunks[w].as_ref() {
                Some(c) => c.cloexec.swap(0, Ordering::Relaxed),
                None => std::mem::take(&mut inner.close_on_exec[w]),
            };
            let mut bits = set;
            while bits != 0 {
                let fd = (w * BITS) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let p = self.pick_file(&mut inner, &g, fd);
                if !p.is_null() {
                    files.push((Fd(fd), p));
                }
            }
        }
        let hook = inner.hook.clone();
        drop(inner);
        drop(g);
        self.finish_close(hook, files);
    }

    /// `fork(2)` without `CLONE_FILES` (`dup_fd`): a copy sharing the files, with the same
    /// close-on-exec bits, limits, settings and close hook. Reserved, not installed slots
    /// are not copied. PerThread chunks are not inherited (the child's bitmaps are plain).
    pub fn fork(&self) -> FdTable<F> {
        self.dup_fd(u32::MAX)
    }

    /// `dup_fd(oldf, max_fds)`: copies descriptors below `below`.
    fn dup_fd(&self, below: u32) -> FdTable<F> {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let inner = self.lock();
        let t = self.fdt.load(&g);
        let mut child = FdTable::with_limits(self.settings, self.rlimit_nofile(), self.nr_open);
        let n = inner.max_fds;
        {
            let cinner = child.file_lock.get_mut();
            cinner.grow(n);
            cinner.hook = inner.hook.clone();
        }
        let slots = Slots::new(n);
        for fd in 0..n.min(below) {
            let p = t.fd[fd as usize].load(Ordering::Acquire);
            if !is_file(p) {
                continue;
            }
            // SAFETY: the table's reference at `fd` is alive while file_lock is held;
            // this is the child's `get_file`.
            let p = unsafe { slot_ref_clone(p) };
            slots.fd[fd as usize].store(p, Ordering::Relaxed);
            let cloexec = inner.cloexec(fd);
            let cinner = child.file_lock.get_mut();
            cinner.set_open(fd);
            cinner.set_cloexec(fd, cloexec);
        }
        *child.fdt.get_mut() = slots;
        child
    }

    /// Every installed descriptor in fd order, with its file and close-on-exec flag.
    pub fn iter(&self) -> Vec<(Fd, Arc<F>, bool)> {
        // Pin first: an outermost pin may run deferred drops (user code), never under
        // `file_lock`.
        let g = self.domain.pin();
        let inner = self.lock();
        let t = self.fdt.load(&g);
        let mut out = Vec::new();
        for (i, s) in t.fd.iter().enumerate() {
            let p = s.load(Ordering::Acquire);
            if is_file(p) {
                // SAFETY: alive under file_lock (see `dup_fd`); a new reference for the caller.
                let f = unsafe {
                    Arc::increment_strong_count(p as *const F);
                    Arc::from_raw(p as *const F)
                };
                out.push((Fd(i as u32), f, inner.cloexec(i as u32)));
            }
        }
        out
    }

    /// Sets the hook run on every close of a descriptor (close, dup2/dup3 replacing,
    /// close_range, exec, and the table's drop): what `filp_close` runs in Linux
    /// (e.g. dropping POSIX locks). It runs without the table lock held.
    pub fn set_close_hook(&self, hook: impl Fn(Fd, &Arc<F>) + Send + Sync + 'static) {
        // The old hook (and what it captured) is dropped after the lock is released.
        let old = self.lock().hook.replace(Arc::new(hook));
        drop(old);
    }

    /// The table's counters. Reading them takes the lock but is not counted.
    pub fn stats(&self) -> TableStats {
        let inner = self.file_lock.lock();
        TableStats {
            lock_acquisitions: inner.lock_acquisitions,
            resizes: inner.resizes,
            install_fallbacks: inner.install_fallbacks,
            chunk_grants: inner.chunk_grants,
            max_fds: inner.max_fds,
        }
    }
}

impl<F: Send + Sync + 'static> Drop for FdTable<F> {
    /// `put_files_struct` -> `close_files`: runs the close hook on each installed
    /// descriptor, then drops the table's references (no reader can remain).
    fn drop(&mut self) {
        let hook = self.file_lock.get_mut().hook.take();
        let t = self.fdt.get_mut();
        // Every slot emptied first, then the hooks (as `finish_close`): a hook that panics
        // leaks nothing, the vector's unwinding drops the files it did not reach.
        let mut files = Vec::new();
        for (i, s) in t.fd.iter().enumerate() {
            let p = s.swap(ptr::null_mut(), Ordering::Acquire);
            if is_file(p) {
                // SAFETY: exclusive access (no lookup of this table runs, so none holds
                // the pointer); the slot held this slot reference.
                let (f, weak) = unsafe { drop_slot_ref(p) };
                drop(weak);
                files.push((Fd(i as u32), f));
            }
        }
        if let Some(h) = hook.as_ref() {
            for (fd, f) in &files {
                h(*fd, f);
            }
        }
    }
}

impl<F: Send + Sync + 'static> std::fmt::Debug for FdTable<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdTable")
            .field("settings", &self.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cold]
fn bad_install<F>(fd: Fd, p: *mut F) -> ! {
    // SAFETY: `p` is the slot reference install made and did not store; give both its
    // references back before panicking so that nothing is leaked.
    drop(unsafe { drop_slot_ref(p) });
    panic!("fd_install({fd}): descriptor not reserved or already installed");
}
