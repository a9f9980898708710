//! Random inode-cache scenarios: the library runner (vfscale-icache itself) against the
//! reference model of fs/inode.c, step by step. Steps are drawn at random and kept when
//! the model accepts them (so every scenario is valid: no WARN, no unknown name).

use proptest::prelude::*;
use vfscale_conformance::format::Step;
use vfscale_conformance::icache::{library, reference::Reference, render_results, Op, Scenario, StateOf};

const TASKS: [&str; 4] = ["t0", "t1", "t2", "t3"];

/// Builds a valid scenario from raw choices, guided by the model.
fn build(choices: &[(u8, u8, u8, u8)]) -> Scenario {
    let mut m = Reference::new();
    let mut steps: Vec<Step<Op>> = Vec::new();
    let mut n = 0usize;
    for &(a, b, c, d) in choices {
        let task = TASKS[b as usize % TASKS.len()].to_string();
        let sb = if c % 5 == 0 { "s1" } else { "s0" }.to_string();
        let ino = (c % 3) as u64 + 1;
        let live = m.tracker().live_refs();
        let r = if live.is_empty() {
            "none".to_string()
        } else {
            live[d as usize % live.len()].clone()
        };
        n += 1;
        let fresh = format!("r{n}");
        let hold = d % 3 == 0;
        let op = match a % 20 {
            0..=3 => Op::Iget {
                task,
                sb,
                ino,
                r: fresh,
            },
            4 => Op::Ilookup {
                task,
                sb,
                ino,
                r: fresh,
            },
            5 => Op::NewInode {
                task,
                sb,
                ino,
                r: fresh,
            },
            6 => Op::InsertLocked { task, r },
            7 | 8 => Op::UnlockNew { task, r },
            9 => Op::DiscardNew { task, r, hold },
            10 => Op::IgetFailed { task, r, hold },
            11 => Op::Ihold { task, r, new: fresh },
            12 | 13 => Op::Iput { task, r, hold },
            14 => match m.tracker().held_tasks().next() {
                Some(t) => Op::FinishEvict { task: t.to_string() },
                None => Op::Stats { task },
            },
            15 => match d % 4 {
                0 => Op::Unhash { task, r },
                1 => Op::SetNlink {
                    task,
                    r,
                    nlink: (d % 3) as u32,
                },
                2 => Op::DropNlink { task, r },
                _ => Op::Dontcache { task, r },
            },
            16 => Op::Prune {
                task,
                sb,
                count: (d % 6) as u64,
            },
            17 => {
                if d % 8 == 0 {
                    Op::Umount { task, sb }
                } else {
                    Op::Lru { task, sb }
                }
            }
            18 => Op::State {
                task,
                of: if d % 2 == 0 {
                    StateOf::Key { sb, ino }
                } else {
                    StateOf::Ref(r)
                },
            },
            _ => Op::ClearNlink { task, r },
        };
        let step = Step {
            line: steps.len() + 1,
            op,
        };
        if m.apply(&step).is_ok() {
            steps.push(step);
        }
    }
    // Let held evictions finish so the scenario ends quiet.
    let held: Vec<String> = m.tracker().held_tasks().map(str::to_string).collect();
    for t in held {
        let step = Step {
            line: steps.len() + 1,
            op: Op::FinishEvict { task: t },
        };
        m.apply(&step).expect("finish a held eviction");
        steps.push(step);
    }
    Scenario { steps }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn library_equals_model(choices in proptest::collection::vec(any::<(u8, u8, u8, u8)>(), 1..80)) {
        let scn = build(&choices);
        let want = render_results(&vfscale_conformance::icache::reference::replay(&scn).unwrap());
        let got = render_results(&library::replay(&scn).unwrap());
        prop_assert_eq!(got, want, "scenario:\n{}", scn.to_jsonl());
    }
}

/// The generator reaches the interesting states (not only trivially valid steps).
#[test]
fn generator_covers_waits_and_holds() {
    let mut blocked = 0;
    let mut held = 0;
    let mut rng = 0x1234_5678u64;
    for _ in 0..200 {
        let choices: Vec<(u8, u8, u8, u8)> = (0..60)
            .map(|_| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let x = rng.to_le_bytes();
                (x[4], x[5], x[6], x[7])
            })
            .collect();
        let scn = build(&choices);
        let out = render_results(&library::replay(&scn).unwrap());
        blocked += out.matches("\"blocked\"").count();
        held += scn
            .steps
            .iter()
            .filter(|s| matches!(s.op, Op::FinishEvict { .. }))
            .count();
    }
    assert!(blocked > 50 && held > 20, "blocked {blocked}, held {held}");
}
