//! The `lockmany` workload — being built (see /work/notes/LAB_READY.md); until then every
//! target says why it cannot run.

use super::{Config, Sample, Skip, Target};

/// Whether `target` can run this workload here.
pub fn available(_target: Target) -> Result<(), Skip> {
    Err(Skip("not built yet".into()))
}

/// Measures `cfg` once on `target`.
pub fn run(_target: Target, _cfg: &Config) -> Result<Sample, Skip> {
    Err(Skip("not built yet".into()))
}
