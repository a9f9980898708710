//! The by-owner half of the index: each owner's own AVL tree by (`start`, id), threaded
//! through the records of the inode's arena (their [`IndexLinks`]).

use super::*;

/// An AVL tree threaded through the records: how it reaches a record's links, height
/// and key (generic so the balancing code reads apart from the by-owner fields).
pub(super) trait ThreadedAvl {
    fn kids(ix: &IndexLinks) -> [NodeId; 2];
    fn set_kids(ix: &mut IndexLinks, k: [NodeId; 2]);
    fn height(ix: &IndexLinks) -> u8;
    fn set_height(ix: &mut IndexLinks, h: u8);
    /// Whether `a`'s key is below `b`'s.
    fn less(ar: &Arena, a: NodeId, b: NodeId) -> bool;
}

/// The by-owner tree: each owner's records by (`start`, id).
pub(super) struct ByOwner;

/// The key of a record in its owner's tree (all of one owner's records).
pub(super) fn owner_key(fl: &FileLock, id: NodeId) -> (i64, NodeId) {
    (fl.start, id)
}

impl ThreadedAvl for ByOwner {
    #[inline]
    fn kids(ix: &IndexLinks) -> [NodeId; 2] {
        ix.by_owner
    }
    #[inline]
    fn set_kids(ix: &mut IndexLinks, k: [NodeId; 2]) {
        ix.by_owner = k;
    }
    #[inline]
    fn height(ix: &IndexLinks) -> u8 {
        ix.h_owner
    }
    #[inline]
    fn set_height(ix: &mut IndexLinks, h: u8) {
        ix.h_owner = h;
    }
    #[inline]
    fn less(ar: &Arena, a: NodeId, b: NodeId) -> bool {
        owner_key(&ar.node(a).fl, a) < owner_key(&ar.node(b).fl, b)
    }
}

// Called at every level of an insert or removal: a call each costs ~3% of a lock
// set+unset at 10,000 held locks.
#[inline(always)]
fn height<S: ThreadedAvl>(ar: &Arena, t: NodeId) -> i32 {
    if t == NIL {
        0
    } else {
        S::height(&ar.node(t).ix) as i32
    }
}

/// Recomputes `t`'s height and augmentation from its children.
#[inline(always)]
fn update<S: ThreadedAvl>(ar: &mut Arena, t: NodeId) {
    let [l, r] = S::kids(&ar.node(t).ix);
    let h = 1 + height::<S>(ar, l).max(height::<S>(ar, r));
    S::set_height(&mut ar.node_mut(t).ix, h as u8);
}

fn rotate<S: ThreadedAvl>(ar: &mut Arena, t: NodeId, dir: usize) -> NodeId {
    // dir 1: rotate right (the left child rises); dir 0: rotate left.
    let up_side = 1 - dir;
    let mut tk = S::kids(&ar.node(t).ix);
    let u = tk[up_side];
    let mut uk = S::kids(&ar.node(u).ix);
    tk[up_side] = uk[dir];
    uk[dir] = t;
    S::set_kids(&mut ar.node_mut(t).ix, tk);
    S::set_kids(&mut ar.node_mut(u).ix, uk);
    update::<S>(ar, t);
    update::<S>(ar, u);
    u
}

fn rebalance<S: ThreadedAvl>(ar: &mut Arena, t: NodeId) -> NodeId {
    update::<S>(ar, t);
    let [l, r] = S::kids(&ar.node(t).ix);
    let bf = height::<S>(ar, l) - height::<S>(ar, r);
    if bf > 1 {
        let [ll, lr] = S::kids(&ar.node(l).ix);
        if height::<S>(ar, ll) < height::<S>(ar, lr) {
            let nl = rotate::<S>(ar, l, 0);
            let mut k = S::kids(&ar.node(t).ix);
            k[0] = nl;
            S::set_kids(&mut ar.node_mut(t).ix, k);
        }
        return rotate::<S>(ar, t, 1);
    }
    if bf < -1 {
        let [rl, rr] = S::kids(&ar.node(r).ix);
        if height::<S>(ar, rr) < height::<S>(ar, rl) {
            let nr = rotate::<S>(ar, r, 1);
            let mut k = S::kids(&ar.node(t).ix);
            k[1] = nr;
            S::set_kids(&mut ar.node_mut(t).ix, k);
        }
        return rotate::<S>(ar, t, 0);
    }
    t
}

#[inline]
fn set_kid<S: ThreadedAvl>(ar: &mut Arena, t: NodeId, side: usize, k: NodeId) {
    let mut kids = S::kids(&ar.node(t).ix);
    kids[side] = k;
    S::set_kids(&mut ar.node_mut(t).ix, kids);
}

/// Rebalances `t` after a change below it: (new subtree root, whether the subtree's
/// root or height changed). When nothing changed, the ancestors need no update either,
/// so the walk back up stops there.
#[inline]
fn fix<S: ThreadedAvl>(ar: &mut Arena, t: NodeId) -> (NodeId, bool) {
    let before = S::height(&ar.node(t).ix);
    let r = rebalance::<S>(ar, t);
    (r, r != t || S::height(&ar.node(r).ix) != before)
}

pub(super) fn insert<S: ThreadedAvl>(
    ar: &mut Arena,
    t: NodeId,
    id: NodeId,
    cost: &mut SearchCost,
) -> (NodeId, bool) {
    if t == NIL {
        S::set_kids(&mut ar.node_mut(id).ix, [NIL; 2]);
        update::<S>(ar, id);
        return (id, true);
    }
    cost.nodes += 1;
    let side = if S::less(ar, id, t) { 0 } else { 1 };
    let k = S::kids(&ar.node(t).ix)[side];
    let (nk, changed) = insert::<S>(ar, k, id, cost);
    if !changed {
        return (t, false);
    }
    set_kid::<S>(ar, t, side, nk);
    fix::<S>(ar, t)
}

/// Takes the least node out of subtree `t`: (new subtree root, whether it changed as in
/// [`fix`], the node).
fn remove_min<S: ThreadedAvl>(ar: &mut Arena, t: NodeId, cost: &mut SearchCost) -> (NodeId, bool, NodeId) {
    cost.nodes += 1;
    let [l, r] = S::kids(&ar.node(t).ix);
    if l == NIL {
        return (r, true, t);
    }
    let (nl, changed, m) = remove_min::<S>(ar, l, cost);
    if !changed {
        return (t, false, m);
    }
    set_kid::<S>(ar, t, 0, nl);
    let (nt, changed) = fix::<S>(ar, t);
    (nt, changed, m)
}

pub(super) fn remove<S: ThreadedAvl>(
    ar: &mut Arena,
    t: NodeId,
    id: NodeId,
    cost: &mut SearchCost,
) -> (NodeId, bool) {
    assert!(t != NIL, "record {id} is not in the index");
    cost.nodes += 1;
    if t == id {
        let [l, r] = S::kids(&ar.node(t).ix);
        S::set_kids(&mut ar.node_mut(t).ix, [NIL; 2]);
        if l == NIL {
            return (r, true);
        }
        if r == NIL {
            return (l, true);
        }
        let (nr, _, m) = remove_min::<S>(ar, r, cost);
        S::set_kids(&mut ar.node_mut(m).ix, [l, nr]);
        return (rebalance::<S>(ar, m), true);
    }
    let side = if S::less(ar, id, t) { 0 } else { 1 };
    let k = S::kids(&ar.node(t).ix)[side];
    let (nk, changed) = remove::<S>(ar, k, id, cost);
    if !changed {
        return (t, false);
    }
    set_kid::<S>(ar, t, side, nk);
    fix::<S>(ar, t)
}
