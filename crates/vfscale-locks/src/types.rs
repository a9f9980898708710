//! Typed wrappers for the values the lock calls take: owners, files, commands and types.
//!
//! Nothing here is a bare integer on the API: a process owner is an [`OwnerId`], an open
//! file description a [`FileId`], a command an [`FcntlCmd`].

use crate::Errno;

/// `OFFSET_MAX`: the largest byte offset, the end of a lock that runs to end of file.
pub const OFFSET_MAX: i64 = i64::MAX;

/// The owner of POSIX locks: a process (Linux keys them by `current->files`).
///
/// Chosen by the caller; two requests with the same `OwnerId` are the same process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub u64);

/// An open file description (Linux `struct file`): owns OFD and flock locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u64);

/// A process id as reported by `F_GETLK` and the lock listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(pub i32);

/// Identity of an inode for the listing: device major, minor and inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct InodeKey {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Inode number.
    pub ino: u64,
}

/// The access mode an open file description was opened with (`O_RDONLY`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessMode {
    /// `O_RDONLY`.
    Read,
    /// `O_WRONLY`.
    Write,
    /// `O_RDWR`.
    ReadWrite,
}

impl AccessMode {
    /// `FMODE_READ`.
    pub fn can_read(self) -> bool {
        matches!(self, AccessMode::Read | AccessMode::ReadWrite)
    }
    /// `FMODE_WRITE`.
    pub fn can_write(self) -> bool {
        matches!(self, AccessMode::Write | AccessMode::ReadWrite)
    }
}

/// A lock type: `F_RDLCK`, `F_WRLCK`, `F_UNLCK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockType {
    /// `F_RDLCK`: shared.
    Read,
    /// `F_WRLCK`: exclusive.
    Write,
    /// `F_UNLCK`: release.
    Unlock,
}

impl LockType {
    /// The `l_type` value Linux uses.
    pub fn raw(self) -> i16 {
        match self {
            LockType::Read => libc::F_RDLCK as i16,
            LockType::Write => libc::F_WRLCK as i16,
            LockType::Unlock => libc::F_UNLCK as i16,
        }
    }
    /// The lock type for an `l_type` value; `EINVAL` for anything else (`assign_type`).
    pub fn from_raw(v: i16) -> Result<LockType, Errno> {
        match v as i32 {
            libc::F_RDLCK => Ok(LockType::Read),
            libc::F_WRLCK => Ok(LockType::Write),
            libc::F_UNLCK => Ok(LockType::Unlock),
            _ => Err(Errno::EINVAL),
        }
    }
    /// `"F_RDLCK"`, `"F_WRLCK"` or `"F_UNLCK"`.
    pub fn name(self) -> &'static str {
        match self {
            LockType::Read => "F_RDLCK",
            LockType::Write => "F_WRLCK",
            LockType::Unlock => "F_UNLCK",
        }
    }
    /// Parses [`LockType::name`].
    pub fn from_name(s: &str) -> Option<LockType> {
        Some(match s {
            "F_RDLCK" => LockType::Read,
            "F_WRLCK" => LockType::Write,
            "F_UNLCK" => LockType::Unlock,
            _ => return None,
        })
    }
}

/// The record-lock commands of `fcntl(2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FcntlCmd {
    /// `F_SETLK`: set a process-owned lock, or fail with `EAGAIN`.
    SetLk,
    /// `F_SETLKW`: set a process-owned lock, waiting.
    SetLkW,
    /// `F_GETLK`: test for a conflicting lock.
    GetLk,
    /// `F_OFD_SETLK`: set a lock owned by the open file description.
    OfdSetLk,
    /// `F_OFD_SETLKW`: as `F_OFD_SETLK`, waiting.
    OfdSetLkW,
    /// `F_OFD_GETLK`: test, as an open-file-description owner.
    OfdGetLk,
}

impl FcntlCmd {
    /// The command number Linux uses.
    pub fn raw(self) -> i32 {
        match self {
            FcntlCmd::SetLk => libc::F_SETLK,
            FcntlCmd::SetLkW => libc::F_SETLKW,
            FcntlCmd::GetLk => libc::F_GETLK,
            FcntlCmd::OfdSetLk => libc::F_OFD_SETLK,
            FcntlCmd::OfdSetLkW => libc::F_OFD_SETLKW,
            FcntlCmd::OfdGetLk => libc::F_OFD_GETLK,
        }
    }
    /// The command's name, as in `"F_OFD_SETLKW"`.
    pub fn name(self) -> &'static str {
        match self {
            FcntlCmd::SetLk => "F_SETLK",
            FcntlCmd::SetLkW => "F_SETLKW",
            FcntlCmd::GetLk => "F_GETLK",
            FcntlCmd::OfdSetLk => "F_OFD_SETLK",
            FcntlCmd::OfdSetLkW => "F_OFD_SETLKW",
            FcntlCmd::OfdGetLk => "F_OFD_GETLK",
        }
    }
    /// Every command.
    pub const ALL: [FcntlCmd; 6] = [
        FcntlCmd::SetLk,
        FcntlCmd::SetLkW,
        FcntlCmd::GetLk,
        FcntlCmd::OfdSetLk,
        FcntlCmd::OfdSetLkW,
        FcntlCmd::OfdGetLk,
    ];
    /// Parses [`FcntlCmd::name`].
    pub fn from_name(s: &str) -> Option<FcntlCmd> {
        FcntlCmd::ALL.into_iter().find(|c| c.name() == s)
    }
    /// The command with Linux's number `v` ([`FcntlCmd::raw`]).
    pub fn from_raw(v: i32) -> Option<FcntlCmd> {
        FcntlCmd::ALL.into_iter().find(|c| c.raw() == v)
    }
    /// An OFD command (`F_OFD_*`).
    pub fn is_ofd(self) -> bool {
        matches!(
            self,
            FcntlCmd::OfdSetLk | FcntlCmd::OfdSetLkW | FcntlCmd::OfdGetLk
        )
    }
    /// A command that waits (`F_SETLKW`, `F_OFD_SETLKW`).
    pub fn waits(self) -> bool {
        matches!(self, FcntlCmd::SetLkW | FcntlCmd::OfdSetLkW)
    }
    /// A test command (`F_GETLK`, `F_OFD_GETLK`).
    pub fn is_get(self) -> bool {
        matches!(self, FcntlCmd::GetLk | FcntlCmd::OfdGetLk)
    }
}

/// `l_whence` with what it is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Whence {
    /// `SEEK_SET`: from offset 0.
    #[default]
    Set,
    /// `SEEK_CUR`, with the file position.
    Cur(i64),
    /// `SEEK_END`, with the file size.
    End(i64),
}

/// `struct flock` as `fcntl(2)` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flock {
    /// `l_type`.
    pub l_type: LockType,
    /// `l_whence`, with the position or size it refers to.
    pub l_whence: Whence,
    /// `l_start`.
    pub l_start: i64,
    /// `l_len`: 0 to end of file, negative for the bytes before `l_start`.
    pub l_len: i64,
    /// `l_pid`: must be 0 for OFD commands; set by `F_GETLK` (-1 for an OFD lock).
    pub l_pid: i32,
}

impl Flock {
    /// A request over `[start, start+len)` from `SEEK_SET`.
    pub fn new(l_type: LockType, l_start: i64, l_len: i64) -> Flock {
        Flock {
            l_type,
            l_whence: Whence::Set,
            l_start,
            l_len,
            l_pid: 0,
        }
    }
}

/// The operations of `flock(2)` (`LOCK_SH`, `LOCK_EX`, `LOCK_UN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlockOp {
    /// `LOCK_SH`.
    Shared,
    /// `LOCK_EX`.
    Exclusive,
    /// `LOCK_UN`.
    Unlock,
}

impl FlockOp {
    /// `"LOCK_SH"`, `"LOCK_EX"`, `"LOCK_UN"`.
    pub fn name(self) -> &'static str {
        match self {
            FlockOp::Shared => "LOCK_SH",
            FlockOp::Exclusive => "LOCK_EX",
            FlockOp::Unlock => "LOCK_UN",
        }
    }
    /// Parses [`FlockOp::name`].
    pub fn from_name(s: &str) -> Option<FlockOp> {
        Some(match s {
            "LOCK_SH" => FlockOp::Shared,
            "LOCK_EX" => FlockOp::Exclusive,
            "LOCK_UN" => FlockOp::Unlock,
            _ => return None,
        })
    }
    /// The `flock(2)` operation bits, without `LOCK_NB`.
    pub fn raw(self) -> i32 {
        match self {
            FlockOp::Shared => libc::LOCK_SH,
            FlockOp::Exclusive => libc::LOCK_EX,
            FlockOp::Unlock => libc::LOCK_UN,
        }
    }
    /// The lock type it stands for (`flock_translate_cmd`).
    pub fn lock_type(self) -> LockType {
        match self {
            FlockOp::Shared => LockType::Read,
            FlockOp::Exclusive => LockType::Write,
            FlockOp::Unlock => LockType::Unlock,
        }
    }
}
