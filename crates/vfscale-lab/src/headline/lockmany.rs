//! The `lockmany` experiment's headline — being built with its workload (see
//! /work/notes/LAB_READY.md).

use super::Finding;
use crate::result::Report;

/// The experiment's lines (none until its workload is built).
pub fn findings(_report: &Report) -> Vec<Finding> {
    Vec::new()
}
