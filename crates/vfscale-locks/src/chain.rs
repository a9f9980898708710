//! A skip pointer over a uniform chain of blocked requests, so that seed 003's herd
//! blocks in O(1) (amortized) where `__locks_insert_block`'s descent walks every waiter.
//!
//! In the herd every contender asks for the same whole-file write lock, so every
//! waiter conflicts with every other and the wait tree is one chain. A **run** is a
//! stretch `top → … → tail` of that chain where each request is the only child of the
//! one before it and all have the same kind, type and range (the *template*). For a new
//! request `fl` and a member `m`, `family_conflict(m, fl)` is then "the template clashes
//! with `fl`" and "`m`'s conflict identity (its owner; for flock its open file) is not
//! `fl`'s". So when the descent reaches a member it conflicts with and `fl`'s identity is
//! none of the run's (kept as a count per identity), it conflicts with every member below
//! as well: the plain walk would go down to `tail`, the only child each time. The
//! descent jumps there and goes on as before, and the tree it builds is exactly the
//! plain walk's (same parent, same child order); debug builds and the crate's tests run
//! the plain walk beside it and compare.
//!
//! One run is tracked per inode. The plain walk builds it from the chain it descended
//! (at no more cost than the walk); a request hung under the tail as its only child
//! with the template extends it; the top leaving (granted, re-blocked or detached from
//! its waiters) shortens it from the top; any other change to a member's links drops
//! the run (the next plain walk builds it again). `flc_lock` protects it, like the tree.

use std::collections::HashMap;

use crate::context::{Arena, NodeId};
use crate::lock::{FileLock, LockKind, OwnerKey};
use crate::LockType;

/// What decides whether two requests conflict, apart from who owns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Template {
    kind: LockKind,
    ty: LockType,
    start: i64,
    end: i64,
}

impl Template {
    fn of(fl: &FileLock) -> Template {
        Template {
            kind: fl.kind,
            ty: fl.ty,
            start: fl.start,
            end: fl.end,
        }
    }

    /// The identity `family_conflict(member, fl)` compares, for a member of this
    /// template: the open file for flock, else the owner.
    fn ident(&self, fl: &FileLock) -> OwnerKey {
        if self.kind == LockKind::Flock {
            OwnerKey::File(fl.file)
        } else {
            fl.owner
        }
    }
}

#[derive(Debug)]
struct Run {
    top: NodeId,
    tail: NodeId,
    tmpl: Template,
    /// Member → the member below it (`NIL`-free: the tail has no entry value used).
    members: HashMap<NodeId, ()>,
    /// Conflict identity → members with it.
    idents: HashMap<OwnerKey, u32>,
}

/// The tracked run of one inode (see the module header).
#[derive(Debug, Default)]
pub(crate) struct Chain {
    run: Option<Run>,
}

impl Chain {
    fn member(&self, id: NodeId) -> bool {
        self.run.as_ref().is_some_and(|r| r.members.contains_key(&id))
    }

    fn drop_run(&mut self) {
        self.run = None;
    }

    /// The descent stands at `c`, a child it conflicts with: where the plain walk would
    /// be after going down through every run member below `c` (the tail), if `c` is a
    /// member and `fl`'s identity is none of the run's.
    pub fn jump(&self, c: NodeId, fl: &FileLock) -> Option<NodeId> {
        let r = self.run.as_ref()?;
        if !r.members.contains_key(&c) || r.idents.contains_key(&r.tmpl.ident(fl)) {
            return None;
        }
        Some(r.tail)
    }

    /// `readopt`'s re-check stands at `n`, a request that stays where it is and conflicts
    /// with every record of `above`: the run's tail, if `n` is the run's top and every
    /// member below it would stay too, so the re-check can go on from the tail's children.
    /// For a member `d`, `family_conflict(d, a)` is "the template clashes with `a`" (shown
    /// by `n`, a member that conflicts with `a`) and "`d`'s identity is not `a`'s": so
    /// every member conflicts with all of `above` iff no member has the identity of a
    /// record of `above`. Only when no retry would run a deadlock check (flock, OFD): a
    /// process-owned POSIX retry also asks the blocked hash, per owner.
    pub fn skip_recheck(&self, n: NodeId, above: &[NodeId], ar: &Arena) -> Option<NodeId> {
        let r = self.run.as_ref()?;
        if r.top != n || r.tail == n || r.tmpl.kind == LockKind::Posix {
            return None;
        }
        if above
            .iter()
            .any(|&a| r.idents.contains_key(&r.tmpl.ident(&ar.node(a).fl)))
        {
            return None;
        }
        Some(r.tail)
    }

    /// After a plain descent through `path` (the requests it went down into, root
    /// excluded): with no run tracked, the longest uniform stretch ending at the last
    /// one becomes the run.
    pub fn build(&mut self, path: &[NodeId], ar: &Arena) {
        if self.run.is_some() || path.len() < 2 {
            return;
        }
        let last = *path.last().expect("non-empty");
        let ln = ar.node(last);
        if ln.waiter().is_none() {
            return;
        }
        let tmpl = Template::of(&ln.fl);
        let mut run = Run {
            top: last,
            tail: last,
            tmpl,
            members: HashMap::new(),
            idents: HashMap::new(),
        };
        run.members.insert(last, ());
        *run.idents.entry(tmpl.ident(&ln.fl)).or_default() += 1;
        for &p in path[..path.len() - 1].iter().rev() {
            let n = ar.node(p);
            if n.waiter().is_none() || n.children().len() != 1 || Template::of(&n.fl) != tmpl {
                break;
            }
            run.members.insert(p, ());
            *run.idents.entry(tmpl.ident(&n.fl)).or_default() += 1;
            run.top = p;
        }
        if run.members.len() >= 2 {
            self.run = Some(run);
        }
    }

    /// Request `wid` (with lock `fl`) is about to hang under `b`, which had children
    /// already if `b_busy`.
    pub fn on_link(&mut self, b: NodeId, b_busy: bool, wid: NodeId, fl: &FileLock) {
        let Some(r) = self.run.as_mut() else { return };
        if b == r.tail {
            if !b_busy && Template::of(fl) == r.tmpl && !r.members.contains_key(&wid) {
                r.members.insert(wid, ());
                *r.idents.entry(r.tmpl.ident(fl)).or_default() += 1;
                r.tail = wid;
            }
        } else if r.members.contains_key(&b) || (r.members.contains_key(&wid) && wid != r.top) {
            self.drop_run();
        }
    }

    /// Request `c` loses its blocker (its blocker's list is handled by the caller).
    pub fn on_detach(&mut self, c: NodeId) {
        if self.member(c) && self.run.as_ref().is_some_and(|r| r.top != c) {
            self.drop_run();
        }
    }

    /// Request `c` leaves its blocker's list and loses its blocker.
    pub fn on_unlink(&mut self, c: NodeId) {
        self.on_detach(c);
    }

    /// `n` loses its children (`children`, before the change).
    pub fn on_take_children(&mut self, n: NodeId, children: &[NodeId], ar: &Arena) {
        let Some(r) = self.run.as_ref() else { return };
        if !r.members.contains_key(&n) || n == r.tail {
            return;
        }
        if n == r.top {
            self.pop_top(children.first().copied(), ar);
        } else {
            self.drop_run();
        }
    }

    /// Request `id` becomes a granted lock (its children, if any, stay).
    pub fn on_grant(&mut self, id: NodeId, ar: &Arena) {
        let Some(r) = self.run.as_ref() else { return };
        if !r.members.contains_key(&id) {
            return;
        }
        if id == r.top {
            let next = ar.node(id).children().first().copied();
            self.pop_top(next, ar);
        } else {
            self.drop_run();
        }
    }

    /// Record `id` is freed.
    pub fn on_release(&mut self, id: NodeId) {
        if self.member(id) {
            self.drop_run();
        }
    }

    /// The top leaves the run; `next` was its only child.
    fn pop_top(&mut self, next: Option<NodeId>, ar: &Arena) {
        let Some(r) = self.run.as_mut() else { return };
        let top = r.top;
        r.members.remove(&top);
        let k = r.tmpl.ident(&ar.node(top).fl);
        match r.idents.get_mut(&k) {
            Some(c) if *c > 1 => *c -= 1,
            _ => {
                r.idents.remove(&k);
            }
        }
        match next {
            Some(n) if top != r.tail && r.members.contains_key(&n) => r.top = n,
            _ => self.drop_run(),
        }
        if self.run.as_ref().is_some_and(|r| r.members.len() < 2) {
            self.drop_run();
        }
    }

    /// Checks the run against the tree: `top → … → tail` each the only child of the one
    /// before, all of the template, members and identity counts exact.
    #[cfg(any(debug_assertions, test))]
    pub fn check(&self, ar: &Arena) {
        let Some(r) = self.run.as_ref() else { return };
        let mut cur = r.top;
        let mut seen = 0usize;
        let mut idents: HashMap<OwnerKey, u32> = HashMap::new();
        loop {
            let n = ar.node(cur);
            assert!(n.waiter().is_some(), "run member {cur} is a request");
            assert_eq!(Template::of(&n.fl), r.tmpl, "run member {cur} has the template");
            assert!(r.members.contains_key(&cur), "{cur} is listed");
            *idents.entry(r.tmpl.ident(&n.fl)).or_default() += 1;
            seen += 1;
            if cur == r.tail {
                break;
            }
            assert_eq!(n.children().len(), 1, "run member {cur} has one child");
            let c = n.children()[0];
            assert_eq!(ar.node(c).blocker(), Some(cur));
            cur = c;
        }
        assert_eq!(seen, r.members.len(), "members");
        assert_eq!(idents, r.idents, "identity counts");
    }
}

#[cfg(test)]
mod tests {
    //! Every block in these tests also runs the plain walk and checks the run against
    //! the tree (`insert_block` under `cfg(test)`), so a jump that lands anywhere else,
    //! or a run that no longer matches the tree, fails them.

    use proptest::prelude::*;

    use crate::*;

    const OWNERS: usize = 6;

    #[derive(Clone, Debug)]
    enum Op {
        Lock {
            who: usize,
            kind: u8,
            write: bool,
            range: u8,
        },
        Unlock {
            who: usize,
            kind: u8,
            range: u8,
        },
        Poll {
            who: usize,
        },
        Interrupt {
            who: usize,
        },
        Close {
            who: usize,
        },
    }

    fn range(r: u8) -> (i64, i64) {
        // Mostly the whole file (the herd), sometimes a piece of it.
        match r % 6 {
            0..=2 => (0, 0),
            3 => (0, 4),
            4 => (2, 4),
            _ => (5, 0),
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        let who = 0..OWNERS;
        prop_oneof![
            4 => (who.clone(), 0..3u8, prop::bool::weighted(0.8), any::<u8>())
                .prop_map(|(who, kind, write, range)| Op::Lock { who, kind, write, range }),
            2 => (who.clone(), 0..3u8, any::<u8>()).prop_map(|(who, kind, range)| Op::Unlock { who, kind, range }),
            3 => who.clone().prop_map(|who| Op::Poll { who }),
            1 => who.clone().prop_map(|who| Op::Interrupt { who }),
            1 => who.prop_map(|who| Op::Close { who }),
        ]
    }

    struct World {
        inode: std::sync::Arc<FileLockContext>,
        pending: Vec<Option<PendingLock>>,
    }

    impl World {
        fn new(owners: usize) -> World {
            let mgr = LockManager::new();
            World {
                inode: FileLockContext::new(&mgr, InodeKey::default()),
                pending: (0..owners).map(|_| None).collect(),
            }
        }

        fn who(i: usize) -> (Process, OpenFile) {
            (
                Process::new(i as u32 + 1),
                OpenFile::new(i as u64 + 1, AccessMode::ReadWrite),
            )
        }

        fn request(&mut self, i: usize, kind: u8, ty: LockType, r: u8, wait: bool) {
            let (p, f) = Self::who(i);
            let (start, len) = range(r);
            let res = match kind {
                0 | 1 => {
                    let cmd = match (kind, wait) {
                        (0, true) => FcntlCmd::SetLkW,
                        (0, false) => FcntlCmd::SetLk,
                        (_, true) => FcntlCmd::OfdSetLkW,
                        (_, false) => FcntlCmd::OfdSetLk,
                    };
                    self.inode.fcntl_lock(p, f, cmd, &mut Flock::new(ty, start, len))
                }
                _ => {
                    let op = match ty {
                        LockType::Read => FlockOp::Shared,
                        LockType::Write => FlockOp::Exclusive,
                        LockType::Unlock => FlockOp::Unlock,
                    };
                    self.inode.flock_lock(p, f, op, !wait)
                }
            };
            if let Ok(Some(pl)) = res {
                self.pending[i] = Some(pl);
            }
        }

        fn apply(&mut self, op: &Op) {
            match *op {
                Op::Lock {
                    who,
                    kind,
                    write,
                    range,
                } => {
                    if self.pending[who].is_none() {
                        let ty = if write { LockType::Write } else { LockType::Read };
                        self.request(who, kind, ty, range, true);
                    }
                }
                Op::Unlock { who, kind, range } => self.request(who, kind, LockType::Unlock, range, false),
                Op::Poll { who } => {
                    if let Some(pl) = self.pending[who].as_mut() {
                        if pl.poll_complete().is_some() {
                            self.pending[who] = None;
                        }
                    }
                }
                Op::Interrupt { who } => {
                    if let Some(mut pl) = self.pending[who].take() {
                        pl.interrupter().interrupt();
                        if pl.poll_complete().is_none() {
                            self.pending[who] = Some(pl);
                        }
                    }
                }
                Op::Close { who } => {
                    let (p, f) = Self::who(who);
                    self.inode.posix_remove_owner(p);
                    self.inode.file_remove(f.id);
                }
            }
            let inner = self.inode.inner.lock();
            inner.chain_check();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        /// Random mixes of owners, families, types, ranges, waits, polls, interrupts,
        /// unlocks and closes: every insertion lands where the plain walk puts it and
        /// the run always matches the tree.
        #[test]
        fn jumps_land_where_the_walk_does(ops in prop::collection::vec(op(), 1..120)) {
            let mut w = World::new(OWNERS);
            for op in &ops {
                w.apply(op);
            }
        }
    }

    /// Seed 003's herd, driven by polls: once the chain is built, putting the owner
    /// that comes back to sleep visits a few records, not the whole chain.
    #[test]
    fn herd_blocks_in_constant_work() {
        for kind in 0..3u8 {
            const N: usize = 40;
            let mut w = World::new(N);
            for i in 0..N {
                w.request(i, kind, LockType::Write, 0, true);
            }
            let mut holder = 0;
            let (mut blocks, mut nodes) = (0, 0);
            for round in 0..200 {
                let before = w.inode.stats();
                // The holder unlocks; the first waiter retries and is granted; the old
                // holder asks again and sleeps at the end of the chain.
                w.request(holder, kind, LockType::Unlock, 0, false);
                let next = (holder + 1) % N;
                let r = w.pending[next].as_mut().expect("waits").poll_complete();
                assert_eq!(r, Some(Ok(())), "round {round}");
                w.pending[next] = None;
                w.request(holder, kind, LockType::Write, 0, true);
                assert!(w.pending[holder].is_some());
                let after = w.inode.stats();
                if round >= 10 {
                    blocks += after.blocks - before.blocks;
                    nodes += after.wait_nodes - before.wait_nodes;
                }
                holder = next;
            }
            assert_eq!(blocks, 190, "one block per round");
            assert!(
                nodes <= 3 * blocks,
                "kind {kind}: {nodes} records visited for {blocks} blocks"
            );
        }
    }

    /// Seed 003's herd as vfscalefs sees it: the holder unlocks and asks again before the
    /// waiter it woke retries, so that waiter finds the lock taken and goes back to
    /// sleep, and its former waiters (the whole chain) are re-checked under it. For flock
    /// and OFD the re-check skips the run: a few records per block, not the chain.
    #[test]
    fn barging_herd_rechecks_in_constant_work() {
        for kind in 0..3u8 {
            const N: usize = 40;
            let mut w = World::new(N);
            for i in 0..N {
                w.request(i, kind, LockType::Write, 0, true);
            }
            let mut holder = 0;
            let (mut blocks, mut nodes) = (0, 0);
            for round in 0..200 {
                let before = w.inode.stats();
                w.request(holder, kind, LockType::Unlock, 0, false);
                w.request(holder, kind, LockType::Write, 0, true);
                if w.pending[holder].is_some() {
                    holder = N; // handed off: found below
                }
                for i in 0..N {
                    if let Some(pl) = w.pending[i].as_mut() {
                        if pl.poll_complete().is_some() {
                            w.pending[i] = None;
                            holder = i;
                        }
                    }
                }
                assert!(holder < N, "round {round}: somebody holds the lock");
                let after = w.inode.stats();
                if round >= 10 {
                    blocks += after.blocks - before.blocks;
                    nodes += after.wait_nodes - before.wait_nodes;
                }
            }
            eprintln!("kind {kind}: {nodes} records visited for {blocks} blocks");
            assert!(blocks >= 190, "kind {kind}: at least one block per round");
            if kind != 0 {
                assert!(
                    nodes <= 6 * blocks,
                    "kind {kind}: {nodes} records visited for {blocks} blocks"
                );
            }
        }
    }
}
