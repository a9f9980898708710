//! `results.csv`: one line per (row, metric), every number at full precision (the
//! shortest decimal that reads back to the same `f64`; `NaN`, `inf` for non-finite
//! values). The `outliers` column lists the outlying samples' indices, separated by `;`
//! (empty when there are none).

use std::io;

use crate::result::{Metric, Report, Row, Summary};

/// The header line's columns.
pub const COLUMNS: [&str; 14] = [
    "workload",
    "target",
    "mode",
    "tasks",
    "metric",
    "unit",
    "mean",
    "stddev",
    "n",
    "ci95_low",
    "ci95_high",
    "min",
    "max",
    "outliers",
];

/// The report as CSV text, header first, rows in report order, metrics by name.
pub fn to_string(report: &Report) -> io::Result<String> {
    let mut writer = ::csv::Writer::from_writer(Vec::new());
    writer.write_record(COLUMNS)?;
    for row in &report.results {
        for (name, summary) in &row.metrics {
            writer.write_record(record(row, name.name(), summary))?;
        }
    }
    let bytes = writer.into_inner().map_err(|e| e.into_error())?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// One (row, metric) line.
fn record(row: &Row, name: &str, s: &Summary) -> [String; 14] {
    [
        row.workload.clone(),
        row.target.name().to_string(),
        row.mode.clone(),
        row.tasks.to_string(),
        name.to_string(),
        Metric::from(name).unit().symbol().to_string(),
        s.mean.to_string(),
        s.stddev.to_string(),
        s.n.to_string(),
        s.ci95[0].to_string(),
        s.ci95[1].to_string(),
        s.min.to_string(),
        s.max.to_string(),
        s.outliers
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(";"),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::result::Meta;

    #[test]
    fn one_line_per_row_and_metric_with_quoting() {
        let metrics = BTreeMap::from([
            (
                "total_lock_seconds".into(),
                Summary::of("total_lock_seconds", &[1.5, 2.5]),
            ),
            ("b".into(), Summary::of("b", &[])),
        ]);
        let report = Report {
            meta: Meta {
                nproc: 1,
                kernel: String::new(),
                commit: String::new(),
                date: String::new(),
                command: String::new(),
            },
            results: vec![Row {
                workload: "posix01".into(),
                target: crate::measure::Target::Kernel,
                mode: "a,b".into(),
                tasks: 3,
                held: None,
                files: None,
                fs: None,
                metrics,
            }],
            skipped: vec![],
        };
        let text = to_string(&report).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], COLUMNS.join(","));
        assert_eq!(lines[1], "posix01,kernel,\"a,b\",3,b,,NaN,NaN,0,NaN,NaN,NaN,NaN,");
        assert!(lines[2].starts_with("posix01,kernel,\"a,b\",3,total_lock_seconds,s,2,0.7071067811865476,2,"));
        assert_eq!(lines.len(), 3);
    }
}
