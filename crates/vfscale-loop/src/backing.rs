//! A backing file: the descriptor the library holds (its own `dup`, sharing the caller's
//! open file description as `fget` does), with `pread`/`pwrite`/`fsync`/hole punching
//! and, when direct I/O is allowed, a second description opened with `O_DIRECT`.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use crate::errno::Errno;

/// `BLKGETSIZE64` (`_IOR(0x12, 114, size_t)`).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// What kind of file backs a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Regular,
    Block,
    Other,
}

/// A backing file held by a device.
pub(crate) struct BackingFile {
    fd: OwnedFd,
    pub(crate) kind: FileKind,
    /// Opened for writing (`FMODE_WRITE`).
    pub(crate) writable: bool,
    /// The description reopened with `O_DIRECT` (`None`: the filesystem refuses it).
    direct: OnceLock<Option<OwnedFd>>,
    /// `STATX_DIOALIGN`'s offset alignment, or 512.
    min_dio: OnceLock<u64>,
}

fn cvt(r: isize) -> Result<usize, Errno> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as usize)
    }
}

impl BackingFile {
    /// Takes a reference to `fd`'s open file description.
    pub(crate) fn from_fd(fd: BorrowedFd<'_>) -> Result<BackingFile, Errno> {
        let fd = fd.try_clone_to_owned().map_err(|_| Errno::EBADF)?;
        // SAFETY: fstat writes a stat into the zeroed local.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid stat pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(Errno::last());
        }
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::Regular,
            libc::S_IFBLK => FileKind::Block,
            _ => FileKind::Other,
        };
        // SAFETY: F_GETFL on a valid descriptor.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(Errno::last());
        }
        let acc = fl & libc::O_ACCMODE;
        Ok(BackingFile {
            fd,
            kind,
            writable: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            direct: OnceLock::new(),
            min_dio: OnceLock::new(),
        })
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The file's size in bytes.
    pub(crate) fn size(&self) -> Result<u64, Errno> {
        if self.kind == FileKind::Block {
            let mut v: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes a u64 into v.
            if unsafe { libc::ioctl(self.raw(), BLKGETSIZE64, &mut v) } < 0 {
                return Err(Errno::last());
            }
            return Ok(v);
        }
        // SAFETY: fstat writes a stat into the zeroed local.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid stat pointer.
        if unsafe { libc::fstat(self.raw(), &mut st) } < 0 {
            return Err(Errno::last());
        }
        Ok(st.st_size.max(0) as u64)
    }

    /// The last path component of the file, as `/sys/block/loopN/loop/backing_file`
    /// shows the path.
    pub(crate) fn path(&self) -> Option<String> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.raw()))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// The `O_DIRECT` description, if the filesystem allows one.
    pub(crate) fn direct(&self) -> Option<&OwnedFd> {
        self.direct
            .get_or_init(|| {
                let path = std::ffi::CString::new(format!("/proc/self/fd/{}", self.raw())).ok()?;
                let acc = if self.writable {
                    libc::O_RDWR
                } else {
                    libc::O_RDONLY
                };
                // SAFETY: a valid path; the descriptor is owned below.
                let fd = unsafe { libc::open(path.as_ptr(), acc | libc::O_DIRECT | libc::O_CLOEXEC) };
                if fd < 0 {
                    None
                } else {
                    // SAFETY: fd was just returned by open and is owned by nobody else.
                    Some(unsafe { OwnedFd::from_raw_fd(fd) })
                }
            })
            .as_ref()
    }

    /// The smallest direct-I/O alignment (`lo_min_dio_size`).
    pub(crate) fn min_dio(&self) -> u64 {
        *self.min_dio.get_or_init(|| {
            // SAFETY: statx writes into the zeroed local; the path is empty with
            // AT_EMPTY_PATH, so it queries the descriptor itself.
            let mut stx: libc::statx = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let r = unsafe {
                libc::statx(
                    self.raw(),
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH,
                    libc::STATX_DIOALIGN,
                    &mut stx,
                )
            };
            if r == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
                u64::from(stx.stx_dio_offset_align)
            } else {
                512
            }
        })
    }

    fn pick(&self, direct: bool, buf: *const u8, len: usize, pos: u64) -> RawFd {
        if direct {
            if let Some(d) = self.direct() {
                let a = self.min_dio().max(512);
                if (buf as u64).is_multiple_of(a) && (len as u64).is_multiple_of(a) && pos.is_multiple_of(a) {
                    return d.as_raw_fd();
                }
            }
        }
        self.raw()
    }

    /// `pread` until `buf` is full or the end; returns the bytes read.
    pub(crate) fn read_at(&self, buf: &mut [u8], pos: u64, direct: bool) -> Result<usize, Errno> {
        let len = buf.len();
        let base = buf.as_mut_ptr();
        self.each_chunk(base, len, pos, direct, |fd, done, rest, off| {
            // SAFETY: `base + done` starts the `rest` bytes of `buf` not yet read into.
            unsafe { libc::pread(fd, base.add(done).cast(), rest, off) }
        })
    }

    /// `pwrite` of all of `buf`; returns the bytes written.
    pub(crate) fn write_at(&self, buf: &[u8], pos: u64, direct: bool) -> Result<usize, Errno> {
        self.each_chunk(buf.as_ptr(), buf.len(), pos, direct, |fd, done, rest, off| {
            // SAFETY: `buf[done..]`, `rest` bytes long, is valid to read.
            unsafe { libc::pwrite(fd, buf.as_ptr().add(done).cast(), rest, off) }
        })
    }

    /// The loop `read_at` and `write_at` share: `io(fd, done, rest, offset)` moves the
    /// `rest` bytes of the `len`-byte buffer at `base` from `done` on, until all are done
    /// or it returns 0; `EINTR` is retried. Returns the bytes done.
    #[inline]
    fn each_chunk(
        &self,
        base: *const u8,
        len: usize,
        pos: u64,
        direct: bool,
        mut io: impl FnMut(RawFd, usize, usize, libc::off_t) -> isize,
    ) -> Result<usize, Errno> {
        let mut done = 0;
        while done < len {
            let (rest, at) = (len - done, pos + done as u64);
            let fd = self.pick(direct, base.wrapping_add(done), rest, at);
            match cvt(io(fd, done, rest, at as libc::off_t)) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.0 == libc::EINTR => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// `fdatasync`.
    pub(crate) fn sync(&self) -> Result<(), Errno> {
        // SAFETY: fdatasync on a valid descriptor.
        if unsafe { libc::fdatasync(self.raw()) } < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }

    /// Punches a hole, keeping the size.
    pub(crate) fn punch(&self, pos: u64, len: u64) -> Result<(), Errno> {
        // SAFETY: fallocate on a valid descriptor.
        let r = unsafe {
            libc::fallocate(
                self.raw(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                pos as libc::off_t,
                len as libc::off_t,
            )
        };
        if r < 0 {
            Err(Errno::last())
        } else {
            Ok(())
        }
    }
}
