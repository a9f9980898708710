//! Inode-cache scenarios (`docs/scenarios/icache.md`, the spec
//! `shared/specs/icache-scenarios.md`): replayable descriptions of inode-cache activity.
//! The kernel's inode cache cannot be driven from userspace, so the reference is a model
//! written from `fs/inode.c` ([`mod@reference`]); the library runner ([`library`]) drives
//! `vfscale-icache` itself, and the two result streams must be identical.

mod format;
pub mod library;
pub mod reference;

pub use format::*;
