//! Whether a source filesystem's change time shows every change made after a `stat` of
//! the file (Linux's multigrain timestamps, 6.13 on: a change after a query of the time
//! takes a fine-grained time, later than the one reported). Where it does, a remembered
//! `stat` vouches for the file at once; where it does not, only once the coarse clock
//! has moved past the change time it shows (see `Mirror::source_changed`).
//!
//! Known per filesystem (`st_dev`), by a probe run once: an unnamed file (`O_TMPFILE`)
//! in the locked file's directory, whose mode is set again and again, each time right
//! after a `stat`. Every change must show a new change time; with a coarse clock,
//! changes microseconds apart share one. Where the probe cannot run (a read-only
//! source, no `O_TMPFILE`), the answer is no, and the next locked file asks again.

use std::collections::HashMap;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// How many changes the probe makes: with a coarse clock at most one tick passes while
/// they are made, so at most one of them shows a new change time.
const PROBE_CHANGES: usize = 32;

/// Whether the filesystem of `file` (device `dev`) shows every change made after a
/// `stat` in the change time.
pub fn fine_ctime(file: BorrowedFd<'_>, dev: u64) -> bool {
    static KNOWN: OnceLock<Mutex<HashMap<u64, bool>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    if let Some(&fine) = known.lock().get(&dev) {
        return fine;
    }
    match probe(file, dev) {
        Some(fine) => *known.lock().entry(dev).or_insert(fine),
        // Asked again for the next file: the probe could not run for this one.
        None => false,
    }
}

fn probe(file: BorrowedFd<'_>, dev: u64) -> Option<bool> {
    let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let dir = std::ffi::CString::new(path.parent()?.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let tmp = unsafe { OwnedFd::from_raw_fd(fd) };
    let ctime = |st: libc::stat64| (st.st_ctime, st.st_ctime_nsec);
    let first = crate::sys::stat_fd(tmp.as_fd()).ok()?;
    if first.st_dev != dev {
        // The file's path led elsewhere (renamed meanwhile): no answer for its filesystem.
        return None;
    }
    let mut last = ctime(first);
    for _ in 0..PROBE_CHANGES {
        // SAFETY: fchmod on a descriptor held above.
        if unsafe { libc::fchmod(tmp.as_raw_fd(), 0o600) } != 0 {
            return None;
        }
        let now = ctime(crate::sys::stat_fd(tmp.as_fd()).ok()?);
        if now == last {
            return Some(false);
        }
        last = now;
    }
    Some(true)
}
