//! vfscale's conformance side: everything that checks the libraries against Linux and
//! that no library user embeds.
//!
//! Each scenario format is a module with the same three parts:
//!
//! * the format (`Scenario::parse`, `render_results`): JSON Lines, one step per line,
//!   errors that name the line and the field ([`mod@format`]);
//! * the library runner (`library::replay`): the scenario driven through the library's
//!   public API, one thread, settling woken waiters after every step;
//! * the kernel runner (`kernel::replay`): the same steps as real system calls made by
//!   real child processes on a fresh tmpfs directory, so the two result streams can be
//!   compared.
//!
//! | module | format (docs/) | library |
//! |---|---|---|
//! | [`locks`] | `docs/scenarios/locks.md` | `vfscale-locks` |
//! | [`icache`] | `docs/scenarios/icache.md` | `vfscale-icache` (no kernel runner: the reference is a model of `fs/inode.c`) |
//! | [`fd`] | `docs/scenarios/fd.md` | `vfscale-fdtable` (its kernel runner drives the `vfscale-fd-child` binary of this crate) |
//! | [`loop_dev`] | `docs/scenarios/loop.md` | `vfscale-loop` (its kernel runner drives the real `/dev/loop-control` and `/dev/loopN` under an exclusive `flock`) |
//!
//! The corpora live at the repository root, `scenarios/<format>/`, each `X.jsonl` next to
//! the kernel's output `X.expected`.

#![warn(missing_docs)]

pub mod fd;
pub mod format;
pub mod harness;
pub mod icache;
pub mod locks;
pub mod loop_dev;
