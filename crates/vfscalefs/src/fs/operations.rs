//! What each request does on the source: one method of [`Conn`] per FUSE operation,
//! returning what its reply carries or the errno to answer with.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use fuser::{
    Errno, FileAttr, FileHandle, Generation, INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyCreate,
    ReplyDirectory, ReplyDirectoryPlus, ReplyOpen, Request, TimeOrNow,
};

use super::attr::{attr, dirent_type, timespec, unlooked};
use super::reply::{Entry, Opened, RequestError, XattrValue};
use super::{Conn, PlusEntry};
use crate::fdcache::CachedFd;
use crate::handles::Handle;
use crate::inodes::{Found, Inode, Kind, Node};
use crate::sys::{self, AsCaller};

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
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
    fn open_file_of(&self, fh: FileHandle) -> Result<Arc<CachedFd>, RequestError> {
        let h = self.handle_of(fh)?;
        Ok(self.file(fh, &h)?)
    }

    /// The open source file of handle `fh`, for a read or a write: `EIO` where its locks
    /// were lost with the cluster lease (`cluster.rs`).
    fn io_file_of(&self, fh: FileHandle) -> Result<Arc<CachedFd>, RequestError> {
        let h = self.handle_of(fh)?;
        if self.srv.locks.lost(&h, fh.0) {
            return Err(Errno::EIO.into());
        }
        Ok(self.file(fh, &h)?)
    }

    /// The entry `name` of `parent`, looked up after it was made: one lookup counted.
    fn entry_after_create(&self, parent: &Inode, name: &OsStr) -> Result<Entry, RequestError> {
        let (_, a) = self.lookup_entry(parent, name)?;
        Ok(Entry {
            ttl: self.entry_ttl(parent),
            attr: a,
        })
    }

    pub(super) fn lookup_op(&self, parent: INodeNo, name: &OsStr) -> Result<Entry, RequestError> {
        let p = self.dir(parent)?;
        let (_, a) = self.lookup_entry(&p, name)?;
        Ok(Entry {
            ttl: self.entry_ttl(&p),
            attr: a,
        })
    }

    pub(super) fn getattr_op(&self, ino: INodeNo) -> Result<FileAttr, RequestError> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let st = sys::stat_fd(fd.as_fd())?;
        Ok(attr(&i, &st))
    }

    pub(super) fn setattr_op(&self, ino: INodeNo, set: SetAttr) -> Result<FileAttr, RequestError> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let h = set.fh.and_then(|fh| Some((fh, self.handle(fh)?)));
        // A locked file: the change is this client's own, not a host's (or another
        // server's), for its next grant's coherence check (`SourceViews::own_change`).
        let views = i
            .source_mirror_if_any()
            .map(|m| m.views())
            .or_else(|| i.grant_views_if_any());
        let before = views.and_then(|_| sys::stat_fd(fd.as_fd()).ok());
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
        if let (Some(v), Some(before)) = (views, &before) {
            v.own_change(self.idx, before, &st, fd.as_fd());
        }
        Ok(attr(&i, &st))
    }

    pub(super) fn readlink_op(&self, ino: INodeNo) -> Result<Vec<u8>, RequestError> {
        let i = self.inode_of(ino)?;
        let fd = self.srv.inode_fd(&i)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        let n = sys::readlink_fd(fd.as_fd(), &mut buf)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Makes `name` in directory `parent` as the caller, with `make`: its entry.
    pub(super) fn make_entry(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(BorrowedFd<'_>, &CString) -> io::Result<()>,
    ) -> Result<Entry, RequestError> {
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
    pub(super) fn remove_op(
        &self,
        parent: INodeNo,
        name: &OsStr,
        what: sys::Unlink,
    ) -> Result<(), RequestError> {
        let p = self.dir(parent)?;
        let c = sys::component(name)?;
        let pfd = self.srv.inode_fd(&p)?;
        let victim = self.victim(pfd.as_fd(), &c);
        sys::unlinkat(pfd.as_fd(), &c, what)?;
        self.keep_victim(victim);
        Ok(())
    }

    pub(super) fn symlink_op(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
    ) -> Result<Entry, RequestError> {
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

    pub(super) fn rename_op(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), RequestError> {
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

    pub(super) fn link_op(
        &self,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
    ) -> Result<Entry, RequestError> {
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

    pub(super) fn open_op(
        &self,
        ino: INodeNo,
        flags: OpenFlags,
        reply: &ReplyOpen,
    ) -> Result<Opened, RequestError> {
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

    pub(super) fn read_op(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, RequestError> {
        let f = self.io_file_of(fh)?;
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

    pub(super) fn write_op(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, RequestError> {
        let f = self.io_file_of(fh)?;
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

    pub(super) fn flush_op(&self, fh: FileHandle, lock_owner: LockOwner) -> Result<(), RequestError> {
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

    pub(super) fn fsync_op(&self, fh: FileHandle, datasync: bool) -> Result<(), RequestError> {
        let f = self.open_file_of(fh)?;
        sys::fsync(f.as_fd(), datasync)?;
        Ok(())
    }

    pub(super) fn opendir_op(&self, ino: INodeNo, flags: OpenFlags) -> Result<u64, RequestError> {
        let i = self.dir(ino)?;
        let flags = (flags.0 & !(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_ACCMODE))
            | libc::O_RDONLY
            | libc::O_DIRECTORY;
        let file = self.srv.inodes.open(&i, flags)?;
        Ok(self.install(i.clone(), file, flags, None)?)
    }

    /// Reads directory handle `fh` from `offset`: `read` gets the handle and its open
    /// directory, positioned at `offset`, while the handle's position is held.
    fn read_dir_at<T>(
        &self,
        fh: FileHandle,
        offset: u64,
        read: impl FnOnce(&Handle, &CachedFd) -> Result<T, RequestError>,
    ) -> Result<T, RequestError> {
        let h = self.handle_of(fh)?;
        let Some(pos) = &h.dir else {
            return Err(Errno::ENOTDIR.into());
        };
        let _g = pos.lock();
        let f = self.file(fh, &h)?;
        sys::seek_to(f.as_fd(), offset as i64)?;
        read(&h, &f)
    }

    pub(super) fn readdir_op(
        &self,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectory,
    ) -> Result<(), RequestError> {
        self.read_dir_at(fh, offset, |_, f| {
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
        })
    }

    pub(super) fn readdirplus_op(
        &self,
        fh: FileHandle,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> Result<(), RequestError> {
        self.read_dir_at(fh, offset, |h, f| {
            // Not cached in a directory of locked files, as a lookup's (`entry_ttl`).
            let ttl = self.entry_ttl(&h.inode);
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
        })
    }

    pub(super) fn statfs_op(&self) -> Result<libc::statvfs64, RequestError> {
        // The root descriptor is O_PATH, which fstatvfs accepts.
        let root = self.srv.inode_fd(self.srv.inodes.root())?;
        Ok(sys::statvfs(root.as_fd())?)
    }

    pub(super) fn setxattr_op(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), RequestError> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        sys::setxattr(&p, &n, value, flags)?;
        Ok(())
    }

    pub(super) fn getxattr_op(
        &self,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
    ) -> Result<XattrValue, RequestError> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        let mut buf = vec![0u8; size as usize];
        let len = sys::getxattr(&p, &n, &mut buf)?;
        Ok(XattrValue { buf, len })
    }

    pub(super) fn listxattr_op(&self, ino: INodeNo, size: u32) -> Result<XattrValue, RequestError> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let mut buf = vec![0u8; size as usize];
        let len = sys::listxattr(&p, &mut buf)?;
        Ok(XattrValue { buf, len })
    }

    pub(super) fn removexattr_op(&self, ino: INodeNo, name: &OsStr) -> Result<(), RequestError> {
        let i = self.inode_of(ino)?;
        let (_fd, p) = self.inode_path(&i)?;
        let n = cname(name)?;
        sys::removexattr(&p, &n)?;
        Ok(())
    }

    pub(super) fn create_op(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        reply: &ReplyCreate,
    ) -> Result<(Entry, Opened), RequestError> {
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

    pub(super) fn fallocate_op(
        &self,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), RequestError> {
        let f = self.open_file_of(fh)?;
        sys::fallocate(f.as_fd(), mode, offset, length)?;
        Ok(())
    }

    pub(super) fn lseek_op(&self, fh: FileHandle, offset: i64, whence: i32) -> Result<i64, RequestError> {
        let f = self.open_file_of(fh)?;
        Ok(sys::lseek(f.as_fd(), offset, whence)?)
    }

    pub(super) fn copy_file_range_op(
        &self,
        fh_in: FileHandle,
        offset_in: u64,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
    ) -> Result<u32, RequestError> {
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
pub(super) struct SetAttr {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeOrNow>,
    pub(super) mtime: Option<TimeOrNow>,
    pub(super) fh: Option<FileHandle>,
}
