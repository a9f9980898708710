//! `vfscale locks check --dir`: the corpus replayed in a directory the user names, and
//! mixed replays over several, where the scenarios a mixed replay cannot judge are listed
//! as skipped instead of reported as differences.

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/locks")
        .join(name)
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let p = PathBuf::from(base).join(format!("vfscale-check-dirs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    Scratch(p)
}

fn check(dirs: &[&Path]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vfscale"));
    cmd.args(["locks", "check"])
        .arg(corpus("posix_basic_conflicts.jsonl"))
        .arg(corpus("flock_shared_exclusive.jsonl"))
        .arg(corpus("ofd_merge_split.jsonl"));
    for d in dirs {
        cmd.arg("--dir").arg(d);
    }
    let out = cmd.output().expect("run vfscale");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn check_runs_in_the_named_directories() {
    if let Err(why) = vfscale_conformance::locks::kernel::available() {
        eprintln!("SKIP: the kernel runner cannot run here: {why}");
        return;
    }
    let d = scratch();
    let (code, text) = check(&[&d.0]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("3 agree, 0 differ, of 3 scenarios"), "{text}");
    // Its scratch directories were made in the named one and removed after.
    assert_eq!(std::fs::read_dir(&d.0).unwrap().count(), 0, "{text}");

    // The same directory twice is a mixed replay whose two sides are one lock space: the
    // POSIX and flock scenarios agree, the OFD one is not for mixed replays.
    let (code, text) = check(&[&d.0, &d.0]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2 agree, 0 differ, of 2 scenarios"), "{text}");
    assert!(
        text.contains("skipped") && text.contains("ofd_merge_split.jsonl") && text.contains("OFD lock"),
        "{text}"
    );

    let (code, text) = check(&[&d.0.join("missing")]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("missing"), "{text}");
}
