//! Small runs of every mode (no timed assertions): the metrics each target reports, the
//! lock counters the designs imply, and the kernel target's clean-up.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::measure::Workload;

fn cfg(mode: &'static str, tasks: usize) -> Config {
    let mut c = Config::new(Workload::Loop, tasks);
    c.modes = vec![mode];
    c.duration = Duration::from_millis(20);
    c.size = 5;
    c
}

/// The workload's modes, as `--mode` names them.
fn modes() -> &'static [&'static str] {
    Workload::Loop.modes()
}

fn keys(s: &Sample) -> Vec<&str> {
    s.keys().map(crate::result::Metric::name).collect()
}

#[test]
fn every_mode_of_the_workload_is_measured() {
    assert_eq!(modes().len(), 6);
    for m in modes() {
        assert!(Mode::of(&cfg(m, 1)).is_ok(), "{m}");
    }
}

#[test]
fn library_runs_every_mode_with_its_metrics() {
    for target in [Target::Library, Target::LibraryPrepatch] {
        for &mode in modes() {
            for tasks in [1, 3] {
                let what = format!("{} {mode} x{tasks}", target.name());
                let s = run(target, &cfg(mode, tasks)).unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut want = vec![
                    "ctl_lock_acquisitions_per_op",
                    "lock_wait_sec",
                    "ops_per_sec",
                    "validate_lock_acquisitions_per_op",
                ];
                match mode {
                    "boot" => want.extend(["boot_sec", "devices"]),
                    "io" => want.push("direct_ops_per_sec"),
                    _ => {}
                }
                want.sort_unstable();
                assert_eq!(keys(&s), want, "{what}");
                for (_, k, v) in s.metrics() {
                    assert!(v.is_finite() && v >= 0.0, "{what}: {k} = {v}");
                }
                assert!(s["ops_per_sec"] > 0.0, "{what}: {s:?}");
                if mode == "boot" {
                    assert_eq!(s["devices"], 5.0, "{what}");
                }
                // The per-device design never takes the control lock to open,
                // close, configure, clear or do I/O; before it, every open, close and
                // ioctl took it. The registry (churn) takes it in both.
                let ctl = s["ctl_lock_acquisitions_per_op"];
                match (mode, target) {
                    ("churn", _) => assert!(ctl >= 1.0, "{what}: {ctl}"),
                    ("io", _) => assert_eq!(ctl, 0.0, "{what}"),
                    (_, Target::Library) => assert_eq!(ctl, 0.0, "{what}"),
                    // open+close: 2; configure+read+clear+close: open, configure, clear,
                    // release and the detach it does = 5; boot: (5 pairs × 2 + 1) / 6.
                    ("open-close" | "open-close-same", _) => assert_eq!(ctl, 2.0, "{what}"),
                    ("configure", _) => assert_eq!(ctl, 5.0, "{what}"),
                    ("boot", _) => assert!((ctl - 11.0 / 6.0).abs() < 1e-9, "{what}: {ctl}"),
                    _ => unreachable!(),
                }
                // LOOP_CLR_FD takes the validation lock, as loop_global_lock_killable does.
                let v = s["validate_lock_acquisitions_per_op"];
                assert_eq!(v, if mode == "configure" { 1.0 } else { 0.0 }, "{what}");
                if target == Target::Library && mode != "churn" && mode != "open-close-same" {
                    // Nothing shared between tasks: no lock is ever found taken.
                    assert_eq!(s["lock_wait_sec"], 0.0, "{what}");
                }
            }
        }
    }
}

#[test]
fn bad_configurations_are_skips() {
    let mut c = cfg("boot", 1);
    c.size = 0;
    assert!(run(Target::Library, &c).is_err());
    let mut c = cfg("io", 0);
    assert!(run(Target::Library, &c).is_err());
    c.tasks = 1;
    c.duration = Duration::ZERO;
    assert!(run(Target::Library, &c).is_err());
    let mut c = cfg("boot", 1);
    c.modes = vec!["boot", "io"];
    assert!(run(Target::Library, &c).is_err());
    assert!(run(Target::Dashmap, &cfg("io", 1)).is_err());
    assert!(available(Target::Moka).is_err());
}

#[test]
fn rounds_start_every_worker_and_stop_them() {
    let rounds = Rounds::default();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let mut seen = 0;
                while rounds.next(&mut seen) {
                    done.fetch_add(1, Ordering::Relaxed);
                    rounds.finished();
                }
            });
        }
        for r in 1..=4 {
            rounds.start();
            rounds.wait_all(3);
            assert_eq!(done.load(Ordering::Relaxed), 3 * r);
        }
        rounds.stop();
    });
}

// ---------------------------------------------------------------------------------------
// The kernel target: root and /dev/loop-control, serialized with every other user of
// real loop devices by the flock on /dev/loop-control.

/// Why the kernel target cannot run here, or `None`.
fn kernel_skip() -> Option<String> {
    if !Path::new(kernel_runner::LOOP_CONTROL).exists() {
        return Some(format!("there is no {}", kernel_runner::LOOP_CONTROL));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    None
}

/// The registry, read under the lock (every user restores its devices before letting
/// go of the lock, so this is the machine's resting state).
fn resting_registry() -> BTreeMap<u32, Option<String>> {
    let _lock = kernel_runner::Control::open().expect("the lock");
    kernel_runner::registry().expect("the registry")
}

#[test]
fn kernel_runs_every_mode_and_restores_the_devices() {
    if let Some(why) = kernel_skip() {
        eprintln!("SKIP: {why}");
        return;
    }
    let before = resting_registry();
    for &mode in modes() {
        let mut c = cfg(mode, 2);
        c.size = 3;
        let s = run(Target::Kernel, &c).unwrap_or_else(|e| panic!("kernel {mode}: {e}"));
        assert!(s["ops_per_sec"] > 0.0, "kernel {mode}: {s:?}");
        // Userspace cannot count the kernel's locks.
        assert!(
            !s.contains_key("ctl_lock_acquisitions_per_op") && !s.contains_key("lock_wait_sec"),
            "kernel {mode}: {s:?}"
        );
        if mode == "io" {
            assert!(s["direct_ops_per_sec"] > 0.0, "{s:?}");
        }
        assert_eq!(resting_registry(), before, "kernel {mode} left devices behind");
    }
}

#[test]
fn kernel_guard_removes_its_devices_on_an_error_path() {
    if let Some(why) = kernel_skip() {
        eprintln!("SKIP: {why}");
        return;
    }
    let before = resting_registry();
    let scratch = Scratch::new(Path::new(SHM_DIR)).unwrap();
    let image = scratch.images("err", 1, IMAGE_BYTES, false).unwrap();
    {
        let mut lab = KernelLab::open().unwrap();
        let idx = lab.reserve(2).unwrap();
        assert!(idx
            .iter()
            .all(|i| *i >= sys::FIRST_INDEX && !before.contains_key(i)));
        let sys = lab.sys();
        sys.add(idx[0]).unwrap();
        sys.add(idx[1]).unwrap();
        let h = sys.open(idx[0], Open::RO).unwrap();
        sys.configure(&h, &image[0], true).unwrap();
        assert!(sys.is_bound(idx[0]));
        drop(h);
        // Dropped without finish(), as an early return or a panic would.
    }
    assert_eq!(resting_registry(), before);
}
