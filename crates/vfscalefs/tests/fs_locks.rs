//! Server-side locks on a vfscalefs mount, with real processes: the lock corpus replayed
//! by the kernel runner on the mount must give what the kernel gives on tmpfs, and the
//! things only a FUSE server can get wrong (a waiter that must not hold a dispatch
//! thread, interrupts, locks dropped at RELEASE, two mountpoints) are checked directly.

mod common;

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cannot_mount, say, Mounted};
use vfscale_conformance::locks::kernel;

/// The corpus scenarios without OFD locks, replayed on the mount: results identical to
/// the kernel's on tmpfs (the recorded `X.expected`, which `locks_kernel_diff` checks
/// against the live kernel). No `/proc/locks` comparison: the locks are the server's.
#[test]
fn corpus_on_the_mount_matches_tmpfs() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    if let Err(why) = kernel::available() {
        return say(&format!("SKIP: the kernel runner cannot run here: {why}"));
    }
    let m = Mounted::start(1, "").expect("mount");
    let start = Instant::now();
    let common::CorpusRun {
        ran,
        skipped,
        failures,
    } = common::replay_corpus(&m.mounts[..1]);
    assert!(ran >= 30, "only {ran} scenarios without OFD locks");
    assert!(
        failures.is_empty(),
        "{} of {ran} differ:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|(_, e)| e.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    say(&format!(
        "lock corpus on vfscalefs: {ran} scenarios identical to tmpfs ({skipped} with OFD locks left out) in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
}

fn setlk(fd: i32, cmd: i32, ty: i32, start: i64, len: i64) -> Result<(), nix::errno::Errno> {
    // SAFETY: a zeroed flock is valid; fields set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: fcntl with a valid flock pointer.
    let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
    if r < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(())
    }
}

/// The OFD lock of an open file goes at its last close (the kernel's RELEASE), and a
/// POSIX lock of one process through one mountpoint conflicts with another's through the
/// other mountpoint.
#[test]
fn release_drops_ofd_locks_and_mountpoints_share_locks() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(2, "").expect("mount");
    let a = m.mounts[0].join("f");
    let b = m.mounts[1].join("f");
    let f1 = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&a)
        .unwrap();
    let f2 = OpenOptions::new().read(true).write(true).open(&b).unwrap();
    setlk(f1.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10).unwrap();
    assert_eq!(
        setlk(f2.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 5, 1),
        Err(nix::errno::Errno::EAGAIN),
        "an OFD lock through one mountpoint must conflict with one through the other"
    );
    drop(f1);
    // RELEASE is sent after close(2) returns: the lock goes shortly after.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match setlk(f2.as_raw_fd(), libc::F_OFD_SETLK, libc::F_WRLCK, 5, 1) {
            Ok(()) => break,
            Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("the OFD lock was not dropped at release: {e}"),
        }
    }
    // A POSIX lock held by a child through mountpoint 0 blocks this process through 1.
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import fcntl,time,sys\nf=open({:?},'r+')\nfcntl.lockf(f,fcntl.LOCK_EX|fcntl.LOCK_NB,1,20)\nprint('locked',flush=True)\ntime.sleep(30)",
            a.display().to_string()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn();
    let Ok(ref mut c) = child else {
        return say("SKIP (POSIX part): python3 is not installed");
    };
    use std::io::BufRead as _;
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let f3 = OpenOptions::new().read(true).write(true).open(&b).unwrap();
    let r = setlk(f3.as_raw_fd(), libc::F_SETLK, libc::F_WRLCK, 20, 1);
    let _ = c.kill();
    let _ = c.wait();
    assert_eq!(
        r,
        Err(nix::errno::Errno::EAGAIN),
        "a POSIX lock through mountpoint 0 must block one through 1"
    );
}

/// Sends `sig` to `w` and reaps it within 5 s (a loaded machine has taken 2); else says where it is stuck: its state,
/// `wchan` and kernel stack (root) and how long it was given (a waiter still blocked in
/// its FUSE request after a fatal signal waits for the server's answer: a lost interrupt).
fn signal_and_reap(
    w: &mut std::process::Child,
    sig: nix::sys::signal::Signal,
) -> Result<std::process::ExitStatus, String> {
    let pid = w.id();
    let t = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
    while t.elapsed() < Duration::from_secs(5) {
        if let Some(st) = w.try_wait().unwrap() {
            return Ok(st);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let read =
        |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_else(|e| format!("({e})"));
    let state = read("status")
        .lines()
        .find(|l| l.starts_with("State:"))
        .unwrap_or("State: ?")
        .to_string();
    Err(format!(
        "{sig:?} to pid {pid}: alive after {:?}; {state}; wchan {}; stack:\n{}",
        t.elapsed(),
        read("wchan"),
        read("stack")
    ))
}

/// The helper above tells a survivor: a shell that ignores SIGINT is reported alive, with
/// its state, and a SIGKILL then reaps it.
#[test]
fn signal_and_reap_reports_a_survivor() {
    let mut c = Command::new("sh")
        .arg("-c")
        .arg("trap '' INT; while :; do sleep 1; done")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let why = signal_and_reap(&mut c, nix::sys::signal::Signal::SIGINT).unwrap_err();
    assert!(why.contains("alive after") && why.contains("State:"), "{why}");
    let st = signal_and_reap(&mut c, nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(!st.success());
}

/// A waiter parked in the server holds no dispatch thread: with one dispatch thread and
/// several blocked flock(1) waiters, other requests are still served; a waiter killed
/// with SIGKILL goes away at once (not stuck in D state); SIGINT ends a wait.
#[test]
fn waiters_hold_no_thread_and_can_be_killed() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    if let Some(why) = common::missing_tool("flock") {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(1, "threads=1").expect("mount");
    let f = m.mounts[0].join("lockfile");
    std::fs::write(&f, b"x").unwrap();
    // -o: the lock stays with flock(1) itself, not with the sleep it runs.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(&f)
        .arg("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut waiters: Vec<_> = (0..4)
        .map(|_| Command::new("flock").arg(&f).arg("true").spawn().unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Still served: a stat, a write and a read through the one dispatch thread.
    let t = Instant::now();
    std::fs::write(m.mounts[0].join("other"), b"hello").unwrap();
    assert_eq!(std::fs::read(m.mounts[0].join("other")).unwrap(), b"hello");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "requests were held up by parked waiters"
    );
    // SIGKILL: reaped at once.
    let mut w = waiters.pop().unwrap();
    if let Err(why) = signal_and_reap(&mut w, nix::sys::signal::Signal::SIGKILL) {
        holder.kill().unwrap();
        panic!("a killed waiter did not die: {why}");
    }
    // SIGINT: the waiter ends (flock(1) has no handler; the default action kills it).
    let mut w = waiters.pop().unwrap();
    match signal_and_reap(&mut w, nix::sys::signal::Signal::SIGINT) {
        Ok(st) => assert!(!st.success()),
        Err(why) => {
            holder.kill().unwrap();
            panic!("an interrupted waiter did not die: {why}");
        }
    }
    // The holder goes: the remaining waiters are granted, one after the other.
    holder.kill().unwrap();
    holder.wait().unwrap();
    for mut w in waiters {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(st) = w.try_wait().unwrap() {
                assert!(st.success());
                break;
            }
            assert!(Instant::now() < deadline, "a waiter was never granted");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A parked request granted by an unlock (or a close) is answered by the thread that
/// served that unlock, not handed to the lock driver thread: with contenders of every
/// kind taking turns, the server's `lock_driver_answers` stays 0 while its waiters
/// sleep and are granted thousands of times.
#[test]
fn grants_are_answered_by_the_unlocking_request() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let t = common::TempDir::new("inline-grants");
    let sf = t.0.join("stats");
    let m = Mounted::start_env(1, "", &[("VFSCALEFS_STATS", &sf)]).expect("mount");
    let f = m.mounts[0].join("herd");
    std::fs::write(&f, b"x").unwrap();
    let field = m.stats_line(&sf);
    let (blocks0, driver0) = (field("lock_blocks"), field("lock_driver_answers"));
    let until = Instant::now() + Duration::from_millis(1500);
    // Threads of one process share a POSIX owner, so they contend with flock and OFD
    // locks (one open file each; an OFD lock is a POSIX request to the server), beside
    // flock(1) processes whose locks go at their close (the kernel's RELEASE).
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let f = f.clone();
            std::thread::spawn(move || {
                let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
                let fd = file.as_raw_fd();
                let mut n = 0u64;
                while Instant::now() < until {
                    if i % 2 == 0 {
                        // SAFETY: flock on a descriptor this thread owns.
                        assert_eq!(unsafe { libc::flock(fd, libc::LOCK_EX) }, 0);
                        // SAFETY: as above.
                        assert_eq!(unsafe { libc::flock(fd, libc::LOCK_UN) }, 0);
                    } else {
                        setlk(fd, libc::F_OFD_SETLKW, libc::F_WRLCK, 0, 0).unwrap();
                        setlk(fd, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0).unwrap();
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let closers = Command::new("sh")
        .arg("-c")
        .arg("end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do flock -x \"$1\" true; done")
        .arg("sh")
        .arg(&f)
        .status();
    let pairs: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let field = m.stats_line(&sf);
    let (blocks, driver) = (
        field("lock_blocks") - blocks0,
        field("lock_driver_answers") - driver0,
    );
    say(&format!(
        "{pairs} lock/unlock pairs in threads: {blocks} requests slept, {driver} answered by the driver thread"
    ));
    if let Ok(st) = closers {
        assert!(st.success(), "the flock(1) loop failed");
    }
    assert!(blocks >= 100, "too few waits to tell: {blocks}");
    assert_eq!(driver, 0, "grants went through the driver thread");
}
