//! The cluster's log on the server's stderr: what `vfscale-cluster` reports through
//! `tracing` at `INFO` and above (joining, members gone, homes claimed and locks
//! reclaimed, fencing, rejoining, peers that do not answer), one line per event:
//! `vfscalefs: cluster: LEVEL message key=value ...`. Installed only under `--cluster`;
//! other crates' events are not shown.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The crate whose events are shown.
const TARGET: &str = "vfscale_cluster";

/// Shows the cluster's events on stderr from now on (once per process; a subscriber
/// set before stays).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(ClusterLog);
}

struct ClusterLog;

/// An event's message and fields, as one line.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for ClusterLog {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::INFO && m.target().starts_with(TARGET)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }

    // No spans are kept: every span is the same, unused one.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        eprintln!(
            "vfscalefs: cluster: {} {}{}",
            event.metadata().level(),
            line.message,
            line.fields
        );
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
