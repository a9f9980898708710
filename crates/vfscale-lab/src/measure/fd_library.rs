//! The library target of the descriptor-table workloads (Mateusz Guzik's 2015 lock-free
//! `fd_install`): `vfscale_fdtable`'s
//! [`FdTable`] shared by `tasks` threads, as threads of one process share
//! `files_struct`, driven by the harness's timed thread team ([`drive`]).
//!
//! `prepatch` selects the design before the patch, `InstallMode::UnderLock` (install takes the table
//! lock again, so allocating a descriptor takes it twice); otherwise `Settings::default()`
//! (lockless install, lowest-fd policy). The table's `RLIMIT_NOFILE` is raised to
//! [`RLIMIT_NOFILE`] so that no configuration runs out of descriptors.
//!
//! # What each workload does (one op)
//!
//! * **pipebench**: `reserve` two descriptors, `install` a new file object in each (as
//!   `do_pipe2` does: two `get_unused_fd_flags`, then two `fd_install`), `close` both.
//! * **opensock**: each thread first opens [`OPENSOCK_FDS_PER_THREAD`] files (before the
//!   measured interval); an op `close`s one of the thread's own descriptors, chosen at
//!   random, and `open`s a new file (reserve + install), which becomes the thread's own.
//! * **dup1**: `dup` of one descriptor opened before the run, then `close` of the copy.
//!
//! # Metrics
//!
//! * `ops_per_sec`: ops counted by the workers when the measured interval ended, over
//!   that interval (from opening the start gate to the snapshot).
//! * `table_lock_acquisitions_per_install`: the table's `lock_acquisitions` counter
//!   (`TableStats`) is read just before the gate opens and after every worker stopped, so
//!   the delta covers exactly the ops the workers did (`n_ops`, not only those inside the
//!   interval). Each op makes `i` descriptors (allocate + install: 2 in pipebench, 1
//!   otherwise) and closes `c` (2, 1, 1). Closes also take the lock, and `TableStats` has
//!   no separate counter for them, so their share is subtracted using a per-close cost
//!   *measured* after the run (the lock delta over closing 256 descriptors, divided by
//!   256; it is 1): `(delta - n_ops * c * close_cost) / (n_ops * i)`. In dup1 this also
//!   includes dup's own lookup of the source descriptor (which takes no lock). Expected:
//!   1 with lockless install (`alloc_fd` only), 2 prepatch (`alloc_fd` + `fd_install`).
//! * `table_lock_acquisitions_per_lookup`: after the run, the lock delta over
//!   [`LOOKUPS`] calls of `get` (`fget`) on an open descriptor from one thread, divided
//!   by [`LOOKUPS`]. dup's own lookup is not separable from its allocation in the
//!   counters, so lookups are measured on their own. Expected: 0.

use std::hint::black_box;
use std::sync::Arc;

use vfscale_conformance::harness::drive;
use vfscale_fdtable::{Fd, FdTable, InstallMode, Settings, DEFAULT_NR_OPEN};

use super::{rate_sample, Config, Sample, Skip, Workload};

/// The library table's `RLIMIT_NOFILE`: far above what any configuration holds open.
pub const RLIMIT_NOFILE: u32 = 1 << 16;
/// Descriptors each opensock thread keeps open (both targets).
pub const OPENSOCK_FDS_PER_THREAD: usize = 64;
/// `get` calls of the lookup measurement.
pub const LOOKUPS: u64 = 4096;
/// Descriptors closed to measure the lock cost of one close.
const CLOSE_PROBES: u64 = 256;

/// What the library table holds: stands for a `struct file`, one allocation per open.
#[derive(Debug)]
struct File {
    id: u64,
}

fn file(id: u64) -> Arc<File> {
    Arc::new(File { id })
}

/// The table settings: the design before the patch (`UnderLock`) if `prepatch`, else
/// the default.
pub fn settings(prepatch: bool) -> Settings {
    if prepatch {
        Settings {
            install: InstallMode::UnderLock,
            ..Settings::default()
        }
    } else {
        Settings::default()
    }
}

/// Measures `cfg` (pipebench, opensock or dup1) once against the library.
pub fn run(cfg: &Config, prepatch: bool) -> Result<Sample, Skip> {
    check(cfg)?;
    let table: Arc<FdTable<File>> = Arc::new(FdTable::with_limits(
        settings(prepatch),
        RLIMIT_NOFILE,
        DEFAULT_NR_OPEN,
    ));
    let t = &*table;
    let lock_count = || t.stats().lock_acquisitions;
    // (descriptors installed, descriptors closed) per op.
    let (per_op, out) = match cfg.workload {
        Workload::Pipebench => (
            (2, 2),
            drive(
                cfg.tasks,
                cfg.duration,
                |i| Ok(Worker::new(i)),
                |_: &mut Worker| {
                    let a = t.reserve(Fd(0), false).map_err(|e| format!("reserve: {e:?}"))?;
                    let b = t.reserve(Fd(0), false).map_err(|e| format!("reserve: {e:?}"))?;
                    t.install(a, file(0));
                    t.install(b, file(1));
                    t.close(a).map_err(|e| format!("close: {e:?}"))?;
                    t.close(b).map_err(|e| format!("close: {e:?}"))
                },
                lock_count,
                |w| close_all(t, &w.own),
            )?,
        ),
        Workload::Opensock => (
            (1, 1),
            drive(
                cfg.tasks,
                cfg.duration,
                |i| {
                    let mut w = Worker::new(i);
                    for _ in 0..OPENSOCK_FDS_PER_THREAD {
                        match t.open(file(i as u64), false) {
                            Ok(fd) => w.own.push(fd),
                            Err(e) => {
                                close_all(t, &w.own);
                                return Err(format!("open: {e:?}"));
                            }
                        }
                    }
                    Ok(w)
                },
                |w: &mut Worker| {
                    let k = w.rng.below(w.own.len());
                    t.close(w.own[k])
                        .map_err(|e| format!("close({}): {e:?}", w.own[k]))?;
                    w.own[k] = t.open(file(0), false).map_err(|e| format!("open: {e:?}"))?;
                    Ok(())
                },
                lock_count,
                |w| close_all(t, &w.own),
            )?,
        ),
        Workload::Dup1 => {
            let shared = t.open(file(0), false).map_err(|e| Skip(format!("open: {e:?}")))?;
            (
                (1, 1),
                drive(
                    cfg.tasks,
                    cfg.duration,
                    |i| Ok(Worker::new(i)),
                    |_: &mut Worker| {
                        let nfd = t.dup(shared).map_err(|e| format!("dup: {e:?}"))?;
                        t.close(nfd).map_err(|e| format!("close: {e:?}"))
                    },
                    lock_count,
                    |w| close_all(t, &w.own),
                )?,
            )
        }
        w => return Err(Skip(format!("{} is not a descriptor-table workload", w.name()))),
    };
    let locks = lock_count() - out.before_go;
    for w in &out.states {
        close_all(t, &w.own);
    }
    let close_cost = close_cost(t)?;
    let lookup_cost = lookup_cost(t)?;
    let (installs, closes) = (out.ops_total * per_op.0, out.ops_total * per_op.1);
    let mut s = rate_sample(&out)?;
    s.insert(
        "table_lock_acquisitions_per_install".into(),
        (locks as f64 - closes as f64 * close_cost) / installs as f64,
    );
    s.insert("table_lock_acquisitions_per_lookup".into(), lookup_cost);
    Ok(s)
}

/// A library worker's state.
struct Worker {
    /// opensock's choice of descriptor.
    rng: Rng,
    /// The descriptors the worker holds open between ops (opensock's own).
    own: Vec<Fd>,
}

impl Worker {
    fn new(i: usize) -> Worker {
        Worker {
            rng: Rng::new(i),
            own: Vec::new(),
        }
    }
}

fn close_all(t: &FdTable<File>, fds: &[Fd]) {
    for &fd in fds {
        let _ = t.close(fd);
    }
}

/// Table-lock acquisitions of one `close`, measured on [`CLOSE_PROBES`] descriptors.
fn close_cost(t: &FdTable<File>) -> Result<f64, Skip> {
    let fds = (0..CLOSE_PROBES)
        .map(|i| t.open(file(i), false))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Skip(format!("open: {e:?}")))?;
    let before = t.stats().lock_acquisitions;
    for &fd in &fds {
        t.close(fd).map_err(|e| Skip(format!("close: {e:?}")))?;
    }
    Ok((t.stats().lock_acquisitions - before) as f64 / CLOSE_PROBES as f64)
}

/// Table-lock acquisitions of one `get` (`fget`), measured over [`LOOKUPS`] calls.
fn lookup_cost(t: &FdTable<File>) -> Result<f64, Skip> {
    let fd = t.open(file(7), false).map_err(|e| Skip(format!("open: {e:?}")))?;
    let before = t.stats().lock_acquisitions;
    for _ in 0..LOOKUPS {
        let f = t.get(fd).ok_or_else(|| Skip(format!("get({fd}): not open")))?;
        black_box(f.id);
    }
    let locks = t.stats().lock_acquisitions - before;
    let _ = t.close(fd);
    Ok(locks as f64 / LOOKUPS as f64)
}

/// Rejects configurations a timed workload cannot run.
pub(super) fn check(cfg: &Config) -> Result<(), Skip> {
    if cfg.tasks == 0 {
        return Err(Skip("no tasks: tasks must be at least 1".into()));
    }
    if cfg.duration.is_zero() {
        return Err(Skip(
            "no duration: a timed workload needs a duration above 0".into(),
        ));
    }
    Ok(())
}

/// A small per-thread xorshift generator (opensock's random descriptor).
#[derive(Clone, Debug)]
pub(super) struct Rng(u64);

impl Rng {
    /// Seeded from the worker index (never 0).
    pub(super) fn new(i: usize) -> Rng {
        Rng((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A value in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        (x % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{LockMode, TaskKind};
    use std::time::Duration;

    fn cfg(workload: Workload, tasks: usize) -> Config {
        Config {
            workload,
            tasks,
            mode: LockMode::Posix,
            kind: TaskKind::Threads,
            iterations: 0,
            duration: Duration::from_millis(30),
            modes: Vec::new(),
            size: 0,
            dir: None,
            targets: None,
            lease_ttl: crate::measure::cluster::DEFAULT_LEASE_TTL,
        }
    }

    #[test]
    fn lock_counts_per_install_and_lookup() {
        for w in [Workload::Pipebench, Workload::Opensock, Workload::Dup1] {
            for tasks in [1, 2, 3] {
                for prepatch in [false, true] {
                    let what = format!("{} x{tasks} prepatch={prepatch}", w.name());
                    let s = run(&cfg(w, tasks), prepatch).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let keys: Vec<&str> = s.keys().map(crate::result::Metric::name).collect();
                    assert_eq!(
                        keys,
                        [
                            "ops_per_sec",
                            "table_lock_acquisitions_per_install",
                            "table_lock_acquisitions_per_lookup"
                        ],
                        "{what}"
                    );
                    assert!(
                        s["ops_per_sec"].is_finite() && s["ops_per_sec"] > 0.0,
                        "{what}: {s:?}"
                    );
                    // Lockless install: alloc_fd only; the base: alloc_fd + fd_install.
                    let want = if prepatch { 2.0 } else { 1.0 };
                    assert_eq!(s["table_lock_acquisitions_per_install"], want, "{what}: {s:?}");
                    assert_eq!(s["table_lock_acquisitions_per_lookup"], 0.0, "{what}: {s:?}");
                }
            }
        }
    }

    #[test]
    fn close_takes_the_lock_once_and_get_never() {
        // The per-install metric subtracts closes at the cost measured here.
        for prepatch in [false, true] {
            let t: FdTable<File> = FdTable::with_limits(settings(prepatch), RLIMIT_NOFILE, DEFAULT_NR_OPEN);
            assert_eq!(close_cost(&t).unwrap(), 1.0);
            assert_eq!(lookup_cost(&t).unwrap(), 0.0);
        }
    }

    #[test]
    fn nothing_is_left_open_after_a_run() {
        // Run opensock by hand with the harness and check the states hold the threads'
        // descriptors, which the run closes.
        let t: FdTable<File> = FdTable::new(Settings::default());
        let out = drive(
            3,
            Duration::from_millis(10),
            |i| {
                let mut w = Worker::new(i);
                w.own.push(t.open(file(0), false).map_err(|e| format!("{e:?}"))?);
                Ok(w)
            },
            |w: &mut Worker| {
                t.close(w.own[0]).map_err(|e| format!("{e:?}"))?;
                w.own[0] = t.open(file(1), false).map_err(|e| format!("{e:?}"))?;
                Ok(())
            },
            || (),
            |_| {},
        )
        .unwrap();
        assert_eq!(out.states.len(), 3);
        for w in &out.states {
            close_all(&t, &w.own);
        }
        assert!(t.iter().is_empty());
    }

    #[test]
    fn bad_configurations_are_skipped() {
        let mut c = cfg(Workload::Pipebench, 0);
        assert!(run(&c, false).is_err());
        c.tasks = 1;
        c.duration = Duration::ZERO;
        assert!(run(&c, false).is_err());
    }
}
