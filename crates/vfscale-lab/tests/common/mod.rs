//! What the lab's command-line tests share.

use std::process::Output;

/// A finished command's stdout and stderr, for assertion messages and searches.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
