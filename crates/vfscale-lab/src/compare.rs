//! Comparing two reports (placeholder, being written).
