//! Failover: a holder process on one server holds a whole-file POSIX write lock, a
//! waiter process on another blocks in `F_SETLKW` for it; the holder's server is
//! killed (`SIGKILL`), and the time until the waiter is granted is measured on
//! `CLOCK_MONOTONIC`, which both processes share.
//!
//! The processes are forked children of the lab (the lab may be multi-threaded, so a
//! child makes only async-signal-safe system calls on data prepared before `fork`); they
//! report over a pipe, the waiter with the monotonic time of its grant, and they die with
//! the forking thread (`PR_SET_PDEATHSIG`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use vfscale_conformance::harness::mono_ns;

use crate::measure::interrupt::interrupted;

/// A lock child's report: `READY` once it holds (holder) or is about to block
/// (waiter), then the waiter's grant as its `CLOCK_MONOTONIC` nanoseconds.
const READY: u8 = b'r';

/// A forked child that takes a lock; dropping it kills and reaps it.
pub struct LockChild {
    pid: libc::pid_t,
    reports: OwnedFd,
}

impl LockChild {
    /// Forks a child that opens `path` and takes a whole-file write lock with
    /// `F_SETLKW`: a holder reports `READY` once it holds; a waiter reports `READY`
    /// before it asks, then its grant time. Either then sleeps until killed.
    pub fn spawn(path: &Path, waiter: bool) -> Result<LockChild, String> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array we pass.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child runs only async-signal-safe calls on data prepared above
        // and leaves with _exit; the parent only records the pid.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: in the child: async-signal-safe calls only, then _exit.
            unsafe { child(c.as_ptr(), w.as_raw_fd(), waiter) };
        }
        drop(w);
        Ok(LockChild { pid, reports: r })
    }

    /// The next report byte, or `None` when `timeout` passes first (or the child died).
    fn read(&self, buf: &mut [u8], timeout: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        while got < buf.len() {
            if interrupted() {
                return Err("interrupted".into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let mut p = libc::pollfd {
                fd: self.reports.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd we own; a timeout of at most 100 ms keeps the
            // interrupt check lively.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(100) as libc::c_int) };
            if n <= 0 {
                continue;
            }
            // SAFETY: reading into the rest of our buffer from our pipe.
            let k = unsafe {
                libc::read(
                    self.reports.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    buf.len() - got,
                )
            };
            if k <= 0 {
                return Ok(false);
            }
            got += k as usize;
        }
        Ok(true)
    }

    /// Its process id.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Waits up to `timeout` for `READY`.
    pub fn ready(&self, timeout: Duration) -> Result<bool, String> {
        let mut b = [0u8];
        Ok(self.read(&mut b, timeout)? && b[0] == READY)
    }

    /// Waits up to `timeout` for the waiter's grant: its `CLOCK_MONOTONIC` time.
    pub fn granted_at(&self, timeout: Duration) -> Result<Option<u64>, String> {
        let mut b = [0u8; 8];
        Ok(self.read(&mut b, timeout)?.then(|| u64::from_ne_bytes(b)))
    }
}

impl Drop for LockChild {
    fn drop(&mut self) {
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// The child's whole life.
///
/// # Safety
///
/// Only in a child just forked: makes only async-signal-safe calls, never returns.
unsafe fn child(path: *const libc::c_char, report: libc::c_int, waiter: bool) -> ! {
    // SAFETY: async-signal-safe system calls on data prepared before fork.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        let fd = libc::open(path, libc::O_RDWR | libc::O_CREAT, 0o644);
        if fd < 0 {
            libc::_exit(2);
        }
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        if waiter {
            libc::write(report, [READY].as_ptr().cast(), 1);
        }
        if libc::fcntl(fd, libc::F_SETLKW, &mut fl) != 0 {
            libc::_exit(3);
        }
        if waiter {
            let t = mono_ns().to_ne_bytes();
            libc::write(report, t.as_ptr().cast(), t.len());
        } else {
            libc::write(report, [READY].as_ptr().cast(), 1);
        }
        loop {
            libc::pause();
        }
    }
}

/// How long after the waiter asks the lab checks that it is still waiting (a waiter
/// granted at once means the two servers do not share a lock space).
pub const SETTLE: Duration = Duration::from_millis(300);

/// One failover: `holder_file` and `waiter_file` are one file through the two servers;
/// `kill` kills the holder's server (it is given the holder) and returns the
/// `CLOCK_MONOTONIC` time it did.
/// Returns the seconds from the kill to the waiter's grant; `give_up` bounds the wait.
pub fn measure(
    holder_file: &Path,
    waiter_file: &Path,
    kill: impl FnOnce(&LockChild) -> u64,
    give_up: Duration,
) -> Result<f64, String> {
    let holder = LockChild::spawn(holder_file, false)?;
    if !holder.ready(Duration::from_secs(10))? {
        return Err(format!(
            "the holder did not get the lock on {}",
            holder_file.display()
        ));
    }
    let waiter = LockChild::spawn(waiter_file, true)?;
    if !waiter.ready(Duration::from_secs(10))? {
        return Err(format!("the waiter did not start on {}", waiter_file.display()));
    }
    if waiter.granted_at(SETTLE)?.is_some() {
        return Err(format!(
            "the waiter on {} was granted while the holder on {} held the lock: the servers do not share one lock space",
            waiter_file.display(),
            holder_file.display()
        ));
    }
    let killed_at = kill(&holder);
    let granted = waiter.granted_at(give_up)?.ok_or_else(|| {
        format!(
            "the waiter on {} was not granted within {give_up:?} of the holder's server's death",
            waiter_file.display()
        )
    })?;
    drop(holder);
    Ok(granted.saturating_sub(killed_at) as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_timed_from_the_holders_death_to_its_grant() {
        let _g = crate::measure::child_processes();
        let dir =
            vfscale_conformance::harness::ScratchDir::create(Path::new("/dev/shm"), "failover").unwrap();
        let f = dir.path().join("f");
        // On one tmpfs file the kernel grants the waiter as soon as the holder dies.
        let kill_holder = |h: &LockChild| {
            std::thread::sleep(Duration::from_millis(50));
            let t = mono_ns();
            // SAFETY: kill(2) of our own child; its Drop reaps it.
            unsafe { libc::kill(h.pid(), libc::SIGKILL) };
            t
        };
        let secs = measure(&f, &f, kill_holder, Duration::from_secs(10)).unwrap();
        assert!((0.0..5.0).contains(&secs), "{secs}");
        // A holder that lives on keeps the waiter waiting, and measure says so.
        let e = measure(&f, &f, |_| mono_ns(), Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("was not granted"), "{e}");
    }
}
