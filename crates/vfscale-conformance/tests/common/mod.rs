//! What the conformance tests share: messages that show even when a test passes, the
//! corpora under `scenarios/`, the kernel targets' availability and the random-case count.

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Printed straight to stderr, which libtest does not capture, so that a skip shows
/// even when the test passes.
pub fn say(msg: &str) {
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// `scenarios/<format>` at the repository's root.
pub fn corpus_dir(format: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios")
        .join(format)
}

/// The `*.jsonl` scenarios directly in `dir` (not in its subdirectories), sorted.
pub fn scenarios(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    v.sort();
    v
}

/// Whether a kernel target can run (`available`, its runner's answer); when it cannot,
/// says `SKIP` for `what`.
pub fn kernel_available(what: &str, available: Result<(), impl Display>) -> bool {
    match available {
        Ok(()) => true,
        Err(why) => {
            say(&format!("SKIP: {what}: the kernel target is unavailable: {why}"));
            false
        }
    }
}

/// The number of random scenarios: `VFSCALE_RANDOM_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("VFSCALE_RANDOM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Fails, listing them, when any of a corpus's `total` scenarios differ.
pub fn assert_no_failures(failures: &[String], total: usize) {
    assert!(
        failures.is_empty(),
        "{} of {} scenarios differ:\n{}",
        failures.len(),
        total,
        failures.join("\n")
    );
}

/// `n` pseudo-random words from a xorshift generator whose state is `seed`, for
/// generators checked without proptest.
pub fn xorshift_words(seed: &mut u64, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        })
        .collect()
}
