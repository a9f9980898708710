//! The loop reference model (`loop_dev::reference`, written from `drivers/block/loop.c`)
//! against the kernel's recordings of the corpus under `scenarios/loop/`, and against the
//! library (`vfscale-loop`) on random scenarios. Neither needs root: this is the oracle
//! where `/dev/loop-control` cannot be asked.
//!
//! `VFSCALE_RANDOM_CASES` sets the number of random scenarios (default 256).

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use vfscale_conformance::loop_dev::reference::Reference;
use vfscale_conformance::loop_dev::{library, reference, render_results, Backing, Mode, Op, Scenario, Step};

use common::{assert_no_failures, cases, corpus, load, say};

#[test]
fn corpus_reference_matches_the_kernel_recording() {
    let files = corpus("loop", 20);
    let mut failures = Vec::new();
    for f in &files {
        let scn: Scenario = load(f);
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

const HANDLES: [&str; 4] = ["h0", "h1", "h2", "h3"];
const BACKINGS: [&str; 3] = ["rw", "ro", "small"];

fn arb_handle() -> impl Strategy<Value = String> {
    prop::sample::select(HANDLES.to_vec()).prop_map(str::to_string)
}

fn arb_backing() -> impl Strategy<Value = Backing> {
    prop_oneof![
        4 => prop::sample::select(BACKINGS.to_vec()).prop_map(|b| Backing::File(b.to_string())),
        2 => arb_handle().prop_map(Backing::Handle),
        1 => Just(Backing::Null),
    ]
}

/// One random step over a small world: devices 0-2 and 8-9 (and 1048576, -1), four
/// handle names, three backing files of which `rw` may grow. I/O steps are kept only
/// where the format calls them sound (see [`settle`]).
fn arb_step() -> impl Strategy<Value = Op> {
    let h = arb_handle;
    let dev = || prop::sample::select(vec![0i64, 0, 1, 1, 2, 2, 8, 9]);
    let flags = || prop::sample::select(vec![0u32, 1, 4, 8, 16, 5, 20, 2, 64]);
    let off = || prop::sample::select(vec![0u64, 512, 4096, 100, 8192, 65536, 1 << 63]);
    let limit = || prop::sample::select(vec![0u64, 0, 8192, 1000, 32768, u64::MAX]);
    let bs = || {
        prop::sample::select(vec![
            0u64,
            512,
            1024,
            2048,
            4096,
            1000,
            8192,
            16384,
            32768,
            65536,
            1 << 32,
        ])
    };
    let io_off = || {
        prop::sample::select(vec![
            0u64, 512, 4096, 100, 8192, 28672, 32768, 61440, 65536, 131072,
        ])
    };
    let io_len = || prop::sample::select(vec![0u64, 512, 4096, 8192, 1000, 32768, 65536, 131072]);
    prop_oneof![
        8 => (h(), dev(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(handle, dev, rw, excl)| Op::Open {
            dev,
            handle,
            mode: if rw { Mode::Rw } else { Mode::Ro },
            excl
        }),
        5 => h().prop_map(|handle| Op::Close { handle }),
        6 => (h(), arb_backing(), bs(), off(), limit(), flags()).prop_map(common::loop_configure),
        4 => (h(), arb_backing()).prop_map(|(handle, backing)| Op::SetFd { handle, backing }),
        2 => (h(), arb_backing()).prop_map(|(handle, backing)| Op::ChangeFd { handle, backing }),
        3 => h().prop_map(|handle| Op::ClrFd { handle }),
        2 => (h(), off(), limit(), flags(), prop::sample::select(vec!["", "x", "rw"])).prop_map(
            |(handle, offset, sizelimit, flags, n)| Op::SetStatus64 {
                handle,
                offset,
                sizelimit,
                flags,
                file_name: n.to_string()
            }
        ),
        2 => h().prop_map(|handle| Op::GetStatus64 { handle }),
        1 => h().prop_map(|handle| Op::SetCapacity { handle }),
        2 => (h(), bs()).prop_map(|(handle, size)| Op::SetBlockSize { handle, size }),
        2 => (h(), any::<bool>()).prop_map(|(handle, on)| Op::SetDirectIo { handle, on }),
        1 => h().prop_map(|handle| Op::Size { handle }),
        1 => h().prop_map(|handle| Op::BlockSize { handle }),
        1 => h().prop_map(|handle| Op::Ro { handle }),
        5 => (h(), io_off(), io_len()).prop_map(|(handle, offset, len)| Op::Read { handle, offset, len }),
        5 => (h(), io_off(), io_len(), any::<u8>()).prop_map(|(handle, offset, len, byte)| Op::Write {
            handle,
            offset,
            len,
            byte
        }),
        2 => h().prop_map(|handle| Op::Fsync { handle }),
        2 => (prop::sample::select(BACKINGS.to_vec()), prop::sample::select(vec![4096u64, 65536, 131072])).prop_map(
            |(n, size)| Op::TruncateBacking { name: n.to_string(), size }
        ),
        1 => (prop::sample::select(BACKINGS.to_vec()), io_off()).prop_map(|(n, offset)| Op::ReadBacking {
            name: n.to_string(),
            offset,
            len: 4096
        }),
        1 => prop::sample::select(vec![0i64, 1, 2, 8, 9, -1, 1048576]).prop_map(|index| Op::CtlAdd { index }),
        1 => prop::sample::select(vec![0i64, 1, 2, 8, 9, -1]).prop_map(|index| Op::CtlRemove { index }),
        1 => Just(Op::CtlGetFree),
        1 => Just(Op::List),
    ]
}

/// Turns random steps into a valid scenario, replaying it on the reference as it goes:
/// the backing files first; a step on a handle that is not open (or an open of a name
/// that is) is dropped, as is I/O the format calls unsound (the device's size not whole
/// logical blocks, a backing that does not cover it, writes at block sizes above a page
/// and above the page cache's). Which
/// opens succeed is the reference's answer; the comparison checks it.
fn settle(ops: Vec<Op>) -> Scenario {
    let mut steps = common::loop_backings();
    steps.extend(ops);
    let mut model = Reference::new();
    let mut open = std::collections::HashSet::new();
    let mut kept = Vec::new();
    for op in steps {
        let ok = match &op {
            Op::Open { handle, .. } => !open.contains(handle),
            Op::Configure { handle, backing, .. }
            | Op::SetFd { handle, backing }
            | Op::ChangeFd { handle, backing } => common::binds_open(&open, handle, backing),
            Op::Read { handle, .. } => open.contains(handle) && model.io_sound(handle, false),
            Op::Write { handle, .. } => open.contains(handle) && model.io_sound(handle, true),
            o => o.handle().is_none_or(|h| open.contains(h)),
        };
        if !ok {
            continue;
        }
        let step = Step {
            line: kept.len() + 1,
            op,
        };
        let res = model.apply(&step).expect("a settled step is valid");
        match &step.op {
            Op::Open { handle, .. } if res.result == vfscale_conformance::loop_dev::Outcome::Ok => {
                open.insert(handle.clone());
            }
            Op::Close { handle } => {
                open.remove(handle);
            }
            _ => {}
        }
        kept.push(step);
    }
    Scenario { steps: kept }
}

fn render(
    r: Result<Vec<vfscale_conformance::loop_dev::StepResult>, vfscale_conformance::loop_dev::ScenarioError>,
) -> String {
    match r {
        Ok(v) => render_results(&v),
        Err(e) => format!("replay failed: {e}\n"),
    }
}

#[test]
fn random_scenarios_reference_matches_library() {
    let n = cases(256).max(1);
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(arb_step(), 1..80), |ops| {
            let scn = settle(ops);
            let r = render(reference::replay(&scn));
            let l = render(library::replay(&scn));
            prop_assert_eq!(&r, &l, "scenario:\n{}", scn.to_jsonl());
            Ok(())
        })
        .unwrap();
    say(&format!("loop: {n} random scenarios, reference == library"));
}
