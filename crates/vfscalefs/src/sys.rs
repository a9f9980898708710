//! The system calls the server makes on the source tree, behind small safe wrappers:
//! resolution beneath an inode (`openat2` with `RESOLVE_BENEATH`), reopening an `O_PATH`
//! descriptor, `stat`, the `*at` calls that make, link, rename and remove names, reads
//! and writes, directory reading, xattrs, and the per-thread credentials a request runs
//! with (`setfsuid`/`setfsgid`). Every `unsafe` block of the server's requests is here.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// The result of a system call that returns -1 and sets `errno`.
fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `EINVAL` unless `name` is one path component: not empty, not `.` or `..`, no `/` and
/// no NUL. The kernel never sends anything else; this makes sure nothing else can make
/// a `*at` call leave its directory.
pub fn component(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The resolution every name lookup uses: stay beneath the directory, follow no symbolic
/// link and no magic link (a final symlink is opened itself, with `O_PATH|O_NOFOLLOW`).
const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dir, name, flags, mode)` resolved beneath `dir`.
pub fn openat_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
            (mode & 0o7777) as u64
        } else {
            0
        },
        resolve: BENEATH,
    };
    loop {
        // SAFETY: `name` is NUL-terminated and `how` is a valid `open_how` of the size
        // passed; the kernel returns a new descriptor that we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        match check(r) {
            // SAFETY: a fresh descriptor returned by openat2.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Opens the source directory itself (`O_PATH|O_DIRECTORY`).
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c =
        CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is NUL-terminated; the result is a new descriptor we own.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `/proc/self/fd/N` for an `O_PATH` descriptor: the way to reach exactly the inode it
/// refers to (reopen it, or use path-only calls such as `chmod`, `truncate`, xattrs).
pub fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// Opens the inode an `O_PATH` descriptor refers to with `flags` (never creating).
/// The caller has checked that it is a regular file or a directory: a magic link to a
/// symbolic link must not be followed.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let p = proc_path(fd);
    let flags = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)) | libc::O_CLOEXEC;
    // SAFETY: `p` is NUL-terminated; the result is a new descriptor we own.
    let r = unsafe { libc::open(p.as_ptr(), flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// `MAX_HANDLE_SZ` of `linux/exportfs.h`: the largest file handle a filesystem makes.
const MAX_HANDLE_SZ: usize = 128;

/// A file handle as `name_to_handle_at(2)` makes it: the filesystem's type and opaque
/// bytes that name one inode of one filesystem for as long as it exists (most
/// filesystems put a generation number in it, so a reused inode number is another
/// handle). Kept inline up to 12 bytes (tmpfs, ext4 and xfs make handles of 8 or 12),
/// which keeps a cached inode small.
#[derive(Clone, PartialEq, Eq)]
pub enum FileHandle {
    /// Up to 12 bytes.
    Inline {
        /// `handle_type`.
        ty: i32,
        /// Bytes used of `bytes`.
        len: u8,
        /// `f_handle`.
        bytes: [u8; 12],
    },
    /// Longer handles.
    Heap {
        /// `handle_type`.
        ty: i32,
        /// `f_handle`.
        bytes: Box<[u8]>,
    },
}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileHandle(type {}, ", self.ty())?;
        for b in self.bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

impl FileHandle {
    pub(crate) fn new(ty: i32, b: &[u8]) -> FileHandle {
        if b.len() <= 12 {
            let mut bytes = [0u8; 12];
            bytes[..b.len()].copy_from_slice(b);
            FileHandle::Inline {
                ty,
                len: b.len() as u8,
                bytes,
            }
        } else {
            FileHandle::Heap { ty, bytes: b.into() }
        }
    }

    /// The filesystem's handle type.
    pub fn ty(&self) -> i32 {
        match self {
            FileHandle::Inline { ty, .. } | FileHandle::Heap { ty, .. } => *ty,
        }
    }

    /// The opaque bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            FileHandle::Inline { len, bytes, .. } => &bytes[..*len as usize],
            FileHandle::Heap { bytes, .. } => bytes,
        }
    }
}

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// `name_to_handle_at(fd, "", AT_EMPTY_PATH)`: the file handle of the inode `fd` refers
/// to (any descriptor, `O_PATH` included) and the id of the mount it was reached
/// through. `EOPNOTSUPP` where the filesystem makes no handles.
pub fn handle_of(fd: BorrowedFd<'_>) -> io::Result<(FileHandle, i32)> {
    name_to_handle(fd, c"", libc::AT_EMPTY_PATH)
}

/// `name_to_handle_at(dir, name, 0)` of one path component (checked by [`component`]),
/// without following a final symbolic link: the handle and mount id of what `name`
/// names now.
pub fn handle_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(FileHandle, i32)> {
    name_to_handle(dir, name, 0)
}

fn name_to_handle(fd: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<(FileHandle, i32)> {
    let mut raw = RawHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `raw` is a `struct file_handle` whose `handle_bytes` says how much room
    // follows; `name` is NUL-terminated; `mount_id` is writable.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            name.as_ptr(),
            &mut raw as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            flags,
        )
    };
    check(r)?;
    let len = (raw.handle_bytes as usize).min(MAX_HANDLE_SZ);
    Ok((FileHandle::new(raw.handle_type, &raw.f_handle[..len]), mount_id))
}

/// `open_by_handle_at(mount_fd, handle, flags | O_CLOEXEC)`: the inode `handle` names on
/// the filesystem of `mount_fd`. `ESTALE` once the inode is gone; `EPERM` without
/// `CAP_DAC_READ_SEARCH`. Only handles the server made itself are ever passed here.
pub fn open_by_handle(mount_fd: BorrowedFd<'_>, handle: &FileHandle, flags: i32) -> io::Result<OwnedFd> {
    let b = handle.bytes();
    let mut raw = RawHandle {
        handle_bytes: b.len() as u32,
        handle_type: handle.ty(),
        f_handle: [0; MAX_HANDLE_SZ],
    };
    raw.f_handle[..b.len()].copy_from_slice(b);
    let flags = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_TRUNC)) | libc::O_CLOEXEC;
    // SAFETY: `raw` is a `struct file_handle` of `handle_bytes` bytes; the kernel returns
    // a new descriptor that we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &mut raw as *mut RawHandle,
            flags,
        )
    };
    let fd = check(r)?;
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat64> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: the empty path is NUL-terminated; `st` is written on success.
    let r = unsafe {
        libc::fstatat64(
            fd.as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded and filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` of one path component (checked by
/// [`component`]), without a descriptor.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat64> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::uninit();
    // SAFETY: `name` is NUL-terminated; `st` is written on success.
    let r = unsafe {
        libc::fstatat64(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded and filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// An error from a plain libc call that returns -1.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// As [`cvt`] for calls returning `ssize_t`.
pub fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// One entry of a directory, as `getdents64` gives it.
pub struct DirEntry {
    /// Inode number in the source.
    pub ino: u64,
    /// The cookie that positions the stream just after this entry.
    pub off: i64,
    /// `DT_*`.
    pub kind: u8,
    /// The name.
    pub name: Vec<u8>,
}

/// Reads the next batch of entries from directory `fd` at its current position.
/// An empty vector at the end of the directory.
pub fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    // SAFETY: `buf` is writable for its length; the kernel writes at most that much.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
    let n = check(n)? as usize;
    let mut out = Vec::new();
    let mut pos = 0;
    // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
    while pos + 19 <= n {
        let ino = u64::from_ne_bytes(buf[pos..pos + 8].try_into().expect("8 bytes"));
        let off = i64::from_ne_bytes(buf[pos + 8..pos + 16].try_into().expect("8 bytes"));
        let reclen = u16::from_ne_bytes(buf[pos + 16..pos + 18].try_into().expect("2 bytes")) as usize;
        let kind = buf[pos + 18];
        if reclen == 0 || pos + reclen > n {
            break;
        }
        let name_bytes = &buf[pos + 19..pos + reclen];
        let len = name_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(name_bytes.len());
        out.push(DirEntry {
            ino,
            off,
            kind,
            name: name_bytes[..len].to_vec(),
        });
        pos += reclen;
    }
    Ok(out)
}

/// `lseek(fd, off, SEEK_SET)`.
pub fn seek_to(fd: BorrowedFd<'_>, off: i64) -> io::Result<()> {
    lseek(fd, off, libc::SEEK_SET).map(drop)
}

/// `lseek(fd, off, whence)`: the new offset.
pub fn lseek(fd: BorrowedFd<'_>, off: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on a descriptor we hold.
    let r = unsafe { libc::lseek64(fd.as_raw_fd(), off, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// `pread(fd, buf, off)`: the number of bytes read into `buf`.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length.
    cvt_size(unsafe { libc::pread64(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off as i64) })
}

/// `pwrite(fd, data, off)`: the number of bytes written from `data`.
pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], off: u64) -> io::Result<usize> {
    // SAFETY: `data` is readable for its length.
    cvt_size(unsafe { libc::pwrite64(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off as i64) })
}

/// `copy_file_range(fd_in, &off_in, fd_out, &off_out, len, 0)`: the bytes copied.
pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    mut off_in: i64,
    fd_out: BorrowedFd<'_>,
    mut off_out: i64,
    len: usize,
) -> io::Result<usize> {
    // SAFETY: descriptors we hold; the offsets are ours for the kernel to update.
    cvt_size(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut off_in,
            fd_out.as_raw_fd(),
            &mut off_out,
            len,
            0,
        )
    })
}

/// `fallocate(fd, mode, off, len)`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we hold.
    cvt(unsafe { libc::fallocate64(fd.as_raw_fd(), mode, off as i64, len as i64) }).map(drop)
}

/// `fsync(fd)`, or `fdatasync(fd)` if `data_only`.
pub fn fsync(fd: BorrowedFd<'_>, data_only: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on a descriptor we hold.
    let r = unsafe {
        if data_only {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    };
    cvt(r).map(drop)
}

/// `ftruncate(fd, len)`.
pub fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we hold.
    cvt(unsafe { libc::ftruncate64(fd.as_raw_fd(), len as i64) }).map(drop)
}

/// `truncate(path, len)`.
pub fn truncate(path: &CStr, len: u64) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated.
    cvt(unsafe { libc::truncate64(path.as_ptr(), len as i64) }).map(drop)
}

/// What `close(2)` of a duplicate of `fd` reports (write-back errors of NFS, say),
/// without closing `fd`. Nothing if no duplicate can be made.
pub fn close_duplicate(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: dup of a descriptor we hold.
    let d = unsafe { libc::dup(fd.as_raw_fd()) };
    if d >= 0 {
        // SAFETY: `d` is ours and closed once.
        cvt(unsafe { libc::close(d) })?;
    }
    Ok(())
}

/// `fstatvfs(fd)` (an `O_PATH` descriptor will do).
pub fn statvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs64>::uninit();
    // SAFETY: `st` is written on success.
    cvt(unsafe { libc::fstatvfs64(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded and filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: the inode `fd`
/// refers to, a symbolic link included. `None` leaves that id as it is.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
    // SAFETY: the empty path is NUL-terminated; AT_EMPTY_PATH acts on `fd` itself.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            u,
            g,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `chmod(path, mode)`.
pub fn chmod(path: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated.
    cvt(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// `utimensat(fd, "", times, AT_EMPTY_PATH)`: the times of the inode `fd` refers to, a
/// symbolic link included.
pub fn utimens_fd(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: the empty path is NUL-terminated; `times` holds two timespecs.
    cvt(unsafe { libc::utimensat(fd.as_raw_fd(), c"".as_ptr(), times.as_ptr(), libc::AT_EMPTY_PATH) })
        .map(drop)
}

/// `utimensat(AT_FDCWD, path, times, 0)`.
pub fn utimens_path(path: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; `times` holds two timespecs.
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

/// `readlinkat(fd, "", buf)` of an `O_PATH` descriptor of a symbolic link: the bytes of
/// its target written to `buf`.
pub fn readlink_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its length; the empty path is NUL-terminated.
    cvt_size(unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `mknodat(dir, name, mode, rdev)`.
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev as libc::dev_t) }).map(drop)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// What [`unlinkat`] removes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Unlink {
    /// Anything but a directory (`unlink`).
    File,
    /// An empty directory (`rmdir`, `AT_REMOVEDIR`).
    Dir,
}

/// `unlinkat(dir, name, 0)` or, for [`Unlink::Dir`], with `AT_REMOVEDIR`.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, what: Unlink) -> io::Result<()> {
    let flags = match what {
        Unlink::File => 0,
        Unlink::Dir => libc::AT_REMOVEDIR,
    };
    // SAFETY: `name` is NUL-terminated.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `symlinkat(target, dir, name)`: the target is stored, not followed.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: `target` and `name` are NUL-terminated.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `renameat2(dir, name, new_dir, new_name, flags)` (`RENAME_*`).
pub fn renameat2(
    dir: BorrowedFd<'_>,
    name: &CStr,
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: `name` and `new_name` are NUL-terminated.
    cvt(unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            name.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `linkat(fd, "", new_dir, new_name, AT_EMPTY_PATH)`: a new link to the inode `fd`
/// refers to. `ENOENT` without `CAP_DAC_READ_SEARCH`.
pub fn link_fd(fd: BorrowedFd<'_>, new_dir: BorrowedFd<'_>, new_name: &CStr) -> io::Result<()> {
    // SAFETY: the empty path and `new_name` are NUL-terminated.
    cvt(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// `linkat(AT_FDCWD, path, new_dir, new_name, AT_SYMLINK_FOLLOW)`: with a magic link as
/// `path`, a new link to exactly the inode it names.
pub fn link_path(path: &CStr, new_dir: BorrowedFd<'_>, new_name: &CStr) -> io::Result<()> {
    // SAFETY: `path` and `new_name` are NUL-terminated.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

/// `setxattr(path, name, value, flags)`.
pub fn setxattr(path: &CStr, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    // SAFETY: NUL-terminated path and name; `value` is readable for its length.
    cvt(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `getxattr(path, name, buf)`: the value's length (written to `buf` unless it is empty).
pub fn getxattr(path: &CStr, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: NUL-terminated path and name; `buf` is writable for its length.
    cvt_size(unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `listxattr(path, buf)`: the list's length (written to `buf` unless it is empty).
pub fn listxattr(path: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a NUL-terminated path; `buf` is writable for its length.
    cvt_size(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `removexattr(path, name)`.
pub fn removexattr(path: &CStr, name: &CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated path and name.
    cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
}

/// `umask(0)`: files are created with exactly the mode asked for.
pub fn clear_umask() {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
}

/// Whether the server runs with effective user id 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// The capabilities `setfsuid` drops from the effective set when the fs uid leaves 0
/// (`CAP_FS_MASK`) and that a request running as its caller gets back: permission was
/// checked by the client kernel (`default_permissions`), so the source must not check
/// again with the server's supplementary groups instead of the caller's.
/// `CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, `CAP_FSETID`
/// (bits 0 to 4 of `linux/capability.h`).
const FS_CAPS: u32 = 0b1_1111;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Raises the filesystem capabilities in this thread's effective set (they stay in its
/// permitted set across `setfsuid`).
fn raise_fs_caps() {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array as capget(2) expects for version 3.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) } < 0 {
        return;
    }
    data[0].effective |= FS_CAPS & data[0].permitted;
    // SAFETY: as above; capset with pid 0 changes the calling thread only.
    unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
}

/// Runs a request as its caller: files and directories it creates belong to `uid`/`gid`
/// (and inherit a set-group-ID directory's group, as on the source). Per thread, undone
/// on drop. A no-op when the server is not root or the caller is root.
pub struct AsCaller {
    switched: bool,
}

impl AsCaller {
    /// Switches this thread's fs uid and gid.
    pub fn new(uid: u32, gid: u32) -> AsCaller {
        if !is_root() || (uid == 0 && gid == 0) {
            return AsCaller { switched: false };
        }
        // SAFETY: setfsgid/setfsuid change this thread's credentials only; they cannot
        // fail in a way that matters here (root may set any id).
        unsafe {
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        if uid != 0 {
            raise_fs_caps();
        }
        AsCaller { switched: true }
    }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: back to root's fs ids; returning fsuid to 0 restores the
            // filesystem capabilities from the permitted set.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn err(r: io::Result<OwnedFd>) -> i32 {
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
    }

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/etc"] {
            assert!(component(OsStr::new(bad)).is_err(), "{bad:?} accepted");
        }
        assert!(component(OsStr::new("...")).is_ok());
        assert!(component(OsStr::new("a b")).is_ok());
    }

    /// Nothing resolves outside the directory: not by `..`, not by a symbolic link
    /// (absolute or relative), not by a magic link; a final symlink opened with
    /// `O_PATH|O_NOFOLLOW` is the link itself.
    #[test]
    fn resolution_stays_beneath() {
        let d = std::env::temp_dir().join(format!("vfscalefs-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("abs")).unwrap();
        std::os::unix::fs::symlink("../..", d.join("sub/up")).unwrap();
        let root = open_root(&d).unwrap();
        let c = |s: &str| CString::new(s).unwrap();
        assert_eq!(
            err(openat_beneath(root.as_fd(), &c(".."), libc::O_PATH, 0)),
            libc::EXDEV
        );
        assert_eq!(
            err(openat_beneath(root.as_fd(), &c("sub/../.."), libc::O_PATH, 0)),
            libc::EXDEV
        );
        assert_eq!(
            err(openat_beneath(root.as_fd(), &c("abs/passwd"), libc::O_RDONLY, 0)),
            libc::ELOOP
        );
        assert_eq!(
            err(openat_beneath(root.as_fd(), &c("sub/up/x"), libc::O_RDONLY, 0)),
            libc::ELOOP
        );
        assert_eq!(
            err(openat_beneath(
                root.as_fd(),
                &c("/proc/self/root/etc"),
                libc::O_PATH,
                0
            )),
            libc::EXDEV
        );
        let link = openat_beneath(root.as_fd(), &c("abs"), libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = stat_fd(link.as_fd()).unwrap();
        assert_eq!(
            st.st_mode & libc::S_IFMT,
            libc::S_IFLNK,
            "the link itself, not /etc"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
