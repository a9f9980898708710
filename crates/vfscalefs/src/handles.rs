//! Open files: one `vfscale-fdtable` entry per open file description the kernel opened
//! (`OPEN`, `CREATE`, `OPENDIR`). The FUSE file handle (`fh`) is the entry's descriptor
//! number, so it is unique across all connections while the file is open and is the
//! owner of the file's flock lock ([`vfscale_locks::FileId`]).
//!
//! A handle's source file is not held open for its whole life where it can be opened
//! again: with kernel passthrough the kernel holds the file itself once its backing is
//! registered, and the server keeps none; without it the file lives in the descriptor
//! cache (`fdcache.rs`) and is reopened with the open's flags on a miss. Only a server
//! that may not reopen files (not root: a file's mode may have changed since it was
//! opened) keeps every handle's file open.
//!
//! `RELEASE` gives the handle up at once, as Linux's last `fput` does: the table's entry
//! is an `Entry` that holds the table's reference to the [`Handle`], and `RELEASE` takes
//! that reference out of it before it closes the entry's descriptor, so that of two
//! removals of one handle only one closes it (see [`Handles::remove`]). A request that is
//! still using the handle holds its own reference, and the handle goes when that request
//! ends. (`vfscale-fdtable` itself drops a closed entry at its last reference too.)

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use parking_lot::Mutex;
use vfscale_fdtable::{AllocPolicy, Fd, FdTable, Settings};
use vfscale_locks::{AccessMode, OwnerId};

use crate::fdcache::{FdCache, FdKey, FdSlot};
use crate::inodes::Node;

/// One open file description.
pub struct Handle {
    /// The inode it was opened on.
    pub inode: Node,
    /// Its source file: kept open by the handle, or in the descriptor cache (see the
    /// module docs).
    pub file: FdSlot,
    /// The open's flags, to open the file again.
    pub flags: i32,
    /// Its access mode (for the lock calls' `EBADF` checks).
    pub mode: AccessMode,
    /// The connection that opened it.
    pub conn: usize,
    /// A directory's reading position lock (serializes seek + getdents).
    pub dir: Option<Mutex<()>>,
    /// The POSIX lock owners that set locks through this handle (see `locks.rs`).
    pub owners: Mutex<Vec<OwnerId>>,
    /// The kernel passthrough backing file, while this handle uses it.
    pub backing: Option<Arc<fuser::BackingId>>,
    /// Whether a flock request came through it (under `--cluster`, its `RELEASE` tells
    /// the cluster only then).
    pub file_locked: AtomicBool,
}

impl Handle {
    /// A handle on `inode` opened with `flags`, its file not yet kept or cached.
    pub fn new(inode: Node, flags: i32, conn: usize, backing: Option<Arc<fuser::BackingId>>) -> Handle {
        let mode = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => AccessMode::Write,
            libc::O_RDWR => AccessMode::ReadWrite,
            _ => AccessMode::Read,
        };
        let dir = (inode.kind == crate::inodes::Kind::Dir).then(|| Mutex::new(()));
        inode.open_started();
        Handle {
            inode,
            file: FdSlot::default(),
            flags,
            mode,
            conn,
            dir,
            owners: Mutex::new(Vec::new()),
            backing,
            file_locked: AtomicBool::new(false),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inode.open_ended();
    }
}

/// One table entry: the table's reference to an open handle, until `RELEASE` takes it.
struct Entry(Mutex<Option<Arc<Handle>>>);

impl Entry {
    /// The handle, if it was not released yet.
    fn handle(&self) -> Option<Arc<Handle>> {
        self.0.lock().clone()
    }
}

/// The server's open files.
pub struct Handles {
    table: FdTable<Entry>,
    fds: Arc<FdCache>,
}

impl Handles {
    /// A table that can hold `limit` open files. Handles need no descriptor each, so
    /// the limit is the clients' (all connections' opens together), not the server's
    /// `RLIMIT_NOFILE`.
    pub fn new(limit: u32, fds: Arc<FdCache>) -> Handles {
        let settings = Settings {
            policy: AllocPolicy::PerThread,
            ..Settings::default()
        };
        let nr_open = limit.max(vfscale_fdtable::DEFAULT_RLIMIT_NOFILE);
        Handles {
            table: FdTable::with_limits(settings, nr_open, nr_open),
            fds,
        }
    }

    /// Installs `h`: its file handle, and the handle. `ENFILE` when the table is full
    /// (the server's limit, not the caller's: `EMFILE` would say the caller's own table
    /// is full).
    pub fn insert(&self, h: Handle) -> Result<(u64, Arc<Handle>), i32> {
        let h = Arc::new(h);
        self.table
            .open(Arc::new(Entry(Mutex::new(Some(h.clone())))), false)
            .map(|fd| (fd.0 as u64, h))
            .map_err(|e| match e.raw() {
                libc::EMFILE => libc::ENFILE,
                e => e,
            })
    }

    /// The handle `fh` of connection `conn`.
    pub fn get(&self, conn: usize, fh: u64) -> Option<Arc<Handle>> {
        let fd = u32::try_from(fh).ok()?;
        self.table
            .with(Fd(fd), Entry::handle)
            .flatten()
            .filter(|h| h.conn == conn)
    }

    /// Removes handle `fh` of connection `conn`, returning the table's reference to it:
    /// once the caller drops it, the handle (its inode reference and source descriptor)
    /// goes unless a request in flight still holds it.
    ///
    /// Of two removals of one handle, only the one that takes the handle out of its entry
    /// closes the descriptor: an entry is closed only by its taker, so `fh` still names
    /// this entry when the taker closes it (closing first could close a new handle that
    /// reused the number after another removal's close).
    pub fn remove(&self, conn: usize, fh: u64) -> Option<Arc<Handle>> {
        let fd = Fd(u32::try_from(fh).ok()?);
        let entry = self.table.get(fd)?;
        let h = {
            let mut slot = entry.0.lock();
            if slot.as_ref()?.conn != conn {
                return None;
            }
            slot.take()?
        };
        // Before the number can name another handle.
        self.fds.remove(FdKey::Handle(fh));
        let closed = self.table.close(fd);
        debug_assert!(
            closed.is_ok(),
            "handle {fh}: its entry was closed by another than its taker"
        );
        Some(h)
    }

    /// Every open handle of connection `conn`, with its file handle.
    pub fn of_connection(&self, conn: usize) -> Vec<(u64, Arc<Handle>)> {
        self.table
            .iter()
            .into_iter()
            .filter_map(|(fd, e, _)| Some((fd.0 as u64, e.handle()?)))
            .filter(|(_, h)| h.conn == conn)
            .collect()
    }

    /// The table's capacity.
    pub fn limit(&self) -> u32 {
        self.table.rlimit_nofile()
    }
}
