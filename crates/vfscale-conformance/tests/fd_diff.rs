//! Descriptor scenarios replayed against the library and the running kernel: the corpus
//! under `scenarios/fd/` (both streams identical, and equal to the recorded
//! `X.expected`), and random scenarios generated against the library's state.
//!
//! `VFSCALE_RANDOM_CASES` sets the number of random scenarios (default 64).
//! `VFSCALE_RECORD=1` rewrites every `X.expected` from the kernel's answers.

mod common;

use std::path::Path;

use proptest::prelude::*;
use vfscale_conformance::fd::kernel::{self, ReplayError};
use vfscale_conformance::fd::library::{self, LibraryReplay};
use vfscale_conformance::fd::{render_results, Op, Scenario, Step, StepOutcome};

use common::{
    assert_no_failures, cases, check_kernel_and_recording, corpus, load_corpus, say, xorshift_words,
};

fn child_exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vfscale-fd-child"))
}

fn kernel_available(what: &str) -> bool {
    common::kernel_available(what, kernel::available(child_exe()))
}

#[test]
fn corpus_library_matches_kernel_and_recording() {
    let files = corpus("fd", 30);
    let live = kernel_available("live kernel comparison of the corpus (comparing with recordings only)");
    let mut failures = Vec::new();
    for f in &files {
        let scn: Scenario = load_corpus(f);
        let lib = render_results(&library::replay(&scn).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
        let ker = live.then(|| {
            render_results(
                &kernel::replay(&scn, child_exe()).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
            )
        });
        check_kernel_and_recording(f, &lib, ker, &mut failures);
    }
    assert_no_failures(&failures, files.len());
    say(&format!(
        "corpus: {} scenarios, library == recording{}",
        files.len(),
        if live { " == live kernel" } else { "" }
    ));
}

/// Both runners reject a bad scenario with the same message, naming the line.
#[test]
fn bad_scenarios_fail_naming_the_line() {
    let cases = [
        (
            "# header\n{\"op\":\"spawn\",\"proc\":\"p1\"}\n{\"op\":\"close\",\"proc\":\"p2\",\"fd\":0}\n",
            "line 3: unknown process \"p2\"",
        ),
        (
            "{\"op\":\"spawn\",\"proc\":\"p1\"}\n{\"op\":\"exit\",\"proc\":\"p1\"}\n{\"op\":\"list\",\"proc\":\"p1\"}\n",
            "line 3: unknown process \"p1\"",
        ),
        (
            "{\"op\":\"spawn\",\"proc\":\"p1\"}\n{\"op\":\"fork\",\"proc\":\"p1\",\"child\":\"p1\"}\n",
            "line 2: process \"p1\" already exists",
        ),
        (
            "{\"op\":\"spawn\",\"proc\":\"p1\"}\n{\"op\":\"setrlimit\",\"proc\":\"p1\",\"nofile\":2048}\n",
            "line 2: setrlimit may only lower RLIMIT_NOFILE (from 1024 to 2048): raising the hard limit needs a privilege",
        ),
    ];
    let live = kernel_available("kernel half of bad_scenarios_fail_naming_the_line");
    for (text, want) in cases {
        let scn = Scenario::parse(text).unwrap();
        let lib = library::replay(&scn).unwrap_err();
        assert_eq!(lib.to_string(), want);
        if live {
            match kernel::replay(&scn, child_exe()) {
                Err(ReplayError::Scenario(e)) => assert_eq!(e.to_string(), want),
                other => panic!("expected a scenario error, got {other:?}"),
            }
        }
    }
    let parse_errors = [
        (
            "{\"op\":\"dup\",\"proc\":\"p1\",\"fd\":3,\"as\":4}",
            "line 1: unknown field `as` for op `dup`",
        ),
        (
            "{\"op\":\"dup\",\"proc\":\"p1\",\"fd\":\"3\"}",
            "line 1: field `fd` must be a descriptor number (a 32-bit signed integer), not \"3\"",
        ),
        (
            "#x\n\n{\"op\":\"dup2\",\"proc\":\"p1\",\"fd\":3}",
            "line 3: missing field `newfd`",
        ),
        (
            "{\"op\":\"close_range\",\"proc\":\"p1\",\"first\":-1,\"last\":3}",
            "line 1: field `first` must be an unsigned 32-bit integer, not -1",
        ),
        (
            "{\"op\":\"close_range\",\"proc\":\"p1\",\"first\":1,\"last\":3,\"flags\":[\"NOPE\"]}",
            "line 1: field `flags`: unknown flag \"NOPE\" (CLOEXEC or UNSHARE)",
        ),
        (
            "{\"op\":\"setfd\",\"proc\":\"p1\",\"fd\":3}",
            "line 1: missing field `cloexec`",
        ),
        ("{\"op\":\"list\"}", "line 1: missing field `proc`"),
        (
            "{\"op\":\"frob\",\"proc\":\"p1\"}",
            "line 1: field `op`: unknown op \"frob\"",
        ),
        ("[1]", "line 1: a step must be a JSON object"),
    ];
    for (text, want) in parse_errors {
        assert_eq!(Scenario::parse(text).unwrap_err().to_string(), want);
    }
}

// ---------------------------------------------------------------------------------------
// Random scenarios
// ---------------------------------------------------------------------------------------

const NAMES: [&str; 3] = ["a", "b", "c"];

/// A cheap splitter of one random word into choices.
struct Pick(u64);

impl Pick {
    fn n(&mut self, k: usize) -> usize {
        let v = (self.0 % k as u64) as usize;
        self.0 /= k as u64;
        v
    }
    fn of<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.n(xs.len())]
    }
    fn flip(&mut self) -> bool {
        self.n(2) == 0
    }
}

struct Gen {
    replay: LibraryReplay,
    steps: Vec<Step>,
    next_proc: usize,
}

impl Gen {
    fn push(&mut self, op: Op) {
        let step = Step {
            line: self.steps.len() + 1,
            op,
        };
        self.replay
            .apply(&step)
            .expect("the generator only makes valid steps");
        self.steps.push(step);
    }

    /// A descriptor number to act on: mostly an open one, sometimes any.
    fn fd(&self, p: &mut Pick, proc: &str, limit: u32) -> i32 {
        let open: Vec<i32> = self
            .replay
            .table(proc)
            .map(|t| t.iter().into_iter().map(|(fd, _, _)| fd.0 as i32).collect())
            .unwrap_or_default();
        if !open.is_empty() && p.n(4) != 0 {
            return p.of(&open);
        }
        self.number(p, limit)
    }

    /// Any descriptor number, near the interesting edges.
    fn number(&self, p: &mut Pick, limit: u32) -> i32 {
        let l = limit as i32;
        match p.n(10) {
            0 => p.of(&[-1, i32::MAX, l - 1, l, l + 1, 1023, 1024]),
            _ => p.n(12) as i32,
        }
    }

    fn step(&mut self, word: u64) {
        let mut p = Pick(word);
        let procs = self.replay.procs();
        if procs.is_empty() || (procs.len() < 3 && p.n(40) == 0) {
            self.next_proc += 1;
            let proc = format!("p{}", self.next_proc);
            self.push(Op::Spawn { proc });
            return;
        }
        let proc = procs[p.n(procs.len())].clone();
        let (limit, open) = {
            let t = self.replay.table(&proc).expect("live");
            (t.rlimit_nofile(), t.iter().len())
        };
        match p.n(100) {
            0..=19 => {
                let name = p.of(&NAMES).to_string();
                let cloexec = p.flip();
                self.push(Op::Open { proc, name, cloexec });
            }
            20..=26 => {
                let fd = self.fd(&mut p, &proc, limit);
                self.push(Op::Dup { proc, fd });
            }
            27..=35 => {
                let fd = self.fd(&mut p, &proc, limit);
                let newfd = if p.n(6) == 0 {
                    fd
                } else {
                    self.number(&mut p, limit)
                };
                if p.flip() {
                    self.push(Op::Dup2 { proc, fd, newfd });
                } else {
                    let cloexec = p.flip();
                    self.push(Op::Dup3 {
                        proc,
                        fd,
                        newfd,
                        cloexec,
                    });
                }
            }
            36..=43 => {
                let fd = self.fd(&mut p, &proc, limit);
                let min = self.number(&mut p, limit);
                let cloexec = p.flip();
                self.push(Op::FcntlDupfd {
                    proc,
                    fd,
                    min,
                    cloexec,
                });
            }
            44..=49 => {
                let fd = self.fd(&mut p, &proc, limit);
                self.push(Op::Getfd { proc, fd });
            }
            50..=55 => {
                let fd = self.fd(&mut p, &proc, limit);
                let cloexec = p.flip();
                self.push(Op::Setfd { proc, fd, cloexec });
            }
            56..=64 => {
                let fd = self.fd(&mut p, &proc, limit);
                self.push(Op::Close { proc, fd });
            }
            65..=70 => {
                let first = p.of(&[0u32, 1, 2, 3, 4, 5, 7, 10, 1023, u32::MAX]);
                let last = match p.n(4) {
                    0 => u32::MAX,
                    1 => first.saturating_sub(1),
                    _ => first.saturating_add(p.n(6) as u32),
                };
                let (cloexec, unshare) = (p.n(3) == 0, p.n(3) == 0);
                self.push(Op::CloseRange {
                    proc,
                    first,
                    last,
                    cloexec,
                    unshare,
                });
            }
            71..=75 if procs.len() < 4 => {
                self.next_proc += 1;
                let child = format!("p{}", self.next_proc);
                self.push(Op::Fork { proc, child });
            }
            76..=80 => {
                // The kernel runner needs a free descriptor below the limit for the new
                // image's dynamic loader (see kernel.rs); below-limit descriptors are
                // what decide it.
                let t = self.replay.table(&proc).expect("live");
                let below = t.iter().iter().filter(|(fd, _, _)| fd.0 < limit).count();
                if (below as u32) < limit {
                    self.push(Op::Exec { proc });
                }
            }
            81..=84 => {
                let nofile = match p.n(3) {
                    0 => u64::from(limit),
                    1 => (open as u64).min(u64::from(limit)),
                    _ => p.of(&[0u64, 1, 3, 4, 5, 6, 8, 12, 64]).min(u64::from(limit)),
                };
                self.push(Op::Setrlimit { proc, nofile });
            }
            85..=95 => self.push(Op::List { proc }),
            96..=99 if procs.len() > 1 || p.flip() => self.push(Op::Exit { proc }),
            _ => {}
        }
    }
}

/// A valid scenario from a list of random words, ending with a `list` of every process.
fn generate(words: &[u64]) -> Scenario {
    let mut g = Gen {
        replay: LibraryReplay::new(),
        steps: Vec::new(),
        next_proc: 0,
    };
    for &w in words {
        g.step(w);
    }
    for proc in g.replay.procs() {
        g.push(Op::List { proc });
    }
    Scenario { steps: g.steps }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_scenarios_match_the_kernel(words in prop::collection::vec(any::<u64>(), 10..80)) {
        if !kernel_available("random kernel comparison") {
            return Ok(());
        }
        let scn = generate(&words);
        let lib = render_results(&library::replay(&scn).unwrap());
        let ker = render_results(&kernel::replay(&scn, child_exe()).map_err(|e| TestCaseError::fail(format!("{e}\nscenario:\n{}", scn.to_jsonl())))?);
        prop_assert_eq!(&lib, &ker, "scenario:\n{}", scn.to_jsonl());
    }
}

#[test]
fn the_generator_reaches_the_interesting_results() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..200 {
        let words = xorshift_words(&mut seed, 60);
        let scn = generate(&words);
        for (s, r) in scn.steps.iter().zip(library::replay(&scn).unwrap()) {
            let key = match r.result.to_json() {
                serde_json::Value::String(e) => format!("{} {e}", s.op.name()),
                _ => s.op.name().to_string(),
            };
            *counts.entry(key).or_default() += 1;
        }
    }
    say(&format!("generator, 200 scenarios: {counts:?}"));
    for want in [
        "exec ok",
        "fork ok",
        "close_range ok",
        "dup2",
        "dup3 EINVAL",
        "dup3 EBADF",
        "fcntl_dupfd EINVAL",
        "open EMFILE",
        "close EBADF",
        "setrlimit ok",
        "exit ok",
    ] {
        assert!(
            counts.get(want).copied().unwrap_or(0) > 0,
            "the generator never made `{want}`: {counts:?}"
        );
    }
}

/// `exec` with no free descriptor below the limit cannot be replayed on the kernel (the
/// new image's dynamic loader needs one): the runner says so instead of dying, and
/// cleans up.
#[test]
fn exec_with_a_full_table_is_refused_by_the_kernel_runner() {
    let text = concat!(
        "{\"op\":\"spawn\",\"proc\":\"p1\"}\n",
        "{\"op\":\"fork\",\"proc\":\"p1\",\"child\":\"p2\"}\n",
        "{\"op\":\"setrlimit\",\"proc\":\"p1\",\"nofile\":3}\n",
        "{\"op\":\"exec\",\"proc\":\"p1\"}\n",
    );
    let scn = Scenario::parse(text).unwrap();
    let lib = render_results(&library::replay(&scn).unwrap());
    assert!(lib.ends_with("{\"step\":3,\"result\":\"ok\"}\n"), "{lib}");
    if !kernel_available("exec_with_a_full_table_is_refused_by_the_kernel_runner") {
        return;
    }
    match kernel::replay(&scn, child_exe()) {
        Err(ReplayError::Kernel(m)) => assert!(
            m.starts_with("step 3 (line 4): exec with no free descriptor"),
            "{m}"
        ),
        other => panic!("expected a kernel error, got {other:?}"),
    }
}
