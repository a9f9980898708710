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
//!   `EDEADLK`: the newest wait of its owner for its blocker, alone (as Linux refuses
//!   the one request that would close a cycle, an owner's other waits go on).
//! * **Failure.** When a home's lease ends, the members that use its inodes claim them
//!   again; the new home asks every live member for the locks its clients hold there
//!   (reclaim) before it grants anything else.
//! * **Giving back.** A home gives back an inode idle for [`HOME_IDLE`] (no lock held,
//!   no waiter, no call in progress; settable): a sweep on the runtime every idle time
//!   takes it out of the table, then deletes its key only under its token, and the next
//!   lock anywhere claims it anew. So a member that locks millions of files over days
//!   keeps only the homes in use, in memory and in etcd. The same sweep drops shadows
//!   that hold nothing.
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
//!
//! # The lock path
//!
//! * **Ids.** A member's owner and file ids become cluster-wide [`GlobalOwner`]s, a
//!   bijection under the seed of (node, lease) (`ids.rs`): one multiply-xor chain per
//!   call, and the home can tell this member's own ids back (for lost locks).
//! * **Home here**: a read lock on one of 64 shards of the home table (inode numbers
//!   hashed with one multiply), `fenced()` (an atomic load and a clock read), then the
//!   `vfscale-locks` call on the caller's thread; the call counter is striped per
//!   thread, and the inode's "used" flag is written only when it is clear. A request
//!   that waits is finished by a task of the service's runtime (`.await` on the
//!   [`vfscale_locks::PendingLock`]), registered so the service can end it, and pins
//!   its home (taken under the shard's read lock) until it ends.
//! * **Home elsewhere**: the runtime resolves the home (the directory answers from its
//!   watch cache) and sends one `Lock` request; a waiting call is one long request,
//!   interrupted by an `Interrupt` request (the home answers `EINTR` unless it granted
//!   first) and abandoned at the home when the stream breaks (the handler's future
//!   owns the pending request). A granted call is mirrored in the shadow. A home that
//!   answers "moved" or not at all is resolved again, with backoff, for up to 2 TTL +
//!   1 s from the first failure (past a dead home's lease), then the call answers
//!   `EIO`.
//! * **A new home** (a claim won in the directory) takes its own shadow of the inode
//!   and asks every live member at once for theirs (`Reclaim`, asked again each second
//!   until the member answers or its lease ends), re-creates those locks, and only then
//!   serves the inode. A claim voided by a fence (or dropped half-way) makes the
//!   shadow's owners answer `EIO`, as the fence does for every other shadow.
//! * **Close** (`posix_remove_owner`, `file_remove`): applied at once when the home is
//!   here; one `Remove` round trip when the shadow says the owner holds something at a
//!   remote home; nothing otherwise.
//!
//! # Invariants
//!
//! * An inode is in the home table only under the token this member claimed it with,
//!   and only under the lease it claimed it with, while not fenced: a claim enters the
//!   table only if the lease is unchanged and `fenced()` is false (checked under the
//!   identity's read lock); the `Fenced` event and a rejoin empty the table; a
//!   `HomeGone` for that token removes the inode, and so does a give-back (below).
//! * One home state per inode, never replaced: a claim enters the table only where the
//!   inode has none (checked under its shard's write lock; a state of an older claim
//!   whose `HomeGone` has not come yet makes the new claim "moved"), and concurrent
//!   calls share one claim: a call that found no home looks again under the claims'
//!   mutex, which a claim leaves only after its home entered the table. (A second home
//!   state would lack the locks the first granted to this member's clients: they are in
//!   no shadow.)
//! * A home grants nothing while
//!   `fenced()`: the lock path checks it before the call and again after a call that
//!   was answered at once, and a wait that ends granted checks it again, answering
//!   `EIO` (a peer's: "moved") instead; a lock so refused leaves the table with the
//!   rest at the fence.
//! * A peer's call is served only under the token the home holds (else "moved": the
//!   caller resolves the home again), and never for a member whose lease the home saw
//!   end ("gone": the caller answers `EIO`).
//! * The shadow holds exactly the granted locks of this member's clients at remote
//!   homes (each granted call is applied to it after the home's answer, each unlock and
//!   close before it is sent; a failed flock conversion drops the file's flock, as
//!   Linux does). A new home takes its own shadow
//!   and every live member's before it serves the inode: calls that arrive meanwhile
//!   wait for the claim.
//! * When a member's lease ends, every home drops its owners' and files' locks and
//!   ends their waits; members re-send their calls that waited there and re-resolve the
//!   homes of their shadows. After missed directory events (a lagging receiver) the
//!   service does the same for every member its homes served that the directory no
//!   longer lists, and re-resolves every shadow's home.
//! * A lost lock (fenced home, or shadow at fencing) makes its (inode, owner) answer
//!   `EIO` to every lock call until the owner closes the file. So does an unlock that
//!   no home answered within the call's patience (it left the shadow, but a home alive
//!   and out of reach may still hold the lock): that owner's close is then sent to the
//!   home whatever the shadow holds.
//! * `EDEADLK` across members is answered only after every other edge of the cycle was
//!   confirmed current by the member that published it.
//!
//! ## Giving back
//!
//! * Every use of a home inode outside its shard's read lock holds a pin, taken under
//!   that lock: a wait, a call past a claim (`home_inode`), a peer's call or close
//!   (`home_for_peer`), a remote close. A call served wholly under the read lock needs
//!   none. Every use marks the inode used; so does a pin's end.
//! * An inode leaves the table for a give-back only under its shard's write lock, after
//!   a check there that it has no pin, was not used since the previous sweep, and its
//!   context holds no lock and no request: no lock call can come between the check and
//!   the removal. Not while fenced, and only under the lease it was claimed with.
//! * In the same critical section it becomes *returning* (inode, token, lease). A claim
//!   under that token or an older one is refused ("moved": the caller resolves the home
//!   again, with backoff, within the usual patience) for as long as it is returning; and
//!   a claim enters the table only if the directory still shows this member as the
//!   home under the claim's token (checked before the shadow is taken). So no call that
//!   resolved the old home, before or after the delete, makes it again: once the key is
//!   deleted another member may claim the inode and grant the same range.
//! * A pinned home is used only if it is still the table's entry after its claim;
//!   otherwise the call resolves again. A peer's call with the old token finds no entry
//!   and answers "moved".
//! * The key is deleted with `if create_revision == token then delete` (a newer claim
//!   is never deleted), retried by each sweep until the directory answers; fenced, it
//!   is not tried: the key goes with the lease. The inode stays returning until the
//!   directory no longer shows the claim (it never shows it again then) or the lease
//!   changed; a delete that failed leaves calls on the inode answered "moved" until a
//!   later sweep's delete succeeds or the lease ends. Nothing is ever put back in the
//!   table: the fence and a rejoin empty it as before, and a sweep finds nothing.
//! * Other members' shadows hold nothing for an idle inode (a shadow holds only locks
//!   granted at that home), so there is nothing to reclaim; a member told `HomeGone`
//!   claims the inode again only if its shadow holds locks there. An unlock or a close
//!   leaves the shadow before it is sent, not after the answer: the home may give the
//!   inode back as soon as it applied it, and a new home must not reclaim the lock.
//! * `HomeGone` re-sends only the calls in flight to the home that went (its token), a
//!   member's end only those sent to it under the lease that ended, and a lagging event
//!   receiver only those whose home the directory no longer shows: a call cancelled
//!   here may still be applied at its home after the one re-sent (an unlock after the
//!   next lock), which is harmless only where the token it carries is no longer served.
//! * The returning mark goes once the watch's own view no longer shows the claim
//!   (`Directory::claim_shown`), not what a fenced member resolves, which hides its
//!   claims whether or not their keys are gone.
//! * A shadow is dropped when it holds nothing, no call holds it, and no call took it to
//!   add a lock between the two looks of the sweep (`taken`, bumped under the table's
//!   mutex).
//!
//! # What protects what
//!
//! | state | protected by |
//! |---|---|
//! | the home table (inode → context, token, peers' owners) | one `RwLock` per shard; a context's locks by its own `flc_lock` |
//! | the peers' owners of one home inode | that inode's `peers` mutex |
//! | the shadow table / one shadow's home | the table's mutex / the shadow's `home` mutex |
//! | a home's pins and "used" flag | atomics; pins are taken under its shard's read lock, read under its write lock |
//! | inodes given back, not yet forgotten (returning) | `Returning`'s mutex, taken under a shard's write lock when an inode leaves |
//! | the idle time | an atomic; the sweeper is woken when it changes |
//! | lost (inode, owner) pairs | `LostSet`'s mutex (an atomic flag skips it when empty) |
//! | waiting calls, early interrupts | `Waiting`'s two mutexes |
//! | a call's interrupt reason and hook | its `CallCtl` mutex |
//! | claims in progress | the `claims` mutex; each claim's `OnceCell` |
//! | remote calls in flight | `InFlight`'s mutex |
//! | leases seen ending (refused callers) | the `dead` mutex |
//! | this member's identity and id seed | an `RwLock` and an atomic (changed on rejoin) |
//! | left the cluster | an atomic flag (and the emptied home table) |
//!
//! # Lock order
//!
//! A home shard's read lock → a context's `flc_lock` (the lock path; also closes and a
//! home's drop of a dead member's owners, which take a home's `peers` mutex first and
//! release it before the context). `Waiting`'s map → its table of early interrupts;
//! `Waiting`'s map → a `CallCtl` → a wait cell's leaf lock (interrupts). The shadow table's mutex → a shadow's `home` mutex; a shadow's
//! context is locked with neither held. A home shard's write lock → a context's
//! `flc_lock` (the idle check) and → `Returning`'s mutex (a give-back, and a claim's
//! insert). The identity's read lock → a home shard's write lock (a claim's insert).
//! The `claims` mutex → a home shard's read lock (a call's second look before it
//! claims). `InFlight`'s mutex → the directory's view (re-sends after missed events).
//! Every other mutex is a leaf. No lock is held across an `.await`.
//!
//! # Known limits
//!
//! * Two calls of one owner on one remote inode in flight at once may reach the shadow
//!   in another order than the home applied them (threads of one process locking one
//!   file concurrently): the shadow, and so a reclaim, may then differ from the home.
//! * A reclaimed lock that conflicts with one already re-created (members disagreeing
//!   about what was held) is not granted, only logged: its owner is not told.
//! * A failed flock conversion drops the file's flock from the shadow only after the
//!   home's answer: were the answer followed by a whole idle time (two sweeps) before
//!   that, a give-back and a new home's reclaim could re-create the dropped flock.
//! * A member cut off from a new home but not from etcd (it keeps its lease) holds up
//!   the inode's service there until it answers: serving without its locks could grant
//!   them twice. A stopped member holds it up for at most its lease.
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | the public face: [`ClusterLocks`], its ids | `cluster_locks.rs` |
//! | configuration | `config.rs` |
//! | what the parts share; the lock path | `service.rs` |
//! | claiming an inode, reclaim | `claim.rs` |
//! | giving back idle inodes (the sweep, returning inodes) | `give_back.rs` |
//! | closes (`posix_remove_owner`, `file_remove`) | `close.rs` |
//! | remote calls in flight (re-sent when a home dies) | `in_flight.rs` |
//! | one call as carried (`Request`), and its mirror in the shadow | `request.rs` |
//! | a call's interrupt and end: [`LockCall`] | `call.rs` |
//! | cluster-wide ids | `ids.rs` |
//! | inodes homed here | `homes.rs` |
//! | the shadow of locks held at remote homes | `shadow.rs` |
//! | lost locks (`EIO`) | `lost.rs` |
//! | waiting calls the service may end | `waiting.rs` |
//! | the peer protocol: wire types, conversions, connections | `peer.rs`, `proto/peer.proto` |
//! | the peer service (the home's side) | `server.rs` |
//! | directory events: dead members, lost homes, fencing | `events.rs` |
//! | deadlock detection across members | `waits.rs`; the cycle search both directories use: `wait_graph.rs` |
//! | counters | `stats.rs` |
//! | the primitives the loom models check (`vfscale-sync`'s) | `sync.rs` |
//! | the seam to etcd: [`Directory`] | `directory.rs`, `types.rs`, `error.rs`; joining: `etcd_join.rs` |
//! | the directory on etcd: [`etcd::EtcdDirectory`] (keys, watch, lease and fence clock) | `etcd/` (its first page maps its files) |
//! | an in-memory directory for tests | `memdir.rs` |

#![warn(missing_docs)]

mod call;
mod claim;
mod close;
mod cluster_locks;
mod config;
mod directory;
mod error;
pub mod etcd;
mod etcd_join;
mod events;
mod give_back;
mod homes;
mod ids;
mod in_flight;
mod lost;
#[doc(hidden)]
pub mod memdir;
mod peer;
mod request;
mod server;
mod service;
mod shadow;
mod stats;
mod sync;
mod types;
mod wait_graph;
mod waiting;
mod waits;

pub use call::{LockCall, LockDone};
pub use cluster_locks::{ClusterFile, ClusterLocks, ClusterProcess};
pub use config::{ClusterConfig, MIN_LEASE_TTL};
pub use directory::{BoxFuture, Directory, DirectoryStats, WaitCycle};
pub use error::ClusterError;
pub use give_back::HOME_IDLE;
pub use ids::{GlobalOwner, IdSeed};
pub use stats::ClusterStats;
pub use types::{DirectoryEvent, Home, InodeId, Member, PublishedEdge, WaitEdge};
