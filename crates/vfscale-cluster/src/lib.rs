//! Several servers, one lock space: `vfscale-locks` shared by the servers of a cluster,
//! with etcd for what must be agreed and direct peer connections for the locks
//! themselves. An NFS, SMB, 9P or FUSE server embeds one [`ClusterLocks`] per process and
//! sends it its clients' lock calls; calls on one inode through any member of the
//! cluster conflict as on one Linux kernel.
//!
//! # Design
//!
//! * **Membership.** Each member holds an etcd lease (TTL `lease_ttl`, kept alive) and
//!   registers the address of its peer service under it. A member whose lease ended is
//!   dead to the cluster.
//! * **Ownership (homes).** Each inode's locks live on one member, its home, recorded in
//!   etcd under the home's lease; the key's creation revision is the fencing token. An
//!   inode is claimed by the first member that locks it, so an inode used by one member
//!   is served there by the local `vfscale-locks` call, with no etcd traffic.
//! * **Remote calls.** Another member sends its calls to the home over a direct
//!   connection (one round trip, not a consensus commit). Blocked requests wait in the
//!   home's wait tree, so the wait tree's rules, the fair hand-off and `EDEADLK` among
//!   the owners of one home hold unchanged; the home answers a remote waiter when granted.
//! * **Deadlock across members.** A POSIX wait that lasts is published in etcd as a
//!   wait-for edge, serialised by a compare-and-swap on one version key; the edge that
//!   closes a cycle, once the other members confirm their edges are current, fails with
//!   `EDEADLK`.
//! * **Failure.** When a home's lease ends, the members that use its inodes claim them
//!   again; the new home asks every live member for the locks its clients hold there
//!   (reclaim) before it grants anything else.
//!
//! # What is fenced, and what is not
//!
//! * A member that cannot renew its lease within its TTL (by its own clock, with a
//!   margin) stops granting at once, before etcd lets another member claim its inodes.
//!   Its clients' lock calls on inodes where they held locks then answer `EIO`, as the
//!   Linux NFS client does for a lost lock.
//! * Not fenced: I/O a client makes outside the lock calls. The embedding server fences
//!   the I/O it sees (vfscalefs answers `EIO` on the handles of a lost lock where it
//!   serves reads and writes itself); I/O that bypasses the server (kernel passthrough)
//!   or a process that ignores the `EIO` is beyond any lock manager's reach, as under NFS.

#![warn(missing_docs)]

mod directory;
mod error;
pub mod etcd;
mod types;

pub use directory::{BoxFuture, Directory, DirectoryStats, WaitCycle};
pub use error::ClusterError;
pub use types::{DirectoryEvent, Home, InodeId, Member, PublishedEdge, WaitEdge};
