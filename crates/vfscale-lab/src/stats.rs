//! Statistics over repeated runs: mean, sample standard deviation, Student-t confidence
//! intervals, the harmonic mean for rates, modified Z-score outliers, Welch's t-test, and
//! [`Ratio`]: the ratio of two metrics with its error and significance, unpaired or
//! paired run by run. Every Student-t computation of the lab lives here.
//!
//! Nothing here panics: empty input gives NaN, one sample gives a zero spread and a
//! point interval, and a NaN sample propagates into the mean and spread (it is also
//! flagged as an outlier) rather than being silently dropped.

use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::result::{Metric, Summary};

/// p-value below which a difference is significant.
pub const SIGNIFICANCE: f64 = 0.05;

/// Modified Z-score above which a sample is flagged as an outlier (Iglewicz and Hoaglin).
pub const OUTLIER_THRESHOLD: f64 = 3.5;

/// The 0.75 quantile of the standard normal: makes the MAD comparable to a standard deviation.
const MAD_SCALE: f64 = 0.6745;

/// Summarizes `samples`, in run order; `rate` marks a per-second metric.
///
/// For ordinary metrics `mean` is the arithmetic mean and `ci95` its Student-t interval.
///
/// For rates `mean` is the harmonic mean: a rate's natural average, the total work over
/// the total time when every run does the same work. `ci95` is then the Student-t
/// interval of the mean of the reciprocals (seconds per unit), mapped back with
/// `x ↦ 1/x` (which swaps its ends, so the interval is asymmetric). When the reciprocal
/// interval reaches zero or below, the rate's upper bound is `+inf`; any sample that is
/// zero, negative or not finite makes the interval `[NaN, NaN]`.
///
/// In both cases `stddev`, `min`, `max` and the outliers are those of the raw samples,
/// in the metric's unit.
pub fn summarize(samples: &[f64], rate: bool) -> Summary {
    let (mean, ci95) = if rate {
        (harmonic_mean(samples), ci95_harmonic(samples))
    } else {
        (mean(samples), ci95_mean(samples))
    };
    Summary {
        mean,
        stddev: stddev(samples),
        n: samples.len(),
        ci95,
        min: min(samples),
        max: max(samples),
        outliers: outliers(samples),
        samples: samples.to_vec(),
    }
}

/// Arithmetic mean; NaN for no samples.
pub fn mean(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// Sample standard deviation (divisor n − 1); 0 for one sample, NaN for none.
pub fn stddev(samples: &[f64]) -> f64 {
    variance(samples).sqrt()
}

/// Sample variance (divisor n − 1); 0 for one sample, NaN for none.
pub fn variance(samples: &[f64]) -> f64 {
    match samples.len() {
        0 => f64::NAN,
        1 => 0.0,
        n => {
            let m = mean(samples);
            samples.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64
        }
    }
}

/// Harmonic mean, n / Σ(1/xᵢ); NaN for no samples, 0 when a sample is 0.
pub fn harmonic_mean(samples: &[f64]) -> f64 {
    match samples {
        [] => f64::NAN,
        [x] => *x,
        _ => samples.len() as f64 / samples.iter().map(|x| 1.0 / x).sum::<f64>(),
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (the two-sided 95%
/// critical value); NaN when `df` is not positive.
pub fn t_critical_95(df: f64) -> f64 {
    students_t(df).map_or(f64::NAN, |t| t.inverse_cdf(0.975))
}

/// 95% confidence interval of the arithmetic mean: mean ± t(0.975, n−1)·s/√n.
///
/// One sample gives `[x, x]`; no samples give `[NaN, NaN]`.
pub fn ci95_mean(samples: &[f64]) -> [f64; 2] {
    let m = mean(samples);
    match samples.len() {
        0 | 1 => [m, m],
        n => {
            let half = t_critical_95((n - 1) as f64) * stddev(samples) / (n as f64).sqrt();
            [m - half, m + half]
        }
    }
}

/// 95% confidence interval of the harmonic mean of positive rates (see [`summarize`]).
pub fn ci95_harmonic(samples: &[f64]) -> [f64; 2] {
    if let [x] = samples {
        return [*x, *x];
    }
    if samples.is_empty() || samples.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return [f64::NAN, f64::NAN];
    }
    let reciprocals: Vec<f64> = samples.iter().map(|x| 1.0 / x).collect();
    let [low, high] = ci95_mean(&reciprocals);
    let upper = if low > 0.0 { 1.0 / low } else { f64::INFINITY };
    [1.0 / high, upper]
}

/// Smallest sample, ignoring NaN; NaN when there is none.
pub fn min(samples: &[f64]) -> f64 {
    samples
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .reduce(f64::min)
        .unwrap_or(f64::NAN)
}

/// Largest sample, ignoring NaN; NaN when there is none.
pub fn max(samples: &[f64]) -> f64 {
    samples
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .reduce(f64::max)
        .unwrap_or(f64::NAN)
}

/// Median (mean of the two middle values for an even count); NaN for no samples.
///
/// NaN samples sort last (IEEE total order), so callers should pass finite values.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Median absolute deviation from the median; NaN for no samples.
pub fn mad(samples: &[f64]) -> f64 {
    let med = median(samples);
    let deviations: Vec<f64> = samples.iter().map(|x| (x - med).abs()).collect();
    median(&deviations)
}

/// Indices of outlying samples, by the modified Z-score of Iglewicz and Hoaglin:
/// `Mᵢ = 0.6745·(xᵢ − median)/MAD`, flagged when `|Mᵢ| >` [`OUTLIER_THRESHOLD`].
///
/// Median and MAD are taken over the finite samples. When the MAD is 0 (over half the
/// samples equal) no finite sample is flagged. Non-finite samples cannot be scored and
/// are always flagged. Outliers are reported, never removed.
pub fn outliers(samples: &[f64]) -> Vec<usize> {
    let finite: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    let med = median(&finite);
    let mad = mad(&finite);
    let scoreable = mad.is_finite() && mad > 0.0;
    samples
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_finite() || (scoreable && modified_z(**x, med, mad).abs() > OUTLIER_THRESHOLD))
        .map(|(i, _)| i)
        .collect()
}

/// The modified Z-score of `x` given the sample's median and MAD.
pub fn modified_z(x: f64, median: f64, mad: f64) -> f64 {
    MAD_SCALE * (x - median) / mad
}

/// Welch's unequal-variances t-test of the means of `a` and `b`: `(t, df, p_two_sided)`.
///
/// `t = (ā − b̄)/√(s²ₐ/nₐ + s²ᵦ/nᵦ)` and df by Welch–Satterthwaite. Each side needs at
/// least two samples, else all three are NaN. When both sides have zero variance the
/// test degenerates: df is nₐ + nᵦ − 2, and t is 0 with p = 1 for equal means, ±inf with
/// p = 0 otherwise.
pub fn welch_t_test(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    if a.len() < 2 || b.len() < 2 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (qa, qb) = (variance(a) / na, variance(b) / nb);
    let diff = mean(a) - mean(b);
    let se2 = qa + qb;
    if se2 == 0.0 {
        return degenerate_t_test(diff, na + nb - 2.0);
    }
    let t = diff / se2.sqrt();
    let df = se2 * se2 / (qa * qa / (na - 1.0) + qb * qb / (nb - 1.0));
    (t, df, two_sided_p(t, df))
}

/// The t-test of two constant samples: certain difference or certain equality.
fn degenerate_t_test(diff: f64, df: f64) -> (f64, f64, f64) {
    if diff == 0.0 {
        (0.0, df, 1.0)
    } else if diff.is_nan() {
        (f64::NAN, df, f64::NAN)
    } else {
        (diff.signum() * f64::INFINITY, df, 0.0)
    }
}

/// Two-sided p-value of `t` under Student's t with `df` degrees of freedom.
fn two_sided_p(t: f64, df: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    students_t(df).map_or(f64::NAN, |dist| (2.0 * dist.sf(t.abs())).min(1.0))
}

/// The standard Student t distribution, if `df` is valid.
fn students_t(df: f64) -> Option<StudentsT> {
    if df.is_nan() || df <= 0.0 {
        return None;
    }
    StudentsT::new(0.0, 1.0, df).ok()
}

/// The ratio of two means `r = ā/b̄` and its standard error, propagated from the
/// standard errors of the means (first order, independent samples):
///
/// `σᵣ/|r| = √((σₐ/ā)²/nₐ + (σᵦ/b̄)²/nᵦ)`
///
/// computed as `σᵣ = √(σₐ²/(nₐ·b̄²) + ā²·σᵦ²/(nᵦ·b̄⁴))`, which is the same and stays finite
/// when ā = 0. Returns `(NaN, NaN)` when either side has no samples or b̄ = 0.
pub fn ratio_with_error(a: &Summary, b: &Summary) -> (f64, f64) {
    if a.n == 0 || b.n == 0 || b.mean == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let ratio = a.mean / b.mean;
    let b2 = b.mean * b.mean;
    let var_a = a.stddev * a.stddev / (a.n as f64 * b2);
    let var_b = a.mean * a.mean * b.stddev * b.stddev / (b.n as f64 * b2 * b2);
    (ratio, (var_a + var_b).sqrt())
}

/// The values Welch's test compares for metric `metric`: the samples, or for a rate
/// their reciprocals (time per unit of work), since a rate's mean is the harmonic mean,
/// the reciprocal of the reciprocals' mean; the test then asks whether the reported
/// means differ.
pub fn test_values(metric: &Metric, summary: &Summary) -> Vec<f64> {
    if metric.is_rate() {
        summary.samples.iter().map(|x| 1.0 / x).collect()
    } else {
        summary.samples.clone()
    }
}

/// `a / b` of one metric, with its error and whether the two differ significantly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    /// `ā / b̄` (the geometric mean of the per-run ratios when paired).
    pub value: f64,
    /// Its standard error.
    pub error: f64,
    /// Two-sided p-value of the test behind it (NaN with fewer than two samples a side).
    pub p: f64,
}

impl Ratio {
    /// `a / b` of metric `metric`, the two sides taken as independent: the ratio of the
    /// means with its propagated error ([`ratio_with_error`]) and Welch's test on
    /// [`test_values`].
    pub fn unpaired(metric: &Metric, a: &Summary, b: &Summary) -> Ratio {
        let (value, error) = ratio_with_error(a, b);
        let (_, _, p) = welch_t_test(&test_values(metric, a), &test_values(metric, b));
        Ratio { value, error, p }
    }

    /// `a / b` of two rows' metrics paired run by run: `bench` interleaves the runs of
    /// the workloads whose targets are ratios between rows (inodes, herd, lockmany: run i
    /// of every configuration and target, one after the other), so run i of `a` and of
    /// `b` saw the same state of the machine, and the ratio of each pair cancels a drift
    /// both saw (on a shared 2-core machine another job's load moved every target's
    /// rates by up to ×2 from one run to the next, burying a 10–20% difference in an
    /// unpaired test). The value is the geometric mean of the per-run ratios; `error` its
    /// standard error (first order from the logs' spread); `p` a two-sided one-sample
    /// t-test of the mean log ratio against 0. `None` unless both sides have the same
    /// number (≥ 2) of positive samples.
    pub fn paired(a: &Summary, b: &Summary) -> Option<Ratio> {
        let n = a.samples.len();
        if n < 2
            || b.samples.len() != n
            || a.samples
                .iter()
                .chain(&b.samples)
                .any(|x| !x.is_finite() || *x <= 0.0)
        {
            return None;
        }
        let logs: Vec<f64> = a
            .samples
            .iter()
            .zip(&b.samples)
            .map(|(x, y)| (x / y).ln())
            .collect();
        let m = mean(&logs);
        let se = stddev(&logs) / (n as f64).sqrt();
        let value = m.exp();
        let p = if se > 0.0 {
            two_sided_p(m / se, (n - 1) as f64)
        } else {
            degenerate_t_test(m, (n - 1) as f64).2
        };
        Some(Ratio {
            value,
            error: value * se,
            p,
        })
    }

    /// `a / b` paired run by run where the rows allow it ([`Ratio::paired`]), else
    /// unpaired ([`Ratio::unpaired`]).
    pub fn paired_or_unpaired(metric: &Metric, a: &Summary, b: &Summary) -> Ratio {
        Ratio::paired(a, b).unwrap_or_else(|| Ratio::unpaired(metric, a, b))
    }

    /// Whether the difference is significant (p < [`SIGNIFICANCE`]; a single sample a
    /// side is taken at face value).
    pub fn significant(&self) -> bool {
        self.p.is_nan() || self.p < SIGNIFICANCE
    }

    /// The ratio with its p-value taken against `bound` instead of against 1: a
    /// two-sided z-test of the ratio's distance to the bound in units of its error
    /// (normal approximation), so a ratio that clears the bound by less than its noise is
    /// not called significant, and one on the right side by more than its noise is,
    /// however close to 1 it is. Why not the mean ratio alone: at 200,000 files an inodes
    /// phase lasts 30–150 ms and a 1-task run on a shared 2-core machine varies by
    /// 10–45%, so a mean ratio of 1.85 from five runs each side can sit well within noise
    /// of 1.8. A single sample a side (no error) is taken at face value, as
    /// [`Ratio::significant`] does.
    pub fn against_bound(self, bound: f64) -> Ratio {
        let p = if self.error.is_finite() && self.error > 0.0 && self.value.is_finite() {
            let z = (self.value - bound) / self.error;
            statrs::function::erf::erfc(z.abs() / std::f64::consts::SQRT_2)
        } else {
            f64::NAN
        };
        Ratio { p, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mean_and_stddev_by_hand() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, squared deviations sum to 32, s² = 32/7.
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), 5.0);
        assert!(close(stddev(&xs), (32.0f64 / 7.0).sqrt(), 1e-12));
    }

    #[test]
    fn empty_and_single_inputs() {
        assert!(mean(&[]).is_nan());
        assert!(stddev(&[]).is_nan());
        assert!(harmonic_mean(&[]).is_nan());
        assert_eq!(stddev(&[3.0]), 0.0);
        assert_eq!(ci95_mean(&[3.0]), [3.0, 3.0]);
        assert_eq!(ci95_harmonic(&[3.0]), [3.0, 3.0]);
        assert_eq!(harmonic_mean(&[3.0]), 3.0);
        let s = summarize(&[], false);
        assert_eq!(s.n, 0);
        assert!(s.mean.is_nan() && s.min.is_nan() && s.max.is_nan());
        assert!(s.outliers.is_empty());
        let s = summarize(&[7.0], true);
        assert_eq!(
            (s.mean, s.stddev, s.ci95, s.min, s.max),
            (7.0, 0.0, [7.0, 7.0], 7.0, 7.0)
        );
    }

    #[test]
    fn t_critical_values_match_tables() {
        // Two-sided 95% critical values from any t table.
        for (df, t) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (4.0, 2.776),
            (9.0, 2.262),
            (29.0, 2.045),
        ] {
            assert!(
                close(t_critical_95(df), t, 1e-3),
                "df {df}: {}",
                t_critical_95(df)
            );
        }
        assert!(t_critical_95(0.0).is_nan());
    }

    #[test]
    fn ci95_by_hand() {
        // 1..=5: mean 3, s = √2.5, t(0.975, 4) = 2.7764 → half width 2.7764·1.5811/2.2361 = 1.9632.
        let [lo, hi] = ci95_mean(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(close(lo, 3.0 - 1.9632, 1e-3) && close(hi, 3.0 + 1.9632, 1e-3));
    }

    #[test]
    fn harmonic_mean_of_rates() {
        // 1 unit at 1/s and 1 unit at 3/s: 2 units in 4/3 s = 1.5/s.
        assert!(close(harmonic_mean(&[1.0, 3.0]), 1.5, 1e-12));
        assert_eq!(harmonic_mean(&[0.0, 3.0]), 0.0);
        let s = summarize(&[1.0, 3.0], true);
        assert!(close(s.mean, 1.5, 1e-12));
        assert!(close(s.stddev, 2.0f64.sqrt(), 1e-12));
    }

    #[test]
    fn harmonic_ci_is_mapped_back_from_reciprocals() {
        // Rates 4, 5, 5, 4 → reciprocals .25, .2, .2, .25: mean .225, s = .028868,
        // t(0.975, 3) = 3.1824 → reciprocal interval .225 ± .045934 = [.179066, .270934].
        let [lo, hi] = ci95_harmonic(&[4.0, 5.0, 5.0, 4.0]);
        assert!(close(lo, 1.0 / 0.270934, 1e-4), "{lo}");
        assert!(close(hi, 1.0 / 0.179066, 1e-4), "{hi}");
        assert!(lo < harmonic_mean(&[4.0, 5.0, 5.0, 4.0]) && hi > 4.444);
    }

    #[test]
    fn harmonic_ci_unbounded_or_undefined() {
        // Two very different rates: the reciprocal interval crosses 0, no upper bound.
        let [lo, hi] = ci95_harmonic(&[100.0, 200.0]);
        assert!(lo > 0.0 && hi == f64::INFINITY);
        assert!(ci95_harmonic(&[0.0, 2.0])[0].is_nan());
        assert!(ci95_harmonic(&[f64::NAN, 2.0])[1].is_nan());
    }

    #[test]
    fn median_and_mad() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        // 1, 1, 2, 2, 4, 6, 9: median 2, deviations 1, 1, 0, 0, 2, 4, 7 → MAD 1.
        assert_eq!(mad(&[1.0, 1.0, 2.0, 2.0, 4.0, 6.0, 9.0]), 1.0);
    }

    #[test]
    fn outliers_by_modified_z_score() {
        // median 10, MAD 1: 30 scores 0.6745·20 = 13.49, 14 scores 2.698 (kept).
        let xs = [10.0, 9.0, 11.0, 10.0, 30.0, 14.0, 9.0, 11.0, 10.0];
        assert_eq!(outliers(&xs), vec![4]);
        // Low outliers count too.
        assert_eq!(outliers(&[10.0, 9.0, 11.0, 10.0, -10.0]), vec![4]);
        // MAD 0: nothing flagged, even the far value.
        assert!(outliers(&[5.0, 5.0, 5.0, 100.0]).is_empty());
        assert!(outliers(&[]).is_empty());
        assert!(outliers(&[1.0]).is_empty());
    }

    #[test]
    fn nan_samples_do_not_panic_and_are_flagged() {
        let s = summarize(&[1.0, f64::NAN, 3.0, 2.0], false);
        assert!(s.mean.is_nan() && s.stddev.is_nan());
        assert_eq!((s.min, s.max), (1.0, 3.0));
        assert_eq!(s.outliers, vec![1]);
        let s = summarize(&[f64::NAN], true);
        assert!(s.mean.is_nan());
        assert_eq!(s.outliers, vec![0]);
    }

    #[test]
    fn zero_samples() {
        let s = summarize(&[0.0, 0.0, 0.0], false);
        assert_eq!((s.mean, s.stddev, s.ci95), (0.0, 0.0, [0.0, 0.0]));
        assert!(s.outliers.is_empty());
    }

    #[test]
    fn welch_by_hand() {
        // a = 1..5 (mean 3, s² 2.5), b = 3,5,..,11 (mean 7, s² 10):
        // se² = 0.5 + 2 = 2.5, t = −4/√2.5 = −2.529822, df = 6.25/(0.0625 + 1) = 5.882353.
        // p = 0.045465, from integrating the t density numerically (independent check).
        let (t, df, p) = welch_t_test(&[1.0, 2.0, 3.0, 4.0, 5.0], &[3.0, 5.0, 7.0, 9.0, 11.0]);
        assert!(close(t, -2.529822, 1e-6), "{t}");
        assert!(close(df, 5.882353, 1e-6), "{df}");
        assert!(close(p, 0.045465, 1e-5), "{p}");
    }

    #[test]
    fn welch_equal_variances_is_students_t() {
        // Equal n and variances: Welch's df is 2n − 2 and t is Student's.
        // a = 1,2,3 (mean 2, s² 1), b = 4,5,6 (mean 5): t = −3/√(2/3) = −3.674235, df 4.
        // Two-sided p for t = 3.674235, df 4 is 0.021312 (t table: between 0.02 and 0.05).
        let (t, df, p) = welch_t_test(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]);
        assert!(close(t, -3.674235, 1e-6));
        assert!(close(df, 4.0, 1e-9));
        assert!(close(p, 0.021312, 1e-5), "{p}");
    }

    #[test]
    fn welch_edge_cases() {
        assert!(welch_t_test(&[1.0], &[1.0, 2.0]).2.is_nan());
        assert!(welch_t_test(&[], &[]).2.is_nan());
        assert_eq!(welch_t_test(&[2.0, 2.0], &[2.0, 2.0]), (0.0, 2.0, 1.0));
        assert_eq!(
            welch_t_test(&[1.0, 1.0], &[2.0, 2.0]),
            (f64::NEG_INFINITY, 2.0, 0.0)
        );
        assert!(welch_t_test(&[f64::NAN, 1.0], &[2.0, 3.0]).2.is_nan());
        let (_, _, p) = welch_t_test(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!(p, 1.0);
    }

    fn summary(mean: f64, stddev: f64, n: usize) -> Summary {
        Summary {
            mean,
            stddev,
            n,
            ci95: [mean, mean],
            min: mean,
            max: mean,
            outliers: vec![],
            samples: vec![],
        }
    }

    #[test]
    fn ratio_error_by_hand() {
        // a = 200 ± 20 (n 4), b = 100 ± 5 (n 25): relative SEs 0.1/2 = 0.05 and 0.05/5 = 0.01,
        // r = 2, σᵣ = 2·√(0.0025 + 0.0001) = 0.101980.
        let (r, e) = ratio_with_error(&summary(200.0, 20.0, 4), &summary(100.0, 5.0, 25));
        assert!(close(r, 2.0, 1e-12));
        assert!(close(e, 0.101980, 1e-6), "{e}");
    }

    #[test]
    fn paired_runs_cancel_a_drift_both_saw() {
        // The machine's load halves both targets' rates in runs 3 and 4; a is 10% faster
        // in every run. Unpaired, the drift buries it; paired, it is plain.
        let rates = |x: &[f64]| summarize(x, true);
        let a = rates(&[11.0, 11.0, 5.5, 5.5, 11.0]);
        let b = rates(&[10.0, 10.0, 5.0, 5.0, 10.0]);
        assert!(Ratio::unpaired(Metric::OPS_PER_SEC, &a, &b).p > 0.05);
        let r = Ratio::paired(&a, &b).unwrap();
        assert!((r.value - 1.1).abs() < 1e-9 && r.p == 0.0, "{r:?}");
        // Noise that is not shared stays noise.
        let r = Ratio::paired(&rates(&[11.0, 9.0, 10.5, 9.5]), &rates(&[10.0, 10.0, 10.0, 10.0])).unwrap();
        assert!(r.p > 0.05, "{r:?}");
        // Different run counts: no pairing.
        assert!(Ratio::paired(&rates(&[1.0, 2.0]), &rates(&[1.0, 2.0, 3.0])).is_none());
    }

    #[test]
    fn ratio_edge_cases() {
        let (r, e) = ratio_with_error(&summary(0.0, 1.0, 4), &summary(10.0, 0.0, 4));
        assert_eq!((r, e), (0.0, 0.05));
        assert!(ratio_with_error(&summary(1.0, 0.0, 1), &summary(0.0, 0.0, 1))
            .0
            .is_nan());
        assert!(ratio_with_error(&summary(1.0, 0.0, 0), &summary(2.0, 0.0, 1))
            .1
            .is_nan());
        assert_eq!(
            ratio_with_error(&summary(3.0, 0.0, 1), &summary(2.0, 0.0, 1)),
            (1.5, 0.0)
        );
    }
}
