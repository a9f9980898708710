//! Golden tests of the exporters: one fixed synthetic report, rendered by every exporter
//! and compared byte for byte with the files in `tests/golden/`.
//!
//! After an intended change of output, regenerate the files and review the diff:
//!
//! ```text
//! UPDATE_GOLDEN=1 cargo test -p vfscale-lab --test exporters
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use vfscale_lab::export::{self, csv, html, json, markdown, plot};
use vfscale_lab::measure::Target;
use vfscale_lab::result::{Meta, Metric, Report, Row, Skipped, Summary};

/// A row of the fixture; `metrics` are (name, samples).
fn row(workload: &str, target: &str, mode: &str, tasks: usize, metrics: &[(&str, &[f64])]) -> Row {
    Row {
        workload: workload.to_string(),
        target: Target::from_name(target).expect("a target"),
        mode: mode.to_string(),
        tasks,
        held: None,
        files: None,
        fs: None,
        metrics: metrics
            .iter()
            .map(|(name, samples)| (Metric::from(*name), Summary::of(name, samples)))
            .collect(),
    }
}

/// Two workloads × three targets × two task counts, some samples with outliers, one
/// configuration skipped. Fixed in every detail, so its renderings are too.
fn fixture() -> Report {
    const RATE: &str = "acquisitions_per_sec";
    const WAIT: &str = "max_wait_ns";
    const TIME: &str = "total_lock_seconds";
    Report {
        meta: Meta {
            nproc: 8,
            kernel: "6.8.0-45-generic".to_string(),
            commit: "0123abc".to_string(),
            date: "2024-05-01T12:00:00Z".to_string(),
            command: "vfscale run --workload herd,posix01 --tasks 2,8 --runs 5 --out <dir>".to_string(),
        },
        results: vec![
            row(
                "herd",
                "kernel",
                "flock",
                2,
                &[
                    (RATE, &[1.80e6, 1.82e6, 1.79e6, 1.81e6, 1.80e6]),
                    (WAIT, &[5100.0, 5300.0, 4900.0, 5000.0, 5200.0]),
                ],
            ),
            row(
                "herd",
                "kernel",
                "flock",
                8,
                &[
                    (RATE, &[7.1e5, 7.0e5, 6.9e5, 7.2e5, 7.0e5]),
                    (WAIT, &[21000.0, 20500.0, 20800.0, 21200.0, 95000.0]),
                ],
            ),
            row(
                "herd",
                "library",
                "flock",
                2,
                &[
                    (RATE, &[1.42e6, 1.40e6, 1.41e6, 1.39e6, 1.40e6]),
                    (WAIT, &[6100.0, 6000.0, 6200.0, 5900.0, 6000.0]),
                ],
            ),
            row(
                "herd",
                "library",
                "flock",
                8,
                &[
                    (RATE, &[1.38e6, 1.40e6, 1.39e6, 1.41e6, 0.52e6]),
                    (WAIT, &[7000.0, 7100.0, 6900.0, 7050.0, 6950.0]),
                ],
            ),
            row(
                "herd",
                "library-prepatch",
                "flock",
                2,
                &[
                    (RATE, &[1.75e6, 1.78e6, 1.76e6, 1.77e6, 1.74e6]),
                    (WAIT, &[5500.0, 5400.0, 5600.0, 5450.0, 5550.0]),
                ],
            ),
            row(
                "herd",
                "library-prepatch",
                "flock",
                8,
                &[
                    (RATE, &[6.8e5, 6.9e5, 7.0e5, 6.7e5, 6.9e5]),
                    (WAIT, &[22000.0, 21500.0, 22500.0, 21800.0, 22200.0]),
                ],
            ),
            row(
                "posix01",
                "kernel",
                "posix",
                2,
                &[(TIME, &[0.78, 0.80, 0.76, 0.79, 0.77])],
            ),
            row(
                "posix01",
                "kernel",
                "posix",
                8,
                &[(TIME, &[3.09, 3.12, 3.05, 3.10, 3.07])],
            ),
            row(
                "posix01",
                "library",
                "posix",
                2,
                &[(TIME, &[0.42, 0.43, 0.41, 0.42, 0.42])],
            ),
            row(
                "posix01",
                "library",
                "posix",
                8,
                &[(TIME, &[2.55, 2.52, 2.58, 2.54, 2.56])],
            ),
            row(
                "posix01",
                "library-prepatch",
                "posix",
                2,
                &[(TIME, &[0.74, 0.75, 0.73, 0.76, 0.74])],
            ),
            row(
                "posix01",
                "library-prepatch",
                "posix",
                8,
                &[(TIME, &[3.21, 3.18, 3.25, 3.20, 9.90])],
            ),
        ],
        skipped: vec![Skipped {
            workload: "herd".to_string(),
            target: Target::Kernel,
            reason: "mode ofd: F_OFD_SETLKW is not supported by this kernel".to_string(),
        }],
    }
}

/// The golden file `name`.
fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
        .join(name)
}

/// Why `actual` is not `expected`: the first differing line of each, or `None` if equal.
fn golden_diff(expected: &str, actual: &str) -> Option<String> {
    if expected == actual {
        return None;
    }
    let mut lines = expected.lines().zip(actual.lines()).enumerate();
    let detail = match lines.find(|(_, (e, a))| e != a) {
        Some((i, (e, a))) => format!("line {}:\n  golden: {e}\n  actual: {a}", i + 1),
        None => format!(
            "lengths differ: golden {} bytes, actual {} bytes",
            expected.len(),
            actual.len()
        ),
    };
    Some(detail)
}

/// Compares `actual` with the golden file `name`, or rewrites the file when the
/// environment has `UPDATE_GOLDEN=1`.
fn check_golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        fs::write(&path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (create it with UPDATE_GOLDEN=1)", path.display()));
    if let Some(diff) = golden_diff(&expected, actual) {
        panic!(
            "{name} differs from {}; {diff}\nIf the change is intended: \
             UPDATE_GOLDEN=1 cargo test -p vfscale-lab --test exporters",
            path.display()
        );
    }
}

#[test]
fn golden_json() {
    check_golden("results.json", &(json::to_string(&fixture()) + "\n"));
}

#[test]
fn golden_csv() {
    check_golden("results.csv", &csv::to_string(&fixture()).unwrap());
}

#[test]
fn golden_markdown() {
    check_golden("report.md", &markdown::render(&fixture()));
}

#[test]
fn golden_html() {
    check_golden("report.html", &html::render(&fixture()));
}

#[test]
fn golden_svg() {
    let svg = plot::scaling_svg(&fixture(), "herd", "flock").expect("herd/flock has points");
    check_golden("herd-flock.svg", &svg);
}

#[test]
fn golden_check_catches_any_change() {
    let text = markdown::render(&fixture());
    let changed = text.replacen("±", "+-", 1);
    assert!(golden_diff(&text, &changed).is_some());
    assert!(golden_diff(&text, &format!("{text}\n")).is_some());
    assert!(golden_diff(&text, &text).is_none());
}

#[test]
fn rendering_is_deterministic() {
    let (a, b) = (fixture(), fixture());
    assert_eq!(html::render(&a), html::render(&b));
    assert_eq!(
        plot::scaling_svg(&a, "posix01", "posix"),
        plot::scaling_svg(&b, "posix01", "posix")
    );
}

#[test]
fn json_reads_back() {
    let report = fixture();
    let back = json::from_str(&json::to_string(&report)).unwrap();
    assert_eq!(back.results.len(), report.results.len());
    assert_eq!(back.skipped, report.skipped);
    let keys = |r: &Report| r.results.iter().map(Row::key).collect::<Vec<_>>();
    assert_eq!(keys(&back), keys(&report));
}

#[test]
fn html_is_self_contained() {
    let page = html::render(&fixture());
    assert!(page.contains("<svg"));
    assert_eq!(page.matches("<svg").count(), 2, "one plot per (workload, mode)");
    for external in ["http://", "https://", "src=", "<link", "@import"] {
        let allowed =
            external == "http://" && page.matches(external).count() == page.matches("xmlns").count();
        assert!(allowed || !page.contains(external), "{external}");
    }
    assert!(page.contains("&lt;dir&gt;"), "the command is escaped");
}

#[test]
fn svg_labels_are_text_elements() {
    let svg = plot::scaling_svg(&fixture(), "herd", "flock").unwrap();
    for label in [
        "herd flock: acquisitions_per_sec (/s) by tasks, per target",
        "tasks (log scale)",
        "acquisitions_per_sec (/s)",
        "kernel",
        "library-prepatch",
    ] {
        assert!(svg.contains(&format!(">\n{label}\n</text>")), "{label}");
    }
}

/// Reports that are empty or full of NaN still render everywhere.
#[test]
fn odd_reports_render() {
    let mut report = fixture();
    report.results.clear();
    report.skipped.clear();
    assert!(markdown::render(&report).contains("No results."));
    assert!(html::render(&report).contains("No results."));
    assert_eq!(csv::to_string(&report).unwrap().lines().count(), 1);
    assert!(plot::scaling_svg(&report, "herd", "flock").is_none());

    let nan = [f64::NAN, f64::NAN];
    report.results = vec![
        row("herd", "kernel", "flock", 2, &[("acquisitions_per_sec", &nan)]),
        row("herd", "library", "flock", 2, &[("acquisitions_per_sec", &[])]),
        row(
            "herd",
            "library-prepatch",
            "flock",
            0,
            &[("acquisitions_per_sec", &[1.0])],
        ),
    ];
    // A mean that is not a number shows as a dash, never as "NaN" or a made-up value.
    let md = markdown::render(&report);
    assert!(md.contains("| – "), "{md}");
    assert!(!md.contains("NaN"), "{md}");
    assert!(html::render(&report).contains("<td class=\"num\">–"));
    assert!(json::from_str(&json::to_string(&report)).is_ok());
    assert!(csv::to_string(&report).is_ok());
    assert!(
        plot::scaling_svg(&report, "herd", "flock").is_none(),
        "nothing finite at tasks > 0"
    );
}

#[test]
fn write_all_writes_the_four_files() {
    let dir = std::env::temp_dir().join(format!("vfscale-lab-exporters-{}", std::process::id()));
    export::write_all(&fixture(), &dir).unwrap();
    for name in ["results.json", "results.csv", "report.md", "report.html"] {
        let written = fs::read_to_string(dir.join(name)).unwrap();
        assert!(!written.is_empty(), "{name}");
    }
    assert_eq!(
        fs::read_to_string(dir.join("report.md")).unwrap(),
        markdown::render(&fixture())
    );
    let json_file = fs::read_to_string(dir.join("results.json")).unwrap();
    assert_eq!(json_file, json::to_string(&fixture()) + "\n");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn metric_objects_carry_every_summary_field() {
    let report = fixture();
    let value: serde_json::Value = serde_json::from_str(&json::to_string(&report)).unwrap();
    let wait = &value["results"][1]["max_wait_ns"];
    assert_eq!(wait["outliers"], serde_json::json!([4]));
    assert_eq!(wait["samples"].as_array().map(Vec::len), Some(5));
    let metrics: BTreeMap<Metric, Summary> = serde_json::from_value(value["results"][1].clone())
        .map(|r: Row| r.metrics)
        .unwrap();
    assert_eq!(metrics.len(), 2);
}

/// The cluster workload's rows: one per mode, each with its own metrics, as `bench
/// cluster --json` writes them.
fn cluster_report() -> Report {
    let mut rows = vec![
        row(
            "cluster",
            "kernel",
            "uncontended",
            2,
            &[
                ("uncontended_ratio", &[0.96, 0.94]),
                ("etcd_txns_per_lock", &[2.1e-5, 1.9e-5]),
                ("cluster_locks_per_sec", &[48_000.0, 47_000.0]),
                ("single_locks_per_sec", &[50_000.0, 50_000.0]),
            ],
        ),
        row(
            "cluster",
            "kernel",
            "pingpong",
            2,
            &[
                ("locks_per_sec", &[12_000.0, 12_500.0]),
                ("etcd_txn_per_sec", &[880.0, 900.0]),
            ],
        ),
        row(
            "cluster",
            "kernel",
            "failover",
            2,
            &[("failover_sec", &[5.6, 5.4]), ("lease_ttl_sec", &[5.0, 5.0])],
        ),
    ];
    for r in &mut rows {
        r.fs = Some(vfscale_lab::measure::cluster::FS.to_string());
    }
    Report {
        meta: fixture().meta,
        results: rows,
        skipped: Vec::new(),
    }
}

#[test]
fn cluster_rows_go_through_every_exporter() {
    let r = cluster_report();
    assert_eq!(json::from_str(&json::to_string(&r)).unwrap(), r);
    let text = json::to_string(&r);
    for m in [
        "uncontended_ratio",
        "etcd_txns_per_lock",
        "locks_per_sec",
        "etcd_txn_per_sec",
        "failover_sec",
        "lease_ttl_sec",
    ] {
        assert!(text.contains(&format!("\"{m}\"")), "{m} missing in results.json");
    }
    assert!(text.contains("\"workload\": \"cluster\""), "{text}");
    let c = csv::to_string(&r).unwrap();
    assert!(
        c.contains("cluster,kernel,failover,2") && c.contains("failover_sec"),
        "{c}"
    );
    assert!(
        c.lines()
            .any(|l| l.contains("locks_per_sec") && l.contains("1/s")),
        "{c}"
    );
    let md = markdown::render(&r);
    assert!(
        md.contains("uncontended_ratio") && md.contains("etcd_txn_per_sec"),
        "{md}"
    );
    let summary = export::summary::render(&r);
    assert!(
        summary.contains("several servers, one lock space (etcd)"),
        "{summary}"
    );
    assert!(summary.contains("✓"), "{summary}");
    let dir = std::env::temp_dir().join(format!("vfscale-cluster-export-{}", std::process::id()));
    export::write_all(&r, &dir).unwrap();
    let _ = fs::remove_dir_all(&dir);
}
