//! The FUSE side: one [`Conn`] per mountpoint (connection), all sharing one [`Server`].
//! Each operation resolves node ids through the inode table, file handles through the
//! handle table, and runs its system call on the source.
//!
//! This file holds the connection and the [`Filesystem`] methods, each of which calls
//! its operation (`operations.rs`, a `Result` of what the reply carries) and answers
//! (`reply.rs`).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, RequestId, TimeOrNow, WriteFlags,
};

use crate::fdcache::{CachedFd, FdKey};
use crate::handles::Handle;
use crate::inodes::{Found, Inode, Kind, Node};
use crate::locks::{Interrupts, LockReq};
use crate::mirror::SourceLocks;
use crate::sys;
use crate::Server;

mod attr;
mod operations;
mod reply;

use attr::attr;
use operations::SetAttr;
use reply::{answer, reply_empty, reply_entry, reply_xattr};

/// What a `READDIRPLUS` entry became.
enum PlusEntry {
    /// Looked up: one lookup counted on this connection.
    Looked(Node, FileAttr),
    /// The name went away meanwhile: skipped, as a `readdir` racing an unlink may.
    Gone,
    /// Not cached and no descriptor to spare beyond the reserve.
    NoBudget,
    /// The lookup failed otherwise.
    Failed(io::Error),
}

/// One connection: a mountpoint of the server.
pub struct Conn {
    idx: usize,
    srv: Arc<Server>,
    intr: Arc<Interrupts>,
    passthrough: AtomicBool,
    destroyed: AtomicBool,
}

impl Conn {
    /// Connection number `idx` of `srv`.
    pub fn new(idx: usize, srv: Arc<Server>) -> Conn {
        Conn {
            idx,
            srv,
            intr: Arc::new(Interrupts::default()),
            passthrough: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        }
    }

    fn inode(&self, id: INodeNo) -> Option<Node> {
        self.srv.inodes.get(id.0)
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.srv.handles.get(self.idx, fh.0)
    }

    fn ttl(&self) -> Duration {
        self.srv.opts.ttl
    }

    /// Looks `name` up in `parent` and counts one lookup: the entry to reply with.
    fn lookup_entry(&self, parent: &Inode, name: &OsStr) -> io::Result<(Node, FileAttr)> {
        let c = sys::component(name)?;
        let pfd = self.srv.inode_fd(parent)?;
        // An inode the table has needs no descriptor: one stat of the name finds it.
        let st = sys::stat_at(pfd.as_fd(), &c)?;
        if let Some(inode) = self.srv.inodes.lookup_cached(self.idx, &st) {
            let a = attr(&inode, &st);
            return Ok((inode, a));
        }
        // A new inode kept by handle needs no descriptor either: the name's handle, which
        // carries the stat's inode number where the source's layout is learned, else taken
        // between two stats that agree. (Were the name replaced twice in between, the
        // inode would hold another file's handle, which opens as ESTALE: every open by
        // handle is checked against the inode's identity.)
        if let Some(mount) = self.srv.inodes.handle_mount() {
            if let Ok((h, m)) = sys::handle_at(pfd.as_fd(), &c) {
                let layout = self.srv.inodes.handle_ino();
                if m == mount && layout.and_then(|l| l.carries(&h, st.st_ino)) == Some(true) {
                    let inode = self.srv.inodes.lookup(self.idx, Found::Handle(h), &st)?;
                    let a = attr(&inode, &st);
                    return Ok((inode, a));
                }
                let again = sys::stat_at(pfd.as_fd(), &c)?;
                if m == mount && (again.st_dev, again.st_ino) == (st.st_dev, st.st_ino) {
                    if let Some(l) = layout {
                        l.confirm(&h, st.st_ino);
                    }
                    let inode = self.srv.inodes.lookup(self.idx, Found::Handle(h), &again)?;
                    let a = attr(&inode, &again);
                    return Ok((inode, a));
                }
            }
        }
        let fd = sys::openat_beneath(pfd.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let st = sys::stat_fd(fd.as_fd())?;
        let inode = self.srv.inodes.lookup(self.idx, Found::Path(fd), &st)?;
        let a = attr(&inode, &st);
        Ok((inode, a))
    }

    /// One `READDIRPLUS` entry other than `.`/`..`: looked up (one lookup counted, as by
    /// `lookup`) if the descriptor budget allows, else through the cache only.
    /// `budget` is the number of descriptors this reply may still take.
    fn plus_entry(&self, parent: &Inode, name: &OsStr, budget: &mut u64) -> PlusEntry {
        if *budget > 0 {
            *budget -= 1;
            match self.lookup_entry(parent, name) {
                Ok((n, a)) => return PlusEntry::Looked(n, a),
                Err(e) => match e.raw_os_error() {
                    Some(libc::ENOENT | libc::ESTALE) => return PlusEntry::Gone,
                    Some(libc::EMFILE | libc::ENFILE) => {}
                    _ => return PlusEntry::Failed(e),
                },
            }
        }
        // Short of descriptors: an inode the cache already holds needs none.
        let Ok(c) = sys::component(name) else {
            return PlusEntry::Failed(io::Error::from_raw_os_error(libc::EINVAL));
        };
        let pfd = match self.srv.inode_fd(parent) {
            Ok(f) => f,
            Err(e) => return PlusEntry::Failed(e),
        };
        match sys::stat_at(pfd.as_fd(), &c) {
            Ok(st) => match self.srv.inodes.lookup_cached(self.idx, &st) {
                Some(n) => {
                    let a = attr(&n, &st);
                    PlusEntry::Looked(n, a)
                }
                None => PlusEntry::NoBudget,
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => PlusEntry::Gone,
            Err(e) => PlusEntry::Failed(e),
        }
    }

    fn dir(&self, id: INodeNo) -> Result<Node, Errno> {
        let i = self.inode(id).ok_or(Errno::ENOENT)?;
        if i.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok(i)
    }

    /// The passthrough backing file of `inode` on this connection, registered from `file`
    /// if no open handle has one.
    fn backing(
        &self,
        inode: &Inode,
        file: BorrowedFd<'_>,
        reg: impl FnOnce(BorrowedFd<'_>) -> io::Result<fuser::BackingId>,
    ) -> Option<Arc<fuser::BackingId>> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let mut slot = inode.backing(self.idx).lock();
        if let Some(b) = slot.upgrade() {
            return Some(b);
        }
        match reg(file) {
            Ok(b) => {
                let b = Arc::new(b);
                *slot = Arc::downgrade(&b);
                Some(b)
            }
            Err(e) => {
                // Not permitted here (no CAP_SYS_ADMIN, stacking depth): serve I/O ourselves.
                if std::env::var_os("VFSCALEFS_DEBUG").is_some() {
                    eprintln!("vfscalefs: connection {}: passthrough off: {e}", self.idx);
                }
                self.passthrough.store(false, Ordering::Relaxed);
                None
            }
        }
    }

    /// Installs a handle on `inode` over `file`, opened with `flags`: its file handle.
    /// The handle keeps `file` only where it could not open it again; with a passthrough
    /// `backing` the kernel holds the file and the server keeps none.
    fn install(
        &self,
        inode: Node,
        file: OwnedFd,
        flags: i32,
        backing: Option<Arc<fuser::BackingId>>,
    ) -> Result<u64, Errno> {
        let keep = backing.is_none();
        // Counted open from here on; had an unlink through the mount come first, the
        // file has no link left and its handle will not open it again.
        let h = Handle::new(inode, flags, self.idx, backing);
        if self.srv.inodes.by_handle()
            && !h.inode.has_own_fd()
            && sys::stat_fd(file.as_fd()).is_ok_and(|st| st.st_nlink == 0)
        {
            if let Ok(fd) = sys::reopen(file.as_fd(), libc::O_PATH) {
                self.srv.inodes.keep_if_open(&h.inode, fd);
            }
        }
        let cache = if keep && !self.srv.reopens() {
            let _ = h.file.pin(CachedFd::pinned(file));
            None
        } else {
            keep.then_some(file)
        };
        let (fh, h) = self.srv.handles.insert(h).map_err(Errno::from_i32)?;
        if let Some(file) = cache {
            self.srv.fds.admit(FdKey::Handle(fh), &h.file, file);
        }
        Ok(fh)
    }

    /// The source file of handle `fh`.
    fn file(&self, fh: FileHandle, h: &Handle) -> io::Result<Arc<CachedFd>> {
        self.srv.handle_fd(fh.0, h)
    }

    /// `/proc/self/fd/N` of an inode's `O_PATH` descriptor, for path-only calls (the
    /// descriptor is held while the path is used). Refused for symbolic links: the magic
    /// link must never lead past one.
    fn inode_path(&self, inode: &Inode) -> io::Result<(Arc<CachedFd>, CString)> {
        if inode.kind == Kind::Symlink {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let fd = self.srv.inode_fd(inode)?;
        let p = sys::proc_path(fd.as_fd());
        Ok((fd, p))
    }

    /// Before `name` in `dir` may lose its last link: its cached inode with an `O_PATH`
    /// descriptor of it, to be kept if the inode is open once the link is gone
    /// ([`Conn::keep_victim`]). Taken whether or not the inode is open now: an `OPEN`
    /// may count itself between this call and the unlink.
    fn victim(&self, dir: BorrowedFd<'_>, name: &CString) -> Option<(Node, OwnedFd)> {
        let st = sys::stat_at(dir, name).ok()?;
        if st.st_nlink > 1 && st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return None;
        }
        let node = self.srv.inodes.peek(&st)?;
        if node.has_own_fd() {
            return None;
        }
        let fd = sys::openat_beneath(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        let again = sys::stat_fd(fd.as_fd()).ok()?;
        ((again.st_dev, again.st_ino) == (st.st_dev, st.st_ino)).then_some((node, fd))
    }

    /// After the link `victim` named is gone: an inode a client holds keeps the
    /// descriptor (its handle no longer opens it, and its open files, and opens of it
    /// through an `O_PATH` descriptor, must keep working).
    fn keep_victim(&self, victim: Option<(Node, OwnedFd)>) {
        if let Some((node, fd)) = victim {
            self.srv.inodes.keep_if_held(&node, fd);
        }
    }

    fn release_handle(&self, fh: u64) {
        if let Some(h) = self.srv.handles.remove(self.idx, fh) {
            self.srv.locks.release(&h, fh);
        }
    }

    fn lock_req(
        &self,
        req: &Request,
        fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> LockReq {
        LockReq {
            conn: self.idx,
            unique: req.unique().0,
            fh: fh.0,
            lock_owner: owner.0,
            start,
            end,
            typ,
            pid,
        }
    }

    /// Ends the connection: parked requests are interrupted, open handles released (their
    /// locks dropped), the kernel's lookups forgotten. Idempotent.
    pub fn shutdown(&self) {
        if self.destroyed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.intr.interrupt_all();
        for (fh, h) in self.srv.handles.of_connection(self.idx) {
            drop(h);
            self.release_handle(fh);
        }
        self.srv.inodes.drop_connection(self.idx);
    }

    /// How long the kernel may keep an entry of `parent`: not at all in a directory where
    /// files locked through the mount live, since processes on the source (or other
    /// servers' clients, under `--cluster`) change its entries under their locks (a rollback journal deleted on the source must not
    /// still show through the mount).
    fn entry_ttl(&self, parent: &Inode) -> Duration {
        let locks = self.srv.locks();
        if parent.is_lock_dir() && (locks.source_locks() == SourceLocks::Mirror || locks.cluster().is_some())
        {
            Duration::ZERO
        } else {
            self.ttl()
        }
    }
}

impl Filesystem for Conn {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Without these the kernel keeps locks to itself and none reach the server.
        config
            .add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS)
            .map_err(|missing| io::Error::other(format!("the kernel lacks lock forwarding ({missing:?})")))?;
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        if self.srv.opts.readdirplus {
            // READDIRPLUS on the first read of a directory and whenever the kernel saw
            // lookups follow a readdir (`ls -l`), plain READDIR otherwise.
            let _ =
                config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        }
        let _ = config.set_max_background(64);
        if self.srv.opts.passthrough
            && sys::is_root()
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.set_max_stack_depth(self.srv.stack_depth).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            self.passthrough.store(true, Ordering::Relaxed);
        }
        if std::env::var_os("VFSCALEFS_DEBUG").is_some() {
            eprintln!(
                "vfscalefs: connection {}: protocol {:?}, passthrough {}",
                self.idx,
                config.kernel_abi(),
                if self.passthrough.load(Ordering::Relaxed) {
                    "on"
                } else {
                    "off"
                }
            );
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(reply, self.lookup_op(parent, name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.srv.inodes.forget(self.idx, ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        answer(reply, self.getattr_op(ino), |reply, a| {
            reply.attr(&self.ttl(), &a)
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        };
        answer(reply, self.setattr_op(ino, set), |reply, a| {
            reply.attr(&self.ttl(), &a)
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        answer(reply, self.readlink_op(ino), |reply, target| reply.data(&target));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let made = self.make_entry(req, parent, name, |dir, c| sys::mknodat(dir, c, mode, rdev));
        reply_entry(reply, made);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let made = self.make_entry(req, parent, name, |dir, c| sys::mkdirat(dir, c, mode));
        reply_entry(reply, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_op(parent, name, sys::Unlink::File));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.remove_op(parent, name, sys::Unlink::Dir));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        reply_entry(reply, self.symlink_op(req, parent, link_name, target));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.rename_op(parent, name, newparent, newname, flags));
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        reply_entry(reply, self.link_op(ino, newparent, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.open_op(ino, flags, &reply);
        answer(reply, opened, |reply, o| match o.backing {
            Some(b) => reply.opened_passthrough(FileHandle(o.fh), FopenFlags::empty(), &b),
            None => reply.opened(FileHandle(o.fh), FopenFlags::empty()),
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        answer(reply, self.read_op(fh, offset, size), |reply, data| {
            reply.data(&data)
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        answer(reply, self.write_op(fh, offset, data), |reply, n| {
            reply.written(n)
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        reply_empty(reply, self.flush_op(fh, lock_owner));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.release_handle(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        if let Some(d) = slow_fsync_for_tests() {
            std::thread::sleep(d);
        }
        reply_empty(reply, self.fsync_op(fh, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        answer(reply, self.opendir_op(ino, flags), |reply, fh| {
            reply.opened(FileHandle(fh), FopenFlags::empty())
        });
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let filled = self.readdir_op(fh, offset, &mut reply);
        answer(reply, filled, |reply, ()| reply.ok());
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let filled = self.readdirplus_op(fh, offset, &mut reply);
        answer(reply, filled, |reply, ()| reply.ok());
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.release_handle(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        answer(reply, self.statfs_op(), |reply, st| {
            reply.statfs(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_bsize as u32,
                st.f_namemax as u32,
                st.f_frsize as u32,
            )
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.setxattr_op(ino, name, value, flags));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.getxattr_op(ino, name, size));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(reply, self.listxattr_op(ino, size));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.removexattr_op(ino, name));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks; this is only asked for by old kernels.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let created = self.create_op(req, parent, name, mode, flags, &reply);
        answer(reply, created, |reply, (e, o)| match o.backing {
            Some(b) => reply.created_passthrough(
                &e.ttl,
                &e.attr,
                Generation(0),
                FileHandle(o.fh),
                FopenFlags::empty(),
                &b,
            ),
            None => reply.created(
                &e.ttl,
                &e.attr,
                Generation(0),
                FileHandle(o.fh),
                FopenFlags::empty(),
            ),
        });
    }

    fn getlk(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let Some(h) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        let r = self.lock_req(req, fh, lock_owner, start, end, typ, pid);
        self.srv.locks.getlk(&self.srv.inodes, &h, &r, reply);
    }

    fn setlk(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        let r = self.lock_req(req, fh, lock_owner, start, end, typ, pid);
        self.srv
            .locks
            .setlk(&self.srv.inodes, &h, &r, sleep, &self.intr, reply);
    }

    fn flock(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        op: i32,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handle(fh) else {
            return reply.error(Errno::EBADF);
        };
        let r = self.lock_req(req, fh, lock_owner, 0, 0, 0, req.pid());
        self.srv
            .locks
            .flock(&self.srv.inodes, &h, &r, op, &self.intr, reply);
    }

    fn interrupt(&self, _req: &Request, unique: RequestId) -> Result<(), Errno> {
        self.intr.interrupt(unique.0);
        Ok(())
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_empty(reply, self.fallocate_op(fh, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        answer(reply, self.lseek_op(fh, offset, whence), |reply, off| {
            reply.offset(off)
        });
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let copied = self.copy_file_range_op(fh_in, offset_in, fh_out, offset_out, len);
        answer(reply, copied, |reply, n| reply.written(n));
    }
}

/// Test knob: `VFSCALEFS_TEST_SLOW_FSYNC_MS=N` makes every `FSYNC` take N ms more, as
/// on a slow source (the tests of requests that may block).
fn slow_fsync_for_tests() -> Option<Duration> {
    static SLOW: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *SLOW.get_or_init(|| {
        std::env::var("VFSCALEFS_TEST_SLOW_FSYNC_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
    })
}
