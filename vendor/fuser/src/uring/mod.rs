//! FUSE over io_uring (Linux 6.14+, `fs/fuse/dev_uring.c`): one ring per possible CPU,
//! each served by a thread pinned to that CPU, beside the `/dev/fuse` threads.
//!
//! # How a connection gets it
//! Asked for with [`Config::io_uring`](crate::Config::io_uring). At `INIT`, if the
//! kernel offers `FUSE_OVER_IO_URING` and the rings can be made, the reply accepts the
//! flag with a `max_write` that keeps an entry at 128 KiB; otherwise the session says
//! why in [`Transport::DevFuseRefused`] and serves `/dev/fuse` only. Once the flag is
//! accepted, the kernel holds every request until each queue has an entry registered:
//! [`Session::run`](crate::Session::run) registers them first thing.
//!
//! # Invariants
//! * A request arrives in a ring entry and its reply can only leave through that entry
//!   (`COMMIT_AND_FETCH`), so a parked request holds its entry. Each queue keeps at
//!   least `depth` entries fetching by registering a new one whenever one parks: the
//!   pool is the most requests ever parked on the queue plus `depth`.
//! * An entry's memory is touched by one party at a time, by phase (see
//!   [`entry::RingEntry`]): the kernel while fetching, the queue thread while
//!   dispatching (or a worker, for a request that may block: see [`offload`]), one
//!   reply after that. The slot's lock orders the hand-overs.
//! * Only the queue thread pushes SQEs and reaps CQEs of its ring; other threads hand it
//!   replies through the commit list and wake it with an eventfd.
//! * Forgets, interrupts and notifications stay on `/dev/fuse` (the kernel sends them
//!   there), and so do the passthrough backing-file ioctls.
//! * An interrupt the kernel failed to send for a parked request is made up by the
//!   sweep ([`sweep`]), from its caller's state in `/proc`.
//!
//! Lock order: a queue's entry list, then an entry's slot, then the queue's commit list.

mod abi;
mod entry;
mod kick;
mod offload;
mod queue;
mod reply;
mod stats;
mod sweep;

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::squeue::Entry128;
use log::warn;

pub use offload::MayBlock;
pub(crate) use reply::QueueShared;
pub(crate) use reply::RingReply;
pub use stats::IoUringStats;
pub use stats::QueueStats;
pub(crate) use sweep::Sweeper;
pub(crate) use sweep::lose_interrupts;

use crate::Filesystem;
use crate::KernelConfig;
use crate::channel::Channel;
use crate::ll::flags::init_flags::InitFlags;
use crate::session::SessionEventLoop;

/// The largest request or reply an entry carries (I/O goes through kernel passthrough,
/// so little needs more; larger writes are split by the kernel).
const ENTRY_PAYLOAD: u32 = 128 * 1024;
/// Submission queue size of each ring (a batch; the pool of entries is not bounded by it).
const RING_ENTRIES: u32 = 256;

/// How to serve a connection over io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoUringConfig {
    /// Entries each queue keeps fetching (registered at start; more are registered as
    /// requests park).
    pub depth: usize,
    /// Which requests, by opcode, may wait long and are served by worker threads (as
    /// many as the session's `n_threads`) instead of their queue's thread, which would
    /// hold its CPU's other requests meanwhile (see [`offload`]). `None`: all inline.
    pub offload: Option<MayBlock>,
}

impl Default for IoUringConfig {
    fn default() -> Self {
        IoUringConfig {
            depth: 8,
            offload: None,
        }
    }
}

/// What carries a session's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// `/dev/fuse` (io_uring not asked for).
    DevFuse,
    /// `/dev/fuse`: io_uring was asked for and could not be had.
    DevFuseRefused {
        /// Why, for the log.
        reason: String,
    },
    /// io_uring, beside `/dev/fuse` for forgets, interrupts and notifications.
    IoUring {
        /// Queues (one per possible CPU).
        queues: usize,
        /// Entries each queue keeps fetching.
        depth: usize,
        /// Bytes of payload per entry.
        payload_size: usize,
    },
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::DevFuse => write!(f, "/dev/fuse"),
            Transport::DevFuseRefused { reason } => {
                write!(f, "/dev/fuse (io_uring refused: {reason})")
            }
            Transport::IoUring {
                queues,
                depth,
                payload_size,
            } => write!(
                f,
                "io_uring ({queues} queues, depth {depth}, {} KiB entries)",
                payload_size / 1024
            ),
        }
    }
}

/// The rings made at `INIT`, waiting for [`Session::run`](crate::Session::run).
pub(crate) struct Rings {
    rings: Vec<IoUring<Entry128>>,
    pub(crate) shared: Vec<Arc<QueueShared>>,
    depth: usize,
    payload_size: usize,
    offload: Option<MayBlock>,
    /// The mountpoint, for the kickers (none without one: see [`kick`]).
    pub(crate) kick_path: Option<std::path::PathBuf>,
}

impl fmt::Debug for Rings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rings")
            .field("queues", &self.rings.len())
            .field("depth", &self.depth)
            .field("payload_size", &self.payload_size)
            .finish()
    }
}

impl Rings {
    /// The transport these rings give.
    pub(crate) fn transport(&self) -> Transport {
        Transport::IoUring {
            queues: self.rings.len(),
            depth: self.depth,
            payload_size: self.payload_size,
        }
    }

    /// A handle on the queues' counters.
    pub(crate) fn stats(&self) -> IoUringStats {
        IoUringStats {
            queues: self.shared.clone(),
        }
    }
}

/// At `INIT`, before replying: checks that the kernel offers FUSE over io_uring, sizes
/// the entries in `config` and makes one ring per possible CPU, then accepts the flag.
/// `Err` says why io_uring cannot be had; `config` is then as it was.
pub(crate) fn prepare(
    offered: InitFlags,
    config: &mut KernelConfig,
    asked: &IoUringConfig,
) -> Result<Rings, String> {
    if !offered.contains(InitFlags::FUSE_OVER_IO_URING) {
        return Err(
            "the kernel does not offer it: it needs Linux >= 6.14 built with \
                    CONFIG_FUSE_IO_URING, and /sys/module/fuse/parameters/enable_uring set to Y"
                .to_string(),
        );
    }
    let queues = possible_cpus().map_err(|e| format!("cannot count the possible CPUs: {e}"))?;
    let mut rings = Vec::with_capacity(queues);
    let mut shared = Vec::with_capacity(queues);
    let slow = Arc::new(offload::SlowSource::default());
    for qid in 0..queues {
        let ring = IoUring::<Entry128>::builder()
            .setup_coop_taskrun()
            .build(RING_ENTRIES)
            .map_err(|e| format!("cannot make an io_uring: {e}"))?;
        rings.push(ring);
        let q = u16::try_from(qid).map_err(|_| format!("{queues} possible CPUs"))?;
        shared.push(Arc::new(
            QueueShared::new(q, slow.clone())
                .map_err(|e| format!("cannot make an eventfd: {e}"))?,
        ));
    }
    // The kernel wants each payload buffer >= max(8192, max_write, max_pages * PAGE_SIZE)
    // (max_pages is 32 when not negotiated).
    config.max_write = config.max_write.min(ENTRY_PAYLOAD);
    config.max_readahead = config.max_readahead.min(ENTRY_PAYLOAD);
    let page = page_size::get();
    let pages = if config.requested.contains(InitFlags::FUSE_MAX_PAGES) {
        usize::from(config.max_pages()).max(32)
    } else {
        32
    };
    let payload_size = 8192.max(config.max_write as usize).max(pages * page);
    config
        .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
        .map_err(|_| "the kernel does not offer it".to_string())?;
    Ok(Rings {
        rings,
        shared,
        depth: asked.depth.max(1),
        payload_size,
        offload: asked.offload,
        kick_path: None,
    })
}

/// The threads [`spawn`] started: joined queue threads first (the workers end once
/// the queues are gone), then the workers, then the sweep.
pub(crate) struct RingThreads {
    pub(crate) queues: Vec<JoinHandle<()>>,
    pub(crate) workers: Vec<JoinHandle<()>>,
    pub(crate) sweeper: Sweeper,
}

/// Starts one thread per queue, named `fuser-uring-<cpu>` and pinned to that CPU, each
/// dispatching through an event loop from `event_loop`, `workers` threads for the
/// requests that may block (with an offload predicate), and the sweep of parked
/// requests. `ch` is the connection's `/dev/fuse` channel the commands go to.
pub(crate) fn spawn<FS: Filesystem>(
    rings: Rings,
    ch: &Channel,
    workers: usize,
    event_loop: impl Fn(usize) -> SessionEventLoop<FS>,
) -> io::Result<RingThreads> {
    let dev = ch.as_fd().as_raw_fd();
    let queues = rings.rings.len();
    let sweeper = Sweeper::spawn(rings.shared.clone(), event_loop(0).filesystem)?;
    let (offload, worker_threads) = match rings.offload {
        Some(wants) => {
            let (o, t) = offload::spawn(wants.0, workers, |i| event_loop(queues + i))?;
            (Some(o), t)
        }
        None => (None, Vec::new()),
    };
    let mut threads = Vec::with_capacity(queues);
    for (ring, shared) in rings.rings.into_iter().zip(rings.shared) {
        let qid = usize::from(shared.qid);
        let kicker = match &rings.kick_path {
            Some(p) => Some(kick::Kicker::spawn(shared.clone(), p.clone(), pin_to_cpu)?),
            None => None,
        };
        let q = queue::QueueThread {
            ring,
            shared,
            dev,
            depth: rings.depth,
            payload_size: rings.payload_size,
            se: event_loop(qid),
            entries: Vec::new(),
            fetching: 0,
            parked: 0,
            ended: false,
            wake_buf: Box::leak(Box::new([0u8; 8])),
            said_many: false,
            reserve: rings.depth,
            kicker,
            kick_mode: false,
            kicks_issued: 0,
            kicks_seen: 0,
            exhausted: false,
            deferred: Vec::new(),
            probe: std::time::Duration::from_millis(1),
            probing_round: false,
            offload: offload.clone(),
            in_workers: 0,
        };
        threads.push(
            std::thread::Builder::new()
                .name(format!("fuser-uring-{qid}"))
                .spawn(move || {
                    let _ = pin_to_cpu(qid);
                    q.run();
                })?,
        );
    }
    Ok(RingThreads {
        queues: threads,
        workers: worker_threads,
        sweeper,
    })
}

/// Pins the calling thread to `cpu`; if that fails (an offline CPU) it runs unpinned
/// and the answer is false.
fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: `cpu_set_t` is plain data, zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: CPU_SET writes within `set` for cpu < CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a live, initialised set.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        warn!(
            "io_uring queue {cpu}: cannot pin to CPU {cpu} ({}), running unpinned",
            io::Error::last_os_error()
        );
    }
    rc == 0
}

/// How many CPUs are possible (the kernel's `num_possible_cpus()`, its queue count).
fn possible_cpus() -> io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpu_list(list.trim())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {list:?}")))
}

/// Counts a kernel CPU list such as `0-3,8,10-11`.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                b.parse::<usize>()
                    .ok()?
                    .checked_sub(a.parse::<usize>().ok()?)?
                    + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod test {
    use super::count_cpu_list;

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }
}
