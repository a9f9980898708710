//! One lock call as the service carries it: to the home's `vfscale-locks` context, or
//! over the wire to a remote home.

use std::sync::Arc;

use vfscale_locks::{
    AccessMode, Errno, FcntlCmd, FileId, FileLockContext, Flock, FlockOp, LockType, OpenFile, OwnerId,
    PendingLock, Pid, Process,
};

use crate::ids::IdSeed;
use crate::InodeId;

/// What is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `fcntl(2)`: one of the six record-lock commands.
    Fcntl { cmd: FcntlCmd, fl: Flock },
    /// `flock(2)`.
    Flock { op: FlockOp, nb: bool },
}

/// Whose lock a lost-lock check looks at: a POSIX owner or an open file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum LockOwner {
    Posix(u64),
    File(u64),
}

/// A lock call: ids are the caller's own (a member's local ids) or global ones (at the
/// home), as the holder says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub ino: InodeId,
    pub owner: u64,
    pub pid: i32,
    pub file: u64,
    pub mode: AccessMode,
    pub op: Op,
}

/// A call started on a context: answered, or waiting.
pub(crate) enum Started {
    Done(Flock),
    Waiting(PendingLock, Flock),
}

impl Request {
    /// Whether the call may wait.
    pub fn waits(&self) -> bool {
        match self.op {
            Op::Fcntl { cmd, .. } => cmd.waits(),
            Op::Flock { op, nb } => !nb && op != FlockOp::Unlock,
        }
    }

    /// Whether it waits as a process-owned POSIX request (the kind deadlock detection
    /// covers).
    pub fn is_posix_wait(&self) -> bool {
        matches!(
            self.op,
            Op::Fcntl {
                cmd: FcntlCmd::SetLkW,
                ..
            }
        )
    }

    /// Whether a granted call changes the locks held (to be mirrored in the shadow).
    pub fn changes_locks(&self) -> bool {
        match self.op {
            Op::Fcntl { cmd, .. } => !cmd.is_get(),
            Op::Flock { .. } => true,
        }
    }

    /// Whether it only lets go of locks (an unlock, which a home never refuses).
    pub fn is_unlock(&self) -> bool {
        match self.op {
            Op::Fcntl { cmd, fl } => !cmd.is_get() && fl.l_type == LockType::Unlock,
            Op::Flock { op, .. } => op == FlockOp::Unlock,
        }
    }

    /// The owner whose locks the call is about.
    pub fn lock_owner(&self) -> LockOwner {
        match self.op {
            Op::Fcntl { cmd, .. } if !cmd.is_ofd() => LockOwner::Posix(self.owner),
            _ => LockOwner::File(self.file),
        }
    }

    /// The same call under global ids.
    #[inline]
    pub fn global(mut self, seed: IdSeed) -> Request {
        self.owner = seed.global(self.owner).0;
        self.file = seed.global(self.file).0;
        self
    }

    /// Starts the call on `ctx` with the ids as they are.
    #[inline]
    pub fn start(&self, ctx: &Arc<FileLockContext>) -> Result<Started, Errno> {
        let who = Process {
            owner: OwnerId(self.owner),
            pid: Pid(self.pid),
        };
        let file = OpenFile {
            id: FileId(self.file),
            mode: self.mode,
        };
        match self.op {
            Op::Fcntl { cmd, fl } => {
                let mut fl = fl;
                match ctx.fcntl_lock(who, file, cmd, &mut fl)? {
                    None => Ok(Started::Done(fl)),
                    Some(p) => Ok(Started::Waiting(p, fl)),
                }
            }
            Op::Flock { op, nb } => {
                let fl = Flock::new(op.lock_type(), 0, 0);
                match ctx.flock_lock(who, file, op, nb)? {
                    None => Ok(Started::Done(fl)),
                    Some(p) => Ok(Started::Waiting(p, fl)),
                }
            }
        }
    }

    /// Applies a granted call to a shadow context, which holds only granted locks of
    /// this member's clients and so never conflicts: opened read-write, never waiting.
    pub fn mirror(&self, ctx: &Arc<FileLockContext>) {
        let who = Process {
            owner: OwnerId(self.owner),
            pid: Pid(self.pid),
        };
        let file = OpenFile {
            id: FileId(self.file),
            mode: AccessMode::ReadWrite,
        };
        let r = match self.op {
            Op::Fcntl { cmd, fl } => {
                let cmd = if cmd.is_ofd() {
                    FcntlCmd::OfdSetLk
                } else {
                    FcntlCmd::SetLk
                };
                ctx.fcntl(who, file, cmd, &mut fl.clone())
            }
            Op::Flock { op, .. } => ctx.flock(who, file, op, true),
        };
        if let Err(e) = r {
            tracing::warn!(ino = self.ino.0, ?e, "shadow refused a lock its home granted");
        }
    }
}

/// `struct flock` over an inclusive range, from `SEEK_SET`.
pub(crate) fn flock_of_range(ty: LockType, start: i64, end: i64) -> Flock {
    let len = if end == vfscale_locks::OFFSET_MAX {
        0
    } else {
        end - start + 1
    };
    Flock::new(ty, start, len)
}
