//! The errors a lock call can return, named as Linux names them.

use std::fmt;

/// An error number, as Linux returns it from `fcntl(2)` and `flock(2)`.
///
/// Only the values the lock calls produce have their own variant; any other raw value
/// (seen when replaying against the kernel) is kept in [`Errno::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    /// `EAGAIN` (Linux's `EWOULDBLOCK` is the same number): a conflicting lock is held.
    EAGAIN,
    /// `EDEADLK`: waiting would deadlock (POSIX locks only).
    EDEADLK,
    /// `EBADF`: the lock type does not fit the open mode.
    EBADF,
    /// `EINVAL`: a bad argument (negative start, bad type, `l_pid` not 0 for OFD).
    EINVAL,
    /// `EINTR`: a wait was interrupted.
    EINTR,
    /// `EOVERFLOW`: the range does not fit in `off_t`.
    EOVERFLOW,
    /// `ENOLCK`: no lock record could be had.
    ENOLCK,
    /// `ETIMEDOUT`: a wait with a deadline ran out (not a Linux lock result; the
    /// library's own deadline extension).
    ETIMEDOUT,
    /// Any other error number.
    Other(i32),
}

impl Errno {
    /// The raw `errno` value.
    pub fn raw(self) -> i32 {
        match self {
            Errno::EAGAIN => libc::EAGAIN,
            Errno::EDEADLK => libc::EDEADLK,
            Errno::EBADF => libc::EBADF,
            Errno::EINVAL => libc::EINVAL,
            Errno::EINTR => libc::EINTR,
            Errno::EOVERFLOW => libc::EOVERFLOW,
            Errno::ENOLCK => libc::ENOLCK,
            Errno::ETIMEDOUT => libc::ETIMEDOUT,
            Errno::Other(n) => n,
        }
    }

    /// The value for a raw `errno`.
    pub fn from_raw(n: i32) -> Errno {
        match n {
            libc::EAGAIN => Errno::EAGAIN,
            libc::EDEADLK => Errno::EDEADLK,
            libc::EBADF => Errno::EBADF,
            libc::EINVAL => Errno::EINVAL,
            libc::EINTR => Errno::EINTR,
            libc::EOVERFLOW => Errno::EOVERFLOW,
            libc::ENOLCK => Errno::ENOLCK,
            libc::ETIMEDOUT => Errno::ETIMEDOUT,
            n => Errno::Other(n),
        }
    }

    /// The symbolic name (`"EAGAIN"`), or `"E<n>"` for an unnamed value.
    pub fn name(self) -> String {
        match self {
            Errno::EAGAIN => "EAGAIN".into(),
            Errno::EDEADLK => "EDEADLK".into(),
            Errno::EBADF => "EBADF".into(),
            Errno::EINVAL => "EINVAL".into(),
            Errno::EINTR => "EINTR".into(),
            Errno::EOVERFLOW => "EOVERFLOW".into(),
            Errno::ENOLCK => "ENOLCK".into(),
            Errno::ETIMEDOUT => "ETIMEDOUT".into(),
            Errno::Other(n) => format!("E{n}"),
        }
    }

    /// Parses a symbolic name produced by [`Errno::name`].
    pub fn from_name(s: &str) -> Option<Errno> {
        Some(match s {
            "EAGAIN" | "EWOULDBLOCK" => Errno::EAGAIN,
            "EDEADLK" => Errno::EDEADLK,
            "EBADF" => Errno::EBADF,
            "EINVAL" => Errno::EINVAL,
            "EINTR" => Errno::EINTR,
            "EOVERFLOW" => Errno::EOVERFLOW,
            "ENOLCK" => Errno::ENOLCK,
            "ETIMEDOUT" => Errno::ETIMEDOUT,
            other => Errno::Other(other.strip_prefix('E')?.parse().ok()?),
        })
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::error::Error for Errno {}
