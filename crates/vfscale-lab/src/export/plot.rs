//! Scaling curves as SVG: for one (workload, mode), the main metric's mean against the
//! number of tasks (log scale) — or, where the rows vary the workload's size at one task
//! count (lockmany's locks held), against that size — with ±1 standard deviation error
//! bars, one line per target, each target in the same colour in every plot.
//!
//! Drawn with `plotters`' SVG backend without any font library: it writes text as SVG
//! `<text>` elements and leaves the font to the viewer, so the output does not depend on
//! the fonts of the machine that renders it.

use std::error::Error;

use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{format_sig, main_metric, metric_header, modes, workload_rows, workloads};
use crate::measure::Target;
use crate::result::{Report, Row};

/// One plot of a report.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// What it compares: `herd, flock: acquisitions_per_sec by tasks (kernel, library)`.
    pub title: String,
    /// A file name for it, without extension: `herd-flock`.
    pub file_stem: String,
    /// The SVG document.
    pub svg: String,
}

/// Every plot of `report`: one per workload and mode with something to draw.
pub fn all(report: &Report) -> Vec<Plot> {
    let mut out = Vec::new();
    for w in workloads(report) {
        for m in modes(report, w) {
            if let Some(svg) = scaling_svg(report, w, m) {
                out.push(Plot {
                    title: plot_title(report, w, m),
                    file_stem: format!("{w}-{m}")
                        .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_"),
                    svg,
                });
            }
        }
    }
    out
}

/// The rows of one plot.
fn plot_rows<'a>(report: &'a Report, workload: &str, mode: &str) -> Vec<&'a Row> {
    workload_rows(report, workload)
        .into_iter()
        .filter(|r| r.mode == mode)
        .collect()
}

/// The x axis of a plot: the workload's size when the rows vary it at one task count,
/// else the number of tasks.
fn x_axis(rows: &[&Row]) -> (&'static str, fn(&Row) -> Option<f64>) {
    let one_task_count = rows.windows(2).all(|w| w[0].tasks == w[1].tasks);
    let sizes: std::collections::BTreeSet<u64> = rows.iter().filter_map(|r| r.size()).collect();
    if one_task_count && sizes.len() > 1 {
        let name = if rows.iter().any(|r| r.held.is_some()) {
            "locks held"
        } else {
            "files per task"
        };
        (name, |r: &Row| r.size().map(|s| s as f64))
    } else {
        ("tasks", |r: &Row| Some(r.tasks as f64))
    }
}

/// `herd, flock: acquisitions_per_sec (/s) by tasks — kernel, library-prepatch, library`.
fn plot_title(report: &Report, workload: &str, mode: &str) -> String {
    let rows = plot_rows(report, workload, mode);
    let metric = main_metric(workload, &rows).unwrap_or_default();
    let (x, _) = x_axis(&rows);
    let mut targets: Vec<&str> = Vec::new();
    for r in &rows {
        if !targets.contains(&r.target.name()) {
            targets.push(r.target.name());
        }
    }
    format!(
        "{workload}, {mode}: {} by {x} — {}",
        metric_header(&metric),
        targets.join(", ")
    )
}

/// Plot width in pixels.
pub const WIDTH: u32 = 640;
/// Plot height in pixels.
pub const HEIGHT: u32 = 400;

/// The factor the x range extends beyond the smallest and largest task counts.
const X_PADDING: f64 = 1.25;

/// The share of the y span left free above the data, where the legend goes.
const Y_HEADROOM: f64 = 0.3;

/// One point of a curve.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    x: f64,
    mean: f64,
    stddev: f64,
}

/// One target's curve.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    target: Target,
    points: Vec<Point>,
}

/// The scaling plot of `workload` in `mode`, or `None` when there is nothing to draw (no
/// such rows, no metric, or no finite mean at a positive task count).
pub fn scaling_svg(report: &Report, workload: &str, mode: &str) -> Option<String> {
    let rows = plot_rows(report, workload, mode);
    let metric = main_metric(workload, &rows)?;
    let (x_desc, x_of) = x_axis(&rows);
    let series = collect_series(&rows, &metric, x_of);
    if series.is_empty() {
        return None;
    }
    let mut svg = String::new();
    draw(
        &mut svg,
        &series,
        &format!(
            "{workload} {mode}: {} by {x_desc}, per target",
            metric_header(&metric)
        ),
        x_desc,
        &metric_header(&metric),
    )
    .ok()?;
    Some(svg)
}

/// The curves, one per target in table order, each sorted by tasks; points without a
/// finite mean or with no tasks are left out, and so are targets left with no point.
fn collect_series(rows: &[&Row], metric: &str, x_of: fn(&Row) -> Option<f64>) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for row in rows {
        let Some(summary) = row.metrics.get(metric) else {
            continue;
        };
        let Some(x) = x_of(row).filter(|x| *x > 0.0) else {
            continue;
        };
        if !summary.mean.is_finite() {
            continue;
        }
        let stddev = if summary.stddev.is_finite() {
            summary.stddev
        } else {
            0.0
        };
        let point = Point {
            x,
            mean: summary.mean,
            stddev,
        };
        match series.iter_mut().find(|s| s.target == row.target) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                target: row.target,
                points: vec![point],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.x.total_cmp(&b.x));
    }
    series
}

/// The x range: the task counts, widened by [`X_PADDING`] on each side (log scale) so the
/// end points and their error bars stay clear of the axes.
fn x_range(series: &[Series]) -> (f64, f64) {
    let tasks = series.iter().flat_map(|s| s.points.iter().map(|p| p.x));
    let (lo, hi) = tasks.fold((f64::INFINITY, 0.0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    (lo / X_PADDING, hi * X_PADDING)
}

/// Every task count measured, sorted: the x axis' ticks.
fn task_counts(series: &[Series]) -> Vec<f64> {
    let mut tasks: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.x)).collect();
    tasks.sort_by(f64::total_cmp);
    tasks.dedup();
    tasks
}

/// The y range: from 0 (or the lowest error bar if negative) to the highest error bar,
/// plus [`Y_HEADROOM`] of the span above it for the legend.
fn y_range(series: &[Series]) -> (f64, f64) {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (lo, hi) = points.fold((0.0f64, 0.0f64), |(lo, hi), p| {
        (lo.min(p.mean - p.stddev), hi.max(p.mean + p.stddev))
    });
    let span = hi - lo;
    if span > 0.0 && span.is_finite() {
        (lo, hi + Y_HEADROOM * span)
    } else {
        (lo, lo + 1.0)
    }
}

/// A target's color: fixed per target so every plot uses the same.
pub fn color(target: Target) -> RGBColor {
    match target {
        Target::Kernel => RGBColor(0x33, 0x33, 0x33),
        Target::KernelExt4 => RGBColor(0x8c, 0x56, 0x4b),
        Target::LibraryPrepatch => RGBColor(0xd6, 0x60, 0x1a),
        Target::LibraryList => RGBColor(0xe3, 0x77, 0xc2),
        Target::RwlockHashmap => RGBColor(0x94, 0x67, 0xbd),
        Target::Dashmap => RGBColor(0xbc, 0xbd, 0x22),
        Target::Moka => RGBColor(0x17, 0xbe, 0xcf),
        Target::Partitioned => RGBColor(0x7f, 0x7f, 0x7f),
        Target::Library => RGBColor(0x1f, 0x6f, 0xb4),
    }
}

/// An axis label: integers as such, other values to 3 significant digits.
fn tick_label(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format_sig(v, 3)
    }
}

/// Draws the curves into `svg`.
fn draw(
    svg: &mut String,
    series: &[Series],
    title: &str,
    x_desc: &str,
    y_desc: &str,
) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::with_string(svg, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (x_lo, x_hi) = x_range(series);
    let (y_lo, y_hi) = y_range(series);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(task_counts(series)),
            y_lo..y_hi,
        )?;
    chart
        .configure_mesh()
        .x_desc(format!("{x_desc} (log scale)"))
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| crate::units::format(*v, crate::units::Unit::Plain))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(TRANSPARENT)
        .draw()?;
    for s in series {
        draw_series(&mut chart, s)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The chart type `draw` builds.
type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<WithKeyPoints<LogCoord<f64>>, RangedCoordf64>>;

/// One target's line, points, error bars and legend entry.
fn draw_series(chart: &mut Chart<'_, '_>, s: &Series) -> Result<(), Box<dyn Error>> {
    let color = color(s.target);
    let line = s.points.iter().map(|p| (p.x, p.mean));
    chart
        .draw_series(LineSeries::new(line, color.stroke_width(2)))?
        .label(s.target.name())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(
        s.points
            .iter()
            .map(|p| Circle::new((p.x, p.mean), 3, color.filled())),
    )?;
    chart.draw_series(
        s.points
            .iter()
            .filter(|p| p.stddev > 0.0)
            .map(|p| ErrorBar::new_vertical(p.x, p.mean - p.stddev, p.mean, p.mean + p.stddev, color, 8)),
    )?;
    Ok(())
}
