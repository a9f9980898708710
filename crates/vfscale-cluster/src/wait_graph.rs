//! The wait-for graph's cycle search, as both directories answer `publish_waits`: the
//! path from a new edge's blocker back to its waiter, no longer than Linux's deadlock
//! detector walks.

use std::collections::HashMap;

use crate::{PublishedEdge, WaitCycle, WaitEdge};

/// For each edge of `new` that closes a cycle in `graph`, the cycle: the path from the
/// edge's blocker back to its waiter.
pub(crate) fn find_cycles(graph: &[PublishedEdge], new: &[WaitEdge]) -> Vec<WaitCycle> {
    let mut out: HashMap<u64, Vec<&PublishedEdge>> = HashMap::new();
    for e in graph {
        out.entry(e.edge.waiter).or_default().push(e);
    }
    new.iter()
        .filter_map(|&closing| {
            let path = path_between(&out, closing.blocker, closing.waiter)?;
            Some(WaitCycle {
                closing,
                path: path.into_iter().cloned().collect(),
            })
        })
        .collect()
}

/// How many edges a cycle's walk may follow from the closing edge's blocker back to its
/// waiter: Linux's deadlock detector gives up after `MAX_DEADLK_ITERATIONS` + 1 hops and
/// lets the request wait, so a longer cycle is not reported here either.
const MAX_HOPS: usize = vfscale_locks::MAX_DEADLK_ITERATIONS + 1;

/// The shortest path of edges from `from` to `to` (breadth first), if it has at most
/// [`MAX_HOPS`] edges.
fn path_between<'g>(
    out: &HashMap<u64, Vec<&'g PublishedEdge>>,
    from: u64,
    to: u64,
) -> Option<Vec<&'g PublishedEdge>> {
    // Each owner reached, with the edge it was reached by (none for `from`).
    let mut via: HashMap<u64, Option<&'g PublishedEdge>> = HashMap::from([(from, None)]);
    let mut level = vec![from];
    for _ in 0..MAX_HOPS {
        let mut next = Vec::new();
        for owner in level {
            for &e in out.get(&owner).map_or(&[][..], Vec::as_slice) {
                let b = e.edge.blocker;
                if via.contains_key(&b) {
                    continue;
                }
                via.insert(b, Some(e));
                if b == to {
                    let mut path = vec![e];
                    let mut at = e.edge.waiter;
                    while let Some(Some(p)) = via.get(&at) {
                        path.push(p);
                        at = p.edge.waiter;
                    }
                    path.reverse();
                    return Some(path);
                }
                next.push(b);
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pe(waiter: u64, blocker: u64, node: &str) -> PublishedEdge {
        PublishedEdge {
            edge: WaitEdge { waiter, blocker },
            node: node.into(),
        }
    }

    #[test]
    fn a_closing_edge_gets_the_path_back_to_its_waiter() {
        // 1 -> 2 (a), 2 -> 3 (b), 3 -> 9 (b, a dead end tried first), 3 -> 1 closes.
        let graph = vec![pe(1, 2, "a"), pe(2, 4, "b"), pe(2, 3, "b"), pe(4, 9, "a")];
        let closing = WaitEdge {
            waiter: 3,
            blocker: 1,
        };
        let cycles = find_cycles(&graph, &[closing]);
        assert_eq!(
            cycles,
            vec![WaitCycle {
                closing,
                path: vec![pe(1, 2, "a"), pe(2, 3, "b")]
            }]
        );
        assert!(find_cycles(
            &graph,
            &[WaitEdge {
                waiter: 9,
                blocker: 5
            }]
        )
        .is_empty());
    }

    #[test]
    fn a_cycle_longer_than_linux_walks_is_not_reported() {
        // The closing edge 0 -> 1, then 1 -> 2 -> ... -> n -> 0: n edges back to 0.
        let chain = |n: u64| {
            (1..=n)
                .map(|i| pe(i, if i == n { 0 } else { i + 1 }, "a"))
                .collect::<Vec<_>>()
        };
        let closing = WaitEdge {
            waiter: 0,
            blocker: 1,
        };
        assert_eq!(
            find_cycles(&chain(MAX_HOPS as u64), &[closing])[0].path.len(),
            MAX_HOPS
        );
        assert!(find_cycles(&chain(MAX_HOPS as u64 + 1), &[closing]).is_empty());
    }

    #[test]
    fn loops_that_do_not_reach_the_waiter_end() {
        let graph = vec![pe(1, 2, "a"), pe(2, 1, "b")];
        assert!(find_cycles(
            &graph,
            &[WaitEdge {
                waiter: 7,
                blocker: 1
            }]
        )
        .is_empty());
    }
}
