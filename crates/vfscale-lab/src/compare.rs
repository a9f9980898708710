//! Comparing two reports (`vfscale compare A.json B.json`): for every configuration and
//! metric measured in both, the ratio B/A with its propagated error, Welch's t-test, and
//! a verdict that only calls a change when it is both significant and above the noise.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use comfy_table::{presets, CellAlignment, Table};

use crate::export::json;
use crate::result::{Metric, Report, Row, Summary};
use crate::stats::{Ratio, SIGNIFICANCE};
use crate::units;

/// Smallest relative change called a change, whatever the p-value.
pub const MIN_CHANGE: f64 = 0.02;

/// How B does against A on one metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Significantly and noticeably better in B.
    Better,
    /// Significantly and noticeably worse in B.
    Worse,
    /// No change that stands out of the noise.
    Same,
}

impl Mark {
    /// `better`, `worse` or `~`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Better => "better",
            Mark::Worse => "worse",
            Mark::Same => "~",
        }
    }
}

/// One metric of one configuration, measured in both reports.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricComparison {
    /// The configuration, [`Row::key`].
    pub configuration: String,
    /// The metric.
    pub metric: Metric,
    /// The metric in report A.
    pub a: Summary,
    /// The metric in report B.
    pub b: Summary,
    /// B's mean over A's, unpaired ([`Ratio::unpaired`]: two reports are two runs).
    pub ratio: Ratio,
    /// The verdict.
    pub mark: Mark,
}

/// The comparison of two reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Every metric measured in both, in A's row order, metrics by name.
    pub metrics: Vec<MetricComparison>,
    /// What only A has: configurations (`key`) and metrics of shared ones (`key metric`).
    pub only_in_a: Vec<String>,
    /// What only B has, likewise.
    pub only_in_b: Vec<String>,
}

/// Reads a report written by `results.json` (see [`json::from_str`]).
pub fn load(path: &Path) -> io::Result<Report> {
    let text = std::fs::read_to_string(path)?;
    json::from_str(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
}

/// Compares report B against report A, matching rows by [`Row::key`] and metrics by name.
/// When a report has the same configuration twice, its first row is used.
pub fn compare(a: &Report, b: &Report) -> Comparison {
    let rows_a = rows_by_key(a);
    let rows_b = rows_by_key(b);
    let mut comparison = Comparison {
        metrics: Vec::new(),
        only_in_a: Vec::new(),
        only_in_b: Vec::new(),
    };
    for (key, row_a) in &rows_a {
        match find(&rows_b, key) {
            Some(row_b) => compare_rows(&mut comparison, key, row_a, row_b),
            None => comparison.only_in_a.push(key.clone()),
        }
    }
    for (key, _) in &rows_b {
        if find(&rows_a, key).is_none() {
            comparison.only_in_b.push(key.clone());
        }
    }
    comparison
}

/// A report's rows with their keys, in order, the first of each key only.
fn rows_by_key(report: &Report) -> Vec<(String, &Row)> {
    let mut seen = HashSet::new();
    report
        .results
        .iter()
        .map(|r| (r.key(), r))
        .filter(|(key, _)| seen.insert(key.clone()))
        .collect()
}

/// The row with `key`.
fn find<'a>(rows: &[(String, &'a Row)], key: &str) -> Option<&'a Row> {
    rows.iter().find(|(k, _)| k == key).map(|(_, r)| *r)
}

/// Compares the metrics of one configuration, noting those only one side has.
fn compare_rows(comparison: &mut Comparison, key: &str, a: &Row, b: &Row) {
    for (name, summary_a) in &a.metrics {
        match b.metrics.get(name) {
            Some(summary_b) => comparison
                .metrics
                .push(compare_metric(key, name, summary_a, summary_b)),
            None => comparison.only_in_a.push(format!("{key} {name}")),
        }
    }
    let only_b = b.metrics.keys().filter(|name| !a.metrics.contains_key(*name));
    comparison
        .only_in_b
        .extend(only_b.map(|name| format!("{key} {name}")));
}

/// Compares one metric.
pub fn compare_metric(configuration: &str, metric: &Metric, a: &Summary, b: &Summary) -> MetricComparison {
    let ratio = Ratio::unpaired(metric, b, a);
    MetricComparison {
        configuration: configuration.to_string(),
        metric: metric.clone(),
        a: a.clone(),
        b: b.clone(),
        ratio,
        mark: mark(metric, &ratio),
    }
}

/// The verdict on a ratio B/A: a change only when significant (p < [`SIGNIFICANCE`]) and
/// larger than the noise (|ratio − 1| above twice its error and above [`MIN_CHANGE`]);
/// its direction then comes from [`Metric::higher_is_better`]. NaN anywhere gives `~`.
pub fn mark(metric: &Metric, ratio: &Ratio) -> Mark {
    let change = (ratio.value - 1.0).abs();
    let stands_out = ratio.p < SIGNIFICANCE && change > 2.0 * ratio.error && change > MIN_CHANGE;
    if !stands_out {
        return Mark::Same;
    }
    if (ratio.value > 1.0) == metric.higher_is_better() {
        Mark::Better
    } else {
        Mark::Worse
    }
}

/// The comparison as a plain-text table (one line per configuration and metric), then
/// what only one report has.
pub fn render_comparison(c: &Comparison) -> String {
    let mut table = Table::new();
    table.load_preset(presets::ASCII_BORDERS_ONLY_CONDENSED);
    table.set_header([
        "configuration",
        "metric",
        "A mean ± sd",
        "B mean ± sd",
        "B/A ± err",
        "p",
        "mark",
    ]);
    for m in &c.metrics {
        table.add_row([
            m.configuration.clone(),
            m.metric.to_string(),
            units::format_summary(m.metric.name(), &m.a),
            units::format_summary(m.metric.name(), &m.b),
            units::format_ratio_pm(m.ratio.value, m.ratio.error),
            units::format_p(m.ratio.p),
            m.mark.as_str().to_string(),
        ]);
    }
    for column in 2..6 {
        if let Some(col) = table.column_mut(column) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut out = table.to_string();
    out.push('\n');
    out.push_str(&only_in("A", &c.only_in_a));
    out.push_str(&only_in("B", &c.only_in_b));
    out
}

/// `only in A: x, y` on its own line, or nothing.
fn only_in(side: &str, items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!("only in {side}: {}\n", items.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::measure::Target;
    use crate::result::Meta;

    fn row(target: &str, tasks: usize, metrics: &[(&str, &[f64])]) -> Row {
        let metrics: BTreeMap<Metric, Summary> = metrics
            .iter()
            .map(|(n, s)| (Metric::from(*n), Summary::of(n, s)))
            .collect();
        Row {
            workload: "herd".into(),
            target: Target::from_name(target).expect("a target"),
            mode: "flock".into(),
            tasks,
            held: None,
            files: None,
            fs: None,
            metrics,
        }
    }

    fn report(results: Vec<Row>) -> Report {
        Report {
            meta: Meta {
                nproc: 8,
                kernel: "6.1.0".into(),
                commit: "abc1234".into(),
                date: "2024-01-01T00:00:00Z".into(),
                command: "vfscale run".into(),
            },
            results,
            skipped: vec![],
        }
    }

    const RATE: &str = "acquisitions_per_sec";
    const TIME: &str = "total_lock_seconds";
    const WAIT: &str = "max_wait_ns";

    /// A: the baseline. B: rate clearly up, lock time only noise, max wait clearly up.
    fn pair() -> (Report, Report) {
        let a = report(vec![
            row("kernel", 2, &[(RATE, &[1000.0, 1010.0, 990.0, 1005.0, 995.0])]),
            row(
                "library",
                2,
                &[
                    (TIME, &[10.0, 10.4, 9.6, 10.2, 9.8]),
                    (WAIT, &[100.0, 102.0, 98.0, 101.0, 99.0]),
                ],
            ),
            row("library", 4, &[(TIME, &[1.0, 1.0])]),
        ]);
        let b = report(vec![
            row("kernel", 2, &[(RATE, &[1500.0, 1510.0, 1490.0, 1505.0, 1495.0])]),
            row(
                "library",
                2,
                &[
                    (TIME, &[10.1, 10.5, 9.7, 9.9, 9.9]),
                    (WAIT, &[150.0, 152.0, 148.0, 151.0, 149.0]),
                ],
            ),
            row("library", 8, &[(TIME, &[1.0, 1.0])]),
        ]);
        (a, b)
    }

    fn find<'a>(c: &'a Comparison, metric: &str) -> &'a MetricComparison {
        c.metrics.iter().find(|m| m.metric.name() == metric).unwrap()
    }

    #[test]
    fn marks_better_noise_and_worse() {
        let (a, b) = pair();
        let c = compare(&a, &b);
        assert_eq!(c.metrics.len(), 3);
        let rate = find(&c, RATE);
        assert_eq!(rate.mark, Mark::Better);
        assert!((rate.ratio.value - 1.5).abs() < 1e-3);
        assert!(rate.ratio.p < 1e-6);
        let time = find(&c, TIME);
        assert_eq!(time.mark, Mark::Same);
        assert!(time.ratio.p > 0.5);
        let wait = find(&c, WAIT);
        assert_eq!(wait.mark, Mark::Worse);
        assert!((wait.ratio.value - 1.5).abs() < 1e-12);
    }

    #[test]
    fn lists_rows_only_on_one_side() {
        let (a, b) = pair();
        let c = compare(&a, &b);
        assert_eq!(c.only_in_a, ["herd/library/flock/4"]);
        assert_eq!(c.only_in_b, ["herd/library/flock/8"]);
    }

    #[test]
    fn lists_metrics_only_on_one_side() {
        let a = report(vec![row(
            "kernel",
            2,
            &[(TIME, &[1.0, 2.0]), (WAIT, &[1.0, 2.0])],
        )]);
        let b = report(vec![row(
            "kernel",
            2,
            &[(TIME, &[1.0, 2.0]), (RATE, &[1.0, 2.0])],
        )]);
        let c = compare(&a, &b);
        assert_eq!(c.metrics.len(), 1);
        assert_eq!(c.only_in_a, ["herd/kernel/flock/2 max_wait_ns"]);
        assert_eq!(c.only_in_b, ["herd/kernel/flock/2 acquisitions_per_sec"]);
    }

    fn r(value: f64, error: f64, p: f64) -> Ratio {
        Ratio { value, error, p }
    }

    #[test]
    fn small_or_noisy_changes_are_not_marked() {
        // Significant but only 1%: below MIN_CHANGE.
        assert_eq!(mark(&Metric::from(TIME), &r(1.01, 0.001, 1e-9)), Mark::Same);
        // Large but within twice its error.
        assert_eq!(mark(&Metric::from(TIME), &r(1.5, 0.3, 0.01)), Mark::Same);
        // Large and precise but not significant.
        assert_eq!(mark(&Metric::from(TIME), &r(1.5, 0.01, 0.2)), Mark::Same);
        assert_eq!(
            mark(&Metric::from(TIME), &r(f64::NAN, f64::NAN, f64::NAN)),
            Mark::Same
        );
        assert_eq!(mark(&Metric::from(TIME), &r(0.5, 0.01, 0.001)), Mark::Better);
        assert_eq!(mark(&Metric::from(RATE), &r(0.5, 0.01, 0.001)), Mark::Worse);
    }

    #[test]
    fn single_runs_and_empty_reports_do_not_panic() {
        let a = report(vec![row("kernel", 2, &[(TIME, &[1.0])])]);
        let b = report(vec![row("kernel", 2, &[(TIME, &[2.0])])]);
        let c = compare(&a, &b);
        assert!(c.metrics[0].ratio.p.is_nan());
        assert_eq!(c.metrics[0].mark, Mark::Same);
        let empty = compare(&report(vec![]), &report(vec![]));
        assert!(empty.metrics.is_empty());
        assert!(render_comparison(&empty).contains("configuration"));
    }

    #[test]
    fn renders_a_stable_table() {
        let (a, b) = pair();
        let expected = "\
+---------------------------------------------------------------------------------------------------------------------+
| configuration          metric                     A mean ± sd       B mean ± sd        B/A ± err         p   mark   |
+=====================================================================================================================+
| herd/kernel/flock/2    acquisitions_per_sec      1000/s ± 7.9      1500/s ± 7.9   1.50× ± 0.0064   < 0.001   better |
| herd/library/flock/2   max_wait_ns            100 ns ± 1.6 ns   150 ns ± 1.6 ns    1.50× ± 0.013   < 0.001   worse  |
| herd/library/flock/2   total_lock_seconds     10.0 s ± 0.32 s   10.0 s ± 0.30 s    1.00× ± 0.020      0.92   ~      |
+---------------------------------------------------------------------------------------------------------------------+
only in A: herd/library/flock/4
only in B: herd/library/flock/8
";
        assert_eq!(render_comparison(&compare(&a, &b)), expected);
    }
}
