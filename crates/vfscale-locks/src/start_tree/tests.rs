//! The tree against a plain sorted set: random inserts and removals (ascending runs,
//! descending runs and random keys, growing to thousands of entries and shrinking
//! back to none), with the invariants checked and random overlap scans compared.

use std::collections::BTreeMap;

use super::*;

/// The tag the tests give entry `id` (checked wherever an entry is reported).
fn tag(id: NodeId) -> Tag {
    Tag {
        seq: id ^ 0x5a5a,
        pid: !(id as i32),
    }
}

/// The entries a scan reports, candidates included. The portable scan reports
/// exactly what the one `scan` dispatched to does (the AVX2 one, on a CPU with it).
fn scan_raw(t: &StartTree, qs: i64, qe: i64, wo: bool) -> Vec<NodeId> {
    let mut got = Vec::new();
    t.scan(qs, qe, wo, &mut SearchCost::default(), &mut |e| {
        assert_eq!(e.tag(), tag(e.id()), "the tag of {}", e.id());
        got.push(e.id())
    });
    let mut portable = Vec::new();
    if t.root != NO_NODE {
        let q = Query {
            qs,
            qe,
            writes_only: wo,
        };
        // SAFETY: the portable body needs nothing of the CPU.
        unsafe {
            t.scan_base(t.root, t.height, q, &mut SearchCost::default(), &mut |e| {
                portable.push(e.id())
            })
        };
    }
    assert_eq!(got, portable, "portable scan [{qs}, {qe}] writes {wo}");
    got
}

/// The entries a scan reports, less those `f` finds not to overlap (by `ends`).
fn scan_all(t: &StartTree, qs: i64, qe: i64, wo: bool, ends: &BTreeMap<NodeId, i64>) -> Vec<NodeId> {
    let mut got = scan_raw(t, qs, qe, wo);
    got.retain(|id| ends[id] >= qs);
    got
}

#[test]
fn matches_a_sorted_set_through_growth_and_shrinkage() {
    let mut t = StartTree::default();
    let mut model: BTreeMap<(i64, NodeId), (i64, bool)> = BTreeMap::new();
    let mut x = 0x2545F4914F6CDD1Du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut next_id: NodeId = 0;
    let cost = &mut SearchCost::default();
    for phase in 0..8u64 {
        let target = [3000, 0, 500, 2000, 10, 4000, 0, 100][phase as usize];
        let mut steps = 0;
        while model.len() != target && steps < 20_000 {
            steps += 1;
            let grow = model.len() < target;
            if grow {
                let start = match phase % 3 {
                    _ if rnd() % 200 == 0 => i64::MAX - (rnd() % 3) as i64,
                    // Evenly spaced runs (guessed) as well as irregular keys.
                    0 => 2 * next_id as i64,
                    1 => 1_000_000 - 3 * next_id as i64,
                    _ => (rnd() % 5000) as i64,
                };
                let end = if rnd() % 100 == 0 {
                    i64::MAX // to the end of the file
                } else {
                    start.saturating_add((rnd() % 4) as i64 * if rnd() % 50 == 0 { 1000 } else { 1 })
                };
                let write = rnd() % 3 != 0;
                t.insert(start, end, next_id, write, tag(next_id), cost);
                model.insert((start, next_id), (end, write));
                next_id += 1;
            } else {
                let k = (rnd() % model.len() as u64) as usize;
                let key = *model.keys().nth(k).unwrap();
                t.remove(key.0, key.1, cost);
                model.remove(&key);
            }
            if steps % 97 == 0 || model.len() == target {
                let all = t.check();
                let want: Vec<_> = model
                    .iter()
                    .map(|(&(s, id), &(e, wr))| (s, e, id, wr, tag(id)))
                    .collect();
                assert_eq!(all, want, "phase {phase} step {steps}");
                for _ in 0..4 {
                    let qs = (rnd() % 6000) as i64;
                    let qe = match rnd() % 10 {
                        0 => i64::MAX,
                        1 => qs,
                        _ => qs + (rnd() % 20) as i64,
                    };
                    let wo = rnd() % 2 == 0;
                    let want: Vec<NodeId> = model
                        .iter()
                        .filter(|(&(s, _), &(e, wr))| s <= qe && e >= qs && (!wo || wr))
                        .map(|(&(_, id), _)| id)
                        .collect();
                    let ends = model.iter().map(|(&(_, id), &(e, _))| (id, e)).collect();
                    assert_eq!(
                        scan_all(&t, qs, qe, wo, &ends),
                        want,
                        "scan [{qs}, {qe}] writes {wo}"
                    );
                }
            }
        }
        assert_eq!(model.len(), target);
    }
    assert!(t.height <= 3);
}

#[test]
fn an_ascending_run_fills_its_leaves() {
    let mut t = StartTree::default();
    let cost = &mut SearchCost::default();
    for i in 0..10_000u32 {
        t.insert(2 * i as i64, 2 * i as i64, i, true, tag(i), cost);
    }
    t.check();
    let per = t.memory() as f64 / 10_000.0;
    // 448-byte leaves 14/15 full, an eighth of spare capacity, the branches: 37.8.
    assert!(per < 39.0, "{per} bytes per entry");
    let live = t.leaves.len() - t.free_leaves.len();
    assert_eq!(live, 10_000usize.div_ceil(14), "leaves of 14");
    assert_eq!(t.height, 2, "three levels: 29^2 leaves of 14 > 10,000");
}

/// Evenly spaced starts (lockmany's, a table of fixed-size records) are guessed
/// exactly at every node: the count is never needed. Irregular ones are not guessed.
#[test]
fn evenly_spaced_starts_are_guessed_exactly() {
    // Up to 16,000 bytes apart (a leaf guesses below 2^14): the root's separators
    // are then 406 steps (29 leaves of 14) apart, below 2^24.
    for step in [2i64, 3, 4096, 16_000] {
        let mut t = StartTree::default();
        let cost = &mut SearchCost::default();
        for i in 0..10_000u32 {
            t.insert(step * i as i64, step * i as i64, i, true, tag(i), cost);
        }
        for q in (0..10_000 * step)
            .step_by(step as usize / 2 + 1)
            .chain([i64::MAX - 1])
        {
            let (mut b, mut h) = (t.root, t.height);
            while h > 0 {
                let br = &t.branches[b as usize];
                assert_ne!(br.inv, NO_GUESS, "branch at height {h}");
                let i = br.find_le(q);
                assert_eq!(br.guess(q), i, "branch guess for {q}, step {step}");
                b = br.child[i];
                h -= 1;
            }
            let l = &t.leaves[b as usize];
            assert_ne!(l.inv, LEAF_NO_GUESS, "leaf");
            assert_eq!(l.guess(q) + 1, l.count_le(q), "leaf guess for {q}, step {step}");
        }
    }
    // A leaf of one-byte write locks at `starts`, inserted in order.
    let leaf = |starts: &[i64]| {
        let mut l = EMPTY_LEAF;
        for (k, &s) in starts.iter().enumerate() {
            let id = k as NodeId;
            l.insert(
                k,
                Item::Leaf {
                    start: s,
                    end: s,
                    id,
                    write: true,
                    tag: tag(id),
                },
            );
        }
        l
    };
    let mut l = leaf(&[0, 2, 4, 7]);
    assert_eq!(l.inv, LEAF_NO_GUESS, "irregular starts");
    l.remove(3);
    assert_ne!(l.inv, LEAF_NO_GUESS, "0, 2, 4");
    assert_eq!((l.guess(0), l.guess(1), l.guess(2), l.guess(5)), (0, 0, 1, 2));
    let mut br = EMPTY_BRANCH;
    for (i, sep) in [(i64::MIN, 0), (100, 0)].into_iter().enumerate() {
        let (max_end, max_wend, child) = (0, 0, i as TreeNodeId);
        br.insert(
            i,
            Item::Branch {
                sep,
                max_end,
                max_wend,
                child,
            },
        );
    }
    let g: Vec<usize> = [0, 99, 100, 101, i64::MAX].iter().map(|&x| br.guess(x)).collect();
    assert_eq!(g, [0, 0, 1, 1, 1], "one separator");
    let l = leaf(&[0, 1 << 14, 2 << 14]);
    assert_eq!(l.inv, LEAF_NO_GUESS, "2^14 apart: too far for 32 bits");
}

/// The same tree with every slope cleared: every step counts.
fn counted(t: &StartTree) -> StartTree {
    let mut c = StartTree {
        leaves: t.leaves.clone(),
        branches: t.branches.clone(),
        root: t.root,
        height: t.height,
        ..StartTree::default()
    };
    c.leaves.iter_mut().for_each(|l| l.inv = LEAF_NO_GUESS);
    c.branches.iter_mut().for_each(|b| b.inv = NO_GUESS);
    c
}

/// What a scan reports, candidates included: dispatched (AVX2 where the CPU has
/// it), portable, and counted (`c`, every slope cleared) give the same entries in
/// the same order.
fn reported(t: &StartTree, c: &StartTree, qs: i64, qe: i64, wo: bool) -> Vec<NodeId> {
    let ways = [t, c].map(|t| scan_raw(t, qs, qe, wo));
    assert_eq!(
        ways[0], ways[1],
        "guessed vs counted scan [{qs}, {qe}] writes {wo}"
    );
    let [got, _] = ways;
    got
}

/// Down the path of bound `x` (the counted one), every node with a slope guesses
/// `x`'s place exactly once `x` is at or above where it counts from (a branch's
/// base, a leaf's first start): the slope's error bound holds for every step the
/// node takes.
fn guesses_exact(t: &StartTree, x: i64) {
    if t.root == NO_NODE {
        return;
    }
    let (mut b, mut h) = (t.root, t.height);
    while h > 0 {
        let br = &t.branches[b as usize];
        let i = br.find_le(x);
        if br.inv != NO_GUESS && x >= br.base {
            assert_eq!(br.guess(x), i, "branch guess for {x}: {br:?}");
        }
        b = br.child[i];
        h -= 1;
    }
    let l = &t.leaves[b as usize];
    if l.inv != LEAF_NO_GUESS && x >= l.start[0] {
        assert_eq!(l.guess(x) + 1, l.count_le(x), "leaf guess for {x}: {l:?}");
    }
}

/// The model's entries as (start, id) -> (end, write).
type Model = BTreeMap<(i64, NodeId), (i64, bool)>;

/// Checks `t` against `model` and scans it at `probes` (each with qs ≤ qe), read and
/// write, guessed against counted, against the model.
fn check_scans(t: &StartTree, model: &Model, probes: &[(i64, i64)]) {
    let all = t.check();
    let want: Vec<_> = model
        .iter()
        .map(|(&(s, id), &(e, wr))| (s, e, id, wr, tag(id)))
        .collect();
    assert_eq!(all, want);
    for &(_, qe) in probes {
        guesses_exact(t, qe);
    }
    let c = counted(t);
    let ends: BTreeMap<NodeId, i64> = model.iter().map(|(&(_, id), &(e, _))| (id, e)).collect();
    for &(qs, qe) in probes {
        for wo in [false, true] {
            let mut got = reported(t, &c, qs, qe, wo);
            got.retain(|id| ends[id] >= qs);
            let want: Vec<NodeId> = model
                .iter()
                .filter(|(&(s, _), &(e, wr))| s <= qe && e >= qs && (!wo || wr))
                .map(|(&(_, id), _)| id)
                .collect();
            assert_eq!(got, want, "scan [{qs}, {qe}] writes {wo}");
        }
    }
}

/// Probes around some of the evenly spaced keys `base + i·step`, `i < n` (the first
/// and last 24, and 16 between), and `extra`: on a key, one byte either side, the
/// last byte before the next, a whole step, several steps, to the end of the file,
/// and the greatest offset.
fn probes_around(base: i64, step: i64, n: i64, extra: &[i64]) -> Vec<(i64, i64)> {
    let mut keys: Vec<i64> = (0..n)
        .filter(|&i| i < 24 || i >= n - 24 || i % (n / 16 + 1) == 0)
        .map(|i| base + i * step)
        .collect();
    keys.extend_from_slice(extra);
    let mut p = vec![
        (0, 0),
        (0, i64::MAX),
        (i64::MAX, i64::MAX),
        (i64::MAX - 1, i64::MAX - 1),
    ];
    for k in keys {
        for (a, b) in [
            (0, 0),
            (-1, -1),
            (1, 1),
            (0, step - 1),
            (1, step - 1),
            (step - 1, step - 1),
            (-1, step),
            (0, step),
            (0, step.saturating_mul(3)),
            (1, step.saturating_mul(2).saturating_add(1)),
        ] {
            let qs = k.saturating_add(a).max(0);
            let qe = k.saturating_add(b).max(qs);
            p.push((qs, qe));
        }
        p.push((k, i64::MAX));
    }
    p
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..Default::default()
    })]

    /// Evenly spaced keys of every spacing the guess takes and just past it (2^14 in
    /// a leaf; 2^24 in a branch, whose separators are 13 leaf entries apart in an
    /// ascending run), from 0 or ending at the greatest offset, inserted in any
    /// order; then changes of one lock (removals, a key one byte off, a key twice):
    /// the tree checks out (the slopes recomputed), and every scan gives the model's
    /// entries, guessed or counted, portable or AVX2.
    #[test]
    fn evenly_spaced_keys_scan_as_counted(
        step in proptest::prop_oneof![
            2i64..40,
            proptest::sample::select(vec![
                (1i64 << 14) - 1, 1 << 14, (1 << 14) + 1,
                (1 << 15) - 1, 1_290_555, 1_290_556, (1 << 24) / 31, (1 << 24) / 31 + 1,
                (1 << 24) - 1, 1 << 24, 1 << 30, 1 << 40, 1 << 61, 1 << 62,
            ]),
            2i64..(1 << 25),
        ],
        n in proptest::prop_oneof![3 => 1i64..40, 1 => 400i64..460],
        at_end in proptest::bool::ANY,
        slack in 0i64..3,
        order in 0u8..3,
        lens in proptest::collection::vec(proptest::sample::select(vec![1i64, 1, 1, 2, 0, -1, -2, i64::MAX]), 1..8),
        changes in proptest::collection::vec((0u8..5, proptest::num::u64::ANY), 0..6),
    ) {
        let n = n.min((i64::MAX - slack) / step + 1);
        // The last key at the greatest offset (less `slack`), or the first at `slack`.
        let base = if at_end { i64::MAX - slack - (n - 1) * step } else { slack };
        let mut t = StartTree::default();
        let mut model = Model::new();
        let cost = &mut SearchCost::default();
        let mut idx: Vec<i64> = (0..n).collect();
        match order {
            0 => {}
            1 => idx.reverse(),
            _ => {
                let mut x = 0x9E3779B97F4A7C15u64 ^ n as u64;
                for i in (1..idx.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    idx.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
        }
        let mut next_id: NodeId = 0;
        let mut add = |t: &mut StartTree, model: &mut Model, start: i64, len: i64| {
            // len 0: one byte short of the next key; -1/-2: reaching it, or past it
            // (spilling); MAX: to the end of the file.
            let end = match len {
                0 => start.saturating_add(step - 1),
                -1 => start.saturating_add(step),
                -2 => start.saturating_add(step.saturating_mul(2).saturating_add(1)),
                l => start.saturating_add(l - 1),
            };
            let write = next_id % 3 != 1;
            t.insert(start, end, next_id, write, tag(next_id), cost);
            model.insert((start, next_id), (end, write));
            next_id += 1;
        };
        for (j, &i) in idx.iter().enumerate() {
            add(&mut t, &mut model, base + i * step, lens[j % lens.len()]);
        }
        let probe = probes_around(base, step, n, &[]);
        check_scans(&t, &model, &probe);
        let mut extra = Vec::new();
        for (what, r) in changes {
            let keys: Vec<(i64, NodeId)> = model.keys().copied().collect();
            let (s, id) = keys[(r % keys.len() as u64) as usize];
            match what {
                0 | 1 => {
                    t.remove(s, id, &mut SearchCost::default());
                    model.remove(&(s, id));
                }
                2 => add(&mut t, &mut model, s.saturating_add(1), 1),
                3 => add(&mut t, &mut model, s, 1),
                _ => add(&mut t, &mut model, (s - 1).max(0), 2),
            }
            extra.push(s);
            if model.is_empty() {
                break;
            }
        }
        check_scans(&t, &model, &probes_around(base, step, n, &extra));
    }

    /// The guess's check alone decides: with every node's slope and base replaced by
    /// arbitrary values (wrong, off by one, huge, zero), every scan still reports
    /// exactly what the counted descent does.
    #[test]
    fn any_slope_is_caught_by_the_check(
        step in proptest::prop_oneof![2i64..9, proptest::strategy::Just(1i64 << 14), proptest::strategy::Just(1i64 << 40)],
        n in proptest::prop_oneof![2i64..30, 390i64..440],
        at_end in proptest::bool::ANY,
        forge in proptest::collection::vec((0u8..6, proptest::num::u64::ANY), 1..64),
        qs in proptest::collection::vec((0i64..500, 0i64..40), 1..20),
    ) {
        let n = n.min(i64::MAX / step);
        let base = if at_end { i64::MAX - (n - 1) * step } else { 0 };
        let mut t = StartTree::default();
        let cost = &mut SearchCost::default();
        for i in 0..n {
            let s = base + i * step;
            let end = if i % 7 == 3 { s.saturating_add(step) } else { s };
            t.insert(s, end, i as NodeId, i % 2 == 0, tag(i as NodeId), cost);
        }
        let c = counted(&t);
        let mut f = counted(&t);
        let mut it = forge.iter().cycle();
        let mut value = |good: u64| {
            let &(how, r) = it.next().unwrap();
            match how {
                0 => good,
                1 => good.wrapping_add(1 + r % 3),
                2 => good.wrapping_sub(1 + r % 3),
                3 => r,
                4 => 0,
                _ => u64::MAX - 1 - r % 3,
            }
        };
        for (l, g) in f.leaves.iter_mut().zip(&t.leaves) {
            l.inv = value(g.inv as u64) as u32;
        }
        for (b, g) in f.branches.iter_mut().zip(&t.branches) {
            b.inv = value(g.inv);
            b.base = value(g.base as u64) as i64;
        }
        for &(k, d) in &qs {
            let k = (k * n / 500).min(n - 1);
            let s = base + k * step;
            for (a, b) in [(0, d), (d, d), (-d, 0), (1, step - 1), (0, i64::MAX)] {
                let lo = s.saturating_add(a).max(0);
                let hi = s.saturating_add(b).max(lo);
                for wo in [false, true] {
                    let want = reported(&t, &c, lo, hi, wo);
                    let got = reported(&f, &c, lo, hi, wo);
                    proptest::prop_assert_eq!(got, want, "forged scan [{}, {}] writes {}", lo, hi, wo);
                }
            }
        }
    }
}
