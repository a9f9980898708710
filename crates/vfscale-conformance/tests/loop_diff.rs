//! Loop scenarios replayed against the library and the running kernel: the corpus under
//! `scenarios/loop/` (library == kernel == the recorded `X.expected`, with both control
//! lock designs), and random scenarios (library against the kernel when it is available,
//! and the per-device design against the global one always).
//!
//! `VFSCALE_RANDOM_CASES` sets the number of random scenarios (default 24 against the
//! kernel, 8 times that between the two library designs). `VFSCALE_RECORD=1` rewrites
//! every `X.expected` from the kernel's answers.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use vfscale_conformance::loop_dev::reference::Reference;
use vfscale_conformance::loop_dev::{kernel, library, render_results, Backing, Mode, Op, Scenario, Step};
use vfscale_loop::{CtlLock, Settings};

use common::{cases, check_kernel_and_recording, corpus, load_corpus, say};

fn kernel_available(what: &str) -> bool {
    common::kernel_available(what, kernel::available())
}

fn global() -> Settings {
    Settings {
        ctl_lock: CtlLock::Global,
        ..Settings::default()
    }
}

fn lib(scn: &Scenario, s: Settings) -> String {
    render_results(&library::replay_with(scn, s).unwrap())
}

#[test]
fn corpus_library_matches_kernel_and_recording() {
    let files = corpus("loop", 20);
    let live = kernel_available("live kernel comparison of the loop corpus (comparing with recordings only)");
    let mut failures = Vec::new();
    for f in &files {
        let scn: Scenario = load_corpus(f);
        let per_device = lib(&scn, Settings::default());
        let pre_patch = lib(&scn, global());
        if per_device != pre_patch {
            failures.push(format!("{}: the two lock designs differ", f.display()));
        }
        let ker = live.then(|| {
            render_results(&kernel::replay(&scn).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        });
        check_kernel_and_recording(f, &per_device, ker, &mut failures);
    }
    if live {
        kernel::check_starting_state().expect("the machine is back in the starting state");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    say(&format!(
        "loop corpus: {} scenarios, library == recording{}",
        files.len(),
        if live { " == kernel" } else { "" }
    ));
}

const HANDLES: [&str; 3] = ["h0", "h1", "h2"];
const BACKINGS: [&str; 3] = ["rw", "ro", "small"];

/// One random step over a small world: devices 0-2 and 8-9, three handle names, three
/// backing files that may be truncated (the read-only one refuses), every logical block
/// size from 512 to 64 KiB, sizes changed by size limits, offsets, truncation and
/// `set_capacity`. [`keep_sound`] then drops the I/O whose answer would depend on Linux's
/// page cache (the spec's unsound I/O).
fn arb_step() -> impl Strategy<Value = Op> {
    let h = prop::sample::select(HANDLES.to_vec()).prop_map(str::to_string);
    let backing = prop_oneof![
        4 => prop::sample::select(BACKINGS.to_vec()).prop_map(|b| Backing::File(b.to_string())),
        1 => prop::sample::select(HANDLES.to_vec()).prop_map(|b| Backing::Handle(b.to_string())),
        1 => Just(Backing::Null),
    ];
    let dev = prop::sample::select(vec![0i64, 1, 2, 8, 9]);
    let flags = prop::sample::select(vec![0u32, 1, 4, 8, 16, 5, 2]);
    let off = prop::sample::select(vec![0u64, 512, 4096, 100, 65536]);
    let limit = prop::sample::select(vec![0u64, 0, 0, 8192, 32768]);
    let bs = prop::sample::select(vec![0u64, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 1000]);
    let io_off = prop::sample::select(vec![0u64, 512, 4096, 8192, 32768, 61440, 65536]);
    prop_oneof![
        3 => (h.clone(), dev.clone(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(handle, dev, rw, excl)| Op::Open {
            dev,
            handle,
            mode: if rw { Mode::Rw } else { Mode::Ro },
            excl
        }),
        2 => h.clone().prop_map(|handle| Op::Close { handle }),
        3 => (h.clone(), backing.clone(), bs.clone(), off.clone(), limit.clone(), flags.clone()).prop_map(common::loop_configure),
        1 => (h.clone(), backing.clone()).prop_map(|(handle, backing)| Op::SetFd { handle, backing }),
        1 => (h.clone(), backing).prop_map(|(handle, backing)| Op::ChangeFd { handle, backing }),
        2 => h.clone().prop_map(|handle| Op::ClrFd { handle }),
        1 => (h.clone(), off.clone(), limit, flags).prop_map(|(handle, offset, sizelimit, flags)| Op::SetStatus64 {
            handle,
            offset,
            sizelimit,
            flags,
            file_name: String::new()
        }),
        1 => h.clone().prop_map(|handle| Op::SetCapacity { handle }),
        1 => (prop::sample::select(BACKINGS.to_vec()), prop::sample::select(vec![32768u64, 65536, 131072])).prop_map(|(n, size)| Op::TruncateBacking {
            name: n.to_string(),
            size
        }),
        1 => h.clone().prop_map(|handle| Op::GetStatus64 { handle }),
        2 => (h.clone(), bs).prop_map(|(handle, size)| Op::SetBlockSize { handle, size }),
        1 => (h.clone(), any::<bool>()).prop_map(|(handle, on)| Op::SetDirectIo { handle, on }),
        1 => h.clone().prop_map(|handle| Op::Size { handle }),
        1 => h.clone().prop_map(|handle| Op::Ro { handle }),
        8 => (h.clone(), io_off.clone(), prop::sample::select(vec![512u64, 1000, 4096, 8192, 32768, 65536])).prop_map(|(handle, offset, len)| Op::Read {
            handle,
            offset,
            len
        }),
        3 => (h.clone(), io_off, prop::sample::select(vec![512u64, 1000, 4096, 8192, 65536]), any::<u8>()).prop_map(|(handle, offset, len, byte)| Op::Write {
            handle,
            offset,
            len,
            byte
        }),
        1 => h.clone().prop_map(|handle| Op::Fsync { handle }),
        1 => dev.clone().prop_map(|index| Op::CtlAdd { index }),
        1 => dev.prop_map(|index| Op::CtlRemove { index }),
        1 => Just(Op::CtlGetFree),
        1 => Just(Op::List),
    ]
}

/// Random steps, most often after a device bound through `h0` at a random block size, so
/// that the steps find a device to do I/O through and change.
fn arb_ops(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Op>> {
    let setup = (
        prop::sample::select(BACKINGS.to_vec()),
        prop::sample::select(vec![512u32, 1024, 2048, 4096, 8192, 16384, 32768, 65536]),
        prop::sample::select(vec![0u64, 0, 4096, 32768]),
        prop::sample::select(vec![0u32, 0, 16, 4]),
    )
        .prop_map(|(b, block_size, sizelimit, flags)| {
            vec![
                Op::Open {
                    dev: 0,
                    handle: "h0".into(),
                    mode: Mode::Rw,
                    excl: false,
                },
                Op::Configure {
                    handle: "h0".into(),
                    backing: Backing::File(b.to_string()),
                    block_size,
                    offset: 0,
                    sizelimit,
                    flags,
                },
            ]
        });
    let setup = prop_oneof![1 => Just(Vec::new()), 3 => setup];
    (setup, prop::collection::vec(arb_step(), len)).prop_map(|(mut ops, rest)| {
        ops.extend(rest);
        ops
    })
}

/// Turns random steps into a valid scenario: the backing files first, steps on handles
/// that are not open dropped, opens of a name that is open dropped.
fn build(ops: Vec<Op>) -> Scenario {
    let mut steps = common::loop_backings();
    let mut open = std::collections::HashSet::new();
    for op in ops {
        let ok = match &op {
            Op::Open { handle, .. } => open.insert(handle.clone()),
            Op::Close { handle } => open.remove(handle),
            Op::Configure { handle, backing, .. }
            | Op::SetFd { handle, backing }
            | Op::ChangeFd { handle, backing } => common::binds_open(&open, handle, backing),
            o => o.handle().is_none_or(|h| open.contains(h)),
        };
        if ok {
            steps.push(op);
        }
    }
    Scenario {
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(i, op)| Step { line: i + 1, op })
            .collect(),
    }
}

/// Drops the I/O steps the format calls unsound (`docs/scenarios/loop.md`, "I/O"), as the
/// reference model judges them along the scenario; I/O does not change what makes later
/// I/O sound. Should the model refuse a step the library accepted (the model test would
/// say so), the rest is kept as it is.
fn keep_sound(scn: Scenario) -> Scenario {
    let mut model = Some(Reference::new());
    let mut kept = Vec::new();
    for st in scn.steps {
        let sound = match (&model, &st.op) {
            (Some(m), Op::Read { handle, .. }) => m.io_sound(handle, false),
            (Some(m), Op::Write { handle, .. }) => m.io_sound(handle, true),
            _ => true,
        };
        if !sound {
            continue;
        }
        let step = Step {
            line: kept.len() + 1,
            op: st.op,
        };
        if model.as_mut().is_some_and(|m| m.apply(&step).is_err()) {
            model = None;
        }
        kept.push(step);
    }
    Scenario { steps: kept }
}

/// Opens may fail (ENOENT, ENXIO, EBUSY): the library's answer decides which later steps
/// name a live handle, so the scenario is cut at the first open the library refused and
/// rebuilt without it.
fn settle(scn: Scenario) -> Scenario {
    let mut steps = scn.steps;
    loop {
        let s = Scenario { steps: steps.clone() };
        let mut r = library::LibraryReplay::new(Settings::default()).unwrap();
        let mut cut = None;
        for (i, st) in s.steps.iter().enumerate() {
            match r.apply(st) {
                Ok(res) => {
                    if matches!(st.op, Op::Open { .. })
                        && res.result != vfscale_conformance::loop_dev::Outcome::Ok
                    {
                        cut = Some(i);
                        break;
                    }
                }
                Err(_) => {
                    cut = Some(i);
                    break;
                }
            }
        }
        match cut {
            None => return s,
            Some(i) => {
                let failed = steps.remove(i);
                if let Op::Open { handle, .. } = failed.op {
                    // Drop later steps on this handle until it is opened again.
                    let mut j = i;
                    while j < steps.len() {
                        if let Op::Open { handle: h2, .. } = &steps[j].op {
                            if *h2 == handle {
                                break;
                            }
                        }
                        let names = match &steps[j].op {
                            Op::Configure {
                                backing: Backing::Handle(b),
                                ..
                            }
                            | Op::SetFd {
                                backing: Backing::Handle(b),
                                ..
                            }
                            | Op::ChangeFd {
                                backing: Backing::Handle(b),
                                ..
                            } => *b == handle,
                            _ => false,
                        };
                        if steps[j].op.handle() == Some(handle.as_str()) || names {
                            steps.remove(j);
                        } else {
                            j += 1;
                        }
                    }
                }
                for (k, st) in steps.iter_mut().enumerate() {
                    st.line = k + 1;
                }
            }
        }
    }
}

#[test]
fn random_scenarios_library_matches_kernel() {
    if !kernel_available("random loop scenarios against the kernel") {
        return;
    }
    let mut runner = TestRunner::new(Config {
        cases: cases(24),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&arb_ops(1..60), |ops| {
            let scn = keep_sound(settle(build(ops)));
            let l = lib(&scn, Settings::default());
            let k = render_results(&kernel::replay(&scn).map_err(|e| TestCaseError::fail(e.to_string()))?);
            prop_assert_eq!(&l, &k, "scenario:\n{}", scn.to_jsonl());
            Ok(())
        })
        .unwrap();
    kernel::check_starting_state().expect("the machine is back in the starting state");
}

#[test]
fn random_scenarios_both_lock_designs_agree() {
    let mut runner = TestRunner::new(Config {
        cases: cases(24) * 8,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&arb_ops(1..60), |ops| {
            let scn = keep_sound(settle(build(ops)));
            prop_assert_eq!(
                lib(&scn, Settings::default()),
                lib(&scn, global()),
                "scenario:\n{}",
                scn.to_jsonl()
            );
            Ok(())
        })
        .unwrap();
}
