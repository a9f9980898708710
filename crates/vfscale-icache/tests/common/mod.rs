//! A test filesystem that counts its operations and can hold an eviction.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use vfscale_icache::{Inode, SuperOperations};

#[derive(Default)]
pub struct Counts {
    pub allocs: AtomicUsize,
    pub evicts: AtomicUsize,
    pub destroys: AtomicUsize,
    /// Per object: evict and destroy calls (must end at 1 each).
    pub per_obj: Mutex<HashMap<u64, (u32, u32)>>,
    next_obj: AtomicU64,
}

impl Counts {
    /// Updates object `obj`'s evict and destroy counts with `f`.
    fn of_obj(&self, obj: u64, f: impl FnOnce(&mut (u32, u32))) {
        f(self.per_obj.lock().unwrap().entry(obj).or_default());
    }
}

/// Data: the object number.
pub struct Obj {
    pub obj: u64,
    pub loaded: AtomicU64,
}

#[derive(Default)]
pub struct Gate {
    held: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Gate {
    /// Arms the gate: the next evict_inode stops until `release`.
    pub fn arm(&self) {
        *self.held.lock().unwrap() = Some(false);
    }
    pub fn wait_held(&self) {
        let mut g = self.held.lock().unwrap();
        while *g != Some(true) {
            g = self.cv.wait(g).unwrap();
        }
    }
    pub fn release(&self) {
        *self.held.lock().unwrap() = None;
        self.cv.notify_all();
    }
    fn enter(&self) {
        let mut g = self.held.lock().unwrap();
        if *g == Some(false) {
            *g = Some(true);
            self.cv.notify_all();
            while g.is_some() {
                g = self.cv.wait(g).unwrap();
            }
        }
    }
}

#[derive(Clone, Default)]
pub struct TestFs {
    pub counts: Arc<Counts>,
    pub gate: Arc<Gate>,
}

impl SuperOperations for TestFs {
    type Data = Obj;
    fn alloc_inode(&self, _ino: u64) -> Obj {
        self.counts.allocs.fetch_add(1, Ordering::SeqCst);
        Obj {
            obj: self.counts.next_obj.fetch_add(1, Ordering::SeqCst) + 1,
            loaded: AtomicU64::new(0),
        }
    }
    fn evict_inode(&self, inode: &Inode<Self>) {
        self.counts.evicts.fetch_add(1, Ordering::SeqCst);
        self.counts.of_obj(inode.data().obj, |(evicts, _)| *evicts += 1);
        self.gate.enter();
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        self.counts.destroys.fetch_add(1, Ordering::SeqCst);
        self.counts
            .of_obj(inode.data().obj, |(_, destroys)| *destroys += 1);
    }
}

impl Counts {
    /// Every evicted object was evicted and destroyed exactly once.
    pub fn check_once(&self) {
        for (obj, (e, d)) in self.per_obj.lock().unwrap().iter() {
            assert!(
                *e <= 1 && *d == 1,
                "object {obj}: evicted {e} times, destroyed {d} times"
            );
        }
    }
}
