//! What the `replay` and `check` commands of the scenario formats share: reading a
//! scenario, finding a corpus's `*.jsonl` files, the `same`/`DIFFER` report of a check
//! and its summary, and the report of a replay against two targets.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The text of a file; the error names it.
pub fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            if e.is_dir() || e.extension().is_some_and(|x| x == "jsonl") {
                collect(&e, out)?;
            }
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// The scenarios named by `paths`: files as given, directories searched recursively for
/// `*.jsonl` in name order. An error when there are none.
pub fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files)?;
    }
    if files.is_empty() {
        return Err("no *.jsonl scenarios found".into());
    }
    Ok(files)
}

/// Checks each of `files` with `problem` (what is wrong with it, `None` when nothing),
/// prints `same` or `DIFFER` for each and the summary; exit 1 when any differ. An error
/// of `problem` ends the check.
pub fn check(
    files: &[PathBuf],
    mut problem: impl FnMut(&Path) -> Result<Option<String>, String>,
) -> Result<ExitCode, String> {
    let (mut same, mut differ) = (0, 0);
    for f in files {
        match problem(f)? {
            None => {
                same += 1;
                println!("same    {}", f.display());
            }
            Some(p) => {
                differ += 1;
                println!("DIFFER  {}: {p}", f.display());
            }
        }
    }
    println!("{same} agree, {differ} differ, of {} scenarios", files.len());
    Ok(if differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The first line where the library's and the kernel's result streams differ, for a
/// report.
pub fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("step {i}:\n  library: {x}\n  kernel:  {y}");
        }
    }
    format!(
        "the library printed {} lines, the kernel {}",
        a.lines().count(),
        b.lines().count()
    )
}

/// The end of a replay against the library and `other` (named so in the messages):
/// prints the library's results, says on stderr whether `other`'s agree and, where they
/// do not, where they first differ (`difference`); exit 1 when they differ.
pub fn report_both(
    file: &Path,
    lib: &str,
    theirs: &str,
    other: &str,
    difference: impl FnOnce(&str, &str) -> String,
) -> ExitCode {
    let difference = (lib != theirs).then(|| difference(lib, theirs));
    report_difference(file, lib, other, difference)
}

/// As [`report_both`], with the difference already found (`None`: they agree).
pub fn report_difference(file: &Path, lib: &str, other: &str, difference: Option<String>) -> ExitCode {
    print!("{lib}");
    if let Some(d) = difference {
        eprintln!("{}: results differ at {d}", file.display());
        return ExitCode::from(1);
    }
    eprintln!("{}: library and {other} agree", file.display());
    ExitCode::SUCCESS
}
