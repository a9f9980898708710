//! The format pages under `docs/scenarios/` are what users read: every example there (a
//! ```` ```scenario ```` block followed by its ```` ```results ```` block) must replay
//! through the library runner exactly as printed, so the docs cannot drift from the code.

use std::path::{Path, PathBuf};

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scenarios")
}

/// The (scenario, results) pairs of one page, in order.
fn examples(page: &str) -> Vec<(String, String)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in page.lines() {
        match (&mut cur, line.strip_prefix("```")) {
            (None, Some(info)) => cur = Some((info.trim().to_string(), String::new())),
            (Some(_), Some("")) => blocks.push(cur.take().unwrap()),
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    let mut out = Vec::new();
    let mut it = blocks.into_iter().peekable();
    while let Some((info, body)) = it.next() {
        if info == "scenario" {
            let (next_info, results) = it
                .next()
                .expect("a ```scenario block is followed by a ```results block");
            assert_eq!(
                next_info, "results",
                "a ```scenario block is followed by a ```results block"
            );
            out.push((body, results));
        }
    }
    out
}

fn replay(format: &str, text: &str) -> String {
    use vfscale_conformance::{fd, locks};
    match format {
        "locks" => {
            let s = locks::Scenario::parse(text).unwrap();
            locks::render_results(&locks::library::replay(&s).unwrap())
        }
        "fd" => {
            let s = fd::Scenario::parse(text).unwrap();
            fd::render_results(&fd::library::replay(&s).unwrap())
        }
        "loop" => {
            let s = vfscale_conformance::loop_dev::Scenario::parse(text).unwrap();
            vfscale_conformance::loop_dev::render_results(
                &vfscale_conformance::loop_dev::library::replay(&s).unwrap(),
            )
        }
        "icache" => {
            use vfscale_conformance::icache;
            let s = icache::Scenario::parse(text).unwrap();
            let lib = icache::render_results(&icache::library::replay(&s).unwrap());
            assert_eq!(
                lib,
                icache::render_results(&icache::reference::replay(&s).unwrap())
            );
            lib
        }
        other => panic!("docs/scenarios/{other}.md: no replay for this format in the test"),
    }
}

#[test]
fn every_format_page_example_replays_as_printed() {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(docs_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    let mut checked = Vec::new();
    for page in &pages {
        let format = page.file_stem().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(page).unwrap();
        let ex = examples(&text);
        assert!(!ex.is_empty(), "{}: no ```scenario example", page.display());
        for (i, (scn, want)) in ex.iter().enumerate() {
            let got = replay(&format, scn);
            assert_eq!(
                got,
                *want,
                "{} example {}: the page's results differ from the replay",
                page.display(),
                i + 1
            );
        }
        checked.push(format!("{format} ({})", ex.len()));
    }
    assert!(checked.len() >= 2, "format pages found: {checked:?}");
    eprintln!("docs examples replayed: {}", checked.join(", "));
}
