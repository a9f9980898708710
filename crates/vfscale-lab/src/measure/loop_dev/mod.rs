//! The `loop` workload (Pasha Tatashin's 2021 "scale loop device lock"): loop devices at boot, open/close storms,
//! configure/clear, registry churn and block I/O, against `vfscale-loop`
//! (`library`: a lock per device; `library-prepatch`: [`vfscale_loop::CtlLock::Global`],
//! every operation under the one control lock as before Linux 5.12) and the running
//! kernel's `/dev/loop*` (`kernel`).
//!
//! # The modes (one per configuration)
//!
//! * **boot** (the upstream patch's measurement): `size` devices (69 by default), each with its
//!   own small read-only image ([`IMAGE_BYTES`], as a squashfs image would be). One boot:
//!   `tasks` tasks take devices from a shared counter and, per device, do what losetup,
//!   udev, blkid and mount do: open it and `LOOP_CONFIGURE` it read-only, close; open,
//!   read a block, close, [`PROBES`] times; open it exclusively (mount's claim), read the
//!   superblock, close. That is [`OPS_PER_DEVICE`] operations (each open+close pair and
//!   the configure count one). Between boots the devices are cleared, untimed; boots
//!   repeat for the configured duration (at least one).
//! * **open-close**: each task opens and closes its own bound device.
//! * **open-close-same**: all tasks open and close one bound device.
//! * **configure**: each task, on its own device and backing file: open read-write,
//!   `LOOP_CONFIGURE`, read a random 4 KiB block, `LOOP_CLR_FD`, close (the detach).
//! * **churn**: each task adds and removes its own private index (`LOOP_CTL_ADD`,
//!   `LOOP_CTL_REMOVE`).
//! * **io**: `tasks` tasks read random 4 KiB blocks through one read-only device bound to
//!   a warm [`IO_FILE_BYTES`] tmpfs file, each through its own open handle (kernel:
//!   `O_DIRECT`, so each read goes through the loop driver rather than the device's page
//!   cache; the library has none), and the same reads with `pread` on the backing file
//!   directly, in the same run: [`IO_PHASES`] phases of equal length alternate device,
//!   direct, direct, device, ..., all tasks reading the same way in a phase, so both
//!   kinds see the same machine and each is measured on its own.
//!
//! # Metrics
//!
//! * `ops_per_sec`: operations per second (boot: over the timed boots; churn: every
//!   add+remove over the time from starting the tasks to the last one stopping; io: the
//!   device reads over the time of the device phases; the other modes: over the
//!   measured interval, see the harness's `drive`).
//! * `lock_wait_sec`: time the tasks spent waiting for the control lock and the device
//!   locks (boot: per boot, the upstream patch's 18.8 s figure; timed modes: over the run).
//! * `ctl_lock_acquisitions_per_op`, `validate_lock_acquisitions_per_op`: control-lock
//!   and loop-on-loop validation-lock acquisitions per operation.
//! * boot: `boot_sec` (the wall time of one boot) and `devices`; io:
//!   `direct_ops_per_sec` (the direct `pread`s over the time of the direct phases).
//!
//! The kernel's rows have no lock metrics: userspace cannot observe `loop_ctl_mutex`.
//!
//! # The kernel target
//!
//! It follows the loop replay runner's rules (see `sys::KernelLab`): an exclusive
//! `flock` on `/dev/loop-control` for the whole workload, only devices it added itself
//! at indices from 64 that were free, everything detached and removed afterwards, also
//! on error, panic or interrupt. Backing files live in a fresh directory under `--dir`
//! or `/dev/shm`; the library's under `/dev/shm`.

mod sys;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use vfscale_conformance::loop_dev::kernel as kernel_runner;
use vfscale_loop::LoopStats;

use vfscale_conformance::harness::{drive, Counter, Outcome, ScratchDir};

use super::fd_library::{check, Rng};
use super::{rate_sample, Config, Sample, Skip, Target, SHM_DIR};
use sys::{pick_free, KernelLab, Library, LoopSys, Open};

/// Bytes of a boot image and of the devices of open-close and configure.
pub const IMAGE_BYTES: u64 = 64 * 1024;
/// The block every read reads.
pub const BLOCK: u64 = 4096;
/// Bytes of the io mode's backing file.
pub const IO_FILE_BYTES: u64 = 8 << 20;
/// Phases of an io run, alternating reads through the device and direct `pread`s.
pub const IO_PHASES: usize = 8;
/// Probing opens (udev, blkid) per device at boot, besides losetup's and mount's.
pub const PROBES: u64 = 3;
/// Operations per device at boot: configure, and the open+close pairs of losetup, the
/// probes and mount.
pub const OPS_PER_DEVICE: u64 = 1 + 1 + PROBES + 1;
/// Boots of one boot run at most.
const MAX_BOOTS: u64 = 100_000;
/// Worker stack size.
const STACK: usize = 256 * 1024;

/// The modes, as [`super::Workload::modes`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Boot,
    OpenClose,
    OpenCloseSame,
    Configure,
    Churn,
    Io,
}

impl Mode {
    fn of(cfg: &Config) -> Result<Mode, Skip> {
        let [m] = cfg.modes.as_slice() else {
            return Err(Skip(format!(
                "loop measures one mode per configuration, not {:?}",
                cfg.modes
            )));
        };
        Ok(match *m {
            "boot" => Mode::Boot,
            "open-close" => Mode::OpenClose,
            "open-close-same" => Mode::OpenCloseSame,
            "configure" => Mode::Configure,
            "churn" => Mode::Churn,
            "io" => Mode::Io,
            other => return Err(Skip(format!("loop has no mode {other:?}"))),
        })
    }

    /// Device indices the mode needs.
    fn devices(self, cfg: &Config) -> usize {
        match self {
            Mode::Boot => cfg.size as usize,
            Mode::OpenClose | Mode::Configure | Mode::Churn => cfg.tasks,
            Mode::OpenCloseSame | Mode::Io => 1,
        }
    }
}

/// Whether `target` can run the loop workload here.
pub fn available(target: Target) -> Result<(), Skip> {
    match target {
        Target::Library | Target::LibraryPrepatch => Ok(()),
        Target::Kernel => {
            let lab = KernelLab::open().map_err(Skip)?;
            kernel_runner::registry().map_err(Skip)?;
            drop(lab);
            Ok(())
        }
        t => Err(Skip(format!("loop has no {} target", t.name()))),
    }
}

/// Measures `cfg` once on `target`.
pub fn run(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    let mode = Mode::of(cfg)?;
    check(cfg)?;
    if mode == Mode::Boot && cfg.size == 0 {
        return Err(Skip("boot needs at least one device".into()));
    }
    let need = mode.devices(cfg);
    match target {
        Target::Library | Target::LibraryPrepatch => {
            let sys = Library::new(target == Target::LibraryPrepatch);
            let scratch = Scratch::new(Path::new(SHM_DIR)).map_err(Skip)?;
            let idx = pick_free(&sys.present().map_err(Skip)?, need);
            measure(&sys, &scratch, &idx, mode, cfg).map_err(Skip)
        }
        Target::Kernel => {
            let mut lab = KernelLab::open().map_err(Skip)?;
            let parent = cfg.dir.clone().unwrap_or_else(|| PathBuf::from(SHM_DIR));
            let scratch = Scratch::new(&parent).map_err(Skip)?;
            let measured = lab
                .reserve(need)
                .and_then(|idx| measure(&lab.sys(), &scratch, &idx, mode, cfg));
            let restored = lab.finish();
            // The backing files go before the guard, whose drop raises an interrupting
            // signal again (and so ends the process).
            drop(scratch);
            drop(lab);
            match (measured, restored) {
                (Ok(s), Ok(())) => Ok(s),
                (Err(e), _) => Err(Skip(e)),
                (Ok(_), Err(m)) => Err(Skip(format!("restoring the loop devices: {m}"))),
            }
        }
        t => Err(Skip(format!("loop has no {} target", t.name()))),
    }
}

fn measure<S: LoopSys>(
    sys: &S,
    scratch: &Scratch,
    idx: &[u32],
    mode: Mode,
    cfg: &Config,
) -> Result<Sample, String> {
    match mode {
        Mode::Boot => boot(sys, scratch, idx, cfg),
        Mode::OpenClose | Mode::OpenCloseSame => open_close(sys, scratch, idx, cfg),
        Mode::Configure => configure(sys, scratch, idx, cfg),
        Mode::Churn => churn(sys, idx, cfg),
        Mode::Io => io(sys, scratch, idx[0], cfg),
    }
}

fn interrupted() -> Result<(), String> {
    if kernel_runner::stop_requested() {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Lock counters

/// Lock counters over some operations.
#[derive(Default)]
struct Locks {
    stats: LoopStats,
    ops: u64,
}

impl Locks {
    fn add(&mut self, before: &Option<LoopStats>, after: &Option<LoopStats>, ops: u64) {
        if let (Some(b), Some(a)) = (before, after) {
            let d = a.since(b);
            let s = &mut self.stats;
            s.ctl_lock_acquisitions += d.ctl_lock_acquisitions;
            s.device_lock_acquisitions += d.device_lock_acquisitions;
            s.validate_lock_acquisitions += d.validate_lock_acquisitions;
            s.ctl_lock_wait_ns += d.ctl_lock_wait_ns;
            s.device_lock_wait_ns += d.device_lock_wait_ns;
        }
        self.ops += ops;
    }

    /// Adds the lock metrics to `s` (when the system counts locks), the wait divided by
    /// `per` (boots; 1 for a timed run).
    fn insert(&self, counted: bool, s: &mut Sample, per: u64) {
        if !counted || self.ops == 0 {
            return;
        }
        let st = &self.stats;
        let ops = self.ops as f64;
        s.insert(
            "ctl_lock_acquisitions_per_op".into(),
            st.ctl_lock_acquisitions as f64 / ops,
        );
        s.insert(
            "validate_lock_acquisitions_per_op".into(),
            st.validate_lock_acquisitions as f64 / ops,
        );
        s.insert(
            "lock_wait_sec".into(),
            (st.ctl_lock_wait_ns + st.device_lock_wait_ns) as f64 / 1e9 / per.max(1) as f64,
        );
    }
}

/// `ops_per_sec` and the lock metrics of one timed run.
fn timed_sample<S: LoopSys, W>(sys: &S, out: Outcome<W, Option<LoopStats>>) -> Result<Sample, String> {
    interrupted()?;
    let after = sys.stats();
    let mut s = rate_sample(&out).map_err(|e| e.0)?;
    let mut locks = Locks::default();
    locks.add(&out.before_go, &after, out.ops_total);
    locks.insert(after.is_some(), &mut s, 1);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// Backing files

/// A fresh scratch directory for backing files, removed when dropped.
struct Scratch {
    dir: ScratchDir,
}

impl Scratch {
    fn new(parent: &Path) -> Result<Scratch, String> {
        let dir = ScratchDir::create(parent, "vfscale-loop-lab").map_err(|e| e.to_string())?;
        Ok(Scratch { dir })
    }

    /// `count` files of `bytes` bytes each (a pattern that differs per file and block),
    /// open read-only or read-write.
    fn images(&self, tag: &str, count: usize, bytes: u64, writable: bool) -> Result<Vec<File>, String> {
        (0..count)
            .map(|k| {
                let path = self.dir.path().join(format!("{tag}{k}"));
                let data: Vec<u8> = (0..bytes)
                    .map(|b| (k as u64 * 31 + b / BLOCK * 7 + b % 251) as u8)
                    .collect();
                std::fs::write(&path, &data).map_err(|e| format!("{}: {e}", path.display()))?;
                File::options()
                    .read(true)
                    .write(writable)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))
            })
            .collect()
    }
}

/// A [`BLOCK`]-sized buffer aligned for `O_DIRECT`.
struct Aligned {
    v: Vec<u8>,
    at: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let v = vec![0u8; 2 * BLOCK as usize];
        let at = v.as_ptr().align_offset(BLOCK as usize);
        Aligned { v, at }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.v[self.at..self.at + BLOCK as usize]
    }
}

// ---------------------------------------------------------------------------------------
// boot

/// Rounds for a fixed set of workers: the driver starts a round, the workers do it and
/// report, the driver waits for all of them.
#[derive(Default)]
struct Rounds {
    state: Mutex<RoundState>,
    changed: Condvar,
}

#[derive(Default)]
struct RoundState {
    round: u64,
    done: bool,
    finished: usize,
}

impl Rounds {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoundState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Worker: waits for a round after `seen`; `false` when there are no more.
    fn next(&self, seen: &mut u64) -> bool {
        let mut g = self.lock();
        while !g.done && g.round == *seen {
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        *seen = g.round;
        !g.done
    }

    /// Worker: this round is done.
    fn finished(&self) {
        self.lock().finished += 1;
        self.changed.notify_all();
    }

    /// Driver: starts a round.
    fn start(&self) {
        let mut g = self.lock();
        g.round += 1;
        g.finished = 0;
        self.changed.notify_all();
    }

    /// Driver: waits until `n` workers finished the round.
    fn wait_all(&self, n: usize) {
        let mut g = self.lock();
        while g.finished < n {
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Driver: no more rounds.
    fn stop(&self) {
        self.lock().done = true;
        self.changed.notify_all();
    }
}

/// The first error any task or the driver met.
#[derive(Default)]
struct Failure(Mutex<Option<String>>);

impl Failure {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `why` unless an earlier error is recorded.
    fn set(&self, why: String) {
        self.lock().get_or_insert(why);
    }

    fn is_set(&self) -> bool {
        self.lock().is_some()
    }

    fn into_result(self) -> Result<(), String> {
        match self.0.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

/// Starts `tasks` threads in `s`, thread `t` running `work(t)`; returns how many
/// started (one that cannot start is recorded in `failure`, and no more are started).
fn spawn_tasks<'scope, F: Fn(usize) + Sync>(
    s: &'scope std::thread::Scope<'scope, '_>,
    tasks: usize,
    failure: &'scope Failure,
    work: &'scope F,
) -> usize {
    for t in 0..tasks {
        let spawned = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn_scoped(s, move || work(t));
        if let Err(e) = spawned {
            failure.set(format!("cannot start thread {t} of {tasks}: {e}"));
            return t;
        }
    }
    tasks
}

/// One device's part of a boot: losetup, the probes, mount.
fn boot_device<S: LoopSys>(sys: &S, index: u32, image: &File, buf: &mut [u8]) -> Result<(), String> {
    {
        let h = sys.open(index, Open::RO)?;
        sys.configure(&h, image, true)?;
    }
    for p in 0..PROBES {
        let h = sys.open(index, Open::RO)?;
        sys.read(&h, buf, (p * BLOCK) % IMAGE_BYTES)?;
    }
    let h = sys.open(
        index,
        Open {
            excl: true,
            ..Open::RO
        },
    )?;
    sys.read(&h, buf, 0)
}

/// Clears every device after a boot (untimed) and checks each detached.
fn boot_teardown<S: LoopSys>(sys: &S, idx: &[u32]) -> Result<(), String> {
    for &i in idx {
        if sys.is_bound(i) {
            let h = sys.open(i, Open::RO)?;
            sys.clear(&h)?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for &i in idx {
        while sys.is_bound(i) {
            if Instant::now() > deadline {
                return Err(format!("loop{i} did not detach after LOOP_CLR_FD"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

fn boot<S: LoopSys>(sys: &S, scratch: &Scratch, idx: &[u32], cfg: &Config) -> Result<Sample, String> {
    let m = idx.len();
    let images = scratch.images("boot", m, IMAGE_BYTES, false)?;
    for &i in idx {
        sys.add(i)?;
    }
    let next = AtomicUsize::new(0);
    let rounds = Rounds::default();
    let failure = Failure::default();
    let mut locks = Locks::default();
    let mut boots = 0u64;
    let mut timed = Duration::ZERO;
    let work = |t: usize| {
        let mut buf = vec![0u8; BLOCK as usize];
        let mut seen = 0;
        while rounds.next(&mut seen) {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= idx.len() {
                    break;
                }
                if let Err(e) = boot_device(sys, idx[k], &images[k], &mut buf) {
                    failure.set(format!("task {t}: {e}"));
                }
            }
            rounds.finished();
        }
    };
    std::thread::scope(|s| {
        let workers = spawn_tasks(s, cfg.tasks, &failure, &work);
        while !failure.is_set() && boots < MAX_BOOTS {
            next.store(0, Ordering::Relaxed);
            let before = sys.stats();
            let t0 = Instant::now();
            rounds.start();
            rounds.wait_all(workers);
            timed += t0.elapsed();
            locks.add(&before, &sys.stats(), m as u64 * OPS_PER_DEVICE);
            boots += 1;
            if failure.is_set() {
                break;
            }
            if let Err(e) = boot_teardown(sys, idx).and_then(|()| interrupted()) {
                failure.set(e);
                break;
            }
            if timed >= cfg.duration {
                break;
            }
        }
        rounds.stop();
    });
    failure.into_result()?;
    let secs = timed.as_secs_f64();
    if boots == 0 || secs <= 0.0 {
        return Err("no boot was timed".into());
    }
    let mut s = Sample::new();
    s.insert(
        "ops_per_sec".into(),
        (boots * m as u64 * OPS_PER_DEVICE) as f64 / secs,
    );
    s.insert("boot_sec".into(), secs / boots as f64);
    s.insert("devices".into(), m as f64);
    locks.insert(sys.stats().is_some(), &mut s, boots);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// The timed modes

/// Adds the devices and binds each read-only to its own image (closed again: the
/// devices stay bound).
fn bind_all<S: LoopSys>(sys: &S, idx: &[u32], images: &[File]) -> Result<(), String> {
    for (&i, image) in idx.iter().zip(images) {
        sys.add(i)?;
        let h = sys.open(i, Open::RO)?;
        sys.configure(&h, image, true)?;
    }
    Ok(())
}

fn open_close<S: LoopSys>(sys: &S, scratch: &Scratch, idx: &[u32], cfg: &Config) -> Result<Sample, String> {
    let images = scratch.images("oc", idx.len(), IMAGE_BYTES, false)?;
    bind_all(sys, idx, &images)?;
    let out = drive(
        cfg.tasks,
        cfg.duration,
        |t| Ok(idx[t % idx.len()]),
        |&mut i| sys.open(i, Open::RO).map(drop),
        || sys.stats(),
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    timed_sample(sys, out)
}

/// A configure task's state.
struct ConfigureTask {
    index: u32,
    image: usize,
    rng: Rng,
    buf: Vec<u8>,
}

fn configure<S: LoopSys>(sys: &S, scratch: &Scratch, idx: &[u32], cfg: &Config) -> Result<Sample, String> {
    let images = scratch.images("cfg", idx.len(), IMAGE_BYTES, true)?;
    for &i in idx {
        sys.add(i)?;
    }
    let blocks = (IMAGE_BYTES / BLOCK) as usize;
    let out = drive(
        cfg.tasks,
        cfg.duration,
        |t| {
            Ok(ConfigureTask {
                index: idx[t],
                image: t,
                rng: Rng::new(t),
                buf: vec![0u8; BLOCK as usize],
            })
        },
        |w: &mut ConfigureTask| {
            let h = sys.open(
                w.index,
                Open {
                    write: true,
                    ..Open::RO
                },
            )?;
            sys.configure(&h, &images[w.image], false)?;
            let pos = w.rng.below(blocks) as u64 * BLOCK;
            sys.read(&h, &mut w.buf, pos)?;
            sys.clear(&h)
        },
        || sys.stats(),
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    timed_sample(sys, out)
}

/// Adding and removing a kernel device takes tens of milliseconds (the removal waits
/// for the block layer), so fewer ops than tasks may end inside a short interval: the
/// rate is every op done over the time from starting the tasks to the last one stopping.
fn churn<S: LoopSys>(sys: &S, idx: &[u32], cfg: &Config) -> Result<Sample, String> {
    let t0 = Instant::now();
    let out = drive(
        cfg.tasks,
        cfg.duration,
        |t| Ok(idx[t]),
        |&mut i| {
            sys.add(i)?;
            sys.remove(i)
        },
        || sys.stats(),
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    let wall = t0.elapsed();
    interrupted()?;
    let after = sys.stats();
    if out.ops_total == 0 {
        return Err(format!("no add+remove finished in {wall:?}"));
    }
    let mut s = Sample::new();
    s.insert("ops_per_sec".into(), out.ops_total as f64 / wall.as_secs_f64());
    let mut locks = Locks::default();
    locks.add(&out.before_go, &after, out.ops_total);
    locks.insert(after.is_some(), &mut s, 1);
    Ok(s)
}

/// Which way the io tasks read in a phase: [`IO_PHASES`] phases alternate device,
/// direct, direct, device, ...
fn io_phase_is_device(p: usize) -> bool {
    matches!(p % 4, 0 | 3)
}

fn io<S: LoopSys>(sys: &S, scratch: &Scratch, index: u32, cfg: &Config) -> Result<Sample, String> {
    let file = scratch.images("io", 1, IO_FILE_BYTES, false)?.remove(0);
    bind_all(sys, &[index], std::slice::from_ref(&file))?;
    // Warm: every block of the file read once (it was just written: this only checks).
    // The device's reads bypass its page cache (`O_DIRECT`), so they reach the file too.
    let mut warm = Aligned::new();
    for b in 0..IO_FILE_BYTES / BLOCK {
        file.read_exact_at(warm.get(), b * BLOCK)
            .map_err(|e| format!("reading the io file: {e}"))?;
    }
    let blocks = (IO_FILE_BYTES / BLOCK) as usize;
    let phase_len = (cfg.duration / IO_PHASES as u32).max(Duration::from_millis(1));
    let rounds = Rounds::default();
    let through_device = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let counts: Vec<Counter> = (0..cfg.tasks).map(|_| Counter::default()).collect();
    let failure = Failure::default();
    // (reads, time) through the device and directly; lock counters over device phases.
    let mut device = (0u64, Duration::ZERO);
    let mut direct = (0u64, Duration::ZERO);
    let mut locks = Locks::default();
    let work = |t: usize| {
        let open = Open {
            direct: true,
            ..Open::RO
        };
        let handle = sys
            .open(index, open)
            .map_err(|e| failure.set(format!("task {t}: {e}")))
            .ok();
        let mut rng = Rng::new(t);
        let mut buf = Aligned::new();
        rounds.finished();
        let mut seen = 0;
        while rounds.next(&mut seen) {
            let dev = through_device.load(Ordering::Relaxed);
            let mut n = 0u64;
            while let Some(h) = handle.as_ref().filter(|_| !stop.load(Ordering::Relaxed)) {
                let pos = rng.below(blocks) as u64 * BLOCK;
                let r = if dev {
                    sys.read(h, buf.get(), pos)
                } else {
                    file.read_exact_at(buf.get(), pos)
                        .map_err(|e| format!("pread of the backing file at {pos}: {e}"))
                };
                if let Err(e) = r {
                    failure.set(format!("task {t}: {e}"));
                    break;
                }
                n += 1;
            }
            counts[t].0.store(n, Ordering::Relaxed);
            rounds.finished();
        }
    };
    std::thread::scope(|s| {
        let workers = spawn_tasks(s, cfg.tasks, &failure, &work);
        // Every task has opened its handle.
        rounds.wait_all(workers);
        for p in 0..IO_PHASES {
            if failure.is_set() || interrupted().is_err() {
                break;
            }
            let dev = io_phase_is_device(p);
            through_device.store(dev, Ordering::Relaxed);
            stop.store(false, Ordering::Relaxed);
            let before = sys.stats();
            let t0 = Instant::now();
            rounds.start();
            std::thread::sleep(phase_len);
            stop.store(true, Ordering::Relaxed);
            rounds.wait_all(workers);
            let took = t0.elapsed();
            let reads: u64 = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
            let acc = if dev {
                locks.add(&before, &sys.stats(), reads);
                &mut device
            } else {
                &mut direct
            };
            acc.0 += reads;
            acc.1 += took;
        }
        rounds.stop();
    });
    failure.into_result()?;
    interrupted()?;
    let rate = |(reads, t): (u64, Duration)| -> Result<f64, String> {
        if reads == 0 || t.is_zero() {
            Err(format!("no reads in {t:?}"))
        } else {
            Ok(reads as f64 / t.as_secs_f64())
        }
    };
    let mut s = Sample::new();
    s.insert("ops_per_sec".into(), rate(device)?);
    s.insert("direct_ops_per_sec".into(), rate(direct)?);
    locks.insert(sys.stats().is_some(), &mut s, 1);
    Ok(s)
}

#[cfg(test)]
mod tests;
