//! Which dispatch threads of a connection read `/dev/fuse`: the connection's
//! [`DispatchGate`], and which requests may block.
//!
//! The kernel wakes the threads blocked in `read(2)` in FIFO order, so with every thread
//! reading, a client that sends one request at a time (a `find`, an `ls -l`, a build
//! step) has each served by the thread idle longest: a wake-up that preempts the thread
//! that just replied, and a cold cache. The gate keeps one thread serving such a stream
//! and parks the others until requests queue up or one in hand may block.
//!
//! A request may block when it can wait on something outside this server's control for
//! long: I/O on file data (`READ`, `WRITE`, `FSYNC`, ...) and anything [`may_block`] does
//! not know. The others are answered from one or a few syscalls on the source (`FLUSH`
//! and `RELEASE` release locks; the waiters they grant are answered from the lock
//! driver's thread). Lock requests are among them: one that must wait is parked, a wait
//! for a holder on the source runs in a thread of its own, and a grant that waits for
//! the client's cache to be invalidated is answered by the notify thread once it is.
//! One of them that runs long anyway (a write-back at `FLUSH` on a network
//! source, an open that breaks a lease, a truncate of a huge file) delays the requests
//! behind it, not for long: a watchdog thread per connection wakes a spare once a
//! request has been served for [`STALL`] with no thread reading.
//!
//! A read counts as finding the queue busy when it returned within [`QUEUED_READ`] and
//! `poll(2)` shows another request behind it. On a machine where a read of a queued
//! request takes longer than that, parallel clients are served by one thread until the
//! watchdog sees a request run for [`STALL`].

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use fuser::DispatchGate as Hook;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use vfscale_sync::DispatchGate;

/// How long a request may be served with no thread reading before the watchdog wakes
/// a spare (checked at this period while requests come, at [`IDLE_TICK`] after a second
/// without one).
pub const STALL: Duration = Duration::from_millis(2);

/// The watchdog's period once no request came for a second.
pub const IDLE_TICK: Duration = Duration::from_millis(50);

/// A read that returns sooner found its request already queued: a read that sleeps
/// takes at least a cross-CPU wake-up, several microseconds.
pub const QUEUED_READ: Duration = Duration::from_micros(2);

/// One dispatch thread's view of its reads; written only by that thread.
#[derive(Default)]
struct Reads {
    /// Its last read found a request queued.
    busy: AtomicBool,
    reads: AtomicU64,
    busy_reads: AtomicU64,
}

/// One connection's gate, as fuser's hook.
pub struct ConnGate {
    gate: Arc<DispatchGate>,
    threads: Vec<CachePadded<Reads>>,
    /// Spares the watchdog woke (written only by it).
    stall_wakes: AtomicU64,
}

/// What a connection's gate counted (the `SIGUSR1` line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Requests read.
    pub reads: u64,
    /// Reads that found their request already queued.
    pub busy_reads: u64,
    /// Times a dispatch thread parked.
    pub parks: u64,
    /// Times a parked thread was woken to read.
    pub wakes: u64,
    /// Of those, times the watchdog woke one behind a request served for [`STALL`].
    pub stall_wakes: u64,
}

impl std::ops::Add for GateStats {
    type Output = GateStats;

    fn add(self, o: GateStats) -> GateStats {
        GateStats {
            reads: self.reads + o.reads,
            busy_reads: self.busy_reads + o.busy_reads,
            parks: self.parks + o.parks,
            wakes: self.wakes + o.wakes,
            stall_wakes: self.stall_wakes + o.stall_wakes,
        }
    }
}

impl ConnGate {
    /// The gate of a connection served by `threads` dispatch threads, with its watchdog
    /// (a thread that ends once the gate is closed or dropped).
    pub fn new(threads: usize) -> io::Result<Arc<Self>> {
        let g = Arc::new(ConnGate {
            gate: Arc::new(DispatchGate::new(threads)),
            threads: (0..threads).map(|_| CachePadded::new(Reads::default())).collect(),
            stall_wakes: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&g);
        std::thread::Builder::new()
            .name("vfscalefs-watch".into())
            .spawn(move || watch(weak))?;
        Ok(g)
    }

    fn reads(&self) -> u64 {
        self.threads.iter().map(|t| t.reads.load(Ordering::Relaxed)).sum()
    }

    /// What the gate counted so far.
    pub fn stats(&self) -> GateStats {
        let (parks, wakes) = self.gate.parks_and_wakes();
        let sum =
            |f: fn(&Reads) -> &AtomicU64| self.threads.iter().map(|t| f(t).load(Ordering::Relaxed)).sum();
        GateStats {
            reads: sum(|t| &t.reads),
            busy_reads: sum(|t| &t.busy_reads),
            parks,
            wakes,
            stall_wakes: self.stall_wakes.load(Ordering::Relaxed),
        }
    }
}

impl Hook for ConnGate {
    fn before_read(&self, thread: usize) -> bool {
        let busy = self.threads[thread].busy.load(Ordering::Relaxed);
        self.gate.before_read(thread, busy)
    }

    fn after_read(&self, thread: usize, opcode: u32, read_time: Duration, dev: BorrowedFd<'_>) {
        // A read that returned at once may just have found the next request of a serial
        // stream; the queue is busy only if another request waits behind it.
        let busy = read_time < QUEUED_READ && more_queued(dev);
        let t = &self.threads[thread];
        t.busy.store(busy, Ordering::Relaxed);
        t.reads.fetch_add(1, Ordering::Relaxed);
        if busy {
            t.busy_reads.fetch_add(1, Ordering::Relaxed);
        }
        self.gate.after_read(may_block(opcode), busy);
    }

    fn close(&self) {
        self.gate.close();
    }

    fn leave(&self, _thread: usize) {
        self.gate.leave();
    }
}

/// The watchdog: no thread read at two ticks in a row and no request was read in between,
/// so one request has been served for a tick with nobody reading behind it.
fn watch(gate: Weak<ConnGate>) {
    let mut tick = STALL;
    let mut last_reads = 0;
    let mut active = Instant::now();
    let mut stalled_at: Option<u64> = None;
    loop {
        std::thread::sleep(tick);
        let Some(g) = gate.upgrade() else { return };
        if g.gate.is_closed() {
            return;
        }
        let reads = g.reads();
        if reads != last_reads {
            last_reads = reads;
            active = Instant::now();
        }
        tick = if active.elapsed() > Duration::from_secs(1) {
            IDLE_TICK
        } else {
            STALL
        };
        if g.gate.readers() > 0 {
            stalled_at = None;
            continue;
        }
        if stalled_at == Some(reads) && g.gate.blocking() {
            g.stall_wakes.fetch_add(1, Ordering::Relaxed);
        }
        stalled_at = Some(reads);
    }
}

/// Whether `/dev/fuse` has another request queued (`poll(2)`, no wait).
fn more_queued(dev: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::new(dev, PollFlags::POLLIN)];
    matches!(poll(&mut p, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// FUSE opcodes (`enum fuse_opcode` of `include/uapi/linux/fuse.h`).
pub mod op {
    #![allow(missing_docs)]
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BATCH_FORGET: u32 = 42;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

/// Whether a request with `opcode` may wait for long (see the module's first page).
pub fn may_block(opcode: u32) -> bool {
    !matches!(
        opcode,
        op::LOOKUP
            | op::FORGET
            | op::BATCH_FORGET
            | op::GETATTR
            | op::SETATTR
            | op::READLINK
            | op::SYMLINK
            | op::MKNOD
            | op::MKDIR
            | op::UNLINK
            | op::RMDIR
            | op::RENAME
            | op::RENAME2
            | op::LINK
            | op::OPEN
            | op::CREATE
            | op::FLUSH
            | op::RELEASE
            | op::STATFS
            | op::GETXATTR
            | op::LISTXATTR
            | op::SETXATTR
            | op::REMOVEXATTR
            | op::ACCESS
            | op::OPENDIR
            | op::READDIR
            | op::READDIRPLUS
            | op::RELEASEDIR
            | op::GETLK
            | op::SETLK
            | op::SETLKW
            | op::INTERRUPT
            | op::LSEEK
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that is not listed as blocking but runs long: the watchdog wakes the
    /// parked spare within a few ticks, and it reads.
    #[test]
    fn the_watchdog_wakes_a_spare_behind_a_long_request() {
        let g = ConnGate::new(2).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(Hook::before_read(&*g, 0));
        let g2 = g.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let spare = std::thread::spawn(move || {
            let t = Instant::now();
            let read = Hook::before_read(&*g2, 1);
            let _ = tx.send(t.elapsed());
            read
        });
        while g.gate.parks_and_wakes().0 == 0 {
            std::thread::yield_now();
        }
        // Thread 0 took a LOOKUP (no wait in the read) and serves it for long.
        use std::os::fd::AsFd as _;
        Hook::after_read(&*g, 0, op::LOOKUP, Duration::from_secs(1), null.as_fd());
        let waited = rx.recv_timeout(Duration::from_secs(5));
        if waited.is_err() {
            Hook::close(&*g);
        }
        assert!(spare.join().unwrap(), "the spare was woken to read, not closed");
        assert!(waited.unwrap() < Duration::from_secs(2));
        // The watchdog counts its wake after the spare may already have run.
        let deadline = Instant::now() + Duration::from_secs(2);
        while g.stats().stall_wakes == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(g.stats().stall_wakes, 1);
        assert_eq!(g.gate.readers(), 1);
        Hook::close(&*g);
    }

    #[test]
    fn metadata_and_locks_are_served_inline_and_data_hands_off() {
        for op in [
            op::LOOKUP,
            op::GETATTR,
            op::READDIRPLUS,
            op::CREATE,
            op::FLUSH,
            op::RELEASE,
            op::SETLK,
            op::SETLKW,
        ] {
            assert!(!may_block(op), "{op}");
        }
        for op in [op::READ, op::WRITE, op::FSYNC, 9999] {
            assert!(may_block(op), "{op}");
        }
    }
}
