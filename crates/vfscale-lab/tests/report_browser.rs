//! The HTML report as people see it: rendered by a real browser (headless Chromium,
//! through `scripts/render-report.sh`), it must show its headline, its summary tables and
//! every plot at a non-zero size, and render to a PNG. Where no Chromium is installed
//! (Debian `chromium`), the test says `SKIP` and why.
//!
//! Also checks what `vfscale run` prints for a report as large as the full run's: the
//! headline within the first 15 lines, at most 120 lines in all, and no e-notation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use vfscale_lab::export::{self, plot, summary};
use vfscale_lab::measure::Target;
use vfscale_lab::result::{Meta, Report, Row, Summary};

fn say(msg: &str) {
    let _ = std::io::stderr().write_all(format!("{msg}\n").as_bytes());
}

/// A row whose samples are `mean` ± 5%.
fn row(workload: &str, target: &str, mode: &str, tasks: usize, metrics: &[(&str, f64)]) -> Row {
    let mut r = Row::new(
        workload,
        Target::from_name(target).expect("a target"),
        mode,
        tasks,
    );
    for (name, mean) in metrics {
        let s = [mean * 0.95, *mean, mean * 1.05];
        r.metrics.insert(name.to_string().into(), Summary::of(name, &s));
    }
    r
}

/// A report shaped like a full `vfscale run`: every experiment, every target, the
/// run's task counts.
fn full_run_like() -> Report {
    let mut results = Vec::new();
    let speed = |t: &str| match t {
        "kernel" => 1.0,
        "library-prepatch" => 8.0,
        _ => 20.0,
    };
    for w in ["posix01", "posix02", "flock01", "flock02"] {
        let mode = &w[..5];
        for n in [1, 2, 128] {
            for t in ["kernel", "library-prepatch", "library"] {
                results.push(row(
                    w,
                    t,
                    mode,
                    n,
                    &[
                        ("total_lock_seconds", 0.05 * n as f64 / speed(t)),
                        ("ops_per_sec", 1e6 * speed(t)),
                    ],
                ));
            }
        }
    }
    for w in ["pipebench", "opensock", "dup1"] {
        for n in [1, 2, 4, 16] {
            for t in ["kernel", "library-prepatch", "library"] {
                results.push(row(w, t, "threads", n, &[("ops_per_sec", 1.3e5 * speed(t))]));
            }
        }
    }
    for mode in ["flock", "ofd", "posix"] {
        for n in [2, 20, 100, 1000] {
            for t in ["kernel", "library-prepatch", "library"] {
                results.push(row(
                    "herd",
                    t,
                    mode,
                    n,
                    &[
                        ("acquisitions_per_sec", 6e5 * speed(t)),
                        ("wakeups_per_acquisition", 0.001),
                        ("min_per_worker", 10.0),
                    ],
                ));
            }
        }
    }
    for w in ["lock1", "lock2"] {
        for kind in ["processes", "threads"] {
            for n in [1, 2, 4] {
                for t in ["kernel", "library-prepatch", "library"] {
                    results.push(row(w, t, kind, n, &[("ops_per_sec", 5e5 * speed(t))]));
                }
            }
        }
    }
    Report {
        meta: Meta {
            nproc: 2,
            kernel: "6.18.44".into(),
            commit: "abc1234".into(),
            date: "2026-11-23T12:00:00Z".into(),
            command: "vfscale run".into(),
        },
        results,
        skipped: vec![],
    }
}

#[test]
fn stdout_leads_with_the_headline_and_fits_the_budget() {
    let report = full_run_like();
    let out = summary::render(&report);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() <= summary::MAX_LINES, "{} lines:\n{out}", lines.len());
    say(&format!("a full run's stdout: {} lines", lines.len()));
    let first = lines
        .iter()
        .take(15)
        .filter(|l| l.contains("(NeilBrown, 2018): herd"))
        .count();
    assert_eq!(
        first, 3,
        "the herd headline is not within the first 15 lines:\n{out}"
    );
    assert!(lines[..15].iter().any(|l| l.contains("(Layton, 2013)")), "{out}");
    let findings = vfscale_lab::headline::findings(&report).len();
    let in_first_15 = lines[..15]
        .iter()
        .filter(|l| l.contains(": ") && l.starts_with("  "))
        .count();
    assert_eq!(
        in_first_15, findings,
        "every headline line within the first 15:\n{out}"
    );
    for l in &lines {
        let has_e_notation = l
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
            .any(|w| {
                let b = w.as_bytes();
                w.contains('e')
                    && b.first().is_some_and(u8::is_ascii_digit)
                    && w.split_once('e').is_some_and(|(m, e)| {
                        m.parse::<f64>().is_ok() && e.trim_start_matches(['-', '+']).parse::<u32>().is_ok()
                    })
            });
        assert!(!has_e_notation, "e-notation on stdout: {l}");
    }
}

/// The inode experiment's part of a `run --quick`: every in-memory target and the kernel
/// at 1 and 2 tasks, five phases, and the kernel's skipped cold walk.
fn with_quick_inodes(mut report: Report) -> Report {
    let targets = [
        "kernel",
        "library-prepatch",
        "rwlock-hashmap",
        "dashmap",
        "moka",
        "partitioned",
        "library",
    ];
    for phase in ["create", "walk", "chmod", "unlink", "cold-walk"] {
        for n in [1, 2] {
            for t in targets {
                if t == "kernel" && phase == "cold-walk" {
                    continue;
                }
                let mut r = row(
                    "inodes",
                    t,
                    phase,
                    n,
                    &[
                        ("ops_per_sec", 1e6 * n as f64),
                        ("global_lock_acquisitions_per_op", 0.0),
                    ],
                );
                r.files = Some(3_000);
                report.results.push(r);
            }
        }
    }
    report.skipped.push(vfscale_lab::result::Skipped {
        workload: "inodes".into(),
        target: Target::Kernel,
        reason: "cold-walk: tmpfs pins its inodes (no cache to drop)".into(),
    });
    report
}

/// The inode part adds at most 15 lines to `run --quick` (its table goes to
/// report.md; its headline lines stay), while `run` keeps the table.
#[test]
fn quick_output_adds_at_most_15_lines_for_the_inode_cache() {
    let mut base = full_run_like();
    base.results.retain(|r| r.workload == "herd");
    let with = with_quick_inodes(base.clone());
    let quick = summary::render_quick(&with);
    let added = quick.lines().count() - summary::render_quick(&base).lines().count();
    assert!(added <= 15, "{added} lines:\n{quick}");
    assert!(quick.contains("(Chinner, 2023): inodes library 2/1"), "{quick}");
    assert!(
        quick.contains("In report.md only: inode cache scalability (Chinner, 2023)"),
        "{quick}"
    );
    let full = summary::render(&with);
    assert!(
        full.contains("\ninode cache scalability (Chinner, 2023)"),
        "{full}"
    );
    say(&format!("the inode part of run --quick: {added} lines"));
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|b| {
            std::env::var_os("PATH")?
                .to_str()?
                .split(':')
                .map(|d| Path::new(d).join(b))
                .find(|p| p.is_file())
        })
}

#[test]
fn the_html_report_renders_in_a_browser() {
    if chromium().is_none() {
        say("SKIP: the_html_report_renders_in_a_browser: no chromium on PATH (Debian: apt-get install chromium)");
        return;
    }
    let report = full_run_like();
    let dir = std::env::temp_dir().join(format!("vfscale-report-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    export::write_all(&report, &dir).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/render-report.sh");
    let out = Command::new("bash").arg(&script).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {}\n{stdout}{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("render-report printed {stdout:?}: {e}"));
    let plots = plot::all(&report);
    let summary_tables = summary::summary_tables(&report).len();
    assert_eq!(
        seen["headline"],
        vfscale_lab::headline::findings(&report).len(),
        "{seen}"
    );
    assert!(seen["headline"].as_u64().unwrap() >= 6, "{seen}");
    assert_eq!(seen["summary_tables"], summary_tables, "{seen}");
    let sizes = seen["plots"].as_array().expect("plot sizes");
    assert_eq!(sizes.len(), plots.len(), "every plot is in the page: {seen}");
    for s in sizes {
        let (w, h) = (s[0].as_u64().unwrap(), s[1].as_u64().unwrap());
        assert!(w >= 300 && h >= 200, "a plot renders at {w}×{h}: {seen}");
    }
    let png = std::fs::metadata(dir.join("report.png")).expect("report.png written");
    assert!(png.len() > 20_000, "report.png is only {} bytes", png.len());
    let _ = std::fs::remove_dir_all(&dir);
}
