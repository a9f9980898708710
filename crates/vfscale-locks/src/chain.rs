//! A skip pointer over a uniform chain of blocked requests, so that the herd (every
//! owner asking for one whole-file lock) blocks in O(1) (amortized) where
//! `__locks_insert_block`'s descent walks every waiter.
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

// foldhash (hashbrown's default): SipHash on these integer keys showed up in a herd's
// profile (the run tracker's lookups on every block and wake).
use hashbrown::HashMap;

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
    /// record of `above`. A process-owned POSIX retry also finds its first conflict and
    /// asks the blocked hash: the caller checks that for the whole run when
    /// [`Chain::posix_run`] (see `Inner::posix_run_would_sleep`).
    pub fn skip_recheck(&self, n: NodeId, above: &[NodeId], ar: &Arena) -> Option<NodeId> {
        let r = self.run.as_ref()?;
        if r.top != n || r.tail == n {
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

    /// The tracked run is of process-owned POSIX requests (whose retries run the
    /// deadlock check).
    pub fn posix_run(&self) -> bool {
        self.run.as_ref().is_some_and(|r| r.tmpl.kind == LockKind::Posix)
    }

    /// Some member of the tracked run has conflict identity `k` (for POSIX, owner `k`).
    pub fn has_ident(&self, k: OwnerKey) -> bool {
        self.run.as_ref().is_some_and(|r| r.idents.contains_key(&k))
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
        if ar.waiter(last).is_none() {
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
            if ar.waiter(p).is_none() || ar.children(p).len() != 1 || Template::of(&n.fl) != tmpl {
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
            let next = ar.children(id).first().copied();
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
            assert!(ar.waiter(cur).is_some(), "run member {cur} is a request");
            assert_eq!(Template::of(&n.fl), r.tmpl, "run member {cur} has the template");
            assert!(r.members.contains_key(&cur), "{cur} is listed");
            *idents.entry(r.tmpl.ident(&n.fl)).or_default() += 1;
            seen += 1;
            if cur == r.tail {
                break;
            }
            assert_eq!(ar.children(cur).len(), 1, "run member {cur} has one child");
            let c = ar.children(cur)[0];
            assert_eq!(ar.blocker(c), Some(cur));
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

    const OWNERS: usize = 8;

    #[derive(Clone, Debug)]
    enum Op {
        Lock {
            who: usize,
            ino: usize,
            kind: u8,
            write: bool,
            range: u8,
        },
        Unlock {
            who: usize,
            ino: usize,
            kind: u8,
            range: u8,
        },
        Poll {
            who: usize,
            ino: usize,
        },
        Interrupt {
            who: usize,
            ino: usize,
        },
        Close {
            who: usize,
        },
        /// The vfscalefs herd's step: unlock the whole file and ask again at once,
        /// before the waiter that woke retries (it then re-blocks, and its former
        /// waiters are re-checked under it).
        Barge {
            who: usize,
            ino: usize,
            kind: u8,
        },
        /// Every woken request retries.
        PollAll,
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

    /// Mostly the first inode (the herd); the second lets POSIX owners wait for each
    /// other across inodes, so the deadlock walk from a run's first conflict meets
    /// run members, and members have newer blocked requests elsewhere.
    fn ino() -> impl Strategy<Value = usize> {
        prop_oneof![3 => Just(0usize), 1 => Just(1usize)]
    }

    fn op() -> impl Strategy<Value = Op> {
        let who = 0..OWNERS;
        prop_oneof![
            4 => (who.clone(), ino(), 0..3u8, prop::bool::weighted(0.8), any::<u8>())
                .prop_map(|(who, ino, kind, write, range)| Op::Lock { who, ino, kind, write, range }),
            2 => (who.clone(), ino(), 0..3u8, any::<u8>())
                .prop_map(|(who, ino, kind, range)| Op::Unlock { who, ino, kind, range }),
            3 => (who.clone(), ino()).prop_map(|(who, ino)| Op::Poll { who, ino }),
            1 => (who.clone(), ino()).prop_map(|(who, ino)| Op::Interrupt { who, ino }),
            1 => who.clone().prop_map(|who| Op::Close { who }),
            3 => (who, ino(), 0..3u8).prop_map(|(who, ino, kind)| Op::Barge { who, ino, kind }),
            2 => Just(Op::PollAll),
        ]
    }

    struct World {
        inodes: [std::sync::Arc<FileLockContext>; 2],
        /// Per inode, per owner: its pending request there.
        waits: [Vec<Option<PendingLock>>; 2],
        /// The first inode (the herd tests use only this one).
        inode: std::sync::Arc<FileLockContext>,
    }

    impl World {
        fn new(owners: usize) -> World {
            let mgr = LockManager::new();
            let inodes = [
                FileLockContext::new(&mgr, InodeKey::default()),
                FileLockContext::new(
                    &mgr,
                    InodeKey {
                        ino: 1,
                        ..InodeKey::default()
                    },
                ),
            ];
            World {
                inode: inodes[0].clone(),
                inodes,
                waits: [(); 2].map(|_| (0..owners).map(|_| None).collect()),
            }
        }

        fn who(i: usize) -> (Process, OpenFile) {
            (
                Process::new(i as u32 + 1),
                OpenFile::new(i as u64 + 1, AccessMode::ReadWrite),
            )
        }

        fn request(&mut self, i: usize, kind: u8, ty: LockType, r: u8, wait: bool) {
            self.request_on(0, i, kind, ty, r, wait)
        }

        fn request_on(&mut self, ino: usize, i: usize, kind: u8, ty: LockType, r: u8, wait: bool) {
            let (p, f) = Self::who(i);
            let (start, len) = range(r);
            let inode = &self.inodes[ino];
            let res = match kind {
                0 | 1 => {
                    let cmd = match (kind, wait) {
                        (0, true) => FcntlCmd::SetLkW,
                        (0, false) => FcntlCmd::SetLk,
                        (_, true) => FcntlCmd::OfdSetLkW,
                        (_, false) => FcntlCmd::OfdSetLk,
                    };
                    inode.fcntl_lock(p, f, cmd, &mut Flock::new(ty, start, len))
                }
                _ => {
                    let op = match ty {
                        LockType::Read => FlockOp::Shared,
                        LockType::Write => FlockOp::Exclusive,
                        LockType::Unlock => FlockOp::Unlock,
                    };
                    inode.flock_lock(p, f, op, !wait)
                }
            };
            if let Ok(Some(pl)) = res {
                self.waits[ino][i] = Some(pl);
            }
        }

        fn apply(&mut self, op: &Op) {
            match *op {
                Op::Lock {
                    who,
                    ino,
                    kind,
                    write,
                    range,
                } => {
                    if self.waits[ino][who].is_none() {
                        let ty = if write { LockType::Write } else { LockType::Read };
                        self.request_on(ino, who, kind, ty, range, true);
                    }
                }
                Op::Unlock {
                    who,
                    ino,
                    kind,
                    range,
                } => self.request_on(ino, who, kind, LockType::Unlock, range, false),
                Op::Poll { who, ino } => {
                    if let Some(pl) = self.waits[ino][who].as_mut() {
                        if pl.poll_complete().is_some() {
                            self.waits[ino][who] = None;
                        }
                    }
                }
                Op::Interrupt { who, ino } => {
                    if let Some(mut pl) = self.waits[ino][who].take() {
                        pl.interrupter().interrupt();
                        if pl.poll_complete().is_none() {
                            self.waits[ino][who] = Some(pl);
                        }
                    }
                }
                Op::Barge { who, ino, kind } => {
                    self.request_on(ino, who, kind, LockType::Unlock, 0, false);
                    if self.waits[ino][who].is_none() {
                        self.request_on(ino, who, kind, LockType::Write, 0, true);
                    }
                }
                Op::PollAll => {
                    for ino in 0..2 {
                        for who in 0..self.waits[ino].len() {
                            if let Some(pl) = self.waits[ino][who].as_mut() {
                                if pl.poll_complete().is_some() {
                                    self.waits[ino][who] = None;
                                }
                            }
                        }
                    }
                }
                Op::Close { who } => {
                    let (p, f) = Self::who(who);
                    for inode in &self.inodes {
                        inode.posix_remove_owner(p);
                        inode.file_remove(f.id);
                    }
                }
            }
            for inode in &self.inodes {
                inode.inner.lock().chain_check();
            }
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

    /// Contenders in the herd tests.
    const HERD: usize = 40;

    /// The herd: `HERD` owners, each asking for the whole-file write lock of
    /// family `kind` (owner 0 gets it, the others wait in one chain).
    fn herd(kind: u8) -> World {
        let mut w = World::new(HERD);
        for i in 0..HERD {
            w.request(i, kind, LockType::Write, 0, true);
        }
        w
    }

    /// Blocks and wait-tree records visited over 200 rounds of `round` (given the round's
    /// number), not counting the first ten.
    fn herd_work(w: &mut World, mut round: impl FnMut(&mut World, usize)) -> (u64, u64) {
        let (mut blocks, mut nodes) = (0, 0);
        for r in 0..200 {
            let before = w.inode.stats();
            round(w, r);
            let after = w.inode.stats();
            if r >= 10 {
                blocks += after.blocks - before.blocks;
                nodes += after.wait_nodes - before.wait_nodes;
            }
        }
        (blocks, nodes)
    }

    /// The herd, driven by polls: once the chain is built, putting the owner
    /// that comes back to sleep visits a few records, not the whole chain.
    #[test]
    fn herd_blocks_in_constant_work() {
        for kind in 0..3u8 {
            let mut w = herd(kind);
            let mut holder = 0;
            let (blocks, nodes) = herd_work(&mut w, |w, round| {
                // The holder unlocks; the first waiter retries and is granted; the old
                // holder asks again and sleeps at the end of the chain.
                w.request(holder, kind, LockType::Unlock, 0, false);
                let next = (holder + 1) % HERD;
                let r = w.waits[0][next].as_mut().expect("waits").poll_complete();
                assert_eq!(r, Some(Ok(())), "round {round}");
                w.waits[0][next] = None;
                w.request(holder, kind, LockType::Write, 0, true);
                assert!(w.waits[0][holder].is_some());
                holder = next;
            });
            assert_eq!(blocks, 190, "one block per round");
            assert!(
                nodes <= 3 * blocks,
                "kind {kind}: {nodes} records visited for {blocks} blocks"
            );
        }
    }

    /// The herd as vfscalefs sees it: the holder unlocks and asks again before the
    /// waiter it woke retries, so that waiter finds the lock taken and goes back to
    /// sleep, and its former waiters (the whole chain) are re-checked under it. The
    /// re-check skips the run (for POSIX after one first-conflict lookup and one walk of
    /// the deadlock detector): a few records per block, not the chain.
    #[test]
    fn barging_herd_rechecks_in_constant_work() {
        for kind in 0..3u8 {
            let mut w = herd(kind);
            let mut holder = 0;
            let (blocks, nodes) = herd_work(&mut w, |w, round| {
                w.request(holder, kind, LockType::Unlock, 0, false);
                w.request(holder, kind, LockType::Write, 0, true);
                if w.waits[0][holder].is_some() {
                    holder = HERD; // handed off: found below
                }
                for i in 0..HERD {
                    if let Some(pl) = w.waits[0][i].as_mut() {
                        if pl.poll_complete().is_some() {
                            w.waits[0][i] = None;
                            holder = i;
                        }
                    }
                }
                assert!(holder < HERD, "round {round}: somebody holds the lock");
            });
            eprintln!("kind {kind}: {nodes} records visited for {blocks} blocks");
            assert!(blocks >= 190, "kind {kind}: at least one block per round");
            assert!(
                nodes <= 6 * blocks,
                "kind {kind}: {nodes} records visited for {blocks} blocks"
            );
        }
    }

    /// A run of POSIX waiters whose re-check must not be skipped: the holder that a
    /// re-blocked request now waits on is itself waiting (on another inode) for a lock
    /// of a run member, so that member's retry would find a deadlock. The re-check
    /// walks the run, wakes that member (`EDEADLK`) and keeps the others.
    #[test]
    fn posix_run_recheck_finds_a_member_on_the_holders_wait_chain() {
        let (h, t, c1, m2, m, m4, p) = (0, 1, 2, 3, 4, 5, 6);
        let mut w = World::new(7);
        // m holds the tail of the second file, p its head; h holds the first file.
        w.request_on(1, m, 0, LockType::Write, 5, false);
        w.request_on(1, p, 0, LockType::Write, 3, false);
        w.request_on(0, h, 0, LockType::Write, 0, false);
        // The herd: a chain t <- c1 <- m2 <- m <- m4 under h's lock.
        for i in [t, c1, m2, m, m4] {
            w.request_on(0, i, 0, LockType::Write, 0, true);
            assert!(w.waits[0][i].is_some(), "{i} waits");
        }
        // m (another thread) waits for p; then h waits for m: no cycle yet.
        w.request_on(1, m, 0, LockType::Write, 3, true);
        assert!(w.waits[1][m].is_some());
        w.request_on(1, h, 0, LockType::Write, 5, true);
        assert!(w.waits[1][h].is_some());
        // h barges: unlocks (waking t) and locks again before t retries.
        w.request_on(0, h, 0, LockType::Unlock, 0, false);
        w.request_on(0, h, 0, LockType::Write, 0, false);
        assert_eq!(
            w.waits[0][t].as_mut().unwrap().poll_complete(),
            None,
            "t sleeps again"
        );
        // m's retry would wait for h, who waits for m.
        assert_eq!(
            w.waits[0][m].as_mut().unwrap().poll_complete(),
            Some(Err(Errno::EDEADLK))
        );
        w.waits[0][m] = None;
        for i in [c1, m2, m4] {
            assert_eq!(w.waits[0][i].as_mut().unwrap().poll_complete(), None, "{i} stays");
        }
        w.inode.inner.lock().chain_check();
    }
}
