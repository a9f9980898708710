//! `report.html`: one self-contained page (inline CSS, inline SVG, nothing fetched)
//! that opens on what the run found, then the summary tables, the scaling plots and
//! every table.

use crate::result::{Meta, Report};

use crate::headline::{self, Status};

use super::{meta_fields, plot, skipped_table, summary, workload_table, workloads, Table, LEGEND};

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
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; vertical-align: top; }
figcaption { font-size: 0.9em; color: #555; max-width: 640px; }
ul.headline { list-style: none; padding-left: 0; }
ul.headline li { margin: 0.3em 0; padding: 0.2em 0.5em; border-left: 4px solid #ccc; }
ul.headline li.met { border-color: #2c8c2c; }
ul.headline li.missed { border-color: #c0392b; background: #fdf0ee; }
ul.headline li.ns { border-color: #d4a017; }
ul.headline li.skipped { border-color: #999; color: #666; }
";

/// The report as a self-contained HTML page: the machine, what it found, the summary
/// tables, the plots, then every table.
pub fn render(report: &Report) -> String {
    let mut out = String::from("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<title>vfscale report</title>\n<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n<h1>vfscale report</h1>\n");
    out.push_str(&meta_table(&report.meta));
    if report.results.is_empty() && report.skipped.is_empty() {
        out.push_str("<p>No results.</p>\n</body>\n</html>\n");
        return out;
    }
    out.push_str("<section id=\"headline\">\n<h2>What it found</h2>\n<ul class=\"headline\">\n");
    for f in headline::findings(report) {
        let class = match f.status {
            Status::Met => "met",
            Status::Missed(_) => "missed",
            Status::NotSignificant(_) => "ns",
            Status::Info => "info",
            Status::Skipped(_) => "skipped",
        };
        out.push_str(&format!("<li class=\"{class}\">{}</li>\n", escape(&f.line())));
    }
    out.push_str(&format!(
        "</ul>\n<p class=\"note\">{}</p>\n</section>\n",
        escape(headline::LEGEND)
    ));
    out.push_str(&format!(
        "<section id=\"summary\">\n<h2>Summary</h2>\n<p class=\"note\">{}</p>\n",
        escape(summary::SUMMARY_NOTE)
    ));
    for (_, t) in summary::summary_tables(report) {
        out.push_str(&render_table_at(&t, 3));
    }
    out.push_str("</section>\n");
    let plots = plot::all(report);
    if !plots.is_empty() {
        out.push_str("<section id=\"plots\">\n<h2>Plots</h2>\n");
        for p in plots {
            out.push_str(&format!(
                "<figure class=\"plot\" id=\"plot-{}\">\n{}<figcaption>{}</figcaption>\n</figure>\n",
                p.file_stem,
                p.svg,
                escape(&p.title)
            ));
        }
        out.push_str("</section>\n");
    }
    out.push_str(&format!(
        "<section id=\"tables\">\n<h2>Every table</h2>\n<p class=\"note\">{}</p>\n",
        escape(LEGEND)
    ));
    for workload in workloads(report) {
        out.push_str(&render_table_at(&workload_table(report, workload), 3));
    }
    if let Some(table) = skipped_table(report) {
        out.push_str(&render_table_at(&table, 3));
    }
    out.push_str("</section>\n</body>\n</html>\n");
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
    render_table_at(table, 2)
}

/// One table under a heading of `level`, with its notes.
pub fn render_table_at(table: &Table, level: usize) -> String {
    let mut out = format!(
        "<h{level}>{}</h{level}>\n<table>\n<thead>\n<tr>",
        escape(&table.title)
    );
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
