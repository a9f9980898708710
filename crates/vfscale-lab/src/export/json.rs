//! `results.json`: the [`Report`] as pretty JSON, every number at full precision.
//!
//! Each row's metrics sit at the row's top level under their full names, each an object
//! with every [`Summary`] field (`mean`, `stddev`, `n`, `ci95`, `min`, `max`, `outliers`,
//! `samples`). JSON has no NaN or infinity: such values are written as `null`, and
//! [`from_str`] reads them back as NaN.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::measure::Target;
use crate::result::{Meta, Metric, Report, Row, Skipped, Summary};

/// The report as pretty-printed JSON (no trailing newline, so it can be `println!`ed).
pub fn to_string(report: &Report) -> String {
    // A Report has only string map keys and plain fields: serializing it cannot fail.
    serde_json::to_string_pretty(report).expect("a Report always serializes to JSON")
}

/// Reads a report written by [`to_string`], accepting `null` where a number is expected
/// (NaN or an infinite bound when written) and reading it as NaN.
pub fn from_str(text: &str) -> serde_json::Result<Report> {
    serde_json::from_str::<LenientReport>(text).map(LenientReport::into_report)
}

/// A [`Report`] whose numbers may be `null`.
#[derive(Deserialize)]
struct LenientReport {
    meta: Meta,
    results: Vec<LenientRow>,
    #[serde(default)]
    skipped: Vec<Skipped>,
}

/// A [`Row`] whose numbers may be `null`.
#[derive(Deserialize)]
struct LenientRow {
    workload: String,
    #[serde(with = "crate::result::target_name")]
    target: Target,
    mode: String,
    tasks: usize,
    #[serde(default)]
    held: Option<u64>,
    #[serde(default)]
    files: Option<u64>,
    #[serde(default)]
    fs: Option<String>,
    #[serde(flatten)]
    metrics: BTreeMap<String, LenientSummary>,
}

/// A [`Summary`] whose numbers may be `null`.
#[derive(Deserialize)]
struct LenientSummary {
    mean: Option<f64>,
    stddev: Option<f64>,
    n: usize,
    ci95: [Option<f64>; 2],
    min: Option<f64>,
    max: Option<f64>,
    outliers: Vec<usize>,
    samples: Vec<Option<f64>>,
}

/// `null` → NaN.
fn number(x: Option<f64>) -> f64 {
    x.unwrap_or(f64::NAN)
}

impl LenientReport {
    fn into_report(self) -> Report {
        Report {
            meta: self.meta,
            results: self.results.into_iter().map(LenientRow::into_row).collect(),
            skipped: self.skipped,
        }
    }
}

impl LenientRow {
    fn into_row(self) -> Row {
        Row {
            workload: self.workload,
            target: self.target,
            mode: self.mode,
            tasks: self.tasks,
            held: self.held,
            files: self.files,
            fs: self.fs,
            metrics: self
                .metrics
                .into_iter()
                .map(|(k, s)| (Metric::from(k), s.into_summary()))
                .collect(),
        }
    }
}

impl LenientSummary {
    fn into_summary(self) -> Summary {
        Summary {
            mean: number(self.mean),
            stddev: number(self.stddev),
            n: self.n,
            ci95: self.ci95.map(number),
            min: number(self.min),
            max: number(self.max),
            outliers: self.outliers,
            samples: self.samples.into_iter().map(number).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(samples: &[f64]) -> Report {
        let metrics = BTreeMap::from([("ops_per_sec".into(), Summary::of("ops_per_sec", samples))]);
        Report {
            meta: Meta {
                nproc: 4,
                kernel: "6.1.0".into(),
                commit: "abc1234".into(),
                date: "2024-01-01T00:00:00Z".into(),
                command: "vfscale run".into(),
            },
            results: vec![Row {
                workload: "lock1".into(),
                target: Target::Kernel,
                mode: "threads".into(),
                tasks: 2,
                held: None,
                files: None,
                fs: None,
                metrics,
            }],
            skipped: vec![],
        }
    }

    #[test]
    fn metrics_are_objects_at_the_row_top_level() {
        let value: serde_json::Value = serde_json::from_str(&to_string(&report(&[4.0, 5.0]))).unwrap();
        let row = &value["results"][0];
        assert_eq!(row["workload"], "lock1");
        let metric = &row["ops_per_sec"];
        for field in ["mean", "stddev", "n", "ci95", "min", "max", "outliers", "samples"] {
            assert!(!metric[field].is_null(), "{field} missing");
        }
        assert_eq!(metric["n"], 2);
        let keys: Vec<&String> = row.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["workload", "target", "mode", "tasks", "ops_per_sec"]);
    }

    #[test]
    fn writes_full_precision_and_reads_back() {
        let r = report(&[3.1, 10.0 / 3.0, 2.0f64.sqrt() * 2.0]);
        let s = &r.results[0].metrics["ops_per_sec"];
        let text = to_string(&r);
        // Written as the shortest decimal that reads back to the same f64.
        for x in [s.mean, s.stddev, s.ci95[0], s.ci95[1], s.samples[1], s.samples[2]] {
            assert!(text.contains(&format!("{x:?}")), "{x:?} not in {text}");
        }
        // serde_json without its `float_roundtrip` feature may read the last bit differently.
        let back = from_str(&text).unwrap();
        let b = &back.results[0].metrics["ops_per_sec"];
        assert_eq!((&back.meta, back.results[0].key()), (&r.meta, r.results[0].key()));
        for (x, y) in [
            (s.mean, b.mean),
            (s.ci95[1], b.ci95[1]),
            (s.samples[1], b.samples[1]),
        ] {
            assert!((x - y).abs() <= 2.0 * f64::EPSILON * x.abs(), "{x} {y}");
        }
    }

    #[test]
    fn nan_and_infinity_come_back_as_nan() {
        // Two very different rates: the interval's upper bound is infinite → null.
        let r = report(&[100.0, 200.0]);
        let text = to_string(&r);
        assert!(text.contains("null"));
        assert!(
            serde_json::from_str::<Report>(&text).is_err(),
            "the strict model rejects null"
        );
        let back = from_str(&text).unwrap();
        assert!(back.results[0].metrics["ops_per_sec"].ci95[1].is_nan());
        let empty = from_str(&to_string(&report(&[]))).unwrap();
        assert!(empty.results[0].metrics["ops_per_sec"].mean.is_nan());
    }
}
