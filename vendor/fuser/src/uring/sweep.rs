//! Parked requests whose caller was interrupted and got no `INTERRUPT`.
//!
//! Linux 6.18's `fs/fuse/dev_uring.c` takes a request off the pending list when it gives
//! it to a ring entry, and marks it sent (`FR_SENT`) only when the queue's thread copies
//! it out; it does not look at `FR_INTERRUPTED` in between, where `/dev/fuse`'s read does
//! (`fuse_dev_do_read`). A signal that lands in that window queues no `INTERRUPT`, and
//! its caller goes on waiting in `request_wait_answer`, past its interruptible part: a
//! parked lock wait then holds a killed process until the lock is granted, maybe never.
//!
//! So while requests are parked, the sweep looks at their callers every [`SWEEP`]. A
//! caller asleep uninterruptibly (`State: D` in `/proc/<tid>/status`: past the
//! interruptible wait) with a signal pending that it neither blocks nor ignores (the
//! same file) was interrupted. Seen so on two sweeps in a row (a sent `INTERRUPT` is served within
//! one), its request gets the `INTERRUPT` the kernel would have sent, once, through
//! [`Filesystem::interrupt`]. Both checks matter: a lock request answered `EINTR` while
//! no signal is delivered returns `ERESTARTSYS` (512) to its caller (`fuse_setlk`
//! restarts locks). A caller outside the server's pid namespace (pid 0) is not seen, and
//! a server whose `/proc` is not of its own pid namespace does not sweep (the pids
//! there would name other tasks).
//!
//! Test knob: a session whose environment has `FUSER_TEST_LOSE_INTERRUPTS` drops every
//! `INTERRUPT` the kernel sends, so that tests can make the lost ones happen at will.

use std::collections::HashSet;
use std::io;
use std::io::Read as _;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use log::warn;

use crate::Filesystem;
use crate::Request;
use crate::ll::Errno;
use crate::ll::RequestId;
use crate::ll::fuse_abi::fuse_in_header;
use crate::ll::fuse_abi::fuse_opcode;
use crate::session::FilesystemHolder;
use crate::uring::reply::Phase;
use crate::uring::reply::QueueShared;

/// How often parked requests' callers are looked at.
pub(crate) const SWEEP: Duration = Duration::from_millis(250);

/// Whether the session drops the kernel's `INTERRUPT`s (the test knob above).
pub(crate) fn lose_interrupts() -> bool {
    static LOSE: OnceLock<bool> = OnceLock::new();
    *LOSE.get_or_init(|| std::env::var_os("FUSER_TEST_LOSE_INTERRUPTS").is_some())
}

/// The sweep's thread; stopped and joined by [`Sweeper::stop`].
#[derive(Debug)]
pub(crate) struct Sweeper {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Sweeper {
    /// Starts the sweep of `queues` for `fs`.
    pub(crate) fn spawn<FS: Filesystem>(
        queues: Vec<Arc<QueueShared>>,
        fs: Arc<FilesystemHolder<FS>>,
    ) -> io::Result<Sweeper> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fuser-uring-sweep".to_string())
            .spawn(move || {
                if !proc_is_ours() {
                    warn!(
                        "io_uring: /proc is not of this process's pid namespace; \
                         interrupts the kernel loses are not made up"
                    );
                    return;
                }
                let mut sweep = Sweep::default();
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(SWEEP) {
                    if !sweep.round(&queues, |unique, pid| match &fs.fs {
                        Some(fs) => interrupt(fs, unique, pid),
                        None => Err(Errno::ENOSYS),
                    }) {
                        return;
                    }
                }
            })?;
        Ok(Sweeper { stop, thread })
    }

    /// Stops the sweep and waits for its thread (at most one round).
    pub(crate) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// Hands the filesystem the `INTERRUPT` the kernel would have sent for `unique`.
fn interrupt<FS: Filesystem>(fs: &FS, unique: u64, pid: u32) -> Result<(), Errno> {
    let header = fuse_in_header {
        len: (size_of::<fuse_in_header>() + size_of::<u64>()) as u32,
        opcode: fuse_opcode::FUSE_INTERRUPT as u32,
        // As the kernel numbers an interrupt (`FUSE_INT_REQ_BIT`).
        unique: unique | 1,
        nodeid: 0,
        uid: 0,
        gid: 0,
        pid,
        padding: 0,
    };
    fs.interrupt(Request::ref_cast(&header), RequestId(unique))
}

/// What one sweep remembers for the next.
#[derive(Debug, Default)]
struct Sweep {
    /// Requests whose caller looked interrupted on the last round.
    suspects: HashSet<u64>,
    /// Requests interrupted by the sweep, while they stay parked.
    sent: HashSet<u64>,
    /// Reused buffer for `/proc` reads.
    buf: Vec<u8>,
}

impl Sweep {
    /// One look at every parked request of `queues`; `interrupt(unique, pid)` delivers.
    /// False once the filesystem said it takes no interrupts (`ENOSYS`): the sweep ends.
    fn round(
        &mut self,
        queues: &[Arc<QueueShared>],
        mut interrupt: impl FnMut(u64, u32) -> Result<(), Errno>,
    ) -> bool {
        if queues
            .iter()
            .all(|q| q.counters.parked.load(Ordering::Relaxed) == 0)
        {
            self.suspects.clear();
            self.sent.clear();
            return true;
        }
        let mut suspects = HashSet::new();
        let mut sent = HashSet::new();
        for q in queues {
            let parked: Vec<(u64, u32)> = q
                .entries
                .lock()
                .iter()
                .filter(|e| e.slot.lock().phase == Phase::Parked)
                .map(|e| {
                    (
                        e.unique.load(Ordering::Acquire),
                        e.pid.load(Ordering::Acquire),
                    )
                })
                .collect();
            for (unique, pid) in parked {
                if self.sent.contains(&unique) {
                    sent.insert(unique);
                    continue;
                }
                if pid == 0 || !self.caller_interrupted(pid) {
                    continue;
                }
                if !self.suspects.contains(&unique) {
                    suspects.insert(unique);
                    continue;
                }
                match interrupt(unique, pid) {
                    Err(e) if e == Errno::EAGAIN => {
                        suspects.insert(unique);
                    }
                    Err(e) if e == Errno::ENOSYS => return false,
                    res => {
                        if let Err(e) = res {
                            warn!("io_uring: interrupt of request {unique} failed: {e:?}");
                        }
                        q.counters.lost_interrupts.fetch_add(1, Ordering::Relaxed);
                        sent.insert(unique);
                    }
                }
            }
        }
        self.suspects = suspects;
        self.sent = sent;
        true
    }

    /// Whether task `pid` sleeps uninterruptibly with a deliverable signal pending.
    /// (`status` is per thread; `stat` of a thread id walks its whole process.)
    fn caller_interrupted(&mut self, pid: u32) -> bool {
        self.read(&format!("/proc/{pid}/status"))
            .is_some_and(|st| status_state(st) == Some(b'D') && signal_deliverable(st))
    }

    fn read(&mut self, path: &str) -> Option<&[u8]> {
        self.buf.clear();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut self.buf))
            .ok()?;
        Some(&self.buf)
    }
}

/// Whether `/proc/self` names this process: `/proc` is of its pid namespace.
fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// The state letter of a `/proc/<pid>/status` text (`State:\tD (disk sleep)`).
fn status_state(status: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(status).ok()?;
    let line = text.lines().find(|l| l.starts_with("State:"))?;
    line["State:".len()..].trim_start().bytes().next()
}

/// Whether a `/proc/<pid>/status` text shows a signal pending (to the thread or its
/// process) that the thread neither blocks nor ignores.
fn signal_deliverable(status: &[u8]) -> bool {
    let mask = |name: &str| -> Option<u64> {
        let text = std::str::from_utf8(status).ok()?;
        let line = text.lines().find(|l| l.starts_with(name))?;
        u64::from_str_radix(line[name.len()..].trim(), 16).ok()
    };
    let (Some(pnd), Some(shd), Some(blk), Some(ign)) = (
        mask("SigPnd:"),
        mask("ShdPnd:"),
        mask("SigBlk:"),
        mask("SigIgn:"),
    ) else {
        return false;
    };
    (pnd | shd) & !blk & !ign != 0
}

#[cfg(test)]
mod test {
    use super::proc_is_ours;
    use super::signal_deliverable;
    use super::status_state;

    #[test]
    fn the_state_letter() {
        assert_eq!(
            status_state(b"Name:\tx\nState:\tD (disk sleep)\n"),
            Some(b'D')
        );
        assert_eq!(
            status_state(b"Name:\tx\nState:\tS (sleeping)\n"),
            Some(b'S')
        );
        assert_eq!(status_state(b"Name:\tx\n"), None);
        let own = std::fs::read("/proc/thread-self/status").unwrap();
        assert_eq!(status_state(&own), Some(b'R'));
    }

    #[test]
    fn proc_here_is_of_this_namespace() {
        assert!(proc_is_ours());
    }

    fn status(pnd: u64, shd: u64, blk: u64, ign: u64) -> String {
        format!(
            "Name:\tx\nState:\tD (disk sleep)\nSigQ:\t1/100\nSigPnd:\t{pnd:016x}\n\
             ShdPnd:\t{shd:016x}\nSigBlk:\t{blk:016x}\nSigIgn:\t{ign:016x}\n\
             SigCgt:\t0000000000000000\n"
        )
    }

    #[test]
    fn a_pending_signal_counts_unless_blocked_or_ignored() {
        let kill = 1 << (9 - 1);
        let alrm = 1 << (14 - 1);
        assert!(signal_deliverable(status(kill, 0, 0, 0).as_bytes()));
        assert!(signal_deliverable(status(0, alrm, 0, 0).as_bytes()));
        assert!(!signal_deliverable(status(0, alrm, alrm, 0).as_bytes()));
        assert!(!signal_deliverable(status(alrm, 0, 0, alrm).as_bytes()));
        assert!(!signal_deliverable(status(0, 0, 0, 0).as_bytes()));
        assert!(!signal_deliverable(b"Name:\tx\nSigPnd:\tzz\n"));
    }
}
