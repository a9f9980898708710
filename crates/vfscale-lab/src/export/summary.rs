//! What `vfscale run` prints: the headline first (what each experiment found, with
//! its targets checked), then one compact table per experiment — the experiment's main
//! metric for every target side by side, with the library's ratios — and what could
//! not run. At most [`MAX_LINES`] lines; `--verbose` prints every table in full instead.
//!
//! The same [`summary_tables`] open `report.md` and `report.html`.

use comfy_table::{presets, CellAlignment, Table as Comfy};

use super::{tables, workload_rows, Table};
use crate::headline::{self, Finding};
use crate::measure::{Target, Workload};
use crate::result::{Meta, Metric, Report, Row};
use crate::stats::Ratio;
use crate::units;

/// What the summary tables show.
pub const SUMMARY_NOTE: &str =
    "Summary: mean ± sd over the runs; library / X is the library's figure over X's in the \
same configuration, paired run by run where the runs interleave (± its standard error, ~ where not \
significant). Every metric: --verbose or report.md.";

/// The default output's line budget.
pub const MAX_LINES: usize = 120;

/// One experiment's summary: its workloads, shown on one metric.
#[derive(Clone, Debug)]
pub struct Group {
    /// The table's title.
    pub title: String,
    /// Its workloads, in order.
    pub workloads: Vec<String>,
    /// The metric shown (and divided in the ratio columns).
    pub metric: String,
}

/// The experiments, in report order: (title, workloads, metric). A workload in none of
/// them gets a group of its own on its main metric.
pub const GROUPS: &[(&str, &[&str], &str)] = &[
    (
        "lockperf, per-inode file locks (Layton, 2013): total time spent locking",
        &["posix01", "posix02", "flock01", "flock02"],
        "total_lock_seconds",
    ),
    (
        "descriptor table, lock-free fd_install (Guzik, 2015): operations per second",
        &["pipebench", "opensock", "dup1"],
        "ops_per_sec",
    ),
    (
        "inode cache scalability (Chinner, 2023): operations per second, per phase",
        &["inodes"],
        "ops_per_sec",
    ),
    (
        "herd, wait tree of fs/locks.c (NeilBrown, 2018): lock acquisitions per second",
        &["herd"],
        "acquisitions_per_sec",
    ),
    (
        "loop devices, per-device loop lock (Tatashin, 2021): operations per second",
        &["loop"],
        "ops_per_sec",
    ),
    (
        "lockmany, many locks on one file: one set+unset with H locks held on the file",
        &["lockmany"],
        "set_unset_ns",
    ),
    (
        "will-it-scale lock1/lock2: lock+unlock pairs per second",
        &["lock1", "lock2"],
        "ops_per_sec",
    ),
    (
        "cluster, several servers, one lock space (etcd): ping_pong locks per second through two servers (the other modes: the headline, --verbose)",
        &["cluster"],
        "locks_per_sec",
    ),
    (
        "wakeup, a control: one wake-up of a sleeping process, on one CPU and across two (a request over /dev/fuse pays up to two)",
        &["wakeup"],
        "handoff_ns",
    ),
];

/// The targets a library row is divided by, first found first.
const RATIO_BASES: [Target; 2] = [Target::Kernel, Target::LibraryPrepatch];

/// The default output of `vfscale run`.
pub fn render(report: &Report) -> String {
    render_leaving(report, &[])
}

/// The output of `vfscale run --quick`: as [`render`], with the experiments of
/// [`QUICK_ELSEWHERE`] in report.md only (their headline lines stay).
pub fn render_quick(report: &Report) -> String {
    render_leaving(report, &QUICK_ELSEWHERE)
}

/// Experiments (by first workload) whose summary table `run --quick` leaves to report.md:
/// the inode cache's (its part of `run --quick` must add at most 15 lines; its table
/// alone is 14, a row per phase and task count, and its three headline lines carry the
/// ratios that are judged).
pub const QUICK_ELSEWHERE: [&str; 1] = ["inodes"];

/// [`render`] with the tables of `elsewhere` (by first workload) in report.md only.
fn render_leaving(report: &Report, elsewhere: &[&str]) -> String {
    let mut out = header(&report.meta, report);
    out.push_str(&headline_text(report));
    out.push('\n');
    out.push_str(SUMMARY_NOTE);
    out.push('\n');
    let tables = summary_tables(report);
    // Tables leave stdout (they stay in report.md), lowest priority first, until the
    // whole output fits in MAX_LINES.
    let mut left_out: Vec<&str> = elsewhere.to_vec();
    let render_with = |left_out: &[&str]| {
        let mut body = String::new();
        let mut elsewhere = Vec::new();
        for (g, t) in &tables {
            if left_out.contains(&g.as_str()) {
                elsewhere.push(t.title.clone());
                continue;
            }
            body.push('\n');
            body.push_str(&text_table(t));
        }
        if !elsewhere.is_empty() {
            body.push_str(&format!("\nIn report.md only: {}.\n", elsewhere.join("; ")));
        }
        body.push_str(&skipped_text(report));
        body
    };
    let full_report_line = 1;
    let mut body = render_with(&left_out);
    for g in STDOUT_DROP_ORDER {
        if out.lines().count() + body.lines().count() + full_report_line <= MAX_LINES {
            break;
        }
        left_out.push(g);
        body = render_with(&left_out);
    }
    out.push_str(&body);
    out
}

/// Experiments (by their first workload) whose summary table leaves stdout first when
/// the output would pass [`MAX_LINES`]: will-it-scale's lock1/lock2 (context, not an
/// experiment's question), then opensock/dup1's descriptor table, then lockperf.
const STDOUT_DROP_ORDER: [&str; 4] = ["lock1", "pipebench", "posix01", "loop"];

/// `--verbose` (and `vfscale bench`): the headline, then every table in full.
pub fn render_verbose(report: &Report) -> String {
    let mut out = header(&report.meta, report);
    out.push_str(&headline_text(report));
    for t in tables(report) {
        out.push('\n');
        out.push_str(&text_table(&t));
    }
    out
}

/// The first lines: what ran where.
fn header(meta: &Meta, report: &Report) -> String {
    let runs = report
        .results
        .iter()
        .flat_map(|r| r.metrics.values().map(|s| s.n))
        .max()
        .unwrap_or(0);
    format!(
        "vfscale — {} CPUs, Linux {}, commit {}, {}; {} runs per configuration\n\n",
        meta.nproc, meta.kernel, meta.commit, meta.date, runs
    )
}

/// The headline block: one line per finding and the legend of the marks.
pub fn headline_text(report: &Report) -> String {
    let findings: Vec<Finding> = headline::findings(report);
    let mut out = format!("What it found  ({})\n", headline::LEGEND);
    if findings.is_empty() {
        out.push_str("  (no experiment in this run)\n");
    }
    for f in &findings {
        out.push_str("  ");
        out.push_str(&f.line());
        out.push('\n');
    }
    out
}

/// The configurations that could not run, one line per (workload set, target, reason).
fn skipped_text(report: &Report) -> String {
    if report.skipped.is_empty() {
        return String::new();
    }
    // One line per (target, reason), naming the workloads.
    let mut lines: Vec<(Target, String, Vec<String>)> = Vec::new();
    for s in &report.skipped {
        match lines
            .iter_mut()
            .find(|(t, r, _)| *t == s.target && *r == s.reason)
        {
            Some((_, _, w)) if !w.contains(&s.workload) => w.push(s.workload.clone()),
            Some(_) => {}
            None => lines.push((s.target, s.reason.clone(), vec![s.workload.clone()])),
        }
    }
    let mut out = String::from("\nSkipped\n");
    for (t, r, w) in lines {
        out.push_str(&format!("  {t} ({}): {r}\n", w.join(", ")));
    }
    out
}

/// The summary tables, each with the first workload of its experiment: one per
/// [`GROUPS`] entry with results, plus one per workload in none.
pub fn summary_tables(report: &Report) -> Vec<(String, Table)> {
    let mut groups: Vec<Group> = GROUPS
        .iter()
        .map(|(title, workloads, metric)| Group {
            title: title.to_string(),
            workloads: workloads.iter().map(|w| w.to_string()).collect(),
            metric: metric.to_string(),
        })
        .collect();
    for w in super::workloads(report) {
        if !GROUPS.iter().any(|g| g.1.contains(&w)) {
            if let Some(metric) = super::main_metric(w, &workload_rows(report, w)) {
                groups.push(Group {
                    title: w.to_string(),
                    workloads: vec![w.to_string()],
                    metric,
                });
            }
        }
    }
    groups
        .iter()
        .filter_map(|g| Some((g.workloads[0].clone(), group_table(report, g)?)))
        .collect()
}

/// One group's table: rows by workload, mode, size and tasks; a column per target.
fn group_table(report: &Report, g: &Group) -> Option<Table> {
    let metric = g.metric.as_str();
    let rows: Vec<&Row> = g
        .workloads
        .iter()
        .flat_map(|w| workload_rows(report, w))
        .filter(|r| r.metrics.contains_key(metric))
        .collect();
    if rows.is_empty() {
        return None;
    }
    let targets: Vec<Target> = Target::ALL
        .into_iter()
        .filter(|t| rows.iter().any(|r| r.target == *t))
        .collect();
    let bases: Vec<Target> = RATIO_BASES
        .into_iter()
        .filter(|b| targets.contains(b) && targets.contains(&Target::Library))
        .collect();
    let many_workloads = g.workloads.len() > 1;
    let has_size = rows.iter().any(|r| r.size().is_some());
    let size_name = if rows.iter().any(|r| r.held.is_some()) {
        "held"
    } else {
        "files"
    };
    // One line per configuration, in the rows' order.
    let mut keys: Vec<(&str, &str, Option<u64>, usize)> = Vec::new();
    for r in &rows {
        let k = (r.workload.as_str(), r.mode.as_str(), r.size(), r.tasks);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let unit = Metric::from(metric).unit();
    let unit_note = match unit.header() {
        "" => String::new(),
        u => format!(" ({u})"),
    };
    let mut header = Vec::new();
    let mut numeric = Vec::new();
    if many_workloads {
        header.push("workload".to_string());
        numeric.push(false);
    }
    header.push("mode".to_string());
    numeric.push(false);
    if has_size {
        header.push(size_name.to_string());
        numeric.push(true);
    }
    header.push("tasks".to_string());
    numeric.push(true);
    for t in &targets {
        header.push(format!("{t}{unit_note}"));
        numeric.push(true);
    }
    for b in &bases {
        header.push(format!("library / {b}"));
        numeric.push(true);
    }
    let find = |k: &(&str, &str, Option<u64>, usize), t: Target| {
        rows.iter()
            .find(|r| {
                r.workload == k.0 && r.mode == k.1 && r.size() == k.2 && r.tasks == k.3 && r.target == t
            })
            .and_then(|r| r.metrics.get(metric))
    };
    let mut cells = Vec::new();
    for k in &keys {
        let mut line = Vec::new();
        if many_workloads {
            line.push(k.0.to_string());
        }
        line.push(k.1.to_string());
        if has_size {
            line.push(k.2.map_or_else(String::new, |s| s.to_string()));
        }
        line.push(k.3.to_string());
        for t in &targets {
            line.push(find(k, *t).map_or_else(String::new, |s| units::format_summary(metric, s)));
        }
        for b in &bases {
            let cell = match (find(k, Target::Library), find(k, *b)) {
                (Some(l), Some(o)) => {
                    let r = if paired_runs(k.0) {
                        Ratio::paired_or_unpaired(&Metric::from(metric), l, o)
                    } else {
                        Ratio::unpaired(&Metric::from(metric), l, o)
                    };
                    let mark = if r.significant() { "" } else { " ~" };
                    format!("{}{mark}", units::format_ratio_pm(r.value, r.error))
                }
                _ => String::new(),
            };
            line.push(cell);
        }
        cells.push(line);
    }
    Some(Table {
        title: g.title.clone(),
        header,
        numeric,
        rows: cells,
        notes: Vec::new(),
    })
}

/// Whether run i of one row of `workload` and run i of another saw the same machine
/// ([`crate::bench::interleaved`]), so that their ratio is paired run by run, as the
/// headline pairs it.
fn paired_runs(workload: &str) -> bool {
    Workload::from_name(workload).is_some_and(crate::bench::interleaved)
}

/// A table as aligned text, under its title.
pub fn text_table(t: &Table) -> String {
    let mut c = Comfy::new();
    c.load_preset(presets::ASCII_MARKDOWN);
    c.set_header(t.header.clone());
    for row in &t.rows {
        c.add_row(row.clone());
    }
    for (i, numeric) in t.numeric.iter().enumerate() {
        if let Some(col) = c.column_mut(i) {
            col.set_cell_alignment(if *numeric {
                CellAlignment::Right
            } else {
                CellAlignment::Left
            });
        }
    }
    let mut out = format!("{}\n{c}\n", t.title);
    for n in &t.notes {
        out.push_str(n);
        out.push('\n');
    }
    out
}
