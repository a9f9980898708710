//! vfscale's conformance side: everything that checks the libraries against Linux and
//! that no library user embeds.
//!
//! Each scenario format is a module with the same parts, in files of the same names:
//!
//! * `format.rs`, the format (`Scenario::parse`, `render_results`): JSON Lines, one step
//!   per line, errors that name the line and the field (what all formats share is the
//!   crate's [`mod@format`]);
//! * `library.rs`, the library runner (`library::replay`): the scenario driven through
//!   the library's public API, one thread, settling woken waiters after every step;
//! * `kernel.rs`, the kernel runner (`kernel::replay`): the same steps as real system
//!   calls made by real child processes on a fresh tmpfs directory, so the two result
//!   streams can be compared;
//! * `reference.rs`, a reference model written from the kernel's source, where the
//!   kernel cannot be asked: always for the inode cache (userspace cannot drive it),
//!   and for loop devices without root.
//!
//! | module | format (docs/) | library |
//! |---|---|---|
//! | [`locks`] | `docs/scenarios/locks.md` | `vfscale-locks` |
//! | [`icache`] | `docs/scenarios/icache.md` | `vfscale-icache` (no kernel runner: the reference is a model of `fs/inode.c`) |
//! | [`fd`] | `docs/scenarios/fd.md` | `vfscale-fdtable` (its kernel runner drives the `vfscale-fd-child` binary of this crate) |
//! | [`loop_dev`] | `docs/scenarios/loop.md` | `vfscale-loop` (its kernel runner drives the real `/dev/loop-control` and `/dev/loopN` under an exclusive `flock`) |
//!
//! ## Where to find what
//!
//! | concept | file |
//! |---|---|
//! | JSON Lines reading, `ScenarioError`, what the formats share | `src/format.rs` |
//! | lock scenarios: format / library / kernel runner | `src/locks/{format,library,kernel}.rs` |
//! | lock replays across a source and its vfscalefs mounts | `src/locks/mixed.rs` |
//! | descriptor scenarios: format / library / kernel runner | `src/fd/{format,library,kernel}.rs` |
//! | the kernel runner's scenario process | `src/bin/vfscale-fd-child.rs` |
//! | inode-cache scenarios: format / library runner | `src/icache/{format,library}.rs` |
//! | the `fs/inode.c` reference model | `src/icache/reference.rs` |
//! | loop scenarios: format / library / kernel runner | `src/loop_dev/{format,library,kernel}.rs` |
//! | the `drivers/block/loop.c` reference model | `src/loop_dev/reference.rs` |
//!
//! The corpora live at the repository root, `scenarios/<format>/`, each `X.jsonl` next to
//! the kernel's output `X.expected`.

#![warn(missing_docs)]

pub mod etcd;
pub mod fd;
pub mod format;
pub mod harness;
pub mod icache;
pub mod locks;
pub mod loop_dev;
