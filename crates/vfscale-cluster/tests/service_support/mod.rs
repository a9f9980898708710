//! Two or three lock services in one process over the in-memory directory, and
//! blocking wrappers of their calls.

#![allow(dead_code)]

use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use vfscale_cluster::memdir::{MemCluster, MemDirectory};
use vfscale_cluster::{ClusterFile, ClusterLocks, ClusterProcess, Directory, InodeId, LockCall, LockDone};
use vfscale_locks::{AccessMode, Errno, FcntlCmd, Flock, FlockOp, LockType};

/// How long a test waits for an answer that must come.
pub const ANSWER: Duration = Duration::from_secs(10);
/// How long a test watches a call that must keep waiting.
pub const STILL: Duration = Duration::from_millis(150);

pub struct Cluster {
    pub mem: Arc<MemCluster>,
    pub members: Vec<Arc<ClusterLocks>>,
    pub dirs: Vec<Arc<MemDirectory>>,
}

pub fn start(n: usize) -> Cluster {
    start_with(n, MemCluster::new())
}

/// `n` members over `mem` (set up as the test needs).
pub fn start_with(n: usize, mem: Arc<MemCluster>) -> Cluster {
    let mut members = Vec::new();
    let mut dirs = Vec::new();
    for i in 0..n {
        let slot = Arc::new(Mutex::new(None));
        let (s, c) = (slot.clone(), mem.clone());
        let m = ClusterLocks::with_directory("127.0.0.1:0".parse().unwrap(), move |addr| async move {
            let d = c.join(&format!("m{i}"), addr);
            *s.lock() = Some(d.clone());
            Ok(d as Arc<dyn Directory>)
        })
        .expect("a member starts");
        members.push(m);
        dirs.push(slot.lock().take().unwrap());
    }
    Cluster { mem, members, dirs }
}

pub fn who(owner: u64, pid: i32) -> ClusterProcess {
    ClusterProcess { owner, pid }
}

pub fn file(id: u64) -> ClusterFile {
    ClusterFile {
        id,
        mode: AccessMode::ReadWrite,
    }
}

pub fn wr(start: i64, len: i64) -> Flock {
    Flock::new(LockType::Write, start, len)
}

pub fn rd(start: i64, len: i64) -> Flock {
    Flock::new(LockType::Read, start, len)
}

pub fn un(start: i64, len: i64) -> Flock {
    Flock::new(LockType::Unlock, start, len)
}

/// Where a call's answer arrives.
pub type Answers<T> = Receiver<Result<T, Errno>>;

/// A completion that sends the answer to the returned receiver.
fn answer<T: Send + 'static>() -> (LockDone<T>, Answers<T>) {
    let (tx, rx) = mpsc::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

/// An fcntl call whose answer comes on the receiver.
pub fn fcntl_start(
    m: &ClusterLocks,
    ino: u64,
    p: ClusterProcess,
    f: ClusterFile,
    cmd: FcntlCmd,
    fl: Flock,
) -> (LockCall, Receiver<Result<Flock, Errno>>) {
    let (done, rx) = answer();
    (m.fcntl(InodeId(ino), p, f, cmd, fl, done), rx)
}

/// An fcntl call, waited for.
pub fn fcntl(
    m: &ClusterLocks,
    ino: u64,
    p: ClusterProcess,
    f: ClusterFile,
    cmd: FcntlCmd,
    fl: Flock,
) -> Result<Flock, Errno> {
    let (_c, rx) = fcntl_start(m, ino, p, f, cmd, fl);
    rx.recv_timeout(ANSWER).expect("an answer")
}

/// F_SETLK with process `p` through its own file `p.owner`.
pub fn setlk(m: &ClusterLocks, ino: u64, p: ClusterProcess, fl: Flock) -> Result<(), Errno> {
    fcntl(m, ino, p, file(p.owner), FcntlCmd::SetLk, fl).map(|_| ())
}

/// F_GETLK with process `p`.
pub fn getlk(m: &ClusterLocks, ino: u64, p: ClusterProcess, fl: Flock) -> Flock {
    fcntl(m, ino, p, file(p.owner), FcntlCmd::GetLk, fl).expect("F_GETLK answers")
}

pub fn flock_start(
    m: &ClusterLocks,
    ino: u64,
    f: ClusterFile,
    op: FlockOp,
    nb: bool,
) -> (LockCall, Receiver<Result<(), Errno>>) {
    let (done, rx) = answer();
    (m.flock(InodeId(ino), who(f.id, f.id as i32), f, op, nb, done), rx)
}

pub fn flock(m: &ClusterLocks, ino: u64, f: ClusterFile, op: FlockOp, nb: bool) -> Result<(), Errno> {
    let (_c, rx) = flock_start(m, ino, f, op, nb);
    rx.recv_timeout(ANSWER).expect("an answer")
}

/// Asserts that a call has not been answered yet.
pub fn still_waiting<T: std::fmt::Debug>(rx: &Receiver<Result<T, Errno>>) {
    match rx.recv_timeout(STILL) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        other => panic!("expected the call to keep waiting, got {other:?}"),
    }
}

/// Waits until `f` holds (polling), or panics with `what`.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + ANSWER;
    while std::time::Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}

pub const EIO: Errno = Errno::Other(libc::EIO);
