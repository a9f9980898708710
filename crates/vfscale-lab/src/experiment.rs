//! The lab's experiments, each named by the upstream kernel change it reproduces.
//!
//! Every line of the headline, every summary table and `vfscale bench --help` names its
//! experiment this way, so a reader can look the patch series up without a decoder.

/// One experiment: the kernel change whose benchmark the lab reruns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Experiment {
    /// Jeff Layton's 2013 per-inode file locks (lockperf).
    PerInodeLocks,
    /// Mateusz Guzik's 2015 lock-free `fd_install` (pipebench, opensock).
    FdInstall,
    /// Dave Chinner's 2023 inode cache scalability work (the inode benchmark).
    InodeCache,
    /// NeilBrown's 2018 wait tree of fs/locks.c (the herd).
    WaitTree,
    /// Pasha Tatashin's 2021 per-device loop lock (loop boot).
    LoopLock,
    /// Many locks held on one file: the O(log n) lock index Linux lacks (lockmany).
    ManyLocks,
    /// Several vfscalefs servers, one lock space on etcd (cluster): delegation against
    /// a consensus commit per lock, as the DLM's plocks and JuiceFS-on-etcd pay it.
    Cluster,
}

impl Experiment {
    /// Every experiment, in the order the headline reports them.
    pub const ALL: [Experiment; 7] = [
        Experiment::PerInodeLocks,
        Experiment::FdInstall,
        Experiment::InodeCache,
        Experiment::WaitTree,
        Experiment::LoopLock,
        Experiment::ManyLocks,
        Experiment::Cluster,
    ];

    /// The short name that opens its headline lines: `wait tree of fs/locks.c
    /// (NeilBrown, 2018)`.
    pub fn label(self) -> &'static str {
        match self {
            Experiment::PerInodeLocks => "per-inode file locks (Layton, 2013)",
            Experiment::FdInstall => "lock-free fd_install (Guzik, 2015)",
            Experiment::InodeCache => "inode cache scalability (Chinner, 2023)",
            Experiment::WaitTree => "wait tree of fs/locks.c (NeilBrown, 2018)",
            Experiment::LoopLock => "per-device loop lock (Tatashin, 2021)",
            Experiment::ManyLocks => "many locks on one file",
            Experiment::Cluster => "several servers, one lock space (etcd)",
        }
    }

    /// The upstream patch series (author, year, subject line), or for lockmany what
    /// the library adds that Linux lacks.
    pub fn upstream(self) -> &'static str {
        match self {
            Experiment::PerInodeLocks => {
                "Jeff Layton, 2013: locks: scalability improvements for file locking"
            }
            Experiment::FdInstall => {
                "Mateusz Guzik, 2015: fs: use a sequence counter instead of file_lock in fd_install"
            }
            Experiment::InodeCache => "Dave Chinner, 2023: vfs: inode cache scalability improvements",
            Experiment::WaitTree => "NeilBrown, 2018: locks: avoid thundering-herd wake-ups",
            Experiment::LoopLock => "Pasha Tatashin, 2021: scale loop device lock",
            Experiment::ManyLocks => "an O(log n) index of a file's locks, which Linux lacks",
            Experiment::Cluster => {
                "a lock space shared by servers through etcd, homed per inode, not one consensus commit per lock"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_carry_no_numbered_tag() {
        for e in Experiment::ALL {
            let l = e.label().to_lowercase();
            assert!(!l.contains("seed") && !l.contains("issue"), "{l}");
        }
    }
}
