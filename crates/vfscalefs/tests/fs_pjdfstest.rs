//! pjdfstest on a vfscalefs mount (`-o allow_other`: it switches users), compared with
//! the same run on the source directory itself: no failure the source run lacks.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::{cannot_mount, say, Mounted, TempDir};

fn pjdfstest() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.push(PathBuf::from("/root/.cargo/bin"));
    dirs.into_iter()
        .map(|d| d.join("pjdfstest"))
        .find(|p| p.is_file())
}

/// Two users the tests switch to, with their groups (pjdfstest's `dummy_auth`).
fn users() -> Option<[(String, String); 2]> {
    let group_of = |user: &str| -> Option<String> {
        let u = nix::unistd::User::from_name(user).ok()??;
        Some(nix::unistd::Group::from_gid(u.gid).ok()??.name)
    };
    let mut found = Vec::new();
    for u in ["nobody", "daemon", "bin", "sys"] {
        if let Some(g) = group_of(u) {
            found.push((u.to_string(), g));
        }
        if found.len() == 2 {
            return Some([found[0].clone(), found[1].clone()]);
        }
    }
    None
}

#[derive(Default, Debug)]
struct Outcome {
    passed: BTreeSet<String>,
    failed: BTreeSet<String>,
    skipped: BTreeSet<String>,
}

fn run_in(bin: &Path, config: &Path, dir: &Path) -> Outcome {
    run_some(bin, config, dir, &[], 100)
}

/// Runs the tests named in `only` (all when empty), requiring more than `at_least` to
/// have run.
fn run_some(bin: &Path, config: &Path, dir: &Path, only: &[&String], at_least: usize) -> Outcome {
    let mut cmd = Command::new(bin);
    cmd.arg("-c").arg(config).arg("-p").arg(dir).env("NO_COLOR", "1");
    if !only.is_empty() {
        // Exact names are matched before pjdfstest trims its module prefix.
        cmd.arg("-e")
            .args(only.iter().map(|n| format!("pjdfstest::tests::{n}")));
    }
    let out = cmd.output().expect("run pjdfstest");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut o = Outcome::default();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some(name), Some(result)) = (w.next(), w.next_back()) else {
            continue;
        };
        if !name.contains("::") {
            continue;
        }
        match result {
            "ok" => o.passed.insert(name.to_string()),
            "FAILED" => o.failed.insert(name.to_string()),
            "skipped" => o.skipped.insert(name.to_string()),
            _ => false,
        };
    }
    assert!(
        o.passed.len() + o.failed.len() >= at_least,
        "pjdfstest ran too few tests in {}:\n{text}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    o
}

#[test]
fn pjdfstest_has_no_failure_the_source_lacks() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let Some(bin) = pjdfstest() else {
        return say("SKIP: pjdfstest is not installed (cargo install pjdfstest)");
    };
    let Some([(u1, g1), (u2, g2)]) = users() else {
        return say("SKIP: no two unprivileged users with groups to switch to");
    };
    let cfg_dir = TempDir::new("pjdfstest-cfg");
    let config = cfg_dir.0.join("pjdfstest.toml");
    // naptime above the coarse clock tick, so timestamp tests do not race it.
    std::fs::write(
        &config,
        format!(
            "[features]\nposix_fallocate = {{}}\nutime_now = {{}}\nutimensat = {{}}\nrename_ctime = {{}}\n\
             [settings]\nnaptime = 0.02\nallow_remount = false\nexpected_failures = []\n\
             [dummy_auth]\nentries = [[\"{u1}\", \"{g1}\"], [\"{u2}\", \"{g2}\"]]\n"
        ),
    )
    .unwrap();
    let m = Mounted::start(1, "allow_other").expect("mount");
    let t = Instant::now();
    let direct = run_in(&bin, &config, &m.source);
    let t_direct = t.elapsed();
    let t = Instant::now();
    let fuse = run_in(&bin, &config, &m.mounts[0]);
    let t_fuse = t.elapsed();
    let mut new: Vec<&String> = fuse.failed.difference(&direct.failed).collect();
    if !new.is_empty() {
        // Timing-sensitive tests (timestamps) can fail once on a loaded machine: a new
        // failure counts only if it fails again when run by itself.
        say(&format!("pjdfstest: running again by themselves: {new:?}"));
        let again = run_some(&bin, &config, &m.mounts[0], &new, new.len());
        new.retain(|n| !again.passed.contains(*n));
    }
    say(&format!(
        "pjdfstest: source: {} passed, {} failed, {} skipped ({:.1} s); vfscalefs: {} passed, {} failed, {} skipped ({:.1} s)",
        direct.passed.len(),
        direct.failed.len(),
        direct.skipped.len(),
        t_direct.as_secs_f64(),
        fuse.passed.len(),
        fuse.failed.len(),
        fuse.skipped.len(),
        t_fuse.as_secs_f64()
    ));
    if !direct.failed.is_empty() {
        say(&format!(
            "pjdfstest: failing on the source too: {:?}",
            direct.failed
        ));
    }
    assert!(
        new.is_empty(),
        "pjdfstest failures on vfscalefs that the source run does not have: {new:?}"
    );
}
