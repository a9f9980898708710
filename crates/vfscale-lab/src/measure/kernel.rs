//! Kernel target (placeholder, being written).

use super::{Config, Sample, Skip};

/// Measures `cfg` once against the running kernel.
pub fn run(_cfg: &Config) -> Result<Sample, Skip> {
    Err(Skip("the kernel target is not written yet".into()))
}

/// Whether the kernel target can run here.
pub fn available() -> Result<(), Skip> {
    Err(Skip("the kernel target is not written yet".into()))
}
