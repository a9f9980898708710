//! vfscalefs: a passthrough FUSE filesystem whose file locks are served by
//! `vfscale-locks`, whose open files are `vfscale-fdtable` entries and whose inode table
//! keys every inode by its source identity, so that several mountpoints of one source,
//! served by one process, share one lock manager: a lock taken through one mountpoint
//! conflicts with one taken through another.
//!
//! ```text
//! vfscalefs SOURCE MOUNTPOINT [MOUNTPOINT...] [-o allow_other,...]
//!           [--cluster ENDPOINTS [--cluster-name NAME] [--node NAME]
//!            [--peer-listen ADDR] [--lease-ttl SECS] [--home-idle SECS]]
//! ```
//!
//! With `--cluster`, several servers (on several hosts, over one shared filesystem)
//! share one lock space through `vfscale-cluster` and etcd (see "Several servers").
//!
//! # Structure
//!
//! | piece | module | what it holds |
//! |---|---|---|
//! | [`Server`] | here | what all connections share: inode table, handle table, lock manager |
//! | [`fs::Conn`] | `fs.rs` | one connection (mountpoint): the FUSE operations, each a thin call into the next file |
//! | | `fs/operations.rs` | what each operation does on the source, returning its reply's content or an errno |
//! | | `fs/reply.rs` | errors to errnos (`EMFILE` → `ENFILE`) and the replies several operations share |
//! | | `fs/attr.rs` | FUSE attributes from the source's `stat`, and the times the kernel sets |
//! | [`dispatch::ConnGate`] | `dispatch.rs` | which dispatch threads read `/dev/fuse`: one serves a serial stream, spares park until requests queue up or may block |
//! | (transport) | `vendor/fuser/src/uring/` | with `-o io_uring`: one ring per CPU, served by a pinned thread beside the `/dev/fuse` threads (forgets, interrupts, notifications), with workers for the requests that may block; see `vendor/fuser/VFSCALE-PATCH.md` |
//! | [`inodes::InodeTable`] | `inodes.rs` | the `vfscale-icache` inode cache: node id ↔ `(st_dev, st_ino)`, each inode's file handle, `I_NEW`-coalesced lookups, lookup counts per connection, eviction when forgotten |
//! | [`fdcache::FdCache`] | `fdcache.rs` | the bounded cache of source descriptors (inodes' `O_PATH` descriptors, open files without passthrough), CLOCK per shard, reopened on a miss |
//! | [`handle_ino::HandleIno`] | `handle_ino.rs` | where the source's file handles carry the inode number, learned from checked handles, so a new inode's handle needs no second `stat` |
//! | [`handles::Handles`] | `handles.rs` | open files: `fh` = a `vfscale-fdtable` descriptor |
//! | [`locks::Locks`] | `locks.rs` | `GETLK`/`SETLK`/`SETLKW`/flock, parked waiters, `FLUSH`/`RELEASE`, `INTERRUPT` |
//! | | `locks/driver.rs` | parked requests: polled and answered by the thread whose request woke them (an unlock, a close), else by the lock driver thread |
//! | | `locks/task_slot.rs` | a parked request's slot: one poller at a time, no wake-up lost (loom model) |
//! | [`mirror::Mirror`] | `mirror.rs` | per locked inode: the clients' locks held on the source file, host waits |
//! | [`mirror::SourceViews`] | `mirror/views.rs` | per inode and connection: the source file as the client's kernel caches it at its last grant |
//! | [`notify::GrantNotify`] | `notify.rs` | per connection, the thread that invalidates a client's caches of a file before a grant and then answers it |
//! | [`cluster::Cluster`] | `cluster.rs` | `--cluster`: every lock call sent to `vfscale-cluster`, coherence at grants, `EIO` for lost locks |
//! | | `cluster/log.rs` | the cluster's events (members gone, homes claimed, fencing) as lines on stderr |
//! | `sys` | `sys.rs` | every system call on the source behind a safe wrapper: `openat2(RESOLVE_BENEATH)`, file handles (`name_to_handle_at`, `open_by_handle_at`), `/proc/self/fd` reopening, the `*at` calls, I/O, xattrs, per-thread credentials |
//!
//! # Invariants
//!
//! * **Nothing outside SOURCE.** Every name the kernel sends is checked to be one path
//!   component (not `.`/`..`, no `/`) and resolved with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` under the `O_PATH` descriptor of its
//!   parent; the server never follows a symbolic link (the client kernel reads and
//!   follows them itself). Other calls act on an inode's `O_PATH` descriptor, or on
//!   `/proc/self/fd/N` of it, never for a symbolic link.
//! * **Descriptors do not grow with the tree or the opens.** Where the source makes file
//!   handles that last (`-o inode_handles=prefer`, the default, as root; every local
//!   filesystem, not FUSE), an inode is kept as its file handle and its `O_PATH`
//!   descriptor lives in a bounded cache, opened again with `open_by_handle_at` on a
//!   miss; an open file with kernel passthrough holds no server descriptor (the kernel
//!   holds the backing file), and one without lives in the same cache, opened again
//!   with the open's flags. The cache keeps the server at half of its `RLIMIT_NOFILE`
//!   (`-o fd_cache=N` sizes it). Where handles cannot be used, each inode the kernel
//!   holds keeps one descriptor (`inode_handles=never`; `mandatory` refuses to serve),
//!   and the mount says which in one line. The server's own shortage of descriptors or
//!   memory reaches a client as `ENFILE` or `ENOMEM`, never `EMFILE`, which would speak
//!   of the client's own table.
//! * **A handle never opens another file.** Only handles the server made, from names it
//!   resolved beneath SOURCE, are ever opened; each open is checked to give the inode's
//!   own `(st_dev, st_ino)`, else `ESTALE`. What a handle allows that a path walk would
//!   not: a file renamed out of SOURCE on the source filesystem (not through the mount)
//!   stays reachable through an inode the kernel still holds, as with knfsd's
//!   `no_subtree_check`.
//! * **Removed files, as a passthrough and as NFS.** A file unlinked through the mount
//!   while open keeps a descriptor of its own until it is forgotten, so `fsync`,
//!   `ftruncate`, `fchmod` and reads through its open descriptors keep working. A file
//!   removed on the source directly, behind the server's back, behaves as under NFS:
//!   once the server's cached descriptor of it has gone, what still needs it gets
//!   `ESTALE` (reads and writes through kernel passthrough go on).
//! * **What the cache does not bound.** Descriptors inodes keep of their own (files
//!   unlinked while open, inodes on another mount than the root's) are outside the
//!   cache; `READDIRPLUS` counts them in its budget ([`Server::fd_budget`]), but a
//!   client holding many unlinked files open makes the server hold as many. And a
//!   write-back error of a source such as NFS, reported at `close` of a cached
//!   descriptor the cache lets go, is not seen by a later `fsync` through the mount.
//! * **Permissions are the kernel's** (`default_permissions`); `allow_other` only when
//!   asked. Files, directories, nodes and symbolic links are created with the caller's
//!   fs uid and gid (`setfsuid`/`setfsgid` on the dispatch thread), so they belong to the
//!   caller as on the source.
//! * **One inode per source inode**, whichever connection reached it; its node id is the
//!   same on every connection, and it stays in the cache while any connection holds a
//!   lookup or any handle is open on it (a handle holds a reference).
//! * **No source descriptor outlives its use**, however idle the server: `RELEASE`
//!   (or the end of the connection) closes the handle's file and puts its inode at once,
//!   and an inode's eviction closes its descriptors (its own, its cached one) and drops
//!   its lock context there, not when the epoch-deferred memory of the inode goes
//!   (`handles.rs`, `inodes.rs`). A file deleted on the source or through a
//!   mountpoint gives its space back once the kernels have forgotten it and closed it.
//! * **No lock outlives its owner's close**: `FLUSH` drops the flushing owner's POSIX
//!   locks, `RELEASE` what is left through the released file (OFD-style locks, the
//!   flock lock); a connection that ends releases all its handles.
//! * **No dispatch thread sleeps on a lock**: a `SETLKW` that must wait is parked and
//!   answered by the lock driver when granted, or `EINTR` when interrupted.
//!
//! # Lock order
//!
//! A directory handle's position lock (`READDIR`/`READDIRPLUS`) → the inode cache (each
//! `READDIRPLUS` entry is a lookup made under it) → a descriptor cache shard → an
//! inode's or handle's descriptor slot. The inode cache's locks (inside
//! `vfscale-icache`) are taken only inside its calls; an
//! inode's `pin` is held around its lookup counts and released before the reference it
//! held is put. Per inode: the mirror's state (`mirror.rs`: held across a request's
//! `vfscale-locks` call, its raise on the source, the direct hand-off and the lowering)
//! → `lock_owners` → the lock context's inode lock (`flc_lock`, inside `vfscale-locks`)
//! → a waiter's state. A connection's interrupt table → a waiter's state
//! (interrupting); a parked cluster call is interrupted after the table is unlocked
//! (its answer unparks it there). The driver's task map and queue are leaves. No path
//! holds two inodes' locks, or any lock across a reply. Under `--cluster` no lock of
//! the server is held across a call into `vfscale-cluster`, except an inode's
//! `lock_owners` across the removals of a `RELEASE` (as without a cluster).
//!
//! # Locks on the source
//!
//! With `-o source_locks=mirror` (the default without `--cluster`) the clients' locks are held on the source
//! too, so that processes using the source directly and the mount's clients agree
//! (`mirror.rs` has the design): the union of the clients' POSIX and OFD locks as OFD
//! locks on one description per locked inode, each client file's flock lock as a flock
//! lock on a description of the inode's own (from a pool). The lock space among clients
//! stays `vfscale-locks`: owners, merging and splitting, the close rules, `EDEADLK`
//! among clients, the wait tree and the hand-off are as without mirroring. Per request
//! `vfscale-locks` is asked first, then, once granted there (at once or after a wait
//! among clients), the source (`F_OFD_SETLK`, `flock(LOCK_NB)`); where a host process
//! holds the lock the grant goes back among clients (what the owner held before put
//! back) and the request fails with `EAGAIN` or waits for the host in a thread of its
//! own; then the mirror is lowered to what the clients hold. So a client is answered
//! only once the source holds its lock, the source lets a lock go only after
//! `vfscale-locks` has, and a request waiting among clients holds nothing on the source.
//! What it gives and cannot give:
//!
//! * A holder on the source makes a conflicting client request fail or wait, and a
//!   client's lock a host's; `F_GETLK` through the mount reports a host holder (a POSIX
//!   holder's pid, 0 for an OFD holder; -1 through `F_OFD_GETLK`), and `F_GETLK` on the
//!   source the server's OFD lock (pid -1), clients' ranges merged.
//! * If the server dies, the kernel drops every mirrored lock with its descriptions
//!   (never passthrough backing files, which the kernel would keep open).
//! * A cycle of waits through a host process is not detected (Linux detects none through
//!   OFD locks); such a waiter can still be interrupted. Between client waiters and host
//!   waiters the kernel decides the order, except at a direct hand-off: an unlock that
//!   grants a waiting client in the same step keeps the source lock held for it (no
//!   call), one of the orders Linux allows, but not where Linux's wait tree queues that
//!   client behind a host waiter, which the server cannot see. Such hand-offs keep the
//!   source lock held for 5 ms at most without a break, so a host waiter is not starved
//!   by clients handing a lock on among themselves.
//! * At a grant the client's cached attributes and data of the file are invalidated
//!   before the answer (`FUSE_NOTIFY_INVAL_INODE`, from the connection's notify thread,
//!   which answers the grant once it is done: the kernel may wait there for a page that
//!   a read waiting for a dispatch thread holds, so no dispatch thread waits for it;
//!   `notify.rs`), unless the file's
//!   times and size are those the client's last grant saw and no invalidation for that
//!   client is still under way, or those the client's own `SETATTR` left where the view
//!   before it was current (a view is trusted at once on a filesystem that gives every
//!   change after a `stat` a new change time, elsewhere 50 ms after the change time;
//!   `mirror/ctime.rs`), or the server held on the source a lock that excludes
//!   every host lock of the kind since then and no other connection was granted one
//!   (no `stat` then); and the file's directory answers entries with no cache
//!   time from then on (a journal deleted on the source must not still show), and
//!   entries every connection cached before are looked up again before their next use
//!   (`FUSE_NOTIFY_INC_EPOCH`, once per such directory: each cached entry of the
//!   connection costs a `LOOKUP` then; a kernel without it keeps them for their cache
//!   time, 1 s by default).
//! * The mirrors' descriptions are a quarter of the server's descriptor share: past it a
//!   lock is the clients' alone (said once on stderr). A description is kept while the
//!   client's file is open and closed at its `RELEASE` once it holds nothing; a flock
//!   description goes back to its inode's pool, which keeps no more than the client
//!   files still open that asked for flock locks.
//! * A source file the server may open only for reading holds the clients' read locks but
//!   not their write locks (an OFD write lock needs a writable description); one it
//!   cannot open at all holds none of them.
//! * A source without OFD locks makes the mount say so and fall back to `off`, where the
//!   clients' locks are the server's alone.
//!
//! # Several servers
//!
//! Under `--cluster` the server's own lock manager and the mirrors are not used: every
//! lock call goes to `vfscale_cluster::ClusterLocks`, with the ids used without a
//! cluster (the source inode number, the connection's owner key, the file handle), so
//! the rules above (owners, close, OFD locks) hold across the servers as among one
//! server's mountpoints. `source_locks` is `off` (a stopped server's locks on the
//! source would keep the others from failing over; `mirror` is refused). Before a grant
//! is answered the client's caches of the file go where the source file changed since
//! that client's last grant, as for a host's change with source locks; and where the
//! server lost the lock with its lease, the lock calls, and the reads and writes it
//! serves itself, answer `EIO` (`cluster.rs`).
//!
//! # One process, two mountpoints
//!
//! The kernel gives each connection its own node ids and its own `lock_owner` keys (it
//! scrambles them per connection). Inodes and lock contexts are keyed by the source
//! identity, shared, but owners cannot be matched across connections: **one process
//! seen through two mountpoints is two POSIX owners.** Its locks through one mountpoint
//! conflict with its own locks through the other (on a local filesystem they would
//! merge), and closing a descriptor drops only the locks taken through that mountpoint.
//!
//! # OFD locks
//!
//! Protocol 7.45 forwards an OFD lock as a POSIX lock whose owner is the open file; the
//! server cannot tell them apart. Consequences: a blocked OFD request takes part in
//! deadlock detection (it can fail with `EDEADLK`, which Linux never returns for OFD
//! locks); `F_GETLK` on an OFD holder reports the holder's pid (Linux: -1), while
//! `F_OFD_GETLK` reports -1 whoever holds the lock (the client kernel fills it in).
//! OFD locks are dropped at `RELEASE`, which the kernel sends after `close(2)` has
//! returned, so another process may briefly still see the lock after the close.
//! Likewise for flock locks: `RELEASE` drops them.

#![warn(missing_docs)]

pub mod cluster;
pub mod dispatch;
pub mod fdcache;
pub mod fs;
pub mod handle_ino;
pub mod handles;
pub mod inodes;
pub mod locks;
pub mod mirror;
pub mod notify;
pub mod sys;

use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::os::unix::fs::OpenOptionsExt as _;

use fuser::{Config, INodeNo, MountOption, Notifier, Session, SessionACL};

pub use vfscale_cluster::ClusterConfig;

use crate::cluster::Cluster;
use crate::fdcache::{CachedFd, FdCache, FdKey};
use crate::handles::{Handle, Handles};
use crate::inodes::{HandleMode, Inode, InodeTable};
use crate::locks::Locks;
use crate::mirror::SourceLocks;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long the kernel may cache attributes and names.
    pub ttl: Duration,
    /// Use the kernel's FUSE passthrough for reads and writes where it is available.
    pub passthrough: bool,
    /// Let other users than the one mounting use the filesystem.
    pub allow_other: bool,
    /// Dispatch threads per mountpoint.
    pub threads: usize,
    /// Park spare dispatch threads until requests queue up or may block
    /// ([`dispatch`]); off, every thread reads `/dev/fuse`.
    pub dispatch_gate: bool,
    /// Mount read-only.
    pub read_only: bool,
    /// Allow device nodes (`dev`) and set-user-ID bits (`suid`) to take effect.
    pub dev: bool,
    /// As `dev`, for `suid`.
    pub suid: bool,
    /// Answer `READDIRPLUS` (entries with attributes, each one a lookup).
    pub readdirplus: bool,
    /// Descriptors `READDIRPLUS` leaves free for opens and lookups (`None`: an eighth of
    /// the limit, 64 to 65,536) when inodes are kept by descriptor.
    pub fd_reserve: Option<u64>,
    /// How inodes are kept: by file handle or by descriptor.
    pub inode_handles: HandleMode,
    /// Descriptors the cache keeps open (`None`: what keeps the server at half of its
    /// `RLIMIT_NOFILE`, see [`Server::size_fd_cache`]).
    pub fd_cache: Option<u64>,
    /// Whether the clients' locks are held on the source too (`None`: the default,
    /// `mirror`, or `off` under `--cluster`).
    pub source_locks: Option<SourceLocks>,
    /// Carry requests over io_uring where the kernel allows it (`-o io_uring`,
    /// `io_uring_depth=N`); `/dev/fuse` otherwise.
    pub io_uring: Option<fuser::IoUringConfig>,
    /// Share one lock space with the other servers of a cluster (`--cluster`).
    pub cluster: Option<ClusterConfig>,
}

impl Default for Options {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Options {
            ttl: Duration::from_secs(1),
            passthrough: true,
            allow_other: false,
            threads: (2 * cpus).clamp(4, 16),
            dispatch_gate: true,
            read_only: false,
            dev: false,
            suid: false,
            readdirplus: true,
            fd_reserve: None,
            inode_handles: HandleMode::Prefer,
            fd_cache: None,
            source_locks: None,
            io_uring: None,
            cluster: None,
        }
    }
}

impl Options {
    /// Applies a comma-separated `-o` list.
    pub fn parse_o(&mut self, list: &str) -> Result<(), String> {
        for opt in list.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let num = |v: Option<&str>| -> Result<u64, String> {
                v.ok_or(format!("option {k} needs a value"))?
                    .parse::<u64>()
                    .map_err(|_| format!("option {k}: not a number: {}", v.unwrap_or("")))
            };
            match k {
                "allow_other" => self.allow_other = true,
                "default_permissions" | "rw" => {}
                "ro" => self.read_only = true,
                "dev" => self.dev = true,
                "suid" => self.suid = true,
                "passthrough" => self.passthrough = true,
                "nopassthrough" => self.passthrough = false,
                "dispatch_gate" => self.dispatch_gate = true,
                "nodispatch_gate" => self.dispatch_gate = false,
                "readdirplus" => self.readdirplus = true,
                "noreaddirplus" => self.readdirplus = false,
                "fd_reserve" => self.fd_reserve = Some(num(v)?),
                "fd_cache" => self.fd_cache = Some(num(v)?.max(1)),
                "inode_handles" => {
                    self.inode_handles = match v {
                        Some("prefer") => HandleMode::Prefer,
                        Some("mandatory") => HandleMode::Mandatory,
                        Some("never") => HandleMode::Never,
                        _ => {
                            return Err(format!(
                                "option inode_handles: prefer, mandatory or never, not {:?}",
                                v.unwrap_or("")
                            ))
                        }
                    }
                }
                "source_locks" => {
                    self.source_locks = match v {
                        Some("mirror") => Some(SourceLocks::Mirror),
                        Some("off") => Some(SourceLocks::Off),
                        _ => {
                            return Err(format!(
                                "option source_locks: mirror or off, not {:?}",
                                v.unwrap_or("")
                            ))
                        }
                    }
                }
                "threads" => self.threads = num(v)?.clamp(1, 1024) as usize,
                "io_uring" if v.is_none() => {
                    self.io_uring.get_or_insert_with(fuser::IoUringConfig::default);
                }
                "io_uring_depth" => {
                    let depth = num(v)?;
                    if !(1..=4096).contains(&depth) {
                        return Err(format!("option io_uring_depth: 1 to 4096, not {depth}"));
                    }
                    self.io_uring
                        .get_or_insert_with(fuser::IoUringConfig::default)
                        .depth = depth as usize;
                }
                "ttl" | "attr_timeout" | "entry_timeout" => self.ttl = Duration::from_millis(num(v)?),
                _ => return Err(format!("unknown option {opt:?}")),
            }
        }
        Ok(())
    }

    /// Whether the source's locks are mirrored: as asked, else `mirror` alone, `off`
    /// under `--cluster` (a stopped server's locks on the source would block the
    /// others' failover). `-o source_locks=mirror` with `--cluster` is refused.
    pub fn source_locks(&self) -> Result<SourceLocks, String> {
        match (self.source_locks, &self.cluster) {
            (Some(SourceLocks::Mirror), Some(_)) => Err(
                "-o source_locks=mirror cannot be used with --cluster: a server that stops while \
                 holding locks on the source would block every other server's failover \
                 (--cluster implies source_locks=off)"
                    .into(),
            ),
            (Some(s), _) => Ok(s),
            (None, Some(_)) => Ok(SourceLocks::Off),
            (None, None) => Ok(SourceLocks::Mirror),
        }
    }
}

/// What every connection shares.
pub struct Server {
    inodes: InodeTable,
    handles: Handles,
    fds: Arc<FdCache>,
    /// Whether files may be opened again (root: a file's mode no longer matters once it
    /// was opened), so that a handle need not keep its file open.
    reopen: bool,
    locks: Locks,
    opts: Options,
    stack_depth: u32,
}

impl Server {
    /// A server of `source` for `conns` connections.
    pub fn new(source: &Path, conns: usize, opts: Options) -> Result<Arc<Server>, Error> {
        let root = sys::open_root(source).map_err(|e| Error::Source(source.to_owned(), e))?;
        // Stacked on an overlayfs source, the passthrough needs room for one more level.
        let stack_depth = match nix::sys::statfs::fstatfs(root.as_fd()) {
            Ok(s) if s.filesystem_type() == nix::sys::statfs::OVERLAYFS_SUPER_MAGIC => 2,
            _ => 1,
        };
        // Without OFD locks on the source there is nothing to mirror onto: say so once.
        let mut source_locks = opts.source_locks().map_err(Error::Usage)?;
        if source_locks == SourceLocks::Mirror {
            let probe = sys::reopen(root.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)
                .and_then(|d| crate::mirror::mirror_supported(d.as_raw_fd()));
            if let Err(e) = probe {
                eprintln!("vfscalefs: the source takes no OFD locks ({e}): source_locks=off, its processes will not see the mount's locks");
                source_locks = SourceLocks::Off;
            }
        }
        let limit = nofile_limit();
        let fds = Arc::new(FdCache::new(opts.fd_cache.unwrap_or(limit as u64 / 4) as usize));
        let inodes = InodeTable::new(root, conns, opts.inode_handles, fds.clone())
            .map_err(|e| Error::Source(source.to_owned(), e))?;
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(vfscale_fdtable::DEFAULT_NR_OPEN);
        // Joined last: a server that cannot serve its source does not join.
        let cluster = match &opts.cluster {
            Some(c) => Some(Cluster::join(c).map_err(Error::Cluster)?),
            None => None,
        };
        let srv = Arc::new(Server {
            inodes,
            handles: Handles::new(nr_open.max(vfscale_fdtable::DEFAULT_NR_OPEN), fds.clone()),
            fds,
            reopen: sys::is_root(),
            locks: Locks::new(source_locks, cluster),
            opts,
            stack_depth,
        });
        let weak = Arc::downgrade(&srv);
        srv.locks
            .set_source_open(Box::new(move |inode, flags| match weak.upgrade() {
                Some(srv) => srv.inodes.open(inode, flags),
                None => Err(std::io::Error::from_raw_os_error(libc::EBADF)),
            }));
        Ok(srv)
    }

    /// The inode table.
    pub fn inodes(&self) -> &InodeTable {
        &self.inodes
    }

    /// The lock side.
    pub fn locks(&self) -> &Locks {
        &self.locks
    }

    /// How many more source descriptors one `READDIRPLUS` reply may open. When inodes
    /// are kept by handle, a lookup keeps none unless its inode must keep one of its own:
    /// half of the limit less the reserve less those. Otherwise the descriptor limit less the reserve (`Options::fd_reserve`) less one per cached
    /// inode (each holds its `O_PATH` descriptor; an evicted inode closes it at its
    /// eviction, before it leaves the count, though its memory goes a grace period
    /// later: see `inodes.rs`). Open handles are not counted: `ENFILE` from the lookup
    /// itself is the backstop.
    pub fn fd_budget(&self) -> u64 {
        let limit = nofile_limit() as u64;
        let reserve = self.opts.fd_reserve.unwrap_or((limit / 8).clamp(64, 65_536));
        if self.inodes.by_handle() {
            // Only inodes that keep a descriptor of their own count (those reached on
            // another mount, say): the other half of the limit is the cache's.
            return (limit / 2)
                .saturating_sub(reserve)
                .saturating_sub(self.inodes.own_fds());
        }
        limit
            .saturating_sub(reserve)
            .saturating_sub(self.inodes.nr_inodes())
    }

    /// How many files the handle table can hold.
    pub fn handle_limit(&self) -> u32 {
        self.handles.limit()
    }

    /// An `O_PATH` descriptor of `inode` (see [`InodeTable::fd`]).
    pub fn inode_fd(&self, inode: &Inode) -> std::io::Result<Arc<CachedFd>> {
        self.inodes.fd(inode)
    }

    /// The source file of handle `fh`: the one it keeps, or the cached one, or the file
    /// opened again with the open's flags.
    pub fn handle_fd(&self, fh: u64, h: &Handle) -> std::io::Result<Arc<CachedFd>> {
        self.fds
            .get_or_open(FdKey::Handle(fh), &h.file, || self.inodes.open(&h.inode, h.flags))
    }

    /// Whether handles may give their file up (see the field).
    pub fn reopens(&self) -> bool {
        self.reopen
    }

    /// Sizes the descriptor cache once the mounts are made, unless `-o fd_cache` did:
    /// half of `RLIMIT_NOFILE`, less what the server holds (`held`: the root, each
    /// connection's `/dev/fuse` descriptors, and the one more each of its dispatch
    /// threads but the first opens), less three per dispatch thread (what a request in
    /// flight may hold beyond the cache: two parents and a victim). At least 16. With
    /// source locks, a quarter of that goes to the descriptions that hold locks on the
    /// source instead.
    pub fn size_fd_cache(&self, held: u64, threads: u64) -> u64 {
        let half = nofile_limit() as u64 / 2;
        let mut n = half.saturating_sub(held + 3 * threads).max(16);
        if self.locks.source_locks() == SourceLocks::Mirror {
            self.locks.set_mirror_budget(n / 4);
            n -= n / 4;
        }
        self.fds.set_capacity(self.opts.fd_cache.unwrap_or(n) as usize);
        self.fds.capacity()
    }

    /// Under `--cluster`, before a lock granted to a client on connection `conn` is
    /// answered: whether the source file may have changed since that connection's
    /// kernel was last known to cache it (`cluster.rs`; one `stat`). If so, the caller
    /// invalidates its caches and then calls `invalidation_done` on the inode's views.
    fn changed_since_grant(&self, conn: usize, node: &Inode) -> bool {
        let views = node.grant_views();
        let st = self
            .inode_fd(node)
            .ok()
            .and_then(|fd| sys::stat_fd(fd.as_fd()).ok().map(|st| (fd, st)));
        match st {
            Some((fd, st)) => views.source_changed(conn, &st, fd.as_fd()),
            None => {
                views.must_invalidate(conn);
                true
            }
        }
    }

    /// Before a lock granted to a client on connection `conn` is answered, where the
    /// source may have changed since (`Mirror::grant_begin`): what the client's kernel caches
    /// of the inode goes (attributes and data, which processes on the source may have
    /// changed under their locks; from the notify thread, see `serve`), and the first
    /// time, the file's directory on the source is marked so that its entries are
    /// answered with no cache time (see `fs.rs`). The entries every connection cached
    /// before the directory was marked are looked up again before their next use
    /// (`FUSE_NOTIFY_INC_EPOCH`: the server does not know their names); a kernel that
    /// does not know it refuses it, and they live out their cache time.
    fn grant_coherence(&self, notifiers: &[Notifier], conn: usize, id: u64) {
        let Some(notifier) = notifiers.get(conn) else {
            return;
        };
        let _ = notifier.inval_inode(INodeNo(id), 0, 0);
        let Some(node) = self.inodes.get(id) else { return };
        if node.kind != inodes::Kind::File || !node.first_lock_grant() {
            return;
        }
        let Ok(fd) = self.inode_fd(&node) else { return };
        let Ok(path) = std::fs::read_link(sys::proc_path(fd.as_fd()).to_string_lossy().as_ref()) else {
            return;
        };
        let Some(dir) = path.parent() else { return };
        let parent = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)
            .and_then(|d| sys::stat_fd(d.as_fd()));
        if let Some(p) = parent.ok().and_then(|st| self.inodes.peek(&st)) {
            if p.mark_lock_dir() {
                for n in notifiers {
                    let _ = n.inc_epoch();
                }
            }
            let _ = notifier.inval_inode(INodeNo(p.id), 0, 0);
        }
    }

    /// One line for the operator: how inodes are kept, how many descriptors the cache
    /// may hold, and whether locks are held on the source, or shared by a cluster
    /// (`cluster=NAME node=NODE peer=ADDR`).
    pub fn mode_line(&self) -> String {
        let limit = nofile_limit();
        let cap = self.fds.capacity();
        let cluster;
        let locks = match (self.locks.cluster(), self.locks.source_locks()) {
            (Some(c), _) => {
                cluster = format!("locks shared by the cluster's servers ({})", c.line());
                cluster.as_str()
            }
            (None, SourceLocks::Mirror) => "locks held on the source too",
            (None, SourceLocks::Off) => "locks the server's alone (source_locks=off)",
        };
        match self.inodes.why_not_by_handle() {
            None => {
                format!("inodes by file handle; descriptor cache of {cap} (RLIMIT_NOFILE {limit}); {locks}")
            }
            Some(why) => {
                format!("inodes by descriptor, one per inode the kernel holds ({why}); RLIMIT_NOFILE {limit}; {locks}")
            }
        }
    }
}

/// Why the server could not start or ended badly.
#[derive(Debug)]
pub enum Error {
    /// The source directory cannot be served.
    Source(PathBuf, std::io::Error),
    /// A mountpoint cannot be used.
    Mountpoint(PathBuf, String),
    /// A connection ended with an error.
    Session(PathBuf, std::io::Error),
    /// The options cannot be used together; the message says why.
    Usage(String),
    /// The cluster could not be joined (`--cluster`); the message says why.
    Cluster(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Source(p, e) => write!(f, "source {}: {e}", p.display()),
            Error::Mountpoint(p, e) => write!(f, "mountpoint {}: {e}", p.display()),
            Error::Session(p, e) => write!(f, "{}: {e}", p.display()),
            Error::Usage(m) => write!(f, "{m}"),
            Error::Cluster(m) => write!(f, "--cluster: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Raises `RLIMIT_NOFILE` as far as allowed (to `fs.nr_open` as root) and returns the
/// soft limit now in force: every open file and every known inode holds a descriptor.
pub fn raise_nofile() -> u32 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((_, mut hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if sys::is_root() {
        if let Ok(s) = std::fs::read_to_string("/proc/sys/fs/nr_open") {
            if let Ok(n) = s.trim().parse::<u64>() {
                hard = hard.max(n);
            }
        }
    }
    if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_err() {
        if let Ok((_, h)) = getrlimit(Resource::RLIMIT_NOFILE) {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, h, h);
        }
    }
    nofile_limit()
}

fn nofile_limit() -> u32 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft.min(u32::MAX as u64) as u32)
        .unwrap_or(1024)
}

fn check_mountpoint(p: &Path) -> Result<(), Error> {
    let m = std::fs::metadata(p).map_err(|e| Error::Mountpoint(p.to_owned(), e.to_string()))?;
    if !m.is_dir() {
        return Err(Error::Mountpoint(p.to_owned(), "not a directory".into()));
    }
    Ok(())
}

/// `SIGUSR1`: one line `inodes=N lookups=M handles=H` (the inode table's size, the root
/// included, the lookups the kernels hold, the open files) appended to the file named by `VFSCALEFS_STATS`, or
/// to stderr, followed by the lock counters of the live inodes, summed since they were
/// loaded (`lock_grants= lock_blocks= lock_wakeups= lock_handoffs= lock_held=
/// lock_wait_nodes=`, see `vfscale_locks::ContextStats`: `lock_wait_nodes` over
/// `lock_blocks` is the wait-tree work per sleep; `lock_driver_answers=`, the parked
/// requests answered by the lock driver thread rather than by the thread whose request
/// woke them, see [`locks::Locks::driver_answers`]), then the dispatch gates' counters over
/// every connection (`dispatch_reads= dispatch_busy_reads= dispatch_parks= dispatch_wakes=
/// dispatch_stall_wakes=`, see [`dispatch::GateStats`]) and, over io_uring, the queues'
/// counters summed over every connection (`uring_requests= uring_entries= uring_parked=
/// uring_max_parked= uring_late_replies= uring_late_wakes= uring_lost_interrupts=
/// uring_offloaded=`: requests carried, ring entries registered, requests parked now,
/// the most parked at once on one queue, replies to parked requests, those of them made
/// on another thread than their queue's, which had to wake it, parked requests
/// interrupted for a caller the kernel sent no `INTERRUPT` for, and requests that may
/// block served by a worker thread). Under `--cluster`, the cluster's counters
/// follow (`cluster_local_calls= cluster_remote_calls= cluster_served_for_peers=
/// cluster_reclaimed= cluster_deadlocks_across= cluster_lost_eio= cluster_homes_claimed=
/// cluster_homes_now= cluster_homes_given_back= cluster_dead_owners_dropped=
/// cluster_etcd_txns= cluster_fences=`,
/// see `vfscale_cluster::ClusterStats`; the lock counters before them are then zero, the
/// server's own lock manager unused). After the kernels have forgotten
/// everything (`umount`, or `echo 2 > /proc/sys/vm/drop_caches` with nothing open) it
/// reads `inodes=1 lookups=0`.
fn write_stats(srv: &Server, gates: &[Arc<dispatch::ConnGate>], rings: &[fuser::IoUringStats]) {
    use std::io::Write as _;
    let g = gates
        .iter()
        .fold(dispatch::GateStats::default(), |a, g| a + g.stats());
    let s = srv.inodes.stats();
    let open: usize = (0..srv.inodes.connections())
        .map(|c| srv.handles.of_connection(c).len())
        .sum();
    let l = srv.locks.stats();
    let f = srv.fds.stats();
    let line = format!(
        "inodes={} lookups={} handles={open} fds_cached={} fds_capacity={} fds_opened={} lock_grants={} lock_blocks={} lock_wakeups={} lock_handoffs={} lock_held={} lock_wait_nodes={} lock_driver_answers={} dispatch_reads={} dispatch_busy_reads={} dispatch_parks={} dispatch_wakes={} dispatch_stall_wakes={}\n",
        s.inodes, s.lookups, f.cached, f.capacity, f.opened, l.grants, l.blocks, l.wakeups, l.handoffs, l.held, l.wait_nodes,
        srv.locks.driver_answers(), g.reads, g.busy_reads, g.parks, g.wakes, g.stall_wakes
    );
    let line = match srv.locks.cluster() {
        None => line,
        Some(c) => {
            let c = c.stats();
            format!(
                "{} cluster_local_calls={} cluster_remote_calls={} cluster_served_for_peers={} cluster_reclaimed={} cluster_deadlocks_across={} cluster_lost_eio={} cluster_homes_claimed={} cluster_homes_now={} cluster_homes_given_back={} cluster_dead_owners_dropped={} cluster_etcd_txns={} cluster_fences={}\n",
                line.trim_end(),
                c.local_calls,
                c.remote_calls,
                c.served_for_peers,
                c.reclaimed,
                c.deadlocks_across,
                c.lost_eio,
                c.homes_claimed,
                c.homes_now,
                c.homes_given_back,
                c.dead_owners_dropped,
                c.directory.etcd_txns,
                c.directory.fences
            )
        }
    };
    let queues: Vec<fuser::QueueStats> = rings.iter().flat_map(|r| r.queues()).collect();
    let line = if queues.is_empty() {
        line
    } else {
        let sum = |f: fn(&fuser::QueueStats) -> u64| queues.iter().map(f).sum::<u64>();
        format!(
            "{} uring_requests={} uring_entries={} uring_parked={} uring_max_parked={} uring_late_replies={} uring_late_wakes={} uring_lost_interrupts={} uring_offloaded={}\n",
            line.trim_end(),
            sum(|q| q.requests),
            sum(|q| q.registered),
            sum(|q| q.parked_now),
            queues.iter().map(|q| q.max_parked).max().unwrap_or(0),
            sum(|q| q.late_replies),
            sum(|q| q.late_wakes),
            sum(|q| q.lost_interrupts),
            sum(|q| q.offloaded)
        )
    };
    let wrote = std::env::var_os("VFSCALEFS_STATS").is_some_and(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .is_ok()
    });
    if !wrote {
        let _ = std::io::stderr().write_all(format!("vfscalefs: {line}").as_bytes());
    }
}

/// Lazily detaches the mount at `p` (the last resort when it is busy).
fn detach(p: &Path) {
    if sys::is_root() {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    } else {
        let _ = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(p)
            .status();
    }
}

/// Mounts `source` on every mountpoint, serves until all are unmounted (by `umount`, or
/// by [`serve`]'s signal handling on `SIGINT`/`SIGTERM`/`SIGHUP`), and returns.
pub fn serve(source: &Path, mountpoints: &[PathBuf], opts: Options) -> Result<(), Error> {
    use nix::sys::signal::{SigSet, Signal};

    let md = std::fs::metadata(source).map_err(|e| Error::Source(source.to_owned(), e))?;
    if !md.is_dir() {
        return Err(Error::Source(
            source.to_owned(),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    for m in mountpoints {
        check_mountpoint(m)?;
    }
    raise_nofile();
    // The client applies the caller's umask; the server must not apply its own on top.
    sys::clear_umask();

    // Every thread started from here on inherits this mask: the signals are taken by
    // the one thread that waits for them.
    let mut sigs = SigSet::empty();
    sigs.add(Signal::SIGINT);
    sigs.add(Signal::SIGTERM);
    sigs.add(Signal::SIGHUP);
    sigs.add(Signal::SIGUSR1);
    sigs.thread_block()
        .map_err(|e| Error::Source(source.to_owned(), e.into()))?;
    // The signal that ends a host wait's blocking call reaches only the waiting thread
    // (which unblocks it): elsewhere it would make an unrelated call return EINTR.
    let mut wake = SigSet::empty();
    wake.add(Signal::SIGUSR2);
    wake.thread_block()
        .map_err(|e| Error::Source(source.to_owned(), e.into()))?;

    let srv = Server::new(source, mountpoints.len(), opts.clone())?;
    let fsname = source.canonicalize().unwrap_or_else(|_| source.to_owned());
    let mut options = vec![
        MountOption::FSName(fsname.to_string_lossy().into_owned()),
        MountOption::Subtype("vfscalefs".into()),
        MountOption::DefaultPermissions,
    ];
    if opts.read_only {
        options.push(MountOption::RO);
    }
    if opts.dev {
        options.push(MountOption::Dev);
    }
    if opts.suid {
        options.push(MountOption::Suid);
    }
    let mut config = Config::default();
    config.mount_options = options;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    // Over io_uring, as over /dev/fuse, a request that may wait long does not hold the
    // ones behind it: while the source is slow, a worker serves it instead of its CPU's
    // queue thread.
    config.io_uring = opts.io_uring.map(|c| fuser::IoUringConfig {
        offload: Some(fuser::MayBlock(dispatch::may_block)),
        ..c
    });

    let mut sessions = Vec::new();
    let mut unmounters = Vec::new();
    let mut gates = Vec::new();
    let mut rings = Vec::new();
    for (i, mp) in mountpoints.iter().enumerate() {
        config.dispatch_gate = None;
        if opts.dispatch_gate && opts.threads > 1 {
            let g = dispatch::ConnGate::new(opts.threads).map_err(|e| Error::Session(mp.clone(), e))?;
            gates.push(g.clone());
            config.dispatch_gate = Some(fuser::GateHandle(g));
        }
        match Session::new(fs::Conn::new(i, srv.clone()), mp, &config) {
            Ok(mut s) => {
                if opts.io_uring.is_some() {
                    eprintln!("vfscalefs: {}: {}", mp.display(), transport_line(s.transport()));
                }
                rings.extend(s.io_uring_stats());
                unmounters.push((mp.clone(), s.unmount_callable()));
                sessions.push((mp.clone(), s));
            }
            Err(e) => {
                for (p, mut u) in unmounters {
                    if u.unmount().is_err() {
                        detach(&p);
                    }
                }
                return Err(Error::Mountpoint(mp.clone(), e.to_string()));
            }
        }
    }

    // A client granted a lock sees what processes on the source (or, under --cluster,
    // the other servers' clients) changed under theirs.
    let mirror = srv.locks.source_locks() == SourceLocks::Mirror;
    if mirror || srv.locks.cluster().is_some() {
        let notifiers: Vec<Notifier> = sessions.iter().map(|(_, s)| s.notifier()).collect();
        let notify = notify::GrantNotify::start(notifiers, Arc::downgrade(&srv))
            .map_err(|e| Error::Source(source.to_owned(), e))?;
        let invalidate = notify.clone();
        if mirror {
            srv.locks.set_grant_hook(Box::new(move |conn, id, answer| {
                notify.invalidate_then(conn, id, answer)
            }));
        }
        if let Some(c) = srv.locks.cluster() {
            let weak = Arc::downgrade(&srv);
            c.set_coherence(Box::new(move |conn, node, reply| {
                if !weak.upgrade().is_some_and(|s| s.changed_since_grant(conn, node)) {
                    return reply.ok();
                }
                let n = node.clone();
                invalidate.invalidate_then(
                    conn,
                    node.id,
                    Box::new(move || {
                        n.grant_views().invalidation_done(conn);
                        reply.ok()
                    }),
                );
            }));
        }
    }

    // Every mount is made: what the server holds now is its base, and each connection's
    // dispatch threads but the first will open a /dev/fuse descriptor of their own.
    // Over io_uring, the queue threads and the workers serve requests too.
    let threads = opts.threads.max(1) as u64;
    let conns = mountpoints.len() as u64;
    let ring_threads: u64 = sessions
        .iter()
        .map(|(_, s)| match s.transport() {
            fuser::Transport::IoUring { queues, .. } => *queues as u64 + threads,
            _ => 0,
        })
        .sum();
    let held = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    srv.size_fd_cache(held + (threads - 1) * conns, threads * conns + ring_threads);
    eprintln!("vfscalefs: {}", srv.mode_line());

    let threads: Vec<_> = sessions
        .into_iter()
        .map(|(mp, s)| {
            let name = format!("vfscalefs-conn-{}", mp.display());
            let h = std::thread::Builder::new()
                .name(name)
                .spawn(move || s.run())
                .expect("spawn a connection thread");
            (mp, h)
        })
        .collect();

    let stats_srv = srv.clone();
    std::thread::Builder::new()
        .name("vfscalefs-signals".into())
        .spawn(move || {
            loop {
                match sigs.wait() {
                    Ok(Signal::SIGUSR1) => write_stats(&stats_srv, &gates, &rings),
                    Ok(_) => break,
                    Err(_) => return,
                }
            }
            for (p, mut u) in unmounters {
                if u.unmount().is_err() {
                    // Busy: detach it; the connection ends when its last user closes.
                    eprintln!(
                        "vfscalefs: {} is busy; detached, it goes away when no longer used",
                        p.display()
                    );
                    detach(&p);
                }
            }
        })
        .expect("spawn the signal thread");

    let mut result = Ok(());
    for (mp, h) in threads {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if result.is_ok() {
                    result = Err(Error::Session(mp, e));
                }
            }
            Err(_) => {
                if result.is_ok() {
                    result = Err(Error::Session(
                        mp,
                        std::io::Error::other("a dispatch thread panicked"),
                    ));
                }
            }
        }
    }
    // Orderly: the lease is revoked, and the other servers take this one's inodes now.
    if let Some(c) = srv.locks.cluster() {
        c.leave();
    }
    result
}

/// The mount's one line about its transport, when io_uring was asked for.
fn transport_line(t: &fuser::Transport) -> String {
    match t {
        fuser::Transport::IoUring {
            queues,
            depth,
            payload_size,
        } => format!(
            "requests over io_uring ({queues} queues, depth {depth}, {} KiB entries)",
            payload_size / 1024
        ),
        fuser::Transport::DevFuseRefused { reason } => {
            format!("io_uring refused ({reason}); serving /dev/fuse")
        }
        fuser::Transport::DevFuse => "serving /dev/fuse".to_string(),
    }
}
