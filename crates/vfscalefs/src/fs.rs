//! The FUSE side: one [`Conn`] per mountpoint (connection), all sharing one [`Server`].
//! Each operation resolves node ids through the inode table, file handles through the
//! handle table, and runs its system call on the source.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, RequestId, TimeOrNow, WriteFlags,
};

use crate::fdcache::{CachedFd, FdKey};
use crate::handles::Handle;
use crate::inodes::{Found, Inode, Kind, Node};
use crate::locks::{Interrupts, LockReq};
use crate::mirror::SourceLocks;
use crate::sys::{self, AsCaller};
use crate::Server;

/// The errno a client gets for a failed call of the server's. The server's own
/// descriptor table being full is `ENFILE` to the client (too many files open "in the
/// system" it sees): `EMFILE` would say that the caller's table is full.
fn errno(e: io::Error) -> Errno {
    Errno::from_i32(match e.raw_os_error() {
        Some(libc::EMFILE) => libc::ENFILE,
        Some(n) => n,
        None => libc::EIO,
    })
}

/// A failed request: the errno its reply carries. `?` turns the server's own errors into
/// one through [`errno`].
struct Failed(Errno);

impl From<io::Error> for Failed {
    fn from(e: io::Error) -> Failed {
        Failed(errno(e))
    }
}

impl From<Errno> for Failed {
    fn from(e: Errno) -> Failed {
        Failed(e)
    }
}

/// A fuser reply, which a failed request answers with its errno.
trait Refuse {
    fn refuse(self, e: Errno);
}

impl Refuse for ReplyAttr {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyCreate {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyData {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyDirectory {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyDirectoryPlus {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyEmpty {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyEntry {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyLseek {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyOpen {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyStatfs {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyWrite {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl Refuse for ReplyXattr {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

/// Answers `reply` through `ok` with what the request produced, or with its errno.
fn answer<R: Refuse, T>(reply: R, outcome: Result<T, Failed>, ok: impl FnOnce(R, T)) {
    match outcome {
        Ok(v) => ok(reply, v),
        Err(Failed(e)) => reply.refuse(e),
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dirent_type(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// The attributes of `inode` as the kernel sees them: the source's, with the node id as
/// inode number (the source's inode number, see `inodes.rs`).
fn attr(inode: &Inode, st: &libc::stat64) -> FileAttr {
    FileAttr {
        ino: INodeNo(inode.id),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

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

/// The attributes sent with `.` and `..`, which the kernel does not instantiate: only the
/// inode number and type are used (for the `dirent`).
fn unlooked(ino: u64, d_type: u8) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: dirent_type(d_type),
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
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

    /// After the link `victim` named is gone: an open inode keeps the descriptor (its
    /// handle no longer opens it, and its open files must keep working).
    fn keep_victim(&self, victim: Option<(Node, OwnedFd)>) {
        if let Some((node, fd)) = victim {
            self.srv.inodes.keep_if_open(&node, fd);
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
    /// files locked through the mount live, since processes on the source change its
    /// entries under their locks (a rollback journal deleted on the source must not
    /// still show through the mount).
    fn entry_ttl(&self, parent: &Inode) -> Duration {
        if parent.is_lock_dir() && self.srv.locks.source_locks() == SourceLocks::Mirror {
            Duration::ZERO
        } else {
            self.ttl()
        }
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
            Err(e) => {
                let d = e.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = -(d.subsec_nanos() as i64);
                if nsec < 0 {
                    sec -= 1;
                    nsec += 1_000_000_000;
                }
                libc::timespec {
                    tv_sec: sec as libc::time_t,
                    tv_nsec: nsec as libc::c_long,
                }
            }
        },
    }
}

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// What `getxattr`/`listxattr` found: the buffer of the size the kernel asked for and
/// the length of the value (written to the buffer unless it is empty).
struct XattrValue {
    buf: Vec<u8>,
    len: usize,
}

/// Answers an xattr read: with the length alone when the kernel asked for the size.
fn reply_xattr(reply: ReplyXattr, outcome: Result<XattrValue, Failed>) {
    answer(reply, outcome, |reply, v| {
        if v.buf.is_empty() {
            reply.size(v.len as u32);
        } else {
            reply.data(&v.buf[..v.len]);
        }
    });
}

/// The operations behind [`Filesystem`]: each returns what its reply carries, or the
/// errno to answer with.
impl Conn {
    fn inode_of(&self, ino: INodeNo) -> Result<Node, Errno> {
        self.inode(ino).ok_or(Errno::ENOENT)
    }

    fn handle_of(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        self.handle(fh).ok_or(Errno::EBADF)
    }

    /// The open source file of handle `fh`.
    fn open_file_of(&self, fh: FileHandle) -> Result<Arc<CachedFd>, Failed> {
        let h = self.handle_of(fh)?;
        Ok(self.file(fh, &h)?)
    }

    /// The entry `name` of `parent`, looked up after it was made: one lookup counted.
    fn entry_after_create(&self, parent: &Inode, name: &OsStr) -> Result<Entry, Failed> {
        let (_, a) = self.lookup_entry(parent, name)?;
        Ok(Entry {
            ttl: self.entry_ttl(parent),
            attr: a,
        })
    }

    fn lookup_op(&self, parent: INodeNo, name: &OsStr) -> Result<Entry, Failed> {
        let p = self.dir(parent)?;
        let (_, a) = self.lookup_entry(&p, name)?;
        Ok(Entry {
            ttl: self.entry_ttl(&p),
            attr: a,
        })
    }

    fn getattr_op(&self, ino: INodeNo) -> Result<FileAttr, Failed> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let st = sys::stat_fd(fd.as_fd())?;
        Ok(attr(&i, &st))
    }

    fn setattr_op(&self, ino: INodeNo, set: SetAttr) -> Result<FileAttr, Failed> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let h = set.fh.and_then(|fh| Some((fh, self.handle(fh)?)));
        if set.uid.is_some() || set.gid.is_some() {
            sys::chown_fd(fd.as_fd(), set.uid, set.gid)?;
        }
        if let Some(m) = set.mode {
            let (_fd, p) = self.inode_path(&i)?;
            sys::chmod(&p, m & 0o7777)?;
        }
        if let Some(sz) = set.size {
            match &h {
                Some((fh, h)) => {
                    let f = self.file(*fh, h)?;
                    sys::ftruncate(f.as_fd(), sz)?;
                }
                None => {
                    let (_fd, p) = self.inode_path(&i)?;
                    sys::truncate(&p, sz)?;
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = [timespec(set.atime), timespec(set.mtime)];
            if i.kind == Kind::Symlink {
                sys::utimens_fd(fd.as_fd(), &ts)?;
            } else {
                let (_fd, p) = self.inode_path(&i)?;
                sys::utimens_path(&p, &ts)?;
            }
        }
        let st = sys::stat_fd(fd.as_fd())?;
        Ok(attr(&i, &st))
    }

    fn readlink_op(&self, ino: INodeNo) -> Result<Vec<u8>, Failed> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        let n = sys::readlink_fd(fd.as_fd(), &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Makes `name` in directory `parent` as the caller, with `make`: its entry.
    fn make_entry(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(BorrowedFd<'_>, &CString) -> io::Result<()>,
    ) -> Result<Entry, Failed> {
        let p = self.dir(parent)?;
        let c = sys::component(name)?;
        let pfd = self.srv.inode_fd(&p)?;
        {
            let _as = AsCaller::new(req.uid(), req.gid());
            make(pfd.as_fd(), &c)?;
        }
        self.entry_after_create(&p, name)
    }

    /// Removes `name` from directory `parent`; an open inode that lost its last link
    /// keeps a descriptor.
    fn remove_op(&self, parent: INodeNo, name: &OsStr, what: sys::Unlink) -> Result<(), Failed> {
        let p = self.dir(parent)?;
        let c = sys::component(name)?;
        let pfd = self.srv.inode_fd(&p)?;
        let victim = self.victim(pfd.as_fd(), &c);
        sys::unlinkat(pfd.as_fd(), &c, what)?;
        self.keep_victim(victim);
        Ok(())
    }

    fn symlink_op(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
    ) -> Result<Entry, Failed> {
        let p = self.dir(parent)?;
        let c = sys::component(link_name)?;
        let t = cname(target.as_os_str())?;
        let pfd = self.srv.inode_fd(&p)?;
        {
            let _as = AsCaller::new(req.uid(), req.gid());
            sys::symlinkat(&t, pfd.as_fd(), &c)?;
        }
        self.entry_after_create(&p, link_name)
    }

    fn rename_op(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Failed> {
        let p = self.dir(parent)?;
        let np = self.dir(newparent)?;
        let c = sys::component(name)?;
        let nc = sys::component(newname)?;
        let pfd = self.srv.inode_fd(&p)?;
        let npfd = self.srv.inode_fd(&np)?;
        let victim = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            None
        } else {
            self.victim(npfd.as_fd(), &nc)
        };
        sys::renameat2(pfd.as_fd(), &c, npfd.as_fd(), &nc, flags.bits())?;
        self.keep_victim(victim);
        Ok(())
    }

    fn link_op(&self, ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> Result<Entry, Failed> {
        let i = self.inode_of(ino)?;
        let np = self.dir(newparent)?;
        let nc = sys::component(newname)?;
        let fd = self.srv.inode_fd(&i)?;
        let npfd = self.srv.inode_fd(&np)?;
        match sys::link_fd(fd.as_fd(), npfd.as_fd(), &nc) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && i.kind != Kind::Symlink => {
                // Without CAP_DAC_READ_SEARCH: through the magic link, which names exactly
                // this inode.
                let p = sys::proc_path(fd.as_fd());
                sys::link_path(&p, npfd.as_fd(), &nc)?;
            }
            r => r?,
        }
        self.entry_after_create(&np, newname)
    }

    fn open_op(&self, ino: INodeNo, flags: OpenFlags, reply: &ReplyOpen) -> Result<Opened, Failed> {
        let i = self.inode_of(ino)?;
        match i.kind {
            Kind::Symlink => return Err(Errno::ELOOP.into()),
            Kind::Special => return Err(Errno::ENXIO.into()),
            Kind::File | Kind::Dir => {}
        }
        let flags = flags.0 & !(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        let file = self.srv.inodes.open(&i, flags)?;
        let backing = if i.kind == Kind::File {
            self.backing(&i, file.as_fd(), |fd| reply.open_backing(fd))
        } else {
            None
        };
        let fh = self.install(i.clone(), file, flags, backing.clone())?;
        Ok(Opened { fh, backing })
    }

    fn read_op(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, Failed> {
        let f = self.open_file_of(fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            let n = sys::pread(f.as_fd(), &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn write_op(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Failed> {
        let f = self.open_file_of(fh)?;
        let mut done = 0;
        while done < data.len() {
            match sys::pwrite(f.as_fd(), &data[done..], offset + done as u64) {
                Ok(n) => done += n,
                Err(e) if done == 0 => return Err(e.into()),
                Err(_) => break,
            }
        }
        Ok(done as u32)
    }

    fn flush_op(&self, fh: FileHandle, lock_owner: LockOwner) -> Result<(), Failed> {
        let h = self.handle_of(fh)?;
        // Never ENOSYS: the kernel would stop sending FLUSH, and POSIX locks would
        // outlive close(2).
        self.srv.locks.flush(&h.inode, self.idx, lock_owner.0);
        // What close(2) of a duplicate does on the source (write-back errors of NFS, say),
        // where the server still has the file open (opening it only to close it would
        // report nothing).
        if let Some(f) = h.file.get() {
            sys::close_duplicate(f.as_fd())?;
        }
        Ok(())
    }

    fn fsync_op(&self, fh: FileHandle, datasync: bool) -> Result<(), Failed> {
        let f = self.open_file_of(fh)?;
        sys::fsync(f.as_fd(), datasync)?;
        Ok(())
    }

    fn opendir_op(&self, ino: INodeNo, flags: OpenFlags) -> Result<u64, Failed> {
        let i = self.dir(ino)?;
        let flags = (flags.0 & !(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_ACCMODE))
            | libc::O_RDONLY
            | libc::O_DIRECTORY;
        let file = self.srv.inodes.open(&i, flags)?;
        Ok(self.install(i.clone(), file, flags, None)?)
    }

    fn readdir_op(&self, fh: FileHandle, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Failed> {
        let h = self.handle_of(fh)?;
        let Some(pos) = &h.dir else {
            return Err(Errno::ENOTDIR.into());
        };
        let _g = pos.lock();
        let f = self.file(fh, &h)?;
        sys::seek_to(f.as_fd(), offset as i64)?;
        // About what one reply holds (the kernel asks a page at a time): every request
        // reads the directory from its offset again, and what does not fit is read for
        // nothing.
        let mut buf = vec![0u8; 8 * 1024];
        loop {
            let entries = sys::getdents(f.as_fd(), &mut buf)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in entries {
                if reply.add(
                    INodeNo(e.ino),
                    e.off as u64,
                    dirent_type(e.kind),
                    OsStr::from_bytes(&e.name),
                ) {
                    return Ok(());
                }
            }
        }
    }

    fn readdirplus_op(
        &self,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<(), Failed> {
        let h = self.handle_of(fh)?;
        let Some(pos) = &h.dir else {
            return Err(Errno::ENOTDIR.into());
        };
        let _g = pos.lock();
        let f = self.file(fh, &h)?;
        sys::seek_to(f.as_fd(), offset as i64)?;
        let ttl = self.ttl();
        // An entry with attributes takes about four times its dirent: see readdir.
        let mut buf = vec![0u8; 2 * 1024];
        let mut added = 0usize;
        let mut budget = self.srv.fd_budget();
        loop {
            let entries = sys::getdents(f.as_fd(), &mut buf)?;
            if entries.is_empty() {
                return Ok(());
            }
            for e in entries {
                let name = OsStr::from_bytes(&e.name);
                let off = e.off as u64;
                if name == "." || name == ".." {
                    // Never instantiated by the kernel (fs/fuse/readdir.c,
                    // fuse_direntplus_link), so never counted; the node id field is
                    // the dirent's inode number, as fuser writes both from one field.
                    if reply.add(
                        INodeNo(e.ino),
                        off,
                        name,
                        &ttl,
                        &unlooked(e.ino, e.kind),
                        Generation(0),
                    ) {
                        return Ok(());
                    }
                    added += 1;
                    continue;
                }
                let (node, a) = match self.plus_entry(&h.inode, name, &mut budget) {
                    PlusEntry::Looked(node, a) => (node, a),
                    PlusEntry::Gone => continue,
                    PlusEntry::NoBudget if added > 0 => return Ok(()),
                    // The first entry: looked up into the reserve (one descriptor per
                    // reply, so listing goes on). An entry without attributes (node id
                    // 0) is not an option with fuser 0.18: it writes the dirent's d_ino
                    // from the node id, and glibc's readdir skips d_ino 0 entries, so
                    // the name would silently vanish.
                    PlusEntry::NoBudget => self.lookup_entry(&h.inode, name)?,
                    PlusEntry::Failed(err) if added == 0 => return Err(err.into()),
                    PlusEntry::Failed(_) => return Ok(()),
                };
                if reply.add(INodeNo(node.id), off, name, &ttl, &a, Generation(0)) {
                    // Not sent: take back the lookup the kernel will never hold.
                    self.srv.inodes.forget(self.idx, node.id, 1);
                    return Ok(());
                }
                added += 1;
            }
        }
    }

    fn statfs_op(&self) -> Result<libc::statvfs64, Failed> {
        // The root descriptor is O_PATH, which fstatvfs accepts.
        let root = self.srv.inode_fd(self.srv.inodes.root())?;
        Ok(sys::statvfs(root.as_fd())?)
    }

    fn setxattr_op(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Failed> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        sys::setxattr(&p, &n, value, flags)?;
        Ok(())
    }

    fn getxattr_op(&self, ino: INodeNo, name: &OsStr, size: u32) -> Result<XattrValue, Failed> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        let mut buf = vec![0u8; size as usize];
        let len = sys::getxattr(&p, &n, &mut buf)?;
        Ok(XattrValue { buf, len })
    }

    fn listxattr_op(&self, ino: INodeNo, size: u32) -> Result<XattrValue, Failed> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let mut buf = vec![0u8; size as usize];
        let len = sys::listxattr(&p, &mut buf)?;
        Ok(XattrValue { buf, len })
    }

    fn removexattr_op(&self, ino: INodeNo, name: &OsStr) -> Result<(), Failed> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        sys::removexattr(&p, &n)?;
        Ok(())
    }

    fn create_op(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        reply: &ReplyCreate,
    ) -> Result<(Entry, Opened), Failed> {
        let p = self.dir(parent)?;
        let c = sys::component(name)?;
        let pfd = self.srv.inode_fd(&p)?;
        let flags = flags & !(libc::O_NOCTTY | libc::O_CLOEXEC);
        let file = {
            let _as = AsCaller::new(req.uid(), req.gid());
            sys::openat_beneath(pfd.as_fd(), &c, flags | libc::O_CREAT | libc::O_NOFOLLOW, mode)?
        };
        let st = sys::stat_fd(file.as_fd())?;
        let found = if self.srv.inodes.by_handle() {
            Found::Opened(file.as_fd())
        } else {
            // The inode's own O_PATH descriptor: by name (cheap), unless the name was
            // renamed or replaced meanwhile, then through /proc/self/fd of the new file.
            match sys::openat_beneath(pfd.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd)
                    if sys::stat_fd(fd.as_fd())
                        .is_ok_and(|s| s.st_dev == st.st_dev && s.st_ino == st.st_ino) =>
                {
                    Found::Path(fd)
                }
                _ => Found::Path(sys::reopen(file.as_fd(), libc::O_PATH)?),
            }
        };
        let inode = self.srv.inodes.lookup(self.idx, found, &st)?;
        let a = attr(&inode, &st);
        let backing = self.backing(&inode, file.as_fd(), |fd| reply.open_backing(fd));
        // Opened again (by a later miss) without O_CREAT, O_EXCL or O_TRUNC, and not
        // by a name: O_NOFOLLOW would refuse the magic link of a reopen.
        let fh = match self.install(inode.clone(), file, flags & !libc::O_NOFOLLOW, backing.clone()) {
            Ok(fh) => fh,
            Err(e) => {
                // The file exists now; the kernel's create failed all the same.
                self.srv.inodes.forget(self.idx, inode.id, 1);
                return Err(e.into());
            }
        };
        let entry = Entry {
            ttl: self.entry_ttl(&p),
            attr: a,
        };
        Ok((entry, Opened { fh, backing }))
    }

    fn fallocate_op(&self, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Result<(), Failed> {
        let f = self.open_file_of(fh)?;
        sys::fallocate(f.as_fd(), mode, offset, length)?;
        Ok(())
    }

    fn lseek_op(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64, Failed> {
        let f = self.open_file_of(fh)?;
        Ok(sys::lseek(f.as_fd(), offset, whence)?)
    }

    fn copy_file_range_op(
        &self,
        fh_in: FileHandle,
        offset_in: u64,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
    ) -> Result<u32, Failed> {
        let hi = self.handle_of(fh_in)?;
        let ho = self.handle_of(fh_out)?;
        let fi = self.file(fh_in, &hi)?;
        let fo = self.file(fh_out, &ho)?;
        let n = sys::copy_file_range(
            fi.as_fd(),
            offset_in as i64,
            fo.as_fd(),
            offset_out as i64,
            len.min(u32::MAX as u64) as usize,
        )?;
        Ok(n as u32)
    }
}

/// The attribute changes of one `SETATTR`.
struct SetAttr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    fh: Option<FileHandle>,
}

/// A new entry to reply with: how long the kernel may keep it, and its attributes.
struct Entry {
    ttl: Duration,
    attr: FileAttr,
}

/// A handle just installed, and the passthrough backing file the kernel serves it from.
struct Opened {
    fh: u64,
    backing: Option<Arc<fuser::BackingId>>,
}

fn reply_entry(reply: ReplyEntry, outcome: Result<Entry, Failed>) {
    answer(reply, outcome, |reply, e| {
        reply.entry(&e.ttl, &e.attr, Generation(0))
    });
}

fn reply_empty(reply: ReplyEmpty, outcome: Result<(), Failed>) {
    answer(reply, outcome, |reply, ()| reply.ok());
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
