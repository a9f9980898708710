//! The vfscale lab: measure → result model → statistics → exporters, as hyperfine splits
//! it. The `vfscale` binary is a thin front over these modules.

#![warn(missing_docs)]

pub mod bench;
pub mod compare;
pub mod experiment;
pub mod export;
pub mod headline;
pub mod measure;
pub mod meta;
pub mod result;
pub mod stats;
