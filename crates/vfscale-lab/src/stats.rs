//! Statistics (placeholder, being written): mean, standard deviation, Student-t
//! confidence intervals, harmonic mean for rates, modified Z-score outliers, Welch's t-test.

use crate::result::Summary;

/// Summarizes samples; `rate` selects the harmonic mean.
pub fn summarize(samples: &[f64], rate: bool) -> Summary {
    let n = samples.len();
    let mean = if rate {
        n as f64 / samples.iter().map(|x| 1.0 / x).sum::<f64>()
    } else {
        samples.iter().sum::<f64>() / n.max(1) as f64
    };
    Summary {
        mean,
        stddev: 0.0,
        n,
        ci95: [mean, mean],
        min: samples.iter().cloned().fold(f64::INFINITY, f64::min),
        max: samples.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        outliers: vec![],
        samples: samples.to_vec(),
    }
}
