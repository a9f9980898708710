//! Error numbers, as the Linux system calls return them.

use std::fmt;

/// An error number a descriptor-table operation fails with (the kernel's `-E...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Errno {
    /// Bad file descriptor: not open, or (dup2/dup3) `newfd` outside the limit.
    EBADF,
    /// Invalid argument: `dup3(fd, fd)`, `F_DUPFD` with `min >= RLIMIT_NOFILE`,
    /// `close_range(first > last)`.
    EINVAL,
    /// No free descriptor below `RLIMIT_NOFILE` (or `nr_open`).
    EMFILE,
    /// `dup2`/`dup3` onto a descriptor that is reserved but not yet installed.
    EBUSY,
    /// Operation not permitted: raising `RLIMIT_NOFILE` above `nr_open` (`setrlimit`).
    EPERM,
    /// Any other error number (raw value).
    Other(i32),
}

impl Errno {
    /// The symbolic name, e.g. `"EBADF"`.
    pub fn name(&self) -> &'static str {
        match self {
            Errno::EBADF => "EBADF",
            Errno::EINVAL => "EINVAL",
            Errno::EMFILE => "EMFILE",
            Errno::EBUSY => "EBUSY",
            Errno::EPERM => "EPERM",
            Errno::Other(_) => "E?",
        }
    }

    /// The raw Linux error number.
    pub fn raw(&self) -> i32 {
        match self {
            Errno::EBADF => libc::EBADF,
            Errno::EINVAL => libc::EINVAL,
            Errno::EMFILE => libc::EMFILE,
            Errno::EBUSY => libc::EBUSY,
            Errno::EPERM => libc::EPERM,
            Errno::Other(n) => *n,
        }
    }

    /// The `Errno` for a raw Linux error number.
    pub fn from_raw(n: i32) -> Errno {
        match n {
            libc::EBADF => Errno::EBADF,
            libc::EINVAL => Errno::EINVAL,
            libc::EMFILE => Errno::EMFILE,
            libc::EBUSY => Errno::EBUSY,
            libc::EPERM => Errno::EPERM,
            n => Errno::Other(n),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Errno::Other(n) => write!(f, "errno {n}"),
            e => f.write_str(e.name()),
        }
    }
}

impl std::error::Error for Errno {}
