//! The mount with `-o io_uring`: requests over the kernel's FUSE io_uring queues
//! (Linux 6.14+, `/sys/module/fuse/parameters/enable_uring`), parked lock waits that do
//! not stall them, interrupts, forgets and unmount; and the refusal when the parameter
//! is off.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{cannot_mount, say, Mounted};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// Serialises the tests that set the parameter (here and in other test processes).
const PARAM_LOCK: &str = "/run/vfscalefs-test-enable-uring.lock";

/// Holds the parameter at a value and puts back what it was on drop (a failed test
/// included), under a lock that keeps other such tests out meanwhile.
struct Param {
    old: String,
    _lock: nix::fcntl::Flock<File>,
}

impl Param {
    fn set(value: &str) -> Param {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(PARAM_LOCK)
            .unwrap();
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .unwrap();
        let old = std::fs::read_to_string(PARAM).unwrap().trim().to_string();
        std::fs::write(PARAM, value).unwrap();
        Param { old, _lock: lock }
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = std::fs::write(PARAM, &self.old);
    }
}

/// The parameter held at `value`, or `None` (with a SKIP line) where these tests cannot
/// run.
fn param(value: &str) -> Option<Param> {
    let why = match cannot_mount() {
        Some(why) => why,
        None if !Path::new(PARAM).exists() => {
            format!("no {PARAM} (a kernel without FUSE over io_uring)")
        }
        None => return Some(Param::set(value)),
    };
    say(&format!("SKIP: {why}"));
    None
}

/// Starts the server with its stderr sent to a file; gives back what it printed at
/// mount.
fn start_logged(opts: &str) -> (Mounted, String) {
    let log = std::env::temp_dir().join(format!(
        "vfscalefs-io-uring-{}-{}.log",
        std::process::id(),
        opts.len()
    ));
    let file = File::create(&log).unwrap();
    // The child inherits fd 2 at spawn: point it at the file for that moment.
    // SAFETY: dup/dup2 on descriptors this process owns; fd 2 is put back below.
    let saved = unsafe { libc::dup(2) };
    assert!(saved >= 0);
    // SAFETY: as above.
    unsafe { libc::dup2(file.as_raw_fd(), 2) };
    let m = Mounted::start(1, opts);
    // SAFETY: as above.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (m.unwrap(), text)
}

/// The server's threads named `prefix*`.
fn threads_named(pid: i32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|c| c.starts_with(prefix))
        .count()
}

/// `field` (`VmSize`, `VmRSS`) of the server's `/proc/PID/status`, in KiB.
fn vm_kib(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
        .unwrap()
}

/// An OFD lock request on `f` (`F_OFD_SETLK`/`F_OFD_SETLKW`).
fn ofd(f: &File, cmd: libc::c_int, typ: libc::c_int) -> Result<(), i32> {
    // SAFETY: flock is plain data; zero is a valid value before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid descriptor and a live flock struct.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// A thread waiting in `F_OFD_SETLKW` for a write lock on a file, which a `SIGUSR2`
/// (handled by a handler that does nothing, without `SA_RESTART`) interrupts unless the
/// thread blocks it.
struct OfdWaiter {
    tid: libc::pthread_t,
    thread: std::thread::JoinHandle<()>,
}

impl OfdWaiter {
    /// Starts the wait on `path` (with `SIGUSR2` blocked in the thread if `block`); the
    /// receiver gets its result.
    fn start(path: &Path, block: bool) -> (OfdWaiter, mpsc::Receiver<Result<(), i32>>) {
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, installed without SA_RESTART.
        unsafe {
            nix::sys::signal::sigaction(
                nix::sys::signal::Signal::SIGUSR2,
                &nix::sys::signal::SigAction::new(
                    nix::sys::signal::SigHandler::Handler(nothing),
                    nix::sys::signal::SaFlags::empty(),
                    nix::sys::signal::SigSet::empty(),
                ),
            )
            .unwrap();
        }
        let (tx, rx) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let p = path.to_path_buf();
        let thread = std::thread::spawn(move || {
            if block {
                let mut set = nix::sys::signal::SigSet::empty();
                set.add(nix::sys::signal::Signal::SIGUSR2);
                set.thread_block().unwrap();
            }
            let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
            // SAFETY: pthread_self has no preconditions.
            tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
            tx.send(ofd(&f, libc::F_OFD_SETLKW, libc::F_WRLCK)).unwrap();
        });
        let tid = tid_rx.recv().unwrap();
        (OfdWaiter { tid, thread }, rx)
    }

    /// Sends the thread `SIGUSR2`.
    fn signal(&self) {
        // SAFETY: the thread is alive until joined (it ends only after its wait).
        unsafe { libc::pthread_kill(self.tid, libc::SIGUSR2) };
    }

    fn join(self) {
        self.thread.join().unwrap();
    }
}

/// Files through the mount: create, write, read, rename, readdir, chmod, unlink.
fn exercise_files(dir: &Path) {
    let a = dir.join("a");
    let mut f = File::create(&a).unwrap();
    f.write_all(b"over the ring").unwrap();
    drop(f);
    let mut s = String::new();
    File::open(&a).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "over the ring");
    let b = dir.join("b");
    std::fs::rename(&a, &b).unwrap();
    assert!(!a.exists());
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["b".to_string()]);
    std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(std::fs::metadata(&b).unwrap().permissions().mode() & 0o777, 0o640);
    // A write larger than an entry's payload is split by the kernel.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    let mut f = OpenOptions::new().write(true).read(true).open(&b).unwrap();
    f.write_all(&big).unwrap();
    f.rewind().unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == big, "a 1 MB write read back differs");
    drop(f);
    std::fs::remove_file(&b).unwrap();
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
}

#[test]
fn mount_over_io_uring_says_so_and_serves_files() {
    let Some(_p) = param("Y") else {
        return;
    };
    let (m, text) = start_logged("io_uring_depth=4");
    assert!(
        text.contains("requests over io_uring") && text.contains("depth 4"),
        "the mount's line: {text:?}"
    );
    assert!(threads_named(m.pid(), "fuser-uring-") >= 1, "no queue thread");
    exercise_files(&m.mounts[0]);
    // The same with passthrough off: reads and writes then come over the rings too.
    drop(m);
    let m = Mounted::start(1, "io_uring,nopassthrough").unwrap();
    exercise_files(&m.mounts[0]);
}

#[test]
fn refused_when_the_parameter_is_off() {
    let Some(_p) = param("N") else {
        return;
    };
    let (m, text) = start_logged("io_uring");
    assert!(
        text.contains("io_uring refused") && text.contains("enable_uring") && text.contains("/dev/fuse"),
        "the mount's line: {text:?}"
    );
    assert_eq!(
        threads_named(m.pid(), "fuser-uring-"),
        0,
        "queue threads without io_uring"
    );
    exercise_files(&m.mounts[0]);
}

#[test]
fn parked_wait_granted_later_and_interrupted() {
    let Some(_p) = param("Y") else {
        return;
    };
    let m = Mounted::start(1, "io_uring").unwrap();
    let path = m.mounts[0].join("lk");
    let holder = File::create(&path).unwrap();
    ofd(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();

    // A wait granted by the holder's unlock.
    let (tx, rx) = mpsc::channel();
    let p = path.clone();
    let waiter = std::thread::spawn(move || {
        let f = File::open(&p).unwrap();
        tx.send(ofd(&f, libc::F_OFD_SETLKW, libc::F_RDLCK)).unwrap();
        // Unlocked before the close, whose release reaches the server later.
        ofd(&f, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the wait ended while the lock was held"
    );
    // Parked: the mount still answers.
    std::fs::metadata(&m.mounts[0]).unwrap();
    ofd(&holder, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the wait was not granted");
    assert_eq!(got, Ok(()));
    waiter.join().unwrap();

    // A wait interrupted by a signal: EINTR.
    ofd(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
    let (waiter, rx) = OfdWaiter::start(&path, false);
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the wait ended while the lock was held"
    );
    waiter.signal();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the interrupted wait did not end");
    assert_eq!(got, Err(libc::EINTR));
    waiter.join();
    // Nothing left behind: the holder's lock goes and another takes it at once.
    ofd(&holder, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    let other = OpenOptions::new().write(true).open(&path).unwrap();
    ofd(&other, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
}

/// An `INTERRUPT` the kernel did not send (Linux 6.18 loses the one of a request signalled
/// between its assignment to a ring entry and its copy-out; here the server drops every
/// one it is sent, `FUSER_TEST_LOSE_INTERRUPTS`): the server sees the waiting caller's
/// pending signal and ends the parked wait itself. A killed `flock(1)` dies, and a thread
/// whose handler has no `SA_RESTART` gets `EINTR`; without the sweep both wait for the
/// holder. A waiter that blocks the signal sent to it waits on and is granted.
#[test]
fn a_wait_whose_interrupt_was_lost_ends() {
    let Some(_p) = param("Y") else {
        return;
    };
    if let Some(why) = common::missing_tool("flock") {
        return say(&format!("SKIP: {why}"));
    }
    let t = common::TempDir::new("lost-interrupt");
    let sf = t.0.join("stats");
    let one = Path::new("1");
    let m = Mounted::start_env(
        1,
        "io_uring",
        &[("FUSER_TEST_LOSE_INTERRUPTS", one), ("VFSCALEFS_STATS", &sf)],
    )
    .unwrap();
    assert!(m.serves_io_uring(), "the server does not serve io_uring");
    let path = m.mounts[0].join("lk");
    let holder = File::create(&path).unwrap();
    ofd(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
    // SAFETY: flock(2) on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );

    // A process killed in its wait.
    let mut child = std::process::Command::new("flock")
        .arg(&path)
        .arg("true")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "flock(1) did not wait for the holder"
    );
    child.kill().unwrap();
    let killed = Instant::now();
    let died = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if killed.elapsed() > Duration::from_secs(5) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = killed.elapsed();

    // A thread interrupted by a handler without SA_RESTART.
    let (waiter, rx) = OfdWaiter::start(&path, false);
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the wait ended while the lock was held"
    );
    waiter.signal();
    let got = rx.recv_timeout(Duration::from_secs(5));
    // A signal the waiter blocks interrupts nothing: the wait goes on until the grant.
    // The signal stays pending and blocked; it goes with the thread.
    let (blocking, rx) = OfdWaiter::start(&path, true);
    std::thread::sleep(Duration::from_millis(300));
    blocking.signal();
    let blocked_early = rx.recv_timeout(Duration::from_millis(1000)).ok();
    let lost = m.stats_line(&sf)("uring_lost_interrupts");
    // Let anything still waiting go before judging.
    ofd(&holder, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    let blocked_late = rx.recv_timeout(Duration::from_secs(5));
    drop(holder);
    let _ = child.wait();
    waiter.join();
    blocking.join();
    assert!(died, "the killed flock(1) still waited {took:?} after SIGKILL");
    assert!(
        took < Duration::from_secs(2),
        "the killed flock(1) took {took:?} to die"
    );
    assert_eq!(
        got,
        Ok(Err(libc::EINTR)),
        "the signalled wait did not end with EINTR"
    );
    assert_eq!(blocked_early, None, "a blocked signal ended the wait");
    assert_eq!(blocked_late, Ok(Ok(())), "the blocking waiter was not granted");
    assert_eq!(lost, 2, "uring_lost_interrupts");
}

/// Pins the calling thread (and the threads it starts) to the first CPU it may run on;
/// gives back the mask it had.
fn pin_to_one_cpu() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; zero is an empty set.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; `old` is a live set of the size given.
    assert_eq!(
        unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old) },
        0
    );
    let first = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads within `old` for c < CPU_SETSIZE.
        .find(|&c| unsafe { libc::CPU_ISSET(c, &old) })
        .expect("a CPU to run on");
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within `set` for first < CPU_SETSIZE.
    unsafe { libc::CPU_SET(first, &mut set) };
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) },
        0
    );
    old
}

/// A request that may wait long (an `FSYNC` on a slow source, made to take 2 s here by
/// `VFSCALEFS_TEST_SLOW_FSYNC_MS`), once its queue found the source slow, is served by a
/// worker thread: the requests that its CPU makes meanwhile, which go to the same queue,
/// are answered at once, as over `/dev/fuse`. Served by the queue's thread, they would
/// wait for the fsync.
#[test]
fn a_slow_request_does_not_hold_its_queue() {
    let Some(_p) = param("Y") else {
        return;
    };
    let t = common::TempDir::new("slow-fsync");
    let sf = t.0.join("stats");
    let m = Mounted::start_env(
        1,
        "io_uring",
        &[
            ("VFSCALEFS_TEST_SLOW_FSYNC_MS", Path::new("2000")),
            ("VFSCALEFS_STATS", &sf),
        ],
    )
    .unwrap();
    assert!(m.serves_io_uring(), "the server does not serve io_uring");
    let dir = m.mounts[0].clone();
    std::fs::write(dir.join("f"), b"x").unwrap();
    // Both on one CPU, so that both requests go to its queue.
    let old = pin_to_one_cpu();
    // The first finds the source slow (served by the queue thread, unless a slow
    // request came before it).
    File::options()
        .write(true)
        .open(dir.join("f"))
        .unwrap()
        .sync_all()
        .unwrap();
    let before = m.stats_line(&sf)("uring_offloaded");
    let d = dir.clone();
    let syncer = std::thread::spawn(move || {
        let f = OpenOptions::new().write(true).open(d.join("f")).unwrap();
        let t = Instant::now();
        f.sync_all().unwrap();
        t.elapsed()
    });
    // The fsync is with a worker before the lookups start.
    let deadline = Instant::now() + Duration::from_secs(5);
    while m.stats_line(&sf)("uring_offloaded") == before {
        assert!(Instant::now() < deadline, "the fsync never reached a worker");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Fresh names: each is a LOOKUP.
    let started = Instant::now();
    for i in 0..20 {
        assert!(std::fs::metadata(dir.join(format!("none-{i}"))).is_err());
    }
    let took = started.elapsed();
    let synced = syncer.join().unwrap();
    // SAFETY: pid 0 is the calling thread; `old` is the mask it had.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &old) };
    assert!(
        synced >= Duration::from_millis(1900),
        "the fsync took only {synced:?}"
    );
    assert!(
        took < Duration::from_millis(1000),
        "20 lookups beside the slow fsync took {took:?}"
    );
}

/// 1,000 waiters parked at once, each on an entry of its own: the mount still answers,
/// and the unlock grants them all.
#[test]
fn a_thousand_parked_waiters_do_not_stall_the_queues() {
    let Some(_p) = param("Y") else {
        return;
    };
    const WAITERS: usize = 1000;
    let dir = common::TempDir::new("uring-stats");
    let stats = dir.0.join("stats");
    let m = Mounted::start_env(1, "io_uring", &[("VFSCALEFS_STATS", &stats)]).unwrap();
    let path = m.mounts[0].join("herd");
    let holder = File::create(&path).unwrap();
    ofd(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
    let vm_before = vm_kib(m.pid(), "VmSize");
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for _ in 0..WAITERS {
        let (tx, p) = (tx.clone(), path.clone());
        threads.push(
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let f = File::open(&p).unwrap();
                    tx.send(ofd(&f, libc::F_OFD_SETLKW, libc::F_RDLCK)).unwrap();
                    // Keep the read lock until every waiter has been granted.
                    std::thread::park_timeout(Duration::from_secs(60));
                    drop(f);
                })
                .unwrap(),
        );
    }
    drop(tx);
    // Wait until the server holds them (each waiter's request parked on an entry).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        rx.try_recv().is_err(),
        "a waiter was granted while the lock was held"
    );
    // Each parked waiter holds an entry, and a new one was registered in its place: the
    // server's counters (SIGUSR1) show them all parked with entries to spare.
    let t = Instant::now();
    let mut seen = common::UringStats {
        parked: 0,
        entries: 0,
    };
    while t.elapsed() < Duration::from_secs(20) {
        seen = m.uring_stats(&stats);
        if seen.parked >= WAITERS as u64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let common::UringStats { parked, entries } = seen;
    say(&format!(
        "{WAITERS} waiters: {parked} parked, {entries} ring entries; address space +{} KiB, resident {} KiB",
        vm_kib(m.pid(), "VmSize").saturating_sub(vm_before),
        vm_kib(m.pid(), "VmRSS")
    ));
    assert_eq!(
        parked, WAITERS as u64,
        "not every waiter's request was parked on an entry"
    );
    assert!(
        entries >= parked + 8,
        "{entries} entries for {parked} parked requests: no queue keeps entries fetching"
    );
    let t = Instant::now();
    std::fs::metadata(m.mounts[0].join("herd")).unwrap();
    let f = File::create(m.mounts[0].join("beside")).unwrap();
    drop(f);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "requests waited {:?} behind the parked waiters",
        t.elapsed()
    );
    ofd(&holder, libc::F_OFD_SETLK, libc::F_UNLCK).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..WAITERS {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{i} of {WAITERS} waiters granted"));
        assert_eq!(got, Ok(()));
    }
    assert_eq!(
        m.uring_stats(&stats).parked,
        0,
        "requests still parked after every grant"
    );
    for t in &threads {
        t.thread().unpark();
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// Forgets come over /dev/fuse beside the rings: many lookups, then the kernel drops
/// them all, and the mount goes on.
#[test]
fn forgets_beside_the_rings() {
    let Some(_p) = param("Y") else {
        return;
    };
    let m = Mounted::start(1, "io_uring").unwrap();
    for i in 0..2000 {
        File::create(m.source.join(format!("f{i}"))).unwrap();
    }
    for i in 0..2000 {
        std::fs::metadata(m.mounts[0].join(format!("f{i}"))).unwrap();
    }
    for _ in 0..2 {
        std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        assert_eq!(std::fs::read_dir(&m.mounts[0]).unwrap().count(), 2000);
        for i in (0..2000).step_by(7) {
            std::fs::metadata(m.mounts[0].join(format!("f{i}"))).unwrap();
        }
    }
    for i in 0..2000 {
        std::fs::remove_file(m.mounts[0].join(format!("f{i}"))).unwrap();
    }
    exercise_files(&m.mounts[0]);
}

/// Unmounted while waiters are parked: the waiters end, and so does the server, with
/// success.
#[test]
fn unmount_with_parked_waiters_ends_the_server() {
    let Some(_p) = param("Y") else {
        return;
    };
    let mut m = Mounted::start(1, "io_uring").unwrap();
    let path = m.mounts[0].join("lk");
    let holder = File::create(&path).unwrap();
    ofd(&holder, libc::F_OFD_SETLK, libc::F_WRLCK).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for _ in 0..20 {
        let (tx, p) = (tx.clone(), path.clone());
        threads.push(std::thread::spawn(move || {
            let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
            let r = ofd(&f, libc::F_OFD_SETLKW, libc::F_WRLCK);
            drop(f);
            tx.send(r).unwrap();
        }));
    }
    drop(tx);
    std::thread::sleep(Duration::from_millis(500));
    if let Ok(r) = rx.try_recv() {
        panic!("a waiter ended while the lock was held: {r:?}");
    }
    // A forced unmount aborts the connection (it stays mounted, busy, until its files
    // are closed): every parked wait ends with an error.
    let _ = nix::mount::umount2(m.mounts[0].as_path(), nix::mount::MntFlags::MNT_FORCE);
    for _ in 0..20 {
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a parked waiter did not end at unmount");
        assert!(got.is_err(), "a waiter was granted by the unmount");
    }
    for t in threads {
        t.join().unwrap();
    }
    drop(holder);
    let st = m
        .wait_exit(Duration::from_secs(20))
        .expect("the server did not end after the unmount");
    assert!(st.success(), "the server ended with {st}");
}

/// Bad `io_uring` options are refused before anything is mounted (exit status 2).
#[test]
fn bad_io_uring_options_are_refused() {
    for opts in ["io_uring_depth=0", "io_uring_depth=x", "io_uring=1"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vfscalefs"))
            .args(["/nonexistent-source", "/nonexistent-mountpoint", "-o", opts])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "-o {opts}: {err}");
        assert!(err.contains("io_uring"), "-o {opts}: {err}");
    }
}

/// A herd of flock contenders through the mount, each taking and dropping the lock in
/// a loop: bursts larger than the queues' entries wait in the kernel's lists, which
/// must drain (they did not before the kickers: the herd hung). Every contender ends.
#[test]
fn a_lock_herd_finishes() {
    let Some(_p) = param("Y") else {
        return;
    };
    const CONTENDERS: usize = 300;
    let m = Mounted::start(1, "io_uring").unwrap();
    let path = m.mounts[0].join("herd");
    File::create(&path).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    for _ in 0..CONTENDERS {
        let (tx, p, stop) = (tx.clone(), path.clone(), stop.clone());
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                let f = File::open(&p).unwrap();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: flock on a descriptor this thread owns.
                    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
                    // SAFETY: as above.
                    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) }, 0);
                    n += 1;
                }
                tx.send(n).unwrap();
            })
            .unwrap();
    }
    drop(tx);
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut total = 0;
    for i in 0..CONTENDERS {
        let left = deadline.saturating_duration_since(Instant::now());
        total += rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{i} of {CONTENDERS} contenders ended"));
    }
    say(&format!(
        "{CONTENDERS} flock contenders: {total} lock/unlock pairs"
    ));
    assert!(total > 0);
}
