//! The herd's metrics, the same for its kernel and library targets: each worker's
//! waits from request to grant in a [`WaitHistogram`], and the fairness of the shares
//! ([`herd_fairness`]).

use super::Sample;

/// Waits in a log-linear histogram: exact below 32 units, then 16 buckets per power of
/// two (a value is known within 1/16 of itself). Counts are weights, so sampled values
/// can stand for several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WaitHistogram {
    counts: Vec<u64>,
    max: u64,
}

impl WaitHistogram {
    /// Buckets: 32 exact ones, then 16 for each power of two from 2^5 to 2^42.
    pub(crate) const BUCKETS: usize = 32 + 38 * 16;

    pub(crate) fn new() -> WaitHistogram {
        WaitHistogram {
            counts: vec![0; Self::BUCKETS],
            max: 0,
        }
    }

    /// The bucket of `v` (values past 2^43 share the last one).
    pub(crate) fn bucket(v: u64) -> usize {
        if v < 32 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize;
        let sub = ((v >> (e - 4)) & 15) as usize;
        (32 + (e - 5) * 16 + sub).min(Self::BUCKETS - 1)
    }

    /// The middle of bucket `b`.
    pub(crate) fn value(b: usize) -> f64 {
        if b < 32 {
            return b as f64;
        }
        let e = (b - 32) / 16 + 5;
        let sub = ((b - 32) % 16) as u64;
        let width = 1u64 << (e - 4);
        ((16 + sub) * width) as f64 + width as f64 / 2.0
    }

    pub(crate) fn record(&mut self, v: u64, weight: u64) {
        self.counts[Self::bucket(v)] += weight;
        self.max = self.max.max(v);
    }

    /// Adds `weight` values in bucket `b`, the largest being at least `max`.
    pub(crate) fn add_bucket(&mut self, b: usize, weight: u64) {
        self.counts[b] += weight;
    }

    pub(crate) fn set_max(&mut self, max: u64) {
        self.max = self.max.max(max);
    }

    pub(crate) fn merge(&mut self, other: &WaitHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    /// The value below which a fraction `q` of the weight lies (a bucket's middle, and
    /// never above the largest value seen); 0 when empty.
    pub(crate) fn quantile(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::value(b).min(self.max as f64);
            }
        }
        self.max as f64
    }
}

/// The herd's per-worker fairness metrics, from the acquisitions each worker made in
/// the measured interval and the waits from request to grant (`waits`, in units of
/// `unit` seconds): minimum, median, mean and maximum per worker, Jain's fairness index
/// `(Σx)² / (n Σx²)` (1 when all are equal, 1/n when one worker does everything), and
/// the wait's 50th and 99th percentiles and maximum.
pub(crate) fn herd_fairness(s: &mut Sample, counts: &[u64], waits: &WaitHistogram, unit: f64) {
    let n = counts.len().max(1) as f64;
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    let median = match sorted.len() {
        0 => 0.0,
        l if l % 2 == 1 => sorted[l / 2] as f64,
        l => (sorted[l / 2 - 1] + sorted[l / 2]) as f64 / 2.0,
    };
    s.insert(
        "min_per_worker".into(),
        sorted.first().copied().unwrap_or(0) as f64,
    );
    s.insert(
        "max_per_worker".into(),
        sorted.last().copied().unwrap_or(0) as f64,
    );
    s.insert("mean_per_worker".into(), sum / n);
    s.insert("median_per_worker".into(), median);
    s.insert(
        "jain_index".into(),
        if squares > 0.0 {
            sum * sum / (n * squares)
        } else {
            0.0
        },
    );
    s.insert("wait_p50_sec".into(), waits.quantile(0.5) * unit);
    s.insert("wait_p99_sec".into(), waits.quantile(0.99) * unit);
    s.insert("wait_max_sec".into(), waits.max as f64 * unit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_histogram_buckets_and_quantiles() {
        // Every value lands in a bucket whose middle is within 1/16 of it.
        for v in [0u64, 1, 31, 32, 33, 100, 1_000, 123_456, 7_000_000_000, 1 << 42] {
            let mid = WaitHistogram::value(WaitHistogram::bucket(v));
            assert!((mid - v as f64).abs() <= v as f64 / 16.0 + 0.5, "{v}: {mid}");
        }
        let mut h = WaitHistogram::new();
        for v in 1..=100u64 {
            h.record(v * 1000, 1);
        }
        let p50 = h.quantile(0.5);
        assert!((p50 - 50_000.0).abs() <= 50_000.0 / 16.0, "{p50}");
        assert!(h.quantile(0.99) <= 100_000.0);
        // Weights count: one value standing for 99 pulls the median to it.
        let mut w = WaitHistogram::new();
        w.record(10, 99);
        w.record(1_000_000, 1);
        assert_eq!(w.quantile(0.5), 10.0);
        assert_eq!(
            w.quantile(1.0),
            1_000_000f64.min(WaitHistogram::value(WaitHistogram::bucket(1_000_000)))
        );
    }

    #[test]
    fn fairness_metrics_of_equal_and_skewed_shares() {
        let h = WaitHistogram::new();
        let mut s = Sample::new();
        herd_fairness(&mut s, &[10, 10, 10, 10], &h, 1e-9);
        assert_eq!(
            (s["jain_index"], s["median_per_worker"], s["mean_per_worker"]),
            (1.0, 10.0, 10.0)
        );
        herd_fairness(&mut s, &[40, 0, 0, 0], &h, 1e-9);
        assert_eq!(
            (s["jain_index"], s["min_per_worker"], s["median_per_worker"]),
            (0.25, 0.0, 0.0)
        );
    }
}
