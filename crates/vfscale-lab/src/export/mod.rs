//! Exporters, one file per format (placeholder, being written).
