//! A team of forked worker processes that start together.
//!
//! Shared state between the parent and its children is an anonymous `MAP_SHARED`
//! mapping: a header (go and stop flags) and one 128-byte [`WorkerSlot`] per worker.
//! Children start behind a barrier: each opens its file, writes one byte to a status pipe
//! when ready and blocks reading a go pipe, which the parent closes to start them all at
//! once. The status pipe's write end stays open in every child until it exits, so its
//! end-of-file tells the parent that all have exited. Everything created (children,
//! the mapping, descriptors) is owned by the [`Team`], which kills, reaps, unmaps and
//! closes on every path.
//!
//! The caller may be multi-threaded, so after `fork` a child makes only async-signal-safe
//! system calls on data prepared before `fork`: no allocation, no locks, no std I/O, no
//! panics. [`ForkedWork::run`] is held to the same rule. Children die with the forking
//! thread (`PR_SET_PDEATHSIG`), which outlives them.

use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{c_char, c_int, pid_t};

/// How long all workers may take to start and report ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What a forked worker does once the team goes.
///
/// `run` executes in the child after `fork` while the parent may have other threads, so
/// it may make only async-signal-safe system calls on data prepared before `fork`: no
/// allocation, no locks, no std I/O, no panics.
pub trait ForkedWork: Copy {
    /// What each failure of `run` names, by [`WorkFailed::stage`].
    const STAGES: &'static [&'static str];

    /// The measured part, on the worker's open file `fd`.
    fn run(self, fd: c_int, worker: &Worker<'_>) -> Result<(), WorkFailed>;
}

/// How [`ForkedWork::run`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkFailed {
    /// Index into [`ForkedWork::STAGES`].
    pub stage: usize,
    /// The errno.
    pub errno: c_int,
}

/// A worker's view of the team from inside the child.
pub struct Worker<'a> {
    header: &'a Header,
    /// The worker's own slot.
    pub slot: &'a WorkerSlot,
}

impl Worker<'_> {
    /// Whether the parent asked a timed workload to finish ([`Team::stop`]).
    #[inline]
    pub fn stop_requested(&self) -> bool {
        self.header.stop.load(Ordering::Relaxed) != 0
    }
}

/// The run's flags.
#[repr(C, align(128))]
struct Header {
    /// Set (1) by the parent just before it opens the barrier; a child woken without it
    /// exits (the parent went away or gave up).
    go: AtomicU32,
    /// Set (1) by the parent to end a timed workload.
    stop: AtomicU32,
}

/// One worker's slot; 128 bytes so that neighbours share neither a cache line nor an
/// adjacent-line prefetch pair. `count`, `loop_ns` and `end_ns` are the work's to fill.
#[repr(C, align(128))]
pub struct WorkerSlot {
    /// What the work counts (acquisitions, pairs done).
    pub count: AtomicU64,
    /// The time the work spent in its loop.
    pub loop_ns: AtomicU64,
    /// `CLOCK_MONOTONIC` ([`mono_ns`]) when the work's loop ended.
    pub end_ns: AtomicU64,
    /// The stage that failed (an index into the team's stages + 1), 0 if none.
    stage: AtomicU32,
    /// The errno of the failure.
    errno: AtomicI32,
}

/// An anonymous shared mapping of a [`Header`] and `n` [`WorkerSlot`]s, all zero at
/// first.
struct Shared {
    base: *mut libc::c_void,
    len: usize,
    n: usize,
}

impl Shared {
    fn new(n: usize) -> io::Result<Shared> {
        let len = std::mem::size_of::<Header>() + n * std::mem::size_of::<WorkerSlot>();
        let base = map_shared(len)?;
        Ok(Shared { base, len, n })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page-aligned, zero = valid atomics)
        // and lives as long as `self`.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot(&self, i: usize) -> &WorkerSlot {
        assert!(i < self.n, "slot {i} of {}", self.n);
        // SAFETY: slot `i < n` lies inside the mapping, suitably aligned.
        unsafe {
            &*(self.base as *const u8)
                .add(std::mem::size_of::<Header>())
                .cast::<WorkerSlot>()
                .add(i)
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference outlives `self`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A fresh anonymous `MAP_SHARED` mapping of `len` bytes, all zero, which forked
/// children inherit. The caller unmaps it.
pub fn map_shared(len: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot map {len} bytes of shared memory: {e}"),
        ));
    }
    Ok(base)
}

// ---------------------------------------------------------------------------------------
// The child side. Everything from here to the parent side runs after fork: only
// async-signal-safe system calls on data prepared before fork, no allocation, no panics.
// ---------------------------------------------------------------------------------------

/// The child's go pipe (read end) and status pipe (write end) are placed at these
/// numbers; every other inherited descriptor is closed.
const GO_FD: c_int = 0;
const STATUS_FD: c_int = 1;

/// What a failing child reports before its work runs, by index + 1 in the slot's stage;
/// the work's own stages follow.
const SETUP_STAGES: [&str; 5] = [
    "prctl(PR_SET_PDEATHSIG)",
    "placing its pipes (dup2)",
    "close_range",
    "open",
    "waiting for the go signal",
];
const STAGE_PDEATHSIG: u32 = 1;
const STAGE_FDS: u32 = 2;
const STAGE_CLOSE: u32 = 3;
const STAGE_OPEN: u32 = 4;
const STAGE_GO: u32 = 5;

/// Everything a child needs, prepared before `fork`.
struct ChildSpec<W> {
    parent: pid_t,
    go_r: c_int,
    status_w: c_int,
    path: *const c_char,
    header: *const Header,
    slot: *const WorkerSlot,
    work: W,
}

/// Ends the child without running anything of the parent's (`_exit`, not `exit`).
fn child_exit(status: c_int) -> ! {
    // SAFETY: `_exit` is async-signal-safe.
    unsafe { libc::_exit(status) }
}

/// Records the failure in the slot, tells the parent, and exits.
fn child_fail(slot: &WorkerSlot, status_fd: c_int, stage: u32, err: c_int) -> ! {
    slot.errno.store(err, Ordering::Relaxed);
    slot.stage.store(stage, Ordering::Release);
    // SAFETY: a one-byte write from a static.
    unsafe { libc::write(status_fd, b"E".as_ptr().cast(), 1) };
    child_exit(1)
}

/// A worker's life: set up, report ready, wait for go, work, exit. Never returns.
fn child_main<W: ForkedWork>(s: &ChildSpec<W>) -> ! {
    // SAFETY: the mapping outlives the child (it is inherited and never unmapped here).
    let (hdr, slot) = unsafe { (&*s.header, &*s.slot) };
    // SAFETY: plain system calls on integers.
    unsafe {
        // Die with the parent (strictly: the forking thread, which waits for us), or a
        // worker could be left looping or blocked forever.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            child_fail(slot, s.status_w, STAGE_PDEATHSIG, errno());
        }
        if libc::getppid() != s.parent {
            child_exit(2);
        }
        // Move both pipe ends above the fixed numbers first, so placing one cannot
        // overwrite the other, then place them.
        let go = libc::fcntl(s.go_r, libc::F_DUPFD, STATUS_FD + 1);
        let status = libc::fcntl(s.status_w, libc::F_DUPFD, STATUS_FD + 1);
        if go < 0 || status < 0 {
            child_fail(slot, s.status_w, STAGE_FDS, errno());
        }
        if libc::dup2(go, GO_FD) != GO_FD || libc::dup2(status, STATUS_FD) != STATUS_FD {
            child_fail(slot, s.status_w, STAGE_FDS, errno());
        }
        // Everything else goes: above all the go pipe's write end (or the barrier never
        // opens) and the status pipe's read end; also other workers' files.
        if libc::syscall(
            libc::SYS_close_range,
            (STATUS_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            0,
        ) != 0
        {
            child_fail(slot, STATUS_FD, STAGE_CLOSE, errno());
        }
        let fd = libc::open(s.path, libc::O_RDWR);
        if fd < 0 {
            child_fail(slot, STATUS_FD, STAGE_OPEN, errno());
        }
        libc::write(STATUS_FD, b"R".as_ptr().cast(), 1);
        // The barrier: the parent closes the go pipe's write end.
        let mut byte = 0u8;
        loop {
            match libc::read(GO_FD, (&mut byte as *mut u8).cast(), 1) {
                0 => break,
                n if n < 0 && errno() == libc::EINTR => {}
                n if n < 0 => child_fail(slot, STATUS_FD, STAGE_GO, errno()),
                _ => {}
            }
        }
        if hdr.go.load(Ordering::Acquire) == 0 {
            child_exit(0);
        }
        let worker = Worker { header: hdr, slot };
        match s.work.run(fd, &worker) {
            Ok(()) => child_exit(0),
            Err(f) => child_fail(
                slot,
                STATUS_FD,
                SETUP_STAGES.len() as u32 + 1 + f.stage as u32,
                f.errno,
            ),
        }
    }
}

/// The calling thread's `errno`. Async-signal-safe.
pub fn errno() -> c_int {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// `CLOCK_MONOTONIC` in nanoseconds (one clock for all processes). Async-signal-safe.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Wrapping: this also runs in children, which must not panic.
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

// ---------------------------------------------------------------------------------------
// The parent side.
// ---------------------------------------------------------------------------------------

/// Forked children not yet reaped; dropping kills (`SIGKILL`) and reaps them.
struct Children {
    pids: Vec<pid_t>,
}

impl Children {
    fn with_capacity(n: usize) -> Children {
        Children {
            pids: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, pid: pid_t) {
        self.pids.push(pid);
    }

    /// Waits for child `index` (blocking) and forgets it: its wait status and rusage.
    fn reap(&mut self, index: usize) -> io::Result<(c_int, libc::rusage)> {
        let pid = self.pids[index];
        // SAFETY: all-zero is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut status = 0;
        loop {
            // SAFETY: wait4 writes into the two locals.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            if r == pid {
                self.pids[index] = 0;
                return Ok((status, ru));
            }
            let e = errno();
            if e != libc::EINTR {
                let e = io::Error::from_raw_os_error(e);
                return Err(io::Error::new(e.kind(), format!("waiting for worker {pid}: {e}")));
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in self.pids.iter().filter(|&&p| p > 0) {
            // SAFETY: `pid` is our unreaped child, so it cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in self.pids.iter().filter(|&&p| p > 0) {
            let mut status = 0;
            // SAFETY: waits for our own child; the status goes into a local.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && errno() == libc::EINTR {}
        }
        self.pids.clear();
    }
}

/// Whether `fork` works here: forks a child that exits at once and reaps it.
pub fn probe_fork() -> io::Result<()> {
    let mut children = Children::with_capacity(1);
    // SAFETY: the child only calls `_exit`.
    match unsafe { libc::fork() } {
        -1 => {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("fork failed: {e}")));
        }
        0 => child_exit(0),
        pid => children.push(pid),
    }
    let (status, _) = children.reap(0)?;
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(io::Error::other(format!(
            "a forked probe child ended with status {status:#x}"
        )));
    }
    Ok(())
}

/// A team of forked workers with their pipes and shared slots. Fields drop in order:
/// children are killed and reaped first.
pub struct Team<W> {
    children: Children,
    go_w: Option<OwnedFd>,
    status_r: OwnedFd,
    shared: Shared,
    tasks: usize,
    _work: std::marker::PhantomData<W>,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("pipe2: {e}")));
    }
    // SAFETY: both are fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl<W: ForkedWork> Team<W> {
    /// Forks `tasks` workers; worker `i` opens the file `spec(i).0` (read-write) and,
    /// after [`Team::go`], does `spec(i).1`. The path must stay valid until this returns.
    pub fn spawn(tasks: usize, spec: impl Fn(usize) -> (*const c_char, W)) -> io::Result<Team<W>> {
        let shared = Shared::new(tasks)?;
        let (go_r, go_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let mut team = Team {
            children: Children::with_capacity(tasks),
            go_w: Some(go_w),
            status_r,
            shared,
            tasks,
            _work: std::marker::PhantomData,
        };
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        for i in 0..tasks {
            let (path, work) = spec(i);
            let child = ChildSpec {
                parent,
                go_r: go_r.as_raw_fd(),
                status_w: status_w.as_raw_fd(),
                path,
                header: team.shared.header(),
                slot: team.shared.slot(i),
                work,
            };
            // SAFETY: the child runs only `child_main`, which makes async-signal-safe
            // system calls on `child` (a copy in its own memory) and never returns.
            match unsafe { libc::fork() } {
                -1 => {
                    let e = io::Error::last_os_error();
                    return Err(io::Error::new(
                        e.kind(),
                        format!("fork failed after {i} of {tasks} workers: {e}"),
                    ));
                }
                0 => child_main(&child),
                pid => team.children.push(pid),
            }
        }
        // The children hold the status pipe's write end until they exit; the parent's
        // copy goes so that end-of-file means "all exited".
        drop(status_w);
        drop(go_r);
        Ok(team)
    }

    /// Worker `i`'s slot.
    pub fn slot(&self, i: usize) -> &WorkerSlot {
        self.shared.slot(i)
    }

    /// The first worker that reported a failure, as a reason.
    fn failure(&self) -> Option<io::Error> {
        (0..self.tasks).find_map(|i| {
            let slot = self.slot(i);
            match slot.stage.load(Ordering::Acquire) as usize {
                0 => None,
                stage => {
                    let name = SETUP_STAGES
                        .iter()
                        .chain(W::STAGES)
                        .nth(stage - 1)
                        .copied()
                        .unwrap_or("?");
                    let e = io::Error::from_raw_os_error(slot.errno.load(Ordering::Relaxed));
                    Some(io::Error::new(
                        e.kind(),
                        format!("worker {i}: {name} failed: {e}"),
                    ))
                }
            }
        })
    }

    /// Reads the status pipe until `want` ready bytes (Some) or end-of-file (None) or the
    /// timeout. Returns the ready bytes seen; any error byte is an error.
    fn read_status(&self, want: Option<usize>, timeout: Duration, what: &str) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut ready = 0;
        let mut buf = [0u8; 4096];
        loop {
            if want.is_some_and(|w| ready >= w) {
                return Ok(ready);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "workers did not {what} within {timeout:?} ({ready} of {} ready)",
                        self.tasks
                    ),
                ));
            }
            let mut pfd = libc::pollfd {
                fd: self.status_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, 60_000) as c_int;
            // SAFETY: poll on one pollfd we own.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 && errno() != libc::EINTR {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(e.kind(), format!("poll: {e}")));
            }
            if r <= 0 {
                continue;
            }
            // SAFETY: reads into a local buffer of the given size.
            let n = unsafe { libc::read(self.status_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => {
                    return match want {
                        None => Ok(ready),
                        Some(_) => Err(self.failure().unwrap_or_else(|| {
                            io::Error::other(format!(
                                "workers exited before all were ready ({ready} of {})",
                                self.tasks
                            ))
                        })),
                    }
                }
                n if n < 0 => {
                    if errno() != libc::EINTR {
                        let e = io::Error::last_os_error();
                        return Err(io::Error::new(e.kind(), format!("reading the status pipe: {e}")));
                    }
                }
                n => {
                    let got = &buf[..n as usize];
                    if got.contains(&b'E') {
                        return Err(self
                            .failure()
                            .unwrap_or_else(|| io::Error::other("a worker failed without saying why")));
                    }
                    ready += got.iter().filter(|&&b| b == b'R').count();
                }
            }
        }
    }

    /// Waits until every worker is at the barrier.
    pub fn wait_ready(&mut self) -> io::Result<()> {
        self.read_status(Some(self.tasks), START_TIMEOUT, "start")
            .map(|_| ())
    }

    /// Opens the barrier; returns the time it did ([`mono_ns`]).
    pub fn go(&mut self) -> u64 {
        self.shared.header().go.store(1, Ordering::Release);
        let t0 = mono_ns();
        self.go_w = None;
        t0
    }

    /// Tells the workers of a timed workload to finish.
    pub fn stop(&self) {
        self.shared.header().stop.store(1, Ordering::Release);
    }

    /// Waits until every worker has exited (within `timeout`), reaps them all and checks
    /// they succeeded; their rusage, in worker order.
    pub fn finish(&mut self, timeout: Duration) -> io::Result<Vec<libc::rusage>> {
        self.read_status(None, timeout, "exit")?;
        let mut usage = Vec::with_capacity(self.tasks);
        let mut bad = None;
        for i in 0..self.children.pids.len() {
            let (status, ru) = self.children.reap(i)?;
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) && bad.is_none() {
                bad = Some((i, status));
            }
            usage.push(ru);
        }
        if let Some((i, status)) = bad {
            return Err(self.failure().unwrap_or_else(|| {
                let mut why = format!("worker {i} ended with wait status {status:#x}");
                if libc::WIFSIGNALED(status) {
                    let _ = write!(why, " (signal {})", libc::WTERMSIG(status));
                }
                io::Error::other(why)
            }));
        }
        Ok(usage)
    }
}
