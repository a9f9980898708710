//! The kernel target of the descriptor-table workloads (Mateusz Guzik's 2015 lock-free
//! `fd_install`): real system calls by
//! threads of this process, which share its descriptor table (`files_struct`) — the
//! table whose `file_lock` the upstream patch is about. Every thread closes only descriptors it
//! created itself.
//!
//! # What each workload does (one op)
//!
//! * **pipebench** (Mateusz Guzik's pipebench): `pipe()`, then `close()` of both ends.
//! * **opensock** (Eric Dumazet's opensock, on the thread's own descriptors only): each
//!   thread first creates [`OPENSOCK_FDS_PER_THREAD`] sockets (before the measured
//!   interval); an op `close()`s one of them, chosen at random, and creates a new
//!   `socket(AF_UNIX, SOCK_STREAM, 0)` in its place (no traffic, no network: socket
//!   creation only). With lowest-fd allocation the new socket often gets a number another
//!   thread just closed; it is the creating thread's own from then on.
//! * **dup1** (will-it-scale dup1): `dup()` of one descriptor of `/dev/null` opened before
//!   the run, then `close()` of the copy.
//!
//! `ops_per_sec` is the ops the threads counted when the measured interval ended, over
//! that interval; threads start behind a gate and count in cache-line-padded slots (the
//! harness's timed thread team, [`drive`]). Descriptors still open when the run ends
//! (opensock's, dup1's source) are closed afterwards.

use std::os::fd::AsRawFd;

use libc::c_int;

use vfscale_conformance::harness::{drive, raise_nofile};

use super::fd_library::{check, Rng};
use super::{rate_sample, Config, Sample, Skip, Workload};

pub use super::fd_library::OPENSOCK_FDS_PER_THREAD;

/// A kernel worker's state.
struct Worker {
    /// opensock's choice of descriptor.
    rng: Rng,
    /// The descriptors the worker holds open between ops (opensock's own); -1: none (a
    /// closed one whose replacement could not be created).
    own: Vec<c_int>,
}

impl Worker {
    fn new(i: usize) -> Worker {
        Worker {
            rng: Rng::new(i),
            own: Vec::new(),
        }
    }

    fn close_own(&mut self) {
        for fd in self.own.drain(..) {
            if fd >= 0 {
                // SAFETY: the worker created `fd` and nobody else closes it.
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// Measures `cfg` (pipebench, opensock or dup1) once against the running kernel.
pub fn run(cfg: &Config) -> Result<Sample, Skip> {
    check(cfg)?;
    let out = match cfg.workload {
        Workload::Pipebench => {
            raise_nofile(cfg.tasks as u64 * 2 + 256)?;
            drive(
                cfg.tasks,
                cfg.duration,
                |i| Ok(Worker::new(i)),
                |_: &mut Worker| pipe_and_close(),
                || (),
                |mut w| w.close_own(),
            )?
        }
        Workload::Opensock => {
            raise_nofile((cfg.tasks * OPENSOCK_FDS_PER_THREAD) as u64 + 256)?;
            drive(
                cfg.tasks,
                cfg.duration,
                |i| {
                    let mut w = Worker::new(i);
                    for _ in 0..OPENSOCK_FDS_PER_THREAD {
                        match unix_socket() {
                            Ok(fd) => w.own.push(fd),
                            Err(e) => {
                                w.close_own();
                                return Err(e);
                            }
                        }
                    }
                    Ok(w)
                },
                |w: &mut Worker| {
                    let k = w.rng.below(w.own.len());
                    let fd = std::mem::replace(&mut w.own[k], -1);
                    close(fd)?;
                    w.own[k] = unix_socket()?;
                    Ok(())
                },
                || (),
                |mut w| w.close_own(),
            )?
        }
        Workload::Dup1 => {
            raise_nofile(cfg.tasks as u64 + 256)?;
            let null = dev_null()?;
            let fd = null.as_raw_fd();
            drive(
                cfg.tasks,
                cfg.duration,
                |i| Ok(Worker::new(i)),
                |_: &mut Worker| dup_and_close(fd),
                || (),
                |mut w| w.close_own(),
            )?
        }
        w => return Err(Skip(format!("{} is not a descriptor-table workload", w.name()))),
    };
    let sample = rate_sample(&out);
    for mut w in out.states {
        w.close_own();
    }
    sample
}

/// Whether these workloads can run here: `pipe`, `socket(AF_UNIX, SOCK_STREAM)`, and
/// `dup` of `/dev/null` work. `Err` says why not.
pub fn available() -> Result<(), Skip> {
    pipe_and_close().map_err(Skip)?;
    close(unix_socket().map_err(Skip)?).map_err(Skip)?;
    let null = dev_null()?;
    dup_and_close(null.as_raw_fd()).map_err(Skip)
}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn close(fd: c_int) -> Result<(), String> {
    // SAFETY: callers pass descriptors they created and close them once. An EINTR from
    // close still frees the descriptor on Linux, so it is not retried.
    if unsafe { libc::close(fd) } != 0 {
        return Err(os_error(&format!("close({fd})")));
    }
    Ok(())
}

/// One pipebench op: `pipe` and two `close`s.
fn pipe_and_close() -> Result<(), String> {
    let mut fds: [c_int; 2] = [-1; 2];
    // SAFETY: pipe writes two descriptors into the local array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(os_error("pipe"));
    }
    let r = close(fds[0]);
    close(fds[1]).and(r)
}

/// `socket(AF_UNIX, SOCK_STREAM, 0)`.
fn unix_socket() -> Result<c_int, String> {
    // SAFETY: plain system call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return Err(os_error("socket(AF_UNIX, SOCK_STREAM)"));
    }
    Ok(fd)
}

/// One dup1 op: `dup(fd)` and `close` of the copy.
fn dup_and_close(fd: c_int) -> Result<(), String> {
    // SAFETY: plain system call on a descriptor the caller keeps open.
    let nfd = unsafe { libc::dup(fd) };
    if nfd < 0 {
        return Err(os_error("dup"));
    }
    close(nfd)
}

fn dev_null() -> Result<std::fs::File, Skip> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| Skip(format!("cannot open /dev/null: {e}")))
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::time::Duration;

    use super::*;
    use crate::measure::{LockMode, TaskKind};

    /// Set in the environment of the child test process that runs [`isolated`].
    const INNER: &str = "VFSCALE_FD_KERNEL_TEST_INNER";

    fn skip(why: &str) {
        let _ = std::io::stderr().write_all(format!("SKIP: {why}\n").as_bytes());
    }

    fn cfg(workload: Workload, tasks: usize) -> Config {
        Config {
            workload,
            tasks,
            mode: LockMode::Posix,
            kind: TaskKind::Threads,
            iterations: 0,
            duration: Duration::from_millis(50),
            modes: Vec::new(),
            size: 0,
            dir: None,
            targets: None,
            lease_ttl: crate::measure::cluster::DEFAULT_LEASE_TTL,
        }
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
    }

    /// The real test, run by [`workloads_run_and_leak_no_descriptor`] in a process of its
    /// own (other tests of this binary open and close descriptors concurrently, which
    /// would make the `/proc/self/fd` count meaningless); a no-op otherwise.
    #[test]
    fn isolated() {
        if std::env::var_os(INNER).is_none() {
            return;
        }
        if let Err(why) = available() {
            return skip(&why.0);
        }
        if std::fs::read_dir("/proc/self/fd").is_err() {
            return skip("/proc/self/fd is not readable");
        }
        for w in [Workload::Pipebench, Workload::Opensock, Workload::Dup1] {
            let before = open_fds();
            let s = run(&cfg(w, 2)).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
            let after = open_fds();
            assert_eq!(
                s.keys().map(crate::result::Metric::name).collect::<Vec<_>>(),
                ["ops_per_sec"],
                "{}",
                w.name()
            );
            let rate = s["ops_per_sec"];
            assert!(rate.is_finite() && rate > 0.0, "{}: {rate}", w.name());
            assert_eq!(before, after, "{}: descriptors leaked", w.name());
        }
    }

    #[test]
    fn workloads_run_and_leak_no_descriptor() {
        if std::env::var_os(INNER).is_some() {
            return;
        }
        let exe = match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => return skip(&format!("cannot find the test binary: {e}")),
        };
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "measure::fd_kernel::tests::isolated",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(INNER, "1")
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) => return skip(&format!("cannot run the test binary: {e}")),
        };
        let _ = std::io::stderr().write_all(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "isolated run failed:\n{stdout}");
        assert!(
            stdout.contains("1 passed"),
            "the isolated test did not run:\n{stdout}"
        );
    }

    #[test]
    fn bad_configurations_are_skipped() {
        let mut c = cfg(Workload::Dup1, 0);
        assert!(run(&c).is_err());
        c.tasks = 2;
        c.duration = Duration::ZERO;
        assert!(run(&c).is_err());
        assert!(run(&cfg(Workload::Lock1, 2)).is_err());
    }
}
