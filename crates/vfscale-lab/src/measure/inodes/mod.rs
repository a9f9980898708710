//! W4 `inodes`: seed 002's experiment, after Dave Chinner's benchmark. Each of N tasks
//! creates F files in its own directory, walks them (readdir + stat of each), chmods
//! each, and unlinks each, every phase timed on its own; plus a cold walk before the
//! unlink: the inode cache is dropped, then every task walks every task's directory in
//! the same order, so tasks meet on the same misses and every load goes through the
//! `I_NEW` path.
//!
//! Targets: `kernel` (real system calls on a private tmpfs directory, or `--dir`; its cold
//! walk is skipped: tmpfs pins its inodes), `kernel-ext4` (ext4 on a loop
//! device the lab sets up and tears down; its cold walk drops the kernel's caches), and a small in-memory filesystem ([`fs`]) on five inode tables:
//! `library` (vfscale-icache), `library-prepatch` (every mechanism of seed 002 switched
//! back), `rwlock-hashmap`, `dashmap`, `moka` ([`tables`]).
//!
//! Metrics per phase (`phase/metric`): `ops_per_sec`; for the in-memory targets whose
//! locks can be counted, `global_lock_acquisitions_per_op` (locks every task shares: the
//! icache's global settings, the one `RwLock`; the filesystem's own tables add none:
//! directories are per task and the "disk" is read without locks) and
//! `shard_lock_acquisitions_per_op` (per-chain/per-CPU/per-shard/per-directory locks);
//! on `cold-walk` also `loads_per_distinct_inode`.
//!
//! Not a default phase: `--mode evict` ([`million`]), issue 9's 1,000,000-inode point
//! (`--files` = inodes cached in all; bytes of bookkeeping per cached inode and
//! `evict_inodes` time per inode), `library` and `library-prepatch` only.

mod fs;
mod kernel;
pub mod million;
mod tables;

use super::{Config, Sample, Skip, Target, SKIP_PREFIX};

/// A phase's measured interval: from the first task's start to the last task's end,
/// recorded by the tasks themselves (the driver may be scheduled late after the start
/// barrier opens, and a short phase may be over by then).
#[derive(Default)]
pub(super) struct Span(std::sync::Mutex<Option<(std::time::Instant, std::time::Instant)>>);

impl Span {
    /// A task ran from `a` to `b`.
    pub(super) fn record(&self, a: std::time::Instant, b: std::time::Instant) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(match *g {
            None => (a, b),
            Some((x, y)) => (x.min(a), y.max(b)),
        });
    }

    /// The interval in seconds, and a fresh span for the next phase.
    pub(super) fn take(&self) -> f64 {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        g.map_or(0.0, |(a, b)| (b - a).as_secs_f64())
    }
}

/// The phases, in the order one run performs them (the cold walk needs the files, so it
/// runs before the unlink).
pub const PHASES: [&str; 5] = ["create", "walk", "chmod", "cold-walk", "unlink"];

/// Whether `target` can run this workload here.
pub fn available(target: Target) -> Result<(), Skip> {
    match target {
        Target::Kernel => kernel::available(),
        Target::KernelExt4 => kernel::available_ext4(),
        Target::Library
        | Target::LibraryPrepatch
        | Target::RwlockHashmap
        | Target::Dashmap
        | Target::Moka => Ok(()),
        t => Err(Skip(format!("inodes has no {} target", t.name()))),
    }
}

/// Measures `cfg` once on `target`: every selected phase (all when none is).
pub fn run(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    let phases: Vec<&'static str> = if cfg.modes.is_empty() {
        PHASES.to_vec()
    } else {
        PHASES.iter().copied().filter(|p| cfg.modes.contains(p)).collect()
    };
    let files = cfg.size.max(1);
    let tasks = cfg.tasks.max(1);
    if cfg.modes.contains(&million::MODE) {
        let mut s = match million::run(target, tasks, files) {
            Ok(s) => s,
            // With other phases selected, they still run; the point is listed skipped.
            Err(Skip(why)) if !phases.is_empty() => Sample::from([(format!("{SKIP_PREFIX}{why}"), 0.0)]),
            Err(e) => return Err(e),
        };
        if !phases.is_empty() {
            let rest = Config {
                modes: phases,
                ..cfg.clone()
            };
            s.extend(run(target, &rest)?);
        }
        return Ok(s);
    }
    let mut s = match target {
        Target::Kernel => kernel::run(tasks, files, &phases, cfg.dir.as_deref())?,
        Target::KernelExt4 => kernel::run_ext4(tasks, files, &phases)?,
        t => fs::run(t, tasks, files, &phases)?,
    };
    // A phase that did not run because another was not selected is not reported.
    s.retain(|k, _| k.starts_with(SKIP_PREFIX) || phases.iter().any(|p| k.starts_with(&format!("{p}/"))));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Workload;

    fn cfg(tasks: usize, files: u64) -> Config {
        let mut c = Config::new(Workload::Inodes, tasks);
        c.size = files;
        c
    }

    #[test]
    fn library_counts_no_global_lock_and_loads_once() {
        let s = run(Target::Library, &cfg(2, 300)).unwrap();
        for p in PHASES {
            assert!(s[&format!("{p}/ops_per_sec")] > 0.0, "{p}");
            assert_eq!(s[&format!("{p}/global_lock_acquisitions_per_op")], 0.0, "{p}");
        }
        assert_eq!(s["cold-walk/loads_per_distinct_inode"], 1.0);
    }

    #[test]
    fn prepatch_takes_a_global_lock_every_op() {
        let s = run(Target::LibraryPrepatch, &cfg(2, 200)).unwrap();
        for p in PHASES {
            assert!(s[&format!("{p}/global_lock_acquisitions_per_op")] >= 1.0, "{p}");
        }
        assert_eq!(s["cold-walk/loads_per_distinct_inode"], 1.0);
    }

    #[test]
    fn alternatives_run_every_phase() {
        for t in [Target::RwlockHashmap, Target::Dashmap, Target::Moka] {
            let s = run(t, &cfg(2, 200)).unwrap();
            for p in PHASES {
                assert!(s[&format!("{p}/ops_per_sec")] > 0.0, "{} {p}", t.name());
            }
            assert!(s["cold-walk/loads_per_distinct_inode"] >= 1.0, "{}", t.name());
        }
        let s = run(Target::RwlockHashmap, &cfg(1, 100)).unwrap();
        assert!(s["walk/global_lock_acquisitions_per_op"] >= 1.0);
    }

    #[test]
    fn selected_phases_only() {
        let mut c = cfg(1, 50);
        c.modes = vec!["create", "cold-walk"];
        let s = run(Target::Library, &c).unwrap();
        assert!(s.contains_key("create/ops_per_sec") && s.contains_key("cold-walk/ops_per_sec"));
        assert!(!s.contains_key("walk/ops_per_sec") && !s.contains_key("unlink/ops_per_sec"));
    }

    #[test]
    fn kernel_tmpfs_phases_or_skip() {
        let _g = crate::measure::child_processes();
        if let Err(Skip(why)) = available(Target::Kernel) {
            eprintln!("SKIP: {why}");
            return;
        }
        let s = run(Target::Kernel, &cfg(2, 100)).unwrap();
        for p in ["create", "walk", "chmod", "unlink"] {
            assert!(s[&format!("{p}/ops_per_sec")] > 0.0, "{p}");
        }
        assert!(s.keys().any(|k| k.starts_with("skip:cold-walk")), "{s:?}");
    }

    #[test]
    fn kernel_ext4_cold_walk_or_skip() {
        let _g = crate::measure::child_processes();
        if let Err(Skip(why)) = available(Target::KernelExt4) {
            eprintln!("SKIP: {why}");
            return;
        }
        let s = run(Target::KernelExt4, &cfg(2, 100)).unwrap();
        for p in PHASES {
            assert!(s[&format!("{p}/ops_per_sec")] > 0.0, "{p}");
        }
    }
}
