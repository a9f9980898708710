//! Exporters, one file per format: [`json`] and [`csv`] carry every number at full
//! precision; [`markdown`] and [`html`] open on the headline ([`crate::headline`]) and the
//! summary tables ([`summary`]), then render every table (built here, as [`Table`]s) in
//! SI form ([`units`]); [`plot`] draws the scaling curves as SVG; [`summary`] is also
//! what `vfscale run` prints.
//!
//! Every exporter is a pure function of the [`Report`]: no clock, no environment, so the
//! same report always gives the same bytes.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

use crate::measure::Target;
use crate::result::{Meta, Metric, Report, Row, Summary};
use crate::stats::Ratio;
use crate::units;

pub mod csv;
pub mod html;
pub mod json;
pub mod markdown;
pub mod plot;
pub mod summary;

/// Significant digits of the values shown in tables.
pub const TABLE_DIGITS: usize = 4;

/// The mark appended to a value whose samples include outliers.
pub const OUTLIER_MARK: &str = "†";

/// What the values in the tables are.
pub const LEGEND: &str = "Values are mean ± sample standard deviation over n runs; rates (per second) \
use the harmonic mean.";

/// The note under a table that has values marked with [`OUTLIER_MARK`].
pub const OUTLIER_NOTE: &str = "† the samples include outliers (modified Z-score above 3.5); they \
are kept in the statistics.";

/// Writes `results.json`, `results.csv`, `report.md`, `report.html` (with the plots
/// inline) and `plots/*.svg` (for report.md) into `dir`, creating it if needed.
pub fn write_all(report: &Report, dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::write(dir.join("results.json"), json::to_string(report) + "\n")?;
    fs::write(dir.join("results.csv"), self::csv::to_string(report)?)?;
    fs::write(dir.join("report.md"), markdown::render(report))?;
    fs::write(dir.join("report.html"), html::render(report))?;
    // The plots report.md shows; report.html has them inline.
    let plots = plot::all(report);
    if !plots.is_empty() {
        fs::create_dir_all(dir.join("plots"))?;
        for p in plots {
            fs::write(dir.join("plots").join(format!("{}.svg", p.file_stem)), p.svg)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Number formatting

/// Formats `x` rounded to `digits` significant digits: fixed notation for magnitudes
/// from 1e-3 to below 1e7 (`780.5`, `0.004200`, `1804000` for 1803942), scientific
/// otherwise (`1.235e7`); `NaN`, `inf` and `-inf` for non-finite values, `0` for zero.
pub fn format_sig(x: f64, digits: usize) -> String {
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return "0".to_string();
    }
    let digits = digits.max(1);
    let scientific = format!("{:.*e}", digits - 1, x);
    let exponent = decimal_exponent(&scientific);
    if !(-3..7).contains(&exponent) {
        return scientific;
    }
    // Round through the scientific form, so large values keep only `digits` digits too.
    let rounded: f64 = scientific.parse().unwrap_or(x);
    let decimals = (digits as i32 - 1 - exponent).max(0) as usize;
    format!("{rounded:.decimals$}")
}

/// The exponent of a number formatted with `{:e}` (after rounding, so 9.9996 → 1).
fn decimal_exponent(scientific: &str) -> i32 {
    scientific
        .rsplit_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0)
}

/// `value ± error`, both to [`TABLE_DIGITS`] significant digits.
pub fn format_pm(value: f64, error: f64) -> String {
    format!(
        "{} ± {}",
        format_sig(value, TABLE_DIGITS),
        format_sig(error, TABLE_DIGITS)
    )
}

/// A summary of metric `name` as shown in tables: `mean ± sd` in SI form
/// ([`units::format_summary`]), followed by [`OUTLIER_MARK`] when its samples include
/// outliers.
pub fn format_summary(name: &str, summary: &Summary) -> String {
    let text = units::format_summary(name, summary);
    if summary.outliers.is_empty() {
        text
    } else {
        format!("{text} {OUTLIER_MARK}")
    }
}

/// A metric's column header: its name and unit, `acquisitions_per_sec (/s)`.
pub fn metric_header(name: &str) -> String {
    match Metric::from(name).unit().header() {
        "" => name.to_string(),
        unit => format!("{name} ({unit})"),
    }
}

// ---------------------------------------------------------------------------------------
// Selecting rows

/// The metric that sums a workload up, used for ratios and plots: the preferred one for
/// the workload if any row has it, else the first metric name (alphabetically); `None`
/// when the rows have no metrics.
pub fn main_metric(workload: &str, rows: &[&Row]) -> Option<String> {
    let names = metric_names(rows);
    preferred_metric(workload)
        .filter(|m| names.contains(*m))
        .map(str::to_string)
        .or_else(|| names.into_iter().next())
}

/// The metric the upstream benchmarks report for a workload.
fn preferred_metric(workload: &str) -> Option<&'static str> {
    match workload {
        "herd" => Some("acquisitions_per_sec"),
        "lock1" | "lock2" | "inodes" | "loop" | "pipebench" | "opensock" | "dup1" => Some("ops_per_sec"),
        "lockmany" => Some("set_unset_ns"),
        "cluster" => Some("locks_per_sec"),
        "wakeup" => Some("handoff_ns"),
        "posix01" | "posix02" | "flock01" | "flock02" => Some("total_lock_seconds"),
        _ => None,
    }
}

/// Every metric name in `rows`, sorted.
pub fn metric_names(rows: &[&Row]) -> BTreeSet<String> {
    rows.iter()
        .flat_map(|r| r.metrics.keys().map(|m| m.to_string()))
        .collect()
}

/// The workloads of a report's results, in order of first appearance.
pub fn workloads(report: &Report) -> Vec<&str> {
    first_appearances(report.results.iter().map(|r| r.workload.as_str()))
}

/// The modes measured for `workload`, in order of first appearance.
pub fn modes<'a>(report: &'a Report, workload: &str) -> Vec<&'a str> {
    first_appearances(
        report
            .results
            .iter()
            .filter(|r| r.workload == workload)
            .map(|r| r.mode.as_str()),
    )
}

/// Distinct items in order of first appearance.
fn first_appearances<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// Where a target goes in tables and legends: the kernel, the alternatives, then the
/// library ([`Target::ALL`]'s order).
pub fn target_rank(target: Target) -> usize {
    Target::ALL
        .iter()
        .position(|t| *t == target)
        .unwrap_or(usize::MAX)
}

/// The rows of `workload`, ordered by mode (first appearance), tasks, then target.
pub fn workload_rows<'a>(report: &'a Report, workload: &str) -> Vec<&'a Row> {
    let modes = modes(report, workload);
    let mode_rank = |m: &str| modes.iter().position(|x| *x == m).unwrap_or(usize::MAX);
    let mut rows: Vec<&Row> = report.results.iter().filter(|r| r.workload == workload).collect();
    rows.sort_by(|a, b| {
        let key = |r: &Row| (mode_rank(&r.mode), r.size(), r.tasks, target_rank(r.target));
        key(a).cmp(&key(b))
    });
    rows
}

// ---------------------------------------------------------------------------------------
// The table model shared by markdown and html

/// A rendered-agnostic table: text cells, which columns are numeric (right-aligned), and
/// notes to print under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// The section title (the workload, or `Skipped`).
    pub title: String,
    /// Column headers.
    pub header: Vec<String>,
    /// Per column: whether it holds numbers.
    pub numeric: Vec<bool>,
    /// The cells, row by row, as many as there are headers.
    pub rows: Vec<Vec<String>>,
    /// Footnotes.
    pub notes: Vec<String>,
}

/// The report's header fields, in order.
pub fn meta_fields(meta: &Meta) -> [(&'static str, String); 5] {
    [
        ("nproc", meta.nproc.to_string()),
        ("kernel", meta.kernel.clone()),
        ("commit", meta.commit.clone()),
        ("date", meta.date.clone()),
        ("command", meta.command.clone()),
    ]
}

/// The targets a library row is divided by, in ratio-column order.
const RATIO_BASES: [Target; 2] = [Target::LibraryPrepatch, Target::Kernel];

/// One workload's table: a row per configuration (target, mode, tasks) with each metric
/// as `mean ± sd`, plus a column `library / <base>` for each base target that some
/// `library` row can be divided by (same mode and tasks), on the workload's main metric.
pub fn workload_table(report: &Report, workload: &str) -> Table {
    let rows = workload_rows(report, workload);
    let main = main_metric(workload, &rows);
    let metrics = ordered_metrics(&rows, main.as_deref());
    let bases: Vec<Target> = main
        .as_deref()
        .map(|m| {
            RATIO_BASES
                .into_iter()
                .filter(|b| rows.iter().any(|r| ratio(&rows, r, *b, m).is_some()))
        })
        .into_iter()
        .flatten()
        .collect();

    let size = if rows.iter().any(|r| r.held.is_some()) {
        Some("held")
    } else if rows.iter().any(|r| r.files.is_some()) {
        Some("files")
    } else {
        None
    };
    let with_fs = rows.iter().any(|r| r.fs.is_some());
    let mut header: Vec<String> = vec!["target".into(), "mode".into()];
    let mut numeric = vec![false, false];
    if let Some(s) = size {
        header.push(s.into());
        numeric.push(true);
    }
    header.extend(["tasks".to_string(), "n".to_string()]);
    numeric.extend([true, true]);
    if with_fs {
        header.push("fs".into());
        numeric.push(false);
    }
    header.extend(metrics.iter().map(|m| metric_header(m)));
    header.extend(bases.iter().map(|b| format!("library / {b}")));
    numeric.resize(header.len(), true);

    let cells = rows
        .iter()
        .map(|r| {
            let mut c = row_cells(&rows, r, &metrics, &bases, main.as_deref());
            if with_fs {
                c.insert(4, r.fs.clone().unwrap_or_default());
            }
            if size.is_some() {
                c.insert(2, r.size().map_or_else(String::new, |s| s.to_string()));
            }
            c
        })
        .collect();
    Table {
        title: workload.to_string(),
        header,
        numeric,
        rows: cells,
        notes: workload_notes(&rows, main.as_deref(), !bases.is_empty()),
    }
}

/// The metric columns: the main metric first, the others alphabetically.
fn ordered_metrics(rows: &[&Row], main: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = metric_names(rows).into_iter().collect();
    if let Some(pos) = main.and_then(|m| names.iter().position(|n| n == m)) {
        let first = names.remove(pos);
        names.insert(0, first);
    }
    names
}

/// One table row's cells.
fn row_cells(
    rows: &[&Row],
    row: &Row,
    metrics: &[String],
    bases: &[Target],
    main: Option<&str>,
) -> Vec<String> {
    let runs = row.metrics.values().map(|s| s.n).max().unwrap_or(0);
    let mut cells = vec![
        row.target.name().to_string(),
        row.mode.clone(),
        row.tasks.to_string(),
        runs.to_string(),
    ];
    cells.extend(metrics.iter().map(|m| {
        row.metrics
            .get(m.as_str())
            .map_or_else(|| "-".to_string(), |s| format_summary(m, s))
    }));
    cells.extend(bases.iter().map(|b| {
        main.and_then(|m| ratio(rows, row, *b, m))
            .map_or_else(String::new, |(r, e)| units::format_ratio_pm(r, e))
    }));
    cells
}

/// `metric` of a `library` row over the same configuration on `base`, with its error.
fn ratio(rows: &[&Row], row: &Row, base: Target, metric: &str) -> Option<(f64, f64)> {
    if row.target != Target::Library {
        return None;
    }
    let other = rows
        .iter()
        .find(|o| o.target == base && o.mode == row.mode && o.tasks == row.tasks && o.size() == row.size())?;
    let r = Ratio::unpaired(
        &Metric::from(metric),
        row.metrics.get(metric)?,
        other.metrics.get(metric)?,
    );
    Some((r.value, r.error))
}

/// The notes under a workload table: what the ratios are, and the outlier mark.
fn workload_notes(rows: &[&Row], main: Option<&str>, has_ratios: bool) -> Vec<String> {
    let mut notes = Vec::new();
    if let (true, Some(main)) = (has_ratios, main) {
        notes.push(format!(
            "Ratios: {main} of library over the same configuration on the named target, shown on the \
             library row; ± is the ratio's standard error, propagated from both means."
        ));
    }
    if rows
        .iter()
        .any(|r| r.metrics.values().any(|s| !s.outliers.is_empty()))
    {
        notes.push(OUTLIER_NOTE.to_string());
    }
    notes
}

/// The configurations that could not run, or `None` when every one ran.
pub fn skipped_table(report: &Report) -> Option<Table> {
    if report.skipped.is_empty() {
        return None;
    }
    Some(Table {
        title: "Skipped".to_string(),
        header: ["workload", "target", "reason"].map(String::from).to_vec(),
        numeric: vec![false; 3],
        rows: report
            .skipped
            .iter()
            .map(|s| vec![s.workload.clone(), s.target.name().to_string(), s.reason.clone()])
            .collect(),
        notes: Vec::new(),
    })
}

/// Every table of a report, in order: one per workload, then the skipped configurations.
pub fn tables(report: &Report) -> Vec<Table> {
    let mut all: Vec<Table> = workloads(report)
        .into_iter()
        .map(|w| workload_table(report, w))
        .collect();
    all.extend(skipped_table(report));
    all
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn significant_digits() {
        let cases = [
            (780.50511606027, "780.5"),
            (20.0773085693901, "20.08"),
            (0.347121187462215, "0.3471"),
            (1.0, "1.000"),
            (12346.0, "12350"),
            (1234567.0, "1235000"),
            (1803942.437, "1804000"),
            (9999.7, "10000"),
            (0.99996, "1.000"),
            (12345678.0, "1.235e7"),
            (0.000123456, "1.235e-4"),
            (-2.5, "-2.500"),
            (0.0, "0"),
            (-0.0, "0"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (x, want) in cases {
            assert_eq!(format_sig(x, 4), want, "{x}");
        }
        assert_eq!(format_sig(2.0, 0), "2");
    }

    fn summary(samples: &[f64]) -> Summary {
        crate::stats::summarize(samples, false)
    }

    #[test]
    fn summary_cell_marks_outliers() {
        assert_eq!(format_summary("x", &summary(&[1.0, 2.0, 3.0])), "2.00 ± 1.0");
        let s = summary(&[10.0, 9.0, 11.0, 10.0, 30.0]);
        assert!(format_summary("x", &s).ends_with(" †"));
    }

    fn row(workload: &str, target: &str, tasks: usize, metrics: &[(&str, &[f64])]) -> Row {
        let metrics: BTreeMap<Metric, Summary> = metrics
            .iter()
            .map(|(n, s)| (Metric::from(*n), Summary::of(n, s)))
            .collect();
        Row {
            workload: workload.into(),
            target: Target::from_name(target).expect("a target"),
            mode: "flock".into(),
            tasks,
            held: None,
            files: None,
            fs: None,
            metrics,
        }
    }

    #[test]
    fn main_metric_prefers_the_upstream_metric() {
        let a = row(
            "herd",
            "kernel",
            1,
            &[("acquisitions_per_sec", &[1.0]), ("a_ns", &[1.0])],
        );
        let b = row("mystery", "kernel", 1, &[("z", &[1.0]), ("b", &[1.0])]);
        assert_eq!(
            main_metric("herd", &[&a]).as_deref(),
            Some("acquisitions_per_sec")
        );
        assert_eq!(main_metric("posix01", &[&b]).as_deref(), Some("b"));
        assert_eq!(main_metric("herd", &[]), None);
    }

    #[test]
    fn ratio_columns_only_where_both_targets_exist() {
        let m = "total_lock_seconds";
        let report = Report {
            meta: Meta {
                nproc: 1,
                kernel: String::new(),
                commit: String::new(),
                date: String::new(),
                command: String::new(),
            },
            results: vec![
                row("posix01", "library", 2, &[(m, &[2.0, 2.0])]),
                row("posix01", "library-prepatch", 2, &[(m, &[4.0, 4.0])]),
                row("posix01", "library", 4, &[(m, &[3.0, 3.0])]),
            ],
            skipped: vec![],
        };
        let t = workload_table(&report, "posix01");
        assert_eq!(
            t.header.last().map(String::as_str),
            Some("library / library-prepatch")
        );
        assert_eq!(t.rows.len(), 3);
        // Sorted by tasks then target: prepatch first, then library with the ratio.
        assert_eq!(t.rows[0][0], "library-prepatch");
        assert_eq!(t.rows[0][5], "");
        assert_eq!(t.rows[1][5], "0.500×");
        assert_eq!(t.rows[2][5], "");
    }

    #[test]
    fn empty_report_has_no_tables() {
        let report = Report {
            meta: Meta {
                nproc: 0,
                kernel: String::new(),
                commit: String::new(),
                date: String::new(),
                command: String::new(),
            },
            results: vec![],
            skipped: vec![],
        };
        assert!(tables(&report).is_empty());
    }
}
