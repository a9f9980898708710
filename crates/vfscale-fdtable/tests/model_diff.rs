//! Random operation sequences against a plain reference model (a `BTreeMap`): the
//! table and the model must give identical results.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use vfscale_fdtable::{AllocPolicy, CloseRangeFlags, Errno, Fd, FdTable, InstallMode, Settings};

#[derive(Debug, Clone)]
enum Op {
    Open(bool),
    Reserve(u32, bool),
    Install(usize),
    Unreserve(usize),
    Close(u32),
    Dup(u32),
    Dup2(u32, u32),
    Dup3(u32, u32, bool),
    Dupfd(u32, u32, bool),
    GetCloexec(u32),
    SetCloexec(u32, bool),
    CloseRange(u32, u32, bool),
    Exec,
    SetRlimit(u32),
    Get(u32),
}

fn fdv() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..8, 0u32..140, Just(u32::MAX)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<bool>().prop_map(Op::Open),
        2 => (fdv(), any::<bool>()).prop_map(|(a, c)| Op::Reserve(a, c)),
        2 => any::<usize>().prop_map(Op::Install),
        1 => any::<usize>().prop_map(Op::Unreserve),
        3 => fdv().prop_map(Op::Close),
        2 => fdv().prop_map(Op::Dup),
        3 => (fdv(), fdv()).prop_map(|(a, b)| Op::Dup2(a, b)),
        2 => (fdv(), fdv(), any::<bool>()).prop_map(|(a, b, c)| Op::Dup3(a, b, c)),
        2 => (fdv(), fdv(), any::<bool>()).prop_map(|(a, b, c)| Op::Dupfd(a, b, c)),
        1 => fdv().prop_map(Op::GetCloexec),
        1 => (fdv(), any::<bool>()).prop_map(|(a, c)| Op::SetCloexec(a, c)),
        1 => (fdv(), fdv(), any::<bool>()).prop_map(|(a, b, c)| Op::CloseRange(a, b, c)),
        1 => Just(Op::Exec),
        1 => (1u32..150).prop_map(Op::SetRlimit),
        2 => fdv().prop_map(Op::Get),
    ]
}

/// The reference: installed fds -> (file id, cloexec); reserved fds -> cloexec.
#[derive(Default)]
struct Model {
    open: BTreeMap<u32, (u64, bool)>,
    reserved: BTreeMap<u32, bool>,
    rlimit: u32,
    nr_open: u32,
}

impl Model {
    fn lowest(&self, start: u32) -> Result<u32, Errno> {
        let mut fd = start;
        while self.open.contains_key(&fd) || self.reserved.contains_key(&fd) {
            fd += 1;
        }
        if fd >= self.rlimit || fd >= self.nr_open {
            Err(Errno::EMFILE)
        } else {
            Ok(fd)
        }
    }

    fn dup3(&mut self, a: u32, b: u32, c: bool) -> Result<Fd, Errno> {
        if b >= self.rlimit {
            return Err(Errno::EBADF);
        }
        let Some(&(id, _)) = self.open.get(&a) else {
            return Err(Errno::EBADF);
        };
        if self.reserved.contains_key(&b) {
            return Err(Errno::EBUSY);
        }
        self.open.insert(b, (id, c));
        Ok(Fd(b))
    }
}

fn run(ops: Vec<Op>, settings: Settings) {
    let t: FdTable<u64> = FdTable::with_limits(settings, 100, 1 << 20);
    let mut m = Model {
        rlimit: 100,
        nr_open: 1 << 20,
        ..Model::default()
    };
    let mut next_id = 0u64;
    let mut new_id = || {
        next_id += 1;
        next_id
    };
    for op in ops {
        match op {
            Op::Open(c) => {
                let id = new_id();
                let r = t.open(Arc::new(id), c).map(|f| f.0);
                let e = m.lowest(0);
                if let Ok(fd) = e {
                    m.open.insert(fd, (id, c));
                }
                assert_eq!(r, e, "{op:?}");
            }
            Op::Reserve(s, c) => {
                let r = t.reserve(Fd(s), c).map(|f| f.0);
                let e = m.lowest(s);
                if let Ok(fd) = e {
                    m.reserved.insert(fd, c);
                }
                assert_eq!(r, e, "{op:?}");
            }
            Op::Install(i) => {
                if m.reserved.is_empty() {
                    continue;
                }
                let fd = *m.reserved.keys().nth(i % m.reserved.len()).unwrap();
                let c = m.reserved.remove(&fd).unwrap();
                let id = new_id();
                t.install(Fd(fd), Arc::new(id));
                m.open.insert(fd, (id, c));
            }
            Op::Unreserve(i) => {
                if m.reserved.is_empty() {
                    continue;
                }
                let fd = *m.reserved.keys().nth(i % m.reserved.len()).unwrap();
                m.reserved.remove(&fd);
                t.unreserve(Fd(fd));
            }
            Op::Close(fd) => {
                let e = m.open.remove(&fd).map(|_| ()).ok_or(Errno::EBADF);
                assert_eq!(t.close(Fd(fd)), e, "{op:?}");
            }
            Op::Dup(fd) => {
                let e = match m.open.get(&fd) {
                    None => Err(Errno::EBADF),
                    Some(&(id, _)) => m.lowest(0).inspect(|&n| {
                        m.open.insert(n, (id, false));
                    }),
                };
                assert_eq!(t.dup(Fd(fd)).map(|f| f.0), e, "{op:?}");
            }
            Op::Dup2(a, b) => {
                let e = if a == b {
                    if m.open.contains_key(&a) {
                        Ok(Fd(b))
                    } else {
                        Err(Errno::EBADF)
                    }
                } else {
                    m.dup3(a, b, false)
                };
                assert_eq!(t.dup2(Fd(a), Fd(b)), e, "{op:?}");
            }
            Op::Dup3(a, b, c) => {
                let e = if a == b {
                    Err(Errno::EINVAL)
                } else {
                    m.dup3(a, b, c)
                };
                assert_eq!(t.dup3(Fd(a), Fd(b), c), e, "{op:?}");
            }
            Op::Dupfd(a, min, c) => {
                let e = match m.open.get(&a) {
                    None => Err(Errno::EBADF),
                    Some(_) if min >= m.rlimit => Err(Errno::EINVAL),
                    Some(&(id, _)) => m.lowest(min).inspect(|&n| {
                        m.open.insert(n, (id, c));
                    }),
                };
                assert_eq!(t.dupfd(Fd(a), min, c).map(|f| f.0), e, "{op:?}");
            }
            Op::GetCloexec(fd) => {
                let e = m.open.get(&fd).map(|&(_, c)| c).ok_or(Errno::EBADF);
                assert_eq!(t.get_cloexec(Fd(fd)), e, "{op:?}");
            }
            Op::SetCloexec(fd, c) => {
                let e = match m.open.get_mut(&fd) {
                    Some(v) => {
                        v.1 = c;
                        Ok(())
                    }
                    None => Err(Errno::EBADF),
                };
                assert_eq!(t.set_cloexec(Fd(fd), c), e, "{op:?}");
            }
            Op::CloseRange(a, b, c) => {
                let e = if a > b {
                    Err(Errno::EINVAL)
                } else {
                    let keys: Vec<u32> = m.open.range(a..=b).map(|(k, _)| *k).collect();
                    for k in keys {
                        if c {
                            m.open.get_mut(&k).unwrap().1 = true;
                        } else {
                            m.open.remove(&k);
                        }
                    }
                    if c {
                        for (_, v) in m.reserved.range_mut(a..=b) {
                            *v = true;
                        }
                    }
                    Ok(())
                };
                let flags = CloseRangeFlags {
                    cloexec: c,
                    unshare: false,
                };
                assert_eq!(
                    t.close_range(a, b, flags).map(|o| o.is_none()),
                    e.map(|_| true),
                    "{op:?}"
                );
            }
            Op::Exec => {
                m.open.retain(|_, v| !v.1);
                for v in m.reserved.values_mut() {
                    *v = false;
                }
                t.exec();
            }
            Op::SetRlimit(n) => {
                m.rlimit = n;
                t.set_rlimit_nofile(n).unwrap();
            }
            Op::Get(fd) => {
                assert_eq!(t.get(Fd(fd)).map(|f| *f), m.open.get(&fd).map(|v| v.0), "{op:?}");
            }
        }
    }
    let got: Vec<(u32, u64, bool)> = t.iter().into_iter().map(|(fd, f, c)| (fd.0, *f, c)).collect();
    let want: Vec<(u32, u64, bool)> = m.open.iter().map(|(&fd, &(id, c))| (fd, id, c)).collect();
    assert_eq!(got, want);
    let child = t.fork();
    let got: Vec<(u32, u64, bool)> = child.iter().into_iter().map(|(fd, f, c)| (fd.0, *f, c)).collect();
    assert_eq!(got, want, "fork copies exactly the installed descriptors");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lockless_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops, Settings { install: InstallMode::Lockless, policy: AllocPolicy::Lowest });
    }

    #[test]
    fn under_lock_matches_model(ops in prop::collection::vec(op(), 1..120)) {
        run(ops, Settings { install: InstallMode::UnderLock, policy: AllocPolicy::Lowest });
    }
}
