//! `vfscale locks replay --dir M1 --dir M2`: a scenario's processes spread over several
//! directories of one lock space (process i on directory i mod n) give the kernel's
//! results in one directory, for the whole lock corpus; a missing directory is named.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::text;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/locks")
}

/// The corpus's scenarios with a recorded kernel result (the `racy/` ones have none that
/// a replay must repeat).
fn corpus() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    v.sort();
    v
}

/// A scratch directory, and a symlink to it that shows the same files by another path.
struct Scratch {
    dir: PathBuf,
    view: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.view);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `test` names the scratch: the tests of this file run at once in one process.
fn scratch(test: &str) -> Scratch {
    let base = PathBuf::from("/dev/shm");
    let dir = base.join(format!("vfscale-{test}-{}", std::process::id()));
    let view = base.join(format!("vfscale-{test}-{}-view", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&view);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&dir, &view).unwrap();
    Scratch { dir, view }
}

fn vfscale() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vfscale"))
}

fn replay(file: &Path, dirs: &[&Path]) -> Output {
    let mut cmd = vfscale();
    cmd.args(["locks", "replay"])
        .arg(file)
        .args(["--against", "kernel"]);
    for d in dirs {
        cmd.arg("--dir").arg(d);
    }
    cmd.output().expect("run vfscale")
}

/// Whether the kernel runner cannot run here (it says `SKIP` and why).
fn no_kernel_runner() -> bool {
    let r = vfscale_conformance::locks::kernel::available();
    if let Err(why) = &r {
        eprintln!("SKIP: the kernel runner cannot run here: {why}");
    }
    r.is_err()
}

#[test]
fn corpus_over_two_views_gives_one_directorys_results() {
    if no_kernel_runner() {
        return;
    }
    let s = scratch("replay-dirs");
    let files = corpus();
    assert!(files.len() >= 60, "the corpus shrank: {}", files.len());
    for f in &files {
        let expected = std::fs::read_to_string(f.with_extension("expected")).unwrap();
        // One directory, as before; the same directory twice; two paths to it, three
        // directories so that process i and i+2 share one.
        for dirs in [
            vec![s.dir.as_path()],
            vec![s.dir.as_path(), s.dir.as_path()],
            vec![s.dir.as_path(), s.view.as_path(), s.view.as_path()],
        ] {
            let o = replay(f, &dirs);
            assert!(o.status.success(), "{} over {dirs:?}: {}", f.display(), text(&o));
            assert_eq!(
                String::from_utf8_lossy(&o.stdout),
                expected,
                "{} over {dirs:?}",
                f.display()
            );
        }
    }
    // Every scratch directory was removed.
    assert_eq!(std::fs::read_dir(&s.dir).unwrap().count(), 0);
}

#[test]
fn check_over_one_lock_space_judges_every_scenario() {
    if no_kernel_runner() {
        return;
    }
    let s = scratch("check-dirs");
    let n = corpus().len();
    let o = vfscale()
        .args(["locks", "check"])
        .arg(corpus_dir())
        .arg("--dir")
        .arg(&s.dir)
        .arg("--dir")
        .arg(&s.view)
        .arg("--one-lock-space")
        .output()
        .expect("run vfscale");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("skipped"), "{t}");
    assert!(
        t.contains(&format!("{n} agree, 0 differ, of {n} scenarios")),
        "{t}"
    );
}

#[test]
fn a_missing_directory_is_named() {
    let s = scratch("missing-dir");
    let missing = s.dir.join("missing");
    let f = corpus_dir().join("posix_basic_conflicts.jsonl");
    for dirs in [vec![s.dir.as_path(), missing.as_path()], vec![missing.as_path()]] {
        let o = replay(&f, &dirs);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        assert!(
            t.contains(&format!("--dir {}: not a directory", missing.display())),
            "{t}"
        );
        assert!(o.stdout.is_empty(), "{t}");
    }
}
