//! `report.md`: the run's machine, what it found (the headline), the summary tables,
//! the plots (as the SVG files [`super::write_all`] writes under `plots/`), then every
//! table in full.

use crate::headline;
use crate::result::{Meta, Report};

use super::{meta_fields, plot, summary, tables, Table, LEGEND};

/// The report as Markdown.
pub fn render(report: &Report) -> String {
    let mut out = String::from("# vfscale report\n\n");
    out.push_str(&meta_list(&report.meta));
    if report.results.is_empty() && report.skipped.is_empty() {
        out.push_str("\nNo results.\n");
        return out;
    }
    out.push_str("\n## What it found\n\n");
    let findings = headline::findings(report);
    if findings.is_empty() {
        out.push_str("No experiment in this run.\n");
    }
    for f in &findings {
        out.push_str(&format!("- {}\n", inline(&f.line())));
    }
    out.push_str(&format!("\n{}\n", inline(headline::LEGEND)));
    out.push_str("\n## Summary\n\n");
    out.push_str(&inline(summary::SUMMARY_NOTE));
    out.push('\n');
    for (_, t) in summary::summary_tables(report) {
        out.push('\n');
        out.push_str(&render_table_at(&t, 3));
    }
    let plots = plot::all(report);
    if !plots.is_empty() {
        out.push_str("\n## Plots\n\n");
        for p in &plots {
            out.push_str(&format!("![{}](plots/{}.svg)\n", inline(&p.title), p.file_stem));
        }
    }
    out.push_str("\n## Every table\n\n");
    out.push_str(LEGEND);
    out.push('\n');
    for table in &tables(report) {
        out.push('\n');
        out.push_str(&render_table_at(table, 3));
    }
    out
}

/// The machine and command, as a list.
fn meta_list(meta: &Meta) -> String {
    meta_fields(meta)
        .iter()
        .map(|(name, value)| match *name {
            "command" => format!("- {name}: {}\n", code_span(value)),
            _ => format!("- {name}: {}\n", inline(value)),
        })
        .collect()
}

/// One table under a level-2 heading, with its notes.
pub fn render_table(table: &Table) -> String {
    render_table_at(table, 2)
}

/// One table under a heading of `level`, with its notes.
pub fn render_table_at(table: &Table, level: usize) -> String {
    let mut out = format!("{} {}\n\n", "#".repeat(level), inline(&table.title));
    out.push_str(&table_line(table.header.iter().map(|h| cell(h))));
    out.push_str(&table_line(
        table
            .numeric
            .iter()
            .map(|&n| if n { "---:" } else { "---" }.to_string()),
    ));
    for row in &table.rows {
        out.push_str(&table_line(row.iter().map(|c| cell(c))));
    }
    for note in &table.notes {
        out.push('\n');
        out.push_str(&inline(note));
        out.push('\n');
    }
    out
}

/// `| a | b |` and a newline.
fn table_line(cells: impl Iterator<Item = String>) -> String {
    let mut line = String::from("|");
    for c in cells {
        line.push(' ');
        line.push_str(&c);
        line.push_str(" |");
    }
    line.push('\n');
    line
}

/// Text for a table cell: inline text with `|` escaped.
fn cell(text: &str) -> String {
    inline(text).replace('|', "\\|")
}

/// Text on one line, with the characters Markdown would read as markup escaped.
fn inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '\n' | '\r' => out.push(' '),
            '\\' | '`' | '*' | '[' | ']' | '<' | '>' => {
                out.push('\\');
                out.push(ch);
            }
            _ => out.push(ch),
        }
    }
    out
}

/// `text` as a code span, fenced with more backticks than it contains in a row.
fn code_span(text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ");
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{text}{pad}{fence}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_pipes() {
        assert_eq!(cell("a|b_c*"), "a\\|b_c\\*");
        assert_eq!(inline("x\ny"), "x y");
        assert_eq!(code_span("run --x"), "`run --x`");
        assert_eq!(code_span("a `b` c"), "``a `b` c``");
        assert_eq!(code_span("`x`"), "`` `x` ``");
    }

    #[test]
    fn renders_a_table_with_alignment_and_notes() {
        let table = Table {
            title: "herd".into(),
            header: vec!["target".into(), "tasks".into()],
            numeric: vec![false, true],
            rows: vec![vec!["kernel".into(), "2".into()]],
            notes: vec!["note".into()],
        };
        assert_eq!(
            render_table(&table),
            "## herd\n\n| target | tasks |\n| --- | ---: |\n| kernel | 2 |\n\nnote\n"
        );
    }
}
