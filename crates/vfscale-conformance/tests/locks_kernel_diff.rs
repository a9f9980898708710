//! The corpus under `scenarios/locks/`, replayed against the library and the running
//! kernel: the two result streams must be identical, and equal to the recorded
//! `X.expected`, with each way of indexing an inode's locks ([`LockIndex`]). Files under
//! `racy/` depend on which of several woken waiters Linux lets win; they are replayed on
//! both sides for errors, not compared.

mod common;

use vfscale_conformance::locks::{kernel, library, render_results, KernelOptions, Scenario};
use vfscale_locks::{LockIndex, Settings};

use common::{assert_no_failures, corpus, corpus_dir, load, say, scenarios};

/// The library settings every scenario is replayed with: the default index and Linux's
/// list.
const INDEXES: [LockIndex; 2] = [LockIndex::Tree, LockIndex::List];

fn settings(index: LockIndex) -> Settings {
    Settings {
        index,
        ..Settings::default()
    }
}

#[test]
fn corpus_library_matches_kernel_and_recording() {
    let files = corpus("locks", 40);
    let kernel_ok = kernel::available();
    if let Err(why) = &kernel_ok {
        say(&format!(
            "SKIP live kernel comparison ({why}); comparing with recordings only"
        ));
    }
    let mut failures = Vec::new();
    let (mut listed, mut waiting) = (0, 0);
    for f in &files {
        let scn: Scenario = load(f);
        let expected_path = f.with_extension("expected");
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let kernel = kernel_ok.is_ok().then(|| {
            let (r, l) = kernel::replay_with_listing(&scn, &KernelOptions::default())
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (render_results(&r), l)
        });
        for index in INDEXES {
            let (lib_results, lib_listing) = library::replay_with_listing(&scn, settings(index))
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let lib = render_results(&lib_results);
            if lib != expected {
                failures.push(format!(
                    "{} ({index:?}): library differs from the recording\n--- library\n{lib}--- recorded\n{expected}",
                    f.display()
                ));
            }
            if let Some((ker, ker_listing)) = &kernel {
                if &lib != ker {
                    failures.push(format!(
                        "{} ({index:?}): library differs from the kernel\n--- library\n{lib}--- kernel\n{ker}",
                        f.display()
                    ));
                }
                if &lib_listing != ker_listing {
                    failures.push(format!(
                        "{} ({index:?}): the lock listing differs from /proc/locks\n--- library\n{lib_listing:#?}\n--- kernel\n{ker_listing:#?}",
                        f.display()
                    ));
                }
            }
        }
        if let Some((_, ker_listing)) = &kernel {
            listed += ker_listing.len();
            waiting += ker_listing.iter().map(|g| g.waiters.len()).sum::<usize>();
        }
    }
    assert_no_failures(&failures, files.len());
    say(&format!(
        "corpus: {} scenarios, library (index and list) == recording{}; /proc/locks lists {listed} locks and {waiting} waiters alike",
        files.len(),
        if kernel_ok.is_ok() { " == live kernel" } else { "" }
    ));
}

#[test]
fn racy_corpus_replays_without_error_on_both_sides() {
    let files = scenarios(&corpus_dir("locks").join("racy"));
    assert!(!files.is_empty());
    for f in &files {
        let scn: Scenario = load(f);
        for index in INDEXES {
            let lib = library::replay_with(&scn, settings(index))
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            assert_eq!(lib.len(), scn.steps.len());
        }
        match kernel::available() {
            Ok(()) => {
                let ker = kernel::replay(&scn).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                assert_eq!(ker.len(), scn.steps.len());
            }
            Err(why) => say(&format!("SKIP kernel replay of {} ({why})", f.display())),
        }
    }
}
