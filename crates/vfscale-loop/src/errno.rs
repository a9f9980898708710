//! The errors a loop call returns, as Linux numbers them.

use std::fmt;

/// An error number, as Linux returns it from the loop ioctls, `open(2)` and block I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// `EPERM`: a write to a read-only device.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// `ENOENT`: no such device (no `/dev/loopN` node).
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// `EIO`: I/O failed (unbound or running-down device, backing file too short).
    pub const EIO: Errno = Errno(libc::EIO);
    /// `ENXIO`: the device is not bound (or is running down, or being deleted).
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    /// `EBADF`: a bad backing descriptor, or a loop-on-loop cycle.
    pub const EBADF: Errno = Errno(libc::EBADF);
    /// `EBUSY`: bound, open, or exclusively claimed by another opener.
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    /// `EEXIST`: `LOOP_CTL_ADD` of an index in use.
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    /// `ENODEV`: `LOOP_CTL_REMOVE` of an absent index.
    pub const ENODEV: Errno = Errno(libc::ENODEV);
    /// `EINVAL`: a bad argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `ENOSPC`: a write at or past the end of the device.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// `EOVERFLOW`: an offset or size limit above `i64::MAX`.
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
    /// `EOPNOTSUPP`: the backing file cannot punch holes.
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);

    /// The raw `errno` value.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// The last OS error of this thread.
    pub(crate) fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for Errno {}
