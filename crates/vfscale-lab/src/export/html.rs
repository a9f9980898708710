//! `report.html`: one self-contained page (inline CSS, inline SVG, nothing fetched) with
//! the tables of [`super::tables`] and, under each workload's table, its scaling plots.

use crate::result::{Meta, Report};

use super::{meta_fields, modes, plot, skipped_table, workload_table, workloads, Table, LEGEND};

/// The page's stylesheet.
const STYLE: &str = "\
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; }
th { background: #f2f2f2; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.meta th { background: none; border: none; padding-left: 0; }
table.meta td { border: none; }
p.note { color: #555; font-size: 0.9em; margin: 0.2em 0; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; }
figcaption { font-size: 0.9em; color: #555; }
";

/// The report as a self-contained HTML page.
pub fn render(report: &Report) -> String {
    let mut out = String::from("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<title>vfscale report</title>\n<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n<h1>vfscale report</h1>\n");
    out.push_str(&meta_table(&report.meta));
    if report.results.is_empty() && report.skipped.is_empty() {
        out.push_str("<p>No results.</p>\n");
    } else {
        out.push_str(&format!("<p>{}</p>\n", escape(LEGEND)));
    }
    for workload in workloads(report) {
        out.push_str(&render_table(&workload_table(report, workload)));
        out.push_str(&plots(report, workload));
    }
    if let Some(table) = skipped_table(report) {
        out.push_str(&render_table(&table));
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The machine and command, as a two-column table.
fn meta_table(meta: &Meta) -> String {
    let mut out = String::from("<table class=\"meta\">\n");
    for (name, value) in meta_fields(meta) {
        let value = match name {
            "command" => format!("<code>{}</code>", escape(&value)),
            _ => escape(&value),
        };
        out.push_str(&format!("<tr><th>{name}</th><td>{value}</td></tr>\n"));
    }
    out.push_str("</table>\n");
    out
}

/// One table under a level-2 heading, with its notes.
pub fn render_table(table: &Table) -> String {
    let mut out = format!("<h2>{}</h2>\n<table>\n<thead>\n<tr>", escape(&table.title));
    for header in &table.header {
        out.push_str(&format!("<th>{}</th>", escape(header)));
    }
    out.push_str("</tr>\n</thead>\n<tbody>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if table.numeric.get(i).copied().unwrap_or(false) {
                " class=\"num\""
            } else {
                ""
            };
            out.push_str(&format!("<td{class}>{}</td>", escape(cell)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    for note in &table.notes {
        out.push_str(&format!("<p class=\"note\">{}</p>\n", escape(note)));
    }
    out
}

/// The workload's scaling plots, one figure per mode that has something to plot.
fn plots(report: &Report, workload: &str) -> String {
    modes(report, workload)
        .into_iter()
        .filter_map(|mode| {
            let svg = plot::scaling_svg(report, workload, mode)?;
            let caption = escape(&format!("{workload}, {mode}"));
            Some(format!(
                "<figure>\n{svg}<figcaption>{caption}</figcaption>\n</figure>\n"
            ))
        })
        .collect()
}

/// Text with the HTML special characters escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_special_characters() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn renders_numeric_cells_right_aligned() {
        let table = Table {
            title: "t".into(),
            header: vec!["a".into(), "b".into()],
            numeric: vec![false, true],
            rows: vec![vec!["x".into(), "1".into()]],
            notes: vec![],
        };
        let html = render_table(&table);
        assert!(html.contains("<tr><td>x</td><td class=\"num\">1</td></tr>"));
    }
}
