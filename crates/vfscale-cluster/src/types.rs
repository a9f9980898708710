//! The names the cluster gives things: inodes, members, homes, owners, wait-for edges.

use std::net::SocketAddr;

/// An inode as the cluster names it: its inode number on the shared source (the same on
/// every host of a shared filesystem).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId(pub u64);

/// A live server of the cluster, as registered under its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its `--node` name, unique in the cluster.
    pub node: String,
    /// Where its peer service listens.
    pub addr: SocketAddr,
    /// Its etcd lease; a member that rejoins after losing its lease has a new one.
    pub lease: i64,
}

impl Member {
    /// Whether `other` is this member under the same lease (its address aside).
    pub fn same_lease(&self, other: &Member) -> bool {
        self.node == other.node && self.lease == other.lease
    }
}

/// Where an inode's locks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Home {
    /// The home member.
    pub member: Member,
    /// The fencing token: the creation revision of the ownership key. A later home of the
    /// same inode always has a larger token.
    pub token: i64,
}

/// A POSIX owner waits for a lock held by another owner (owners are cluster-wide ids,
/// [`crate::GlobalOwner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitEdge {
    /// The blocked owner.
    pub waiter: u64,
    /// The owner of the lock it waits for.
    pub blocker: u64,
}

/// A wait-for edge and the member that published it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedEdge {
    /// The edge.
    pub edge: WaitEdge,
    /// Its member's node name.
    pub node: String,
}

/// What the directory tells the lock service as it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectoryEvent {
    /// A member's lease ended (expired or revoked): its registration is gone, and so are
    /// the ownership keys it held.
    MemberGone(Member),
    /// An inode's ownership key was deleted (its home's lease ended).
    HomeGone {
        /// The inode.
        ino: InodeId,
        /// The token of the home that is gone.
        token: i64,
    },
    /// This member can no longer trust its own lease: everything homed here is lost.
    Fenced,
    /// This member holds a new lease and is registered again.
    Rejoined(Member),
}
