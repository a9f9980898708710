//! [`Sample`]: what one repetition of a workload measured.

use std::collections::BTreeMap;
use std::ops::Index;

use crate::result::Metric;

/// One repetition's measurements: metric → value for the configuration's own mode,
/// the same per mode for a run that measures several modes at once (the inodes phases,
/// each of which becomes its own result row), and the parts of the run that could not
/// be measured here, each with why (listed with the skipped configurations).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    own: BTreeMap<Metric, f64>,
    modes: BTreeMap<String, BTreeMap<Metric, f64>>,
    skipped: Vec<String>,
}

impl Sample {
    /// Nothing measured yet.
    pub fn new() -> Sample {
        Sample::default()
    }

    /// Records `metric` of the configuration's own mode.
    pub fn insert(&mut self, metric: Metric, value: f64) {
        self.own.insert(metric, value);
    }

    /// Records `metric` of `mode`, for a run that measures several modes at once.
    pub fn insert_in(&mut self, mode: &str, metric: Metric, value: f64) {
        self.modes
            .entry(mode.to_string())
            .or_default()
            .insert(metric, value);
    }

    /// Records that a part of the run could not be measured here, and why
    /// (`cold-walk: tmpfs pins its inodes`).
    pub fn skip(&mut self, why: String) {
        self.skipped.push(why);
    }

    /// `metric` of the configuration's own mode.
    pub fn get(&self, metric: &str) -> Option<f64> {
        self.own.get(metric).copied()
    }

    /// `metric` of `mode`.
    pub fn get_in(&self, mode: &str, metric: &str) -> Option<f64> {
        self.modes.get(mode)?.get(metric).copied()
    }

    /// Whether the own mode has `metric`.
    pub fn contains_key(&self, metric: &str) -> bool {
        self.own.contains_key(metric)
    }

    /// The own mode's metric names, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &Metric> {
        self.own.keys()
    }

    /// The modes measured besides the own one, sorted.
    pub fn modes(&self) -> impl Iterator<Item = &str> {
        self.modes.keys().map(String::as_str)
    }

    /// Why parts of the run were not measured.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// Every metric: `(None, name, value)` for the own mode, `(Some(mode), ...)` for the
    /// others.
    pub fn metrics(&self) -> impl Iterator<Item = (Option<&str>, &Metric, f64)> {
        let own = self.own.iter().map(|(k, v)| (None, k, *v));
        let modes = self
            .modes
            .iter()
            .flat_map(|(m, ms)| ms.iter().map(move |(k, v)| (Some(m.as_str()), k, *v)));
        own.chain(modes)
    }

    /// Keeps the modes `keep` accepts (the own mode and the skips stay).
    pub fn retain_modes(&mut self, keep: impl Fn(&str) -> bool) {
        self.modes.retain(|m, _| keep(m));
    }

    /// Adds everything `other` measured or skipped.
    pub fn extend(&mut self, other: Sample) {
        self.own.extend(other.own);
        for (mode, metrics) in other.modes {
            self.modes.entry(mode).or_default().extend(metrics);
        }
        self.skipped.extend(other.skipped);
    }
}

/// The own mode's `metric`; panics when it was not measured (for tests and callers that
/// just inserted it).
impl Index<&str> for Sample {
    type Output = f64;

    fn index(&self, metric: &str) -> &f64 {
        self.own
            .get(metric)
            .unwrap_or_else(|| panic!("no metric {metric} in {self:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_skips_stay_apart_from_metrics() {
        let mut s = Sample::new();
        s.insert("ops_per_sec".into(), 2.0);
        s.insert_in("walk", "ops_per_sec".into(), 3.0);
        s.skip("cold-walk: tmpfs pins its inodes".into());
        assert_eq!(s["ops_per_sec"], 2.0);
        assert_eq!(s.get_in("walk", "ops_per_sec"), Some(3.0));
        assert_eq!(s.keys().count(), 1);
        assert_eq!(s.skipped(), ["cold-walk: tmpfs pins its inodes"]);
        let all: Vec<_> = s.metrics().map(|(m, k, v)| (m, k.name(), v)).collect();
        assert_eq!(
            all,
            [(None, "ops_per_sec", 2.0), (Some("walk"), "ops_per_sec", 3.0)]
        );
        s.retain_modes(|m| m != "walk");
        assert_eq!(s.modes().count(), 0);
        assert_eq!(s.skipped().len(), 1);
    }
}
