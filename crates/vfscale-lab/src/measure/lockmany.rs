//! The `lockmany` workload: many locks held on one file, and what one more
//! lock call costs.
//!
//! `held` (H) locks sit on non-adjacent one-byte ranges of one file, at bytes 0, 2, 4, …
//! (adjacent ranges of one owner would merge):
//!
//! * **ofd**: H owners, each an open file description holding an OFD write lock;
//! * **posix**: one process holding H POSIX write locks.
//!
//! One more owner (its own open file description; for POSIX its own process) then sets
//! and removes a write lock at a random free byte (2j + 1): `set_unset_ns` is one such
//! pair; and tests a random held byte (2j) for a write lock (`F_GETLK`, `F_OFD_GETLK`),
//! which reports the holder's lock: `getlk_ns`. A repetition alternates batches of the
//! two until its duration is up, timing whole batches (a batch grows until it lasts
//! 0.2 ms, so the clock costs nothing measurable). `bytes_per_lock`: the library's own
//! report ([`FileLockContext::memory`] over the locks held); the kernel's is the size
//! of a `struct file_lock` (its slab object in `/proc/slabinfo`), one per held lock.
//!
//! Targets: `kernel` (a holder process sets the locks up on a file in a fresh tmpfs
//! directory, or in `--dir`; Linux walks the inode's whole list for every lock, so
//! H = 100,000 takes minutes, and as long again to release), `library`
//! ([`LockIndex::Tree`]) and `library-list` ([`LockIndex::List`], Linux's list). The
//! locks are set up once per configuration and reused by its repetitions, which `bench`
//! interleaves with the other configurations' (so every set-up of the workload is kept
//! until [`release`]: the kernel's at 100,000 held takes minutes). OFD at H
//! needs H descriptors in the holder: the descriptor limit is raised as far as the
//! system allows (`nr_open`), and a larger H is skipped, saying so.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libc::c_int;
use vfscale_locks::{
    AccessMode, FcntlCmd, FileLockContext, Flock, InodeKey, LockIndex, LockManager, LockType, OpenFile,
    Process, Settings,
};

use vfscale_conformance::harness::{raise_nofile, ScratchDir};

use super::{Config, LockMode, Sample, Skip, Target, SHM_DIR};

/// Whether `target` can run this workload here.
pub fn available(target: Target) -> Result<(), Skip> {
    match target {
        Target::Kernel => super::locks_kernel::available(),
        Target::Library | Target::LibraryList => Ok(()),
        t => Err(Skip(format!("lockmany has no {} target", t.name()))),
    }
}

/// Measures `cfg` once on `target`.
pub fn run(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    if cfg.size == 0 {
        return Err(Skip("no locks held: --held must be at least 1".into()));
    }
    if !matches!(cfg.mode, LockMode::Ofd | LockMode::Posix) {
        return Err(Skip(format!("lockmany has no {} mode", cfg.mode.name())));
    }
    match target {
        Target::Kernel => kernel(cfg),
        Target::Library => library(cfg, LockIndex::Tree),
        Target::LibraryList => library(cfg, LockIndex::List),
        t => Err(Skip(format!("lockmany has no {} target", t.name()))),
    }
}

/// A repetition's timing loop: alternates batches of `set_unset` (one pair per call,
/// at a random free byte) and `test` (one test of a random held byte) until `duration`
/// is up (at least one batch of each).
fn measure(
    held: usize,
    duration: Duration,
    mut set_unset: impl FnMut(i64) -> Result<(), String>,
    mut test: impl FnMut(i64) -> Result<(), String>,
) -> Result<Sample, Skip> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ held as u64;
    let mut pick = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % held as u64) as i64
    };
    let (mut pairs, mut pair_time) = (0u64, Duration::ZERO);
    let (mut tests, mut test_time) = (0u64, Duration::ZERO);
    let mut batch = 1u64;
    let start = Instant::now();
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            set_unset(2 * pick() + 1).map_err(Skip)?;
        }
        let a = t.elapsed();
        let t = Instant::now();
        for _ in 0..batch {
            test(2 * pick()).map_err(Skip)?;
        }
        let b = t.elapsed();
        pairs += batch;
        tests += batch;
        pair_time += a;
        test_time += b;
        if start.elapsed() >= duration {
            break;
        }
        if a.min(b) < Duration::from_micros(200) && batch < 1 << 16 {
            batch *= 2;
        }
    }
    let mut s = Sample::new();
    s.insert("set_unset_ns".into(), pair_time.as_nanos() as f64 / pairs as f64);
    s.insert("getlk_ns".into(), test_time.as_nanos() as f64 / tests as f64);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// The library targets.
// ---------------------------------------------------------------------------------------

/// A library set-up: its key (index, mode, H) and the inode holding the locks.
struct LibrarySetup {
    key: (LockIndex, LockMode, usize),
    ctx: Arc<FileLockContext>,
}

/// The set-ups so far, each reused by the later repetitions of its configuration.
static LIBRARY_SETUP: Mutex<Vec<LibrarySetup>> = Mutex::new(Vec::new());

/// Drops every set-up (the library's contexts; the kernel's holder processes, and with
/// them their locks and files): the workload is over.
pub fn release() {
    LIBRARY_SETUP.lock().unwrap_or_else(|e| e.into_inner()).clear();
    KERNEL_SETUP.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

fn library(cfg: &Config, index: LockIndex) -> Result<Sample, Skip> {
    let held = cfg.size as usize;
    let ofd = cfg.mode == LockMode::Ofd;
    let key = (index, cfg.mode, held);
    let mut cache = LIBRARY_SETUP.lock().unwrap_or_else(|e| e.into_inner());
    let ctx = match cache.iter().find(|c| c.key == key) {
        Some(c) => c.ctx.clone(),
        None => {
            let mgr = LockManager::with_settings(Settings {
                index,
                ..Settings::default()
            });
            let ctx = FileLockContext::new(&mgr, InodeKey::default());
            let holder = Process::new(1);
            for i in 0..held {
                let (cmd, file) = if ofd {
                    (
                        FcntlCmd::OfdSetLk,
                        OpenFile::new(i as u64 + 1, AccessMode::ReadWrite),
                    )
                } else {
                    (FcntlCmd::SetLk, OpenFile::new(1, AccessMode::ReadWrite))
                };
                ctx.fcntl(
                    holder,
                    file,
                    cmd,
                    &mut Flock::new(LockType::Write, 2 * i as i64, 1),
                )
                .map_err(|e| Skip(format!("lock {i} of {held}: {e}")))?;
            }
            cache.push(LibrarySetup {
                key,
                ctx: ctx.clone(),
            });
            ctx
        }
    };
    drop(cache);
    let memory = ctx.memory();
    let who = Process::new(2);
    let f = OpenFile::new(held as u64 + 1, AccessMode::ReadWrite);
    let (set, get) = if ofd {
        (FcntlCmd::OfdSetLk, FcntlCmd::OfdGetLk)
    } else {
        (FcntlCmd::SetLk, FcntlCmd::GetLk)
    };
    let mut s = measure(
        held,
        cfg.duration,
        |byte| {
            ctx.fcntl(who, f, set, &mut Flock::new(LockType::Write, byte, 1))
                .and_then(|()| ctx.fcntl(who, f, set, &mut Flock::new(LockType::Unlock, byte, 1)))
                .map_err(|e| format!("set/unset at byte {byte}: {e}"))
        },
        |byte| {
            let mut fl = Flock::new(LockType::Write, byte, 1);
            ctx.fcntl(who, f, get, &mut fl)
                .map_err(|e| format!("test at byte {byte}: {e}"))?;
            if fl.l_type != LockType::Write || fl.l_start != byte {
                return Err(format!("test at byte {byte} found {fl:?}"));
            }
            Ok(())
        },
    )?;
    s.insert("bytes_per_lock".into(), memory.bytes_per_lock());
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// The kernel target.
// ---------------------------------------------------------------------------------------

/// A kernel set-up: a holder process with the locks, and the measuring descriptor. The
/// file and its directory are removed as soon as both have it open, so nothing is left
/// on disk whatever happens; the holder dies with the thread that forked it.
struct KernelSetup {
    key: (LockMode, usize, Option<PathBuf>),
    holder: libc::pid_t,
    /// Closing it tells the holder to exit.
    done_w: c_int,
    /// The measuring owner's descriptor.
    fd: c_int,
}

impl Drop for KernelSetup {
    fn drop(&mut self) {
        // SAFETY: closing descriptors this set-up owns, then reaping its own child.
        unsafe {
            libc::close(self.fd);
            libc::close(self.done_w);
            let mut status = 0;
            libc::waitpid(self.holder, &mut status, 0);
        }
    }
}

static KERNEL_SETUP: Mutex<Vec<KernelSetup>> = Mutex::new(Vec::new());

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn flock_struct(ty: c_int, start: i64) -> libc::flock {
    // SAFETY: `flock` is plain data; all zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    fl
}

/// The holder child: keeps only its two pipe ends (as 0 and 1: another workload's pipes
/// must not stay open in it), sets the locks, reports on `ready_w` (`R`, or `E` and the
/// errno and the lock index), then waits for `done_r` to close. Only async-signal-safe
/// calls on data prepared before `fork`: the parent may have other threads.
fn holder_child(path: &CString, ofd: bool, held: usize, ready_w: c_int, done_r: c_int) -> ! {
    // SAFETY: descriptor shuffling with plain system calls; nothing else runs here.
    let (ready_w, done_r) = unsafe {
        let r = libc::fcntl(ready_w, libc::F_DUPFD, 3);
        let d = libc::fcntl(done_r, libc::F_DUPFD, 3);
        if r < 0 || d < 0 || libc::dup2(d, 0) != 0 || libc::dup2(r, 1) != 1 {
            libc::_exit(2);
        }
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0);
        (1, 0)
    };
    let fail = |i: usize| -> ! {
        let mut msg = [0u8; 13];
        msg[0] = b'E';
        msg[1..5].copy_from_slice(&errno().to_ne_bytes());
        msg[5..13].copy_from_slice(&(i as u64).to_ne_bytes());
        // SAFETY: write and _exit are async-signal-safe; `msg` is a local.
        unsafe {
            libc::write(ready_w, msg.as_ptr().cast(), msg.len());
            libc::_exit(1)
        }
    };
    // SAFETY: plain system calls on integers and on `path`, which outlives the child.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        let mut fd = -1;
        for i in 0..held {
            if ofd || fd < 0 {
                fd = libc::open(path.as_ptr(), libc::O_RDWR);
                if fd < 0 {
                    fail(i);
                }
            }
            let mut fl = flock_struct(libc::F_WRLCK, 2 * i as i64);
            let cmd = if ofd { libc::F_OFD_SETLK } else { libc::F_SETLK };
            if libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) != 0 {
                fail(i);
            }
        }
        libc::write(ready_w, b"R".as_ptr().cast(), 1);
        let mut b = 0u8;
        loop {
            let r = libc::read(done_r, (&mut b as *mut u8).cast(), 1);
            if r == 0 || (r < 0 && errno() != libc::EINTR) {
                libc::_exit(0);
            }
        }
    }
}

fn pipe() -> Result<(c_int, c_int), Skip> {
    let mut p = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the local array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Skip(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    Ok((p[0], p[1]))
}

fn kernel_setup(cfg: &Config) -> Result<KernelSetup, Skip> {
    let held = cfg.size as usize;
    let ofd = cfg.mode == LockMode::Ofd;
    if ofd {
        raise_nofile(held as u64 + 64).map_err(|e| {
            Skip(format!(
                "OFD locks at this H need {} descriptors in one process: {e}",
                held as u64 + 64
            ))
        })?;
    }
    let base = cfg.dir.clone().unwrap_or_else(|| PathBuf::from(SHM_DIR));
    // Removed (on every path) once the holder and we have the file open.
    let dir = ScratchDir::create(&base, "vfscale-lockmany")?;
    let file = dir.create_file("f")?;
    let path = CString::new(file.as_os_str().as_bytes()).map_err(|e| Skip(e.to_string()))?;
    let (ready_r, ready_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    // SAFETY: the child runs only `holder_child`, which keeps to async-signal-safe calls.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        holder_child(&path, ofd, held, ready_w, done_r);
    }
    // SAFETY: closing the child's ends in the parent.
    unsafe {
        libc::close(ready_w);
        libc::close(done_r);
    }
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing this function's own descriptors.
        unsafe {
            libc::close(ready_r);
            libc::close(done_w);
        }
        return Err(Skip(format!("fork: {e}")));
    }
    let mut setup = KernelSetup {
        key: (cfg.mode, held, cfg.dir.clone()),
        holder: pid,
        done_w,
        fd: -1,
    };
    let mut msg = [0u8; 13];
    let mut got = 0;
    while got < 1 {
        // SAFETY: reads into the local buffer.
        let r = unsafe { libc::read(ready_r, msg[got..].as_mut_ptr().cast(), msg.len() - got) };
        if r <= 0 {
            if r < 0 && errno() == libc::EINTR {
                continue;
            }
            break;
        }
        got += r as usize;
    }
    if msg[0] == b'E' {
        // The rest of the message follows the status byte.
        while got < msg.len() {
            // SAFETY: as above.
            let r = unsafe { libc::read(ready_r, msg[got..].as_mut_ptr().cast(), msg.len() - got) };
            if r <= 0 {
                break;
            }
            got += r as usize;
        }
    }
    // SAFETY: the parent's own end.
    unsafe { libc::close(ready_r) };
    if msg[0] != b'R' {
        let err = c_int::from_ne_bytes(msg[1..5].try_into().expect("4 bytes"));
        let at = u64::from_ne_bytes(msg[5..13].try_into().expect("8 bytes"));
        drop(setup);
        return Err(Skip(format!(
            "the holder failed at lock {at} of {held}: {}",
            std::io::Error::from_raw_os_error(err)
        )));
    }
    // SAFETY: open on a NUL-terminated path.
    setup.fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let opened = std::io::Error::last_os_error();
    // Both have the file open: its name and directory can go.
    drop(dir);
    if setup.fd < 0 {
        return Err(Skip(format!("{}: {opened}", file.display())));
    }
    Ok(setup)
}

/// Whether the held locks are still there (the holder is alive): byte 0 reports one.
fn kernel_setup_alive(s: &KernelSetup, ofd: bool) -> bool {
    let mut fl = flock_struct(libc::F_WRLCK, 0);
    let cmd = if ofd { libc::F_OFD_GETLK } else { libc::F_GETLK };
    // SAFETY: fcntl on our descriptor with a local struct.
    let r = unsafe { libc::fcntl(s.fd, cmd, &mut fl as *mut libc::flock) };
    r == 0 && fl.l_type == libc::F_WRLCK as libc::c_short
}

/// The object size of `struct file_lock` from `/proc/slabinfo`.
fn file_lock_size() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/slabinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("file_lock_cache "))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn kernel(cfg: &Config) -> Result<Sample, Skip> {
    let held = cfg.size as usize;
    let ofd = cfg.mode == LockMode::Ofd;
    let key = (cfg.mode, held, cfg.dir.clone());
    let mut cache = KERNEL_SETUP.lock().unwrap_or_else(|e| e.into_inner());
    // A set-up whose holder died is replaced (its Drop reaps the holder).
    cache.retain(|s| s.key != key || kernel_setup_alive(s, ofd));
    let fd = match cache.iter().find(|s| s.key == key) {
        Some(s) => s.fd,
        None => {
            let s = kernel_setup(cfg)?;
            let fd = s.fd;
            cache.push(s);
            fd
        }
    };
    // The guard stays held while `fd` is measured: a `release` would close it.
    let (set, get) = if ofd {
        (libc::F_OFD_SETLK, libc::F_OFD_GETLK)
    } else {
        (libc::F_SETLK, libc::F_GETLK)
    };
    let call = |cmd: c_int, fl: &mut libc::flock| -> Result<(), String> {
        // SAFETY: fcntl on our descriptor with a local struct.
        if unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) } != 0 {
            return Err(format!("fcntl: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    };
    let mut s = measure(
        held,
        cfg.duration,
        |byte| {
            call(set, &mut flock_struct(libc::F_WRLCK, byte))?;
            call(set, &mut flock_struct(libc::F_UNLCK, byte))
        },
        |byte| {
            let mut fl = flock_struct(libc::F_WRLCK, byte);
            call(get, &mut fl)?;
            if fl.l_type != libc::F_WRLCK as libc::c_short || fl.l_start != byte {
                return Err(format!(
                    "test at byte {byte} found type {} at {}",
                    fl.l_type, fl.l_start
                ));
            }
            Ok(())
        },
    )?;
    match file_lock_size() {
        Some(b) => s.insert("bytes_per_lock".into(), b),
        None => s.skip("bytes_per_lock: /proc/slabinfo has no file_lock_cache here".into()),
    };
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mode: LockMode, held: u64) -> Config {
        let mut c = Config::new(super::super::Workload::Lockmany, 1);
        c.mode = mode;
        c.size = held;
        c.duration = Duration::from_millis(20);
        c
    }

    #[test]
    fn library_targets_report_times_and_memory() {
        for target in [Target::Library, Target::LibraryList] {
            for mode in [LockMode::Ofd, LockMode::Posix] {
                let s = run(target, &cfg(mode, 100)).unwrap();
                assert!(
                    s["set_unset_ns"] > 0.0 && s["getlk_ns"] > 0.0,
                    "{target:?} {mode:?}: {s:?}"
                );
                assert!(s["bytes_per_lock"] > 50.0 && s["bytes_per_lock"] < 400.0, "{s:?}");
            }
        }
    }

    #[test]
    fn kernel_target_sets_up_measures_and_leaves_nothing() {
        // It forks a holder process: not beside a test that checks no child is left.
        let _g = crate::measure::child_processes();
        if let Err(why) = available(Target::Kernel) {
            eprintln!("SKIP: {why}");
            return;
        }
        for mode in [LockMode::Ofd, LockMode::Posix] {
            let s = run(Target::Kernel, &cfg(mode, 50)).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            assert!(s["set_unset_ns"] > 0.0 && s["getlk_ns"] > 0.0, "{mode:?}: {s:?}");
        }
        release();
        let left: Vec<_> = std::fs::read_dir(SHM_DIR)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("vfscale-lockmany.{}.", std::process::id()))
            })
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn zero_held_is_skipped() {
        assert!(run(Target::Library, &cfg(LockMode::Ofd, 0)).is_err());
    }
}
