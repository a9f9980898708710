//! How a request's result becomes its reply: the errno a failure carries, and the
//! replies of the shapes several operations share.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, Generation, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};

/// The errno a client gets for a failed call of the server's. The server's own
/// descriptor table being full is `ENFILE` to the client (too many files open "in the
/// system" it sees): `EMFILE` would say that the caller's table is full.
pub(super) fn errno(e: io::Error) -> Errno {
    Errno::from_i32(match e.raw_os_error() {
        Some(libc::EMFILE) => libc::ENFILE,
        Some(n) => n,
        None => libc::EIO,
    })
}

/// A failed request: the errno its reply carries. `?` turns the server's own errors into
/// one through [`errno`].
pub(super) struct RequestError(pub(super) Errno);

impl From<io::Error> for RequestError {
    fn from(e: io::Error) -> RequestError {
        RequestError(errno(e))
    }
}

impl From<Errno> for RequestError {
    fn from(e: Errno) -> RequestError {
        RequestError(e)
    }
}

/// A fuser reply, which a failed request answers with its errno.
pub(super) trait ErrorReply {
    /// Answers with `e`.
    fn refuse(self, e: Errno);
}

impl ErrorReply for ReplyAttr {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyCreate {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyData {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyDirectory {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyDirectoryPlus {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyEmpty {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyEntry {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyLseek {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyOpen {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyStatfs {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyWrite {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

impl ErrorReply for ReplyXattr {
    fn refuse(self, e: Errno) {
        self.error(e)
    }
}

/// Answers `reply` through `ok` with what the request produced, or with its errno.
pub(super) fn answer<R: ErrorReply, T>(reply: R, outcome: Result<T, RequestError>, ok: impl FnOnce(R, T)) {
    match outcome {
        Ok(v) => ok(reply, v),
        Err(RequestError(e)) => reply.refuse(e),
    }
}

/// A new entry to reply with: how long the kernel may keep it, and its attributes.
pub(super) struct Entry {
    pub(super) ttl: Duration,
    pub(super) attr: FileAttr,
}

/// A handle just installed, and the passthrough backing file the kernel serves it from.
pub(super) struct Opened {
    pub(super) fh: u64,
    pub(super) backing: Option<Arc<fuser::BackingId>>,
}

pub(super) fn reply_entry(reply: ReplyEntry, outcome: Result<Entry, RequestError>) {
    answer(reply, outcome, |reply, e| {
        reply.entry(&e.ttl, &e.attr, Generation(0))
    });
}

pub(super) fn reply_empty(reply: ReplyEmpty, outcome: Result<(), RequestError>) {
    answer(reply, outcome, |reply, ()| reply.ok());
}

/// What `getxattr`/`listxattr` found: the buffer of the size the kernel asked for and
/// the length of the value (written to the buffer unless it is empty).
pub(super) struct XattrValue {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
}

/// Answers an xattr read: with the length alone when the kernel asked for the size.
pub(super) fn reply_xattr(reply: ReplyXattr, outcome: Result<XattrValue, RequestError>) {
    answer(reply, outcome, |reply, v| {
        if v.buf.is_empty() {
            reply.size(v.len as u32);
        } else {
            reply.data(&v.buf[..v.len]);
        }
    });
}
