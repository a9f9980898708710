//! The loop reference model (`loop_dev::reference`, written from `drivers/block/loop.c`)
//! against the kernel's recordings of the corpus under `scenarios/loop/`, and against the
//! library (`vfscale-loop`) on random scenarios. Neither needs root: this is the oracle
//! where `/dev/loop-control` cannot be asked.
//!
//! `VFSCALE_RANDOM_CASES` sets the number of random scenarios (default 256).

mod common;

use vfscale_conformance::loop_dev::{reference, render_results, Scenario};

use common::{assert_no_failures, corpus_dir, say, scenarios};

#[test]
fn corpus_reference_matches_the_kernel_recording() {
    let files = scenarios(&corpus_dir("loop"));
    assert!(files.len() >= 20, "the corpus has only {} scenarios", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let scn = Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let got = render_results(&reference::replay(&scn).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
        let expected_path = f.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        if got != expected {
            let diff: Vec<String> = got
                .lines()
                .zip(expected.lines())
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("  reference {a}\n  kernel    {b}"))
                .collect();
            failures.push(format!("{}:\n{}", f.display(), diff.join("\n")));
        }
    }
    assert_no_failures(&failures, files.len());
    say(&format!(
        "loop corpus: {} scenarios, reference == kernel recording",
        files.len()
    ));
}
