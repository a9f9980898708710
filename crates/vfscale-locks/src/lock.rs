//! `struct file_lock`, and the small named predicates every conflict check is built from.

use crate::{FileId, LockType, OwnerId, Pid, OFFSET_MAX};

/// Which lock family a record belongs to (`FL_POSIX`, `FL_POSIX|FL_OFDLCK`, `FL_FLOCK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// A process-owned record lock (`F_SETLK`).
    Posix,
    /// A record lock owned by an open file description (`F_OFD_SETLK`).
    Ofd,
    /// A whole-file `flock(2)` lock, owned by an open file description.
    Flock,
}

/// Who owns a lock: `fl_owner`. POSIX locks are owned by a process, OFD and flock locks by
/// an open file description; the two never compare equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnerKey {
    /// A process (`current->files`).
    Process(OwnerId),
    /// An open file description (`struct file *`).
    File(FileId),
}

/// A lock record: a granted lock or a blocked request. Byte ranges are inclusive,
/// `end == OFFSET_MAX` for one that runs to end of file, as in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLock {
    /// The family.
    pub kind: LockKind,
    /// Read, write, or unlock (only requests are unlocks).
    pub ty: LockType,
    /// First byte.
    pub start: i64,
    /// Last byte, inclusive.
    pub end: i64,
    /// The owner.
    pub owner: OwnerKey,
    /// The open file description the request came through.
    pub file: FileId,
    /// The pid reported by `F_GETLK` and the listing.
    pub pid: Pid,
}

impl FileLock {
    /// A whole-file `flock(2)` record for `file`.
    pub fn flock(file: FileId, pid: Pid, ty: LockType) -> FileLock {
        FileLock {
            kind: LockKind::Flock,
            ty,
            start: 0,
            end: OFFSET_MAX,
            owner: OwnerKey::File(file),
            file,
            pid,
        }
    }

    /// `IS_POSIX(fl) && !IS_OFDLCK(fl)`: a process-owned record lock, the only kind that
    /// takes part in deadlock detection as a requester.
    pub fn is_process_posix(&self) -> bool {
        self.kind == LockKind::Posix
    }

    /// Lives on the inode's POSIX list (POSIX and OFD locks share it).
    pub fn on_posix_list(&self) -> bool {
        matches!(self.kind, LockKind::Posix | LockKind::Ofd)
    }

    /// The `l_pid` `F_GETLK` reports for this lock: `-1` for an OFD lock.
    pub(crate) fn reported_pid(&self) -> i32 {
        if self.kind == LockKind::Ofd {
            -1
        } else {
            self.pid.0
        }
    }

    /// What `F_GETLK` reports of this lock.
    pub(crate) fn reported(&self) -> Reported {
        Reported {
            ty: self.ty,
            start: self.start,
            end: self.end,
            pid: self.reported_pid(),
        }
    }
}

/// What `F_GETLK` reports of the lock it finds (`posix_lock_to_flock`'s part of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reported {
    /// Read or write.
    pub ty: LockType,
    /// First byte.
    pub start: i64,
    /// Last byte, inclusive.
    pub end: i64,
    /// `l_pid`: the owner's pid, `-1` for an OFD lock.
    pub pid: i32,
}

/// `lock_is_unlock`.
pub fn lock_is_unlock(fl: &FileLock) -> bool {
    fl.ty == LockType::Unlock
}

/// `lock_is_write`.
pub fn lock_is_write(fl: &FileLock) -> bool {
    fl.ty == LockType::Write
}

/// `locks_overlap`: the two byte ranges share at least one byte.
pub fn locks_overlap(a: &FileLock, b: &FileLock) -> bool {
    a.start <= b.end && b.start <= a.end
}

/// `posix_same_owner`.
pub fn posix_same_owner(a: &FileLock, b: &FileLock) -> bool {
    a.owner == b.owner
}

/// `locks_conflict`: the types conflict, whatever the ranges (at least one writes).
pub fn locks_conflict(caller: &FileLock, sys: &FileLock) -> bool {
    lock_is_write(sys) || lock_is_write(caller)
}

/// `posix_locks_conflict`: another owner's lock over a shared byte, of a clashing type.
pub fn posix_locks_conflict(caller: &FileLock, sys: &FileLock) -> bool {
    !posix_same_owner(caller, sys) && locks_overlap(caller, sys) && locks_conflict(caller, sys)
}

/// `posix_test_locks_conflict`: what `F_GETLK` reports. An `F_UNLCK` probe (only
/// `F_OFD_GETLK` lets one through) finds the caller's own overlapping locks.
pub fn posix_test_locks_conflict(caller: &FileLock, sys: &FileLock) -> bool {
    if lock_is_unlock(caller) {
        return posix_same_owner(caller, sys) && locks_overlap(caller, sys);
    }
    posix_locks_conflict(caller, sys)
}

/// `flock_locks_conflict`: flock locks of different open file descriptions, one writing.
pub fn flock_locks_conflict(caller: &FileLock, sys: &FileLock) -> bool {
    caller.file != sys.file && locks_conflict(caller, sys)
}

/// The conflict test a wait tree of this family uses.
pub fn family_conflict(caller: &FileLock, sys: &FileLock) -> bool {
    if caller.kind == LockKind::Flock {
        flock_locks_conflict(caller, sys)
    } else {
        posix_locks_conflict(caller, sys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posix(owner: u64, ty: LockType, start: i64, end: i64) -> FileLock {
        FileLock {
            kind: LockKind::Posix,
            ty,
            start,
            end,
            owner: OwnerKey::Process(OwnerId(owner)),
            file: FileId(owner),
            pid: Pid(owner as i32),
        }
    }

    #[test]
    fn overlap_is_inclusive_and_handles_eof() {
        let a = posix(1, LockType::Write, 0, 9);
        assert!(locks_overlap(&a, &posix(2, LockType::Write, 9, 9)));
        assert!(!locks_overlap(&a, &posix(2, LockType::Write, 10, OFFSET_MAX)));
        assert!(locks_overlap(&posix(2, LockType::Read, 5, OFFSET_MAX), &a));
    }

    #[test]
    fn readers_share_writers_do_not() {
        let r1 = posix(1, LockType::Read, 0, 9);
        let r2 = posix(2, LockType::Read, 0, 9);
        let w2 = posix(2, LockType::Write, 0, 9);
        assert!(!posix_locks_conflict(&r1, &r2));
        assert!(posix_locks_conflict(&r1, &w2));
        assert!(
            !posix_locks_conflict(&posix(2, LockType::Write, 0, 9), &w2),
            "same owner never conflicts"
        );
    }

    #[test]
    fn unlock_probe_finds_own_locks_only() {
        let own = posix(1, LockType::Read, 0, 9);
        let probe = posix(1, LockType::Unlock, 5, 5);
        assert!(posix_test_locks_conflict(&probe, &own));
        assert!(!posix_test_locks_conflict(
            &probe,
            &posix(2, LockType::Write, 0, 9)
        ));
    }

    #[test]
    fn flock_conflicts_by_open_file() {
        let a = FileLock::flock(FileId(1), Pid(1), LockType::Write);
        let b = FileLock::flock(FileId(2), Pid(1), LockType::Read);
        assert!(flock_locks_conflict(&a, &b));
        assert!(!flock_locks_conflict(
            &a,
            &FileLock::flock(FileId(1), Pid(1), LockType::Write)
        ));
    }
}
