//! The uncontended lock: one process locks and unlocks one file's whole-file POSIX
//! write lock (`F_SETLK`, then `F_SETLK` `F_UNLCK`) as fast as it can, through a
//! server's mount. Every call is a FUSE request, so the figure is the server's cost of
//! one lock call, here or in a cluster.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::measure::interrupt::interrupted;

/// Lock/unlock pairs between two looks at the clock.
const BATCH: u64 = 32;

/// An open file to lock.
pub struct LockFile(OwnedFd);

impl LockFile {
    /// Opens (creating it) `path` for reading and writing.
    pub fn open(path: &Path) -> Result<LockFile, String> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC, 0o644) };
        if fd < 0 {
            return Err(format!(
                "open {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` is a descriptor we just opened and own.
        Ok(LockFile(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// One whole-file `F_SETLK` of `typ` (`F_WRLCK`, `F_UNLCK`).
    fn setlk(&self, typ: libc::c_short) -> std::io::Result<()> {
        // SAFETY: a zeroed flock is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: fcntl on our open descriptor with a flock we own.
        if unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_SETLK, &mut fl) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// One lock and unlock, outside any measured slice (the first on a clustered
    /// server claims the file's home in etcd).
    pub fn warm_up(&self) -> Result<(), String> {
        self.setlk(libc::F_WRLCK as libc::c_short)
            .and_then(|()| self.setlk(libc::F_UNLCK as libc::c_short))
            .map_err(|e| format!("lock/unlock: {e}"))
    }

    /// Locks and unlocks for about `secs`; returns (pairs, seconds taken).
    pub fn lock_loop(&self, secs: Duration) -> Result<(u64, f64), String> {
        let start = Instant::now();
        let mut pairs = 0u64;
        while start.elapsed() < secs && !interrupted() {
            for _ in 0..BATCH {
                self.setlk(libc::F_WRLCK as libc::c_short)
                    .and_then(|()| self.setlk(libc::F_UNLCK as libc::c_short))
                    .map_err(|e| format!("lock/unlock: {e}"))?;
            }
            pairs += BATCH;
        }
        Ok((pairs, start.elapsed().as_secs_f64()))
    }
}

/// Locks taken and time spent on each side of an alternated measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sides {
    /// Pairs and seconds through the server under test.
    pub test: (u64, f64),
    /// Pairs and seconds through the server it is compared with.
    pub base: (u64, f64),
}

impl Sides {
    /// Pairs per second through the server under test.
    pub fn test_rate(&self) -> f64 {
        self.test.0 as f64 / self.test.1
    }

    /// Pairs per second through the other.
    pub fn base_rate(&self) -> f64 {
        self.base.0 as f64 / self.base.1
    }
}

/// `slices` turns of `slice` each on `test` and `base`, in the order test, base,
/// base, test, test, base, ... (so that each side starts as often as the other, and a
/// drift of the machine falls on both alike).
pub fn alternate(test: &LockFile, base: &LockFile, slice: Duration, slices: usize) -> Result<Sides, String> {
    let mut s = Sides::default();
    for i in 0..2 * slices {
        let on_test = (i % 4 == 0) || (i % 4 == 3);
        let (f, acc) = if on_test {
            (test, &mut s.test)
        } else {
            (base, &mut s.base)
        };
        let (n, secs) = f.lock_loop(slice)?;
        acc.0 += n;
        acc.1 += secs;
    }
    if s.test.0 == 0 || s.base.0 == 0 {
        return Err("no locks taken in the measured interval".into());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_get_equal_turns_and_count_their_locks() {
        let dir =
            vfscale_conformance::harness::ScratchDir::create(Path::new("/dev/shm"), "uncontended").unwrap();
        let a = LockFile::open(&dir.path().join("a")).unwrap();
        let b = LockFile::open(&dir.path().join("b")).unwrap();
        let s = alternate(&a, &b, Duration::from_millis(20), 2).unwrap();
        assert!(s.test.0 >= BATCH && s.base.0 >= BATCH, "{s:?}");
        // Two slices each, ~20 ms apiece.
        assert!(s.test.1 >= 0.04 && s.base.1 >= 0.04, "{s:?}");
        assert!(s.test_rate() > 0.0 && s.base_rate() > 0.0);
    }
}
