//! Kernel runner: replays a lock scenario with real child processes (placeholder).
