//! What the conformance tests share: messages that show even when a test passes, the
//! corpora under `scenarios/`, the kernel targets' availability and the random-case count.

// Each test binary uses only some of these.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

use vfscale_conformance::format::{Scenario, StepOp};
use vfscale_conformance::loop_dev;

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

/// The `*.jsonl` scenarios of corpus `format`, sorted; fails when there are fewer than
/// `at_least` (a corpus that went missing must not pass as empty).
pub fn corpus(format: &str, at_least: usize) -> Vec<PathBuf> {
    let files = scenarios(&corpus_dir(format));
    assert!(
        files.len() >= at_least,
        "the corpus has only {} scenarios",
        files.len()
    );
    files
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

/// The backing files every random loop scenario starts with: the random steps name them.
pub fn loop_backings() -> Vec<loop_dev::Op> {
    use loop_dev::{Mode, Op};
    let backing = |name: &str, size, mode| Op::Backing {
        name: name.into(),
        size,
        mode,
    };
    vec![
        backing("rw", 65536, Mode::Rw),
        backing("ro", 65536, Mode::Ro),
        backing("small", 32768, Mode::Rw),
    ]
}

/// A random `configure` step from its drawn fields (the block size drawn as a `u64`).
pub fn loop_configure(
    (handle, backing, block_size, offset, sizelimit, flags): (String, loop_dev::Backing, u64, u64, u64, u32),
) -> loop_dev::Op {
    loop_dev::Op::Configure {
        handle,
        backing,
        block_size: block_size as u32,
        offset,
        sizelimit,
        flags,
    }
}

/// Whether a step that binds `backing` to `handle` is valid in a random loop scenario:
/// the handle is open, and so is the backing when it is another handle.
pub fn binds_open(open: &HashSet<String>, handle: &str, backing: &loop_dev::Backing) -> bool {
    open.contains(handle) && !matches!(backing, loop_dev::Backing::Handle(b) if !open.contains(b))
}

/// The scenario in file `p`; panics naming the file when it does not parse.
pub fn load<Op: StepOp>(p: &Path) -> Scenario<Op> {
    let text = std::fs::read_to_string(p).unwrap();
    Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A corpus scenario: like [`load`], and it must start with a `#` header naming its source.
pub fn load_corpus<Op: StepOp>(f: &Path) -> Scenario<Op> {
    let text = std::fs::read_to_string(f).unwrap();
    assert!(
        text.starts_with('#'),
        "{}: no `#` header naming its source",
        f.display()
    );
    Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
}

/// Compares corpus scenario `f`'s library results `lib` with the kernel's (`kernel`, when
/// the kernel target runs; `VFSCALE_RECORD` then rewrites `X.expected` from them) and with
/// the recording `X.expected`, adding a failure for each difference.
pub fn check_kernel_and_recording(f: &Path, lib: &str, kernel: Option<String>, failures: &mut Vec<String>) {
    let expected_path = f.with_extension("expected");
    if let Some(ker) = kernel {
        if std::env::var_os("VFSCALE_RECORD").is_some() {
            std::fs::write(&expected_path, &ker).unwrap();
        }
        if lib != ker {
            failures.push(format!(
                "{}: library differs from the kernel\n--- library\n{lib}--- kernel\n{ker}",
                f.display()
            ));
        }
    }
    let expected = std::fs::read_to_string(&expected_path)
        .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
    if lib != expected {
        failures.push(format!(
            "{}: library differs from the recording\n--- library\n{lib}--- recorded\n{expected}",
            f.display()
        ));
    }
}
