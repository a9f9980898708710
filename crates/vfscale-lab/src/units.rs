//! Numbers for people: SI prefixes, units, three significant digits, never e-notation.
//!
//! `12.6 M/s ± 1.3 M`, `93.1 ns`, `0.0014`, `25.9×`. JSON and CSV keep full precision;
//! these are for stdout, `report.md` and `report.html`.

use crate::result::{Metric, Summary};
use crate::stats::Ratio;

pub use crate::result::Unit;

/// Significant digits of a shown value.
pub const DIGITS: usize = 3;

/// Significant digits of a shown error.
pub const ERROR_DIGITS: usize = 2;

/// `x` with [`DIGITS`] significant digits in `unit`: `12.6 M/s`, `93.1 ns`, `0.0014`.
pub fn format(x: f64, unit: Unit) -> String {
    format_digits(x, unit, DIGITS)
}

/// `mean ± error` in `unit`, the error with the mean's prefix: `12.6 M/s ± 1.3 M`,
/// `93.1 ns ± 4.2 ns`.
pub fn format_pm(mean: f64, error: f64, unit: Unit) -> String {
    if !mean.is_finite() {
        return format(mean, unit);
    }
    let (scale, prefix) = prefix_for(mean, unit);
    let value = format(mean, unit);
    if !error.is_finite() || negligible(mean, error) {
        return value;
    }
    let e = plain(error / scale, ERROR_DIGITS);
    let e = match unit {
        // A time's error carries its unit: `32.8 ms ± 6.6 ms`.
        Unit::Seconds | Unit::Nanoseconds => format!("{e} {prefix}s"),
        Unit::Bytes => format!("{e} {prefix}B"),
        _ if prefix.is_empty() => e,
        _ => format!("{e} {prefix}"),
    };
    format!("{value} ± {e}")
}

/// A summary as `mean ± sd` in the unit of metric `name`.
pub fn format_summary(name: &str, s: &Summary) -> String {
    format_pm(s.mean, s.stddev, Metric::from(name).unit())
}

/// A ratio: `25.9×`, `0.0072×`.
pub fn format_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{}×", plain(r, DIGITS))
    } else {
        "–".into()
    }
}

/// A ratio with its error in parentheses, as the headline shows it: `25.9× (± 4.1)`.
pub fn format_ratio_paren(r: &Ratio) -> String {
    if r.error.is_finite() && r.error > 0.0 {
        format!("{} (± {})", format_ratio(r.value), plain(r.error, ERROR_DIGITS))
    } else {
        format_ratio(r.value)
    }
}

/// A ratio and its error: `25.9× ± 4.1`.
pub fn format_ratio_pm(r: f64, e: f64) -> String {
    if e.is_finite() && !negligible(r, e) && r.is_finite() {
        format!("{} ± {}", format_ratio(r), plain(e, ERROR_DIGITS))
    } else {
        format_ratio(r)
    }
}

/// An error that is only floating-point noise of identical samples (the mean of three
/// equal values has a standard deviation of about 1e-17 of it): not worth a `±`.
fn negligible(mean: f64, error: f64) -> bool {
    error <= 0.0 || error <= mean.abs() * 1e-9
}

fn format_digits(x: f64, unit: Unit, digits: usize) -> String {
    if x.is_nan() {
        return "–".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "∞" } else { "-∞" }.into();
    }
    let (scale, prefix) = prefix_for(x, unit);
    let n = plain(x / scale, digits);
    let suffix = match unit {
        Unit::Rate if prefix.is_empty() => "/s".to_string(),
        Unit::Rate => format!(" {prefix}/s"),
        Unit::Seconds | Unit::Nanoseconds => format!(" {prefix}s"),
        Unit::Bytes => format!(" {prefix}B"),
        Unit::Plain if prefix.is_empty() => String::new(),
        Unit::Plain => format!(" {prefix}"),
    };
    format!("{n}{suffix}")
}

/// The divisor and prefix that bring `x` into [1, 1000) (times; rates and plain numbers
/// only scale up; bytes in binary steps).
fn prefix_for(x: f64, unit: Unit) -> (f64, &'static str) {
    let a = x.abs();
    match unit {
        Unit::Seconds | Unit::Nanoseconds => {
            let secs = if unit == Unit::Nanoseconds { a * 1e-9 } else { a };
            let to_unit = if unit == Unit::Nanoseconds { 1e-9 } else { 1.0 };
            let (s, p) = if secs == 0.0 || secs >= 1.0 {
                (1.0, "")
            } else if secs >= 1e-3 {
                (1e-3, "m")
            } else if secs >= 1e-6 {
                (1e-6, "µ")
            } else {
                (1e-9, "n")
            };
            (s / to_unit, p)
        }
        Unit::Bytes => {
            let steps = [(1024f64.powi(3), "Gi"), (1024f64.powi(2), "Mi"), (1024.0, "Ki")];
            steps.into_iter().find(|(s, _)| a >= *s).unwrap_or((1.0, ""))
        }
        Unit::Rate | Unit::Plain => {
            let steps = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")];
            match steps.into_iter().find(|(s, _)| a >= *s) {
                // 10 000 and up get a prefix; 1 000–9 999 read well as they are.
                Some((1e4, _)) => (1e3, "k"),
                Some(found) => found,
                None => (1.0, ""),
            }
        }
    }
}

/// A p-value: `0.21`, `0.0030`, `< 0.001`.
pub fn format_p(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        plain(p, 2)
    }
}

/// `x` with `digits` significant digits in fixed notation: `12.6`, `0.0014`, `1800`.
pub fn plain(x: f64, digits: usize) -> String {
    if x.is_nan() {
        return "–".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let digits = digits.max(1) as i32;
    let exp = x.abs().log10().floor() as i32;
    // Round to `digits` significant digits first: 9.996 → 10.0 has one more integer digit.
    let factor = 10f64.powi(digits - 1 - exp);
    let rounded = (x * factor).round() / factor;
    let exp = if rounded == 0.0 {
        exp
    } else {
        rounded.abs().log10().floor() as i32
    };
    let decimals = (digits - 1 - exp).max(0) as usize;
    format!("{rounded:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_noise_has_no_error() {
        // Three identical samples of 109.0 give a standard deviation of ~1.7e-14.
        assert_eq!(format_pm(109.0, 1.7e-14, Unit::Bytes), "109 B");
        assert_eq!(format_pm(3.0, 5.4e-16, Unit::Plain), "3.00");
        assert_eq!(format_ratio_pm(1.0, 1e-16), "1.00×");
        assert_eq!(format_pm(93.1, 4.2, Unit::Nanoseconds), "93.1 ns ± 4.2 ns");
    }

    #[test]
    fn si_forms() {
        assert_eq!(format(12_634_000.0, Unit::Rate), "12.6 M/s");
        assert_eq!(format(941_200.0, Unit::Rate), "941 k/s");
        assert_eq!(format(5_000.0, Unit::Rate), "5000/s");
        assert_eq!(format(93.14, Unit::Nanoseconds), "93.1 ns");
        assert_eq!(format(1448.0, Unit::Nanoseconds), "1.45 µs");
        assert_eq!(format(252_400.0, Unit::Nanoseconds), "252 µs");
        assert_eq!(format(0.02896, Unit::Seconds), "29.0 ms");
        assert_eq!(format(5.04, Unit::Seconds), "5.04 s");
        assert_eq!(format(0.00014, Unit::Plain), "0.000140");
        assert_eq!(format(2.0, Unit::Plain), "2.00");
        assert_eq!(format(431_000.0, Unit::Plain), "431 k");
        assert_eq!(format(96.0, Unit::Bytes), "96.0 B");
        assert_eq!(format(1536.0, Unit::Bytes), "1.50 KiB");
        assert_eq!(format(0.0, Unit::Plain), "0");
        assert_eq!(format(f64::NAN, Unit::Rate), "–");
        assert_eq!(format(9.996, Unit::Plain), "10.0");
    }

    #[test]
    fn errors_share_the_prefix() {
        assert_eq!(
            format_pm(12_634_000.0, 1_262_000.0, Unit::Rate),
            "12.6 M/s ± 1.3 M"
        );
        assert_eq!(format_pm(93.14, 4.2, Unit::Nanoseconds), "93.1 ns ± 4.2 ns");
        assert_eq!(format_pm(0.0328, 0.0066, Unit::Seconds), "32.8 ms ± 6.6 ms");
        assert_eq!(format_pm(0.0014, 0.0, Unit::Plain), "0.00140");
        assert_eq!(format_ratio_pm(25.86, 4.078), "25.9× ± 4.1");
        assert_eq!(format_ratio(0.007415), "0.00742×");
    }

    #[test]
    fn never_e_notation() {
        for exp in -12..15 {
            for unit in [
                Unit::Rate,
                Unit::Seconds,
                Unit::Nanoseconds,
                Unit::Bytes,
                Unit::Plain,
            ] {
                let x = 1.234_567 * 10f64.powi(exp);
                let s = format_pm(x, x / 10.0, unit);
                assert!(!s.contains('e'), "{x} {unit:?} → {s}");
            }
        }
    }
}
