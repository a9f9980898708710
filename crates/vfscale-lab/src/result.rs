//! The result model: what a measurement produces and every exporter reads.
//!
//! One [`Report`] per run: the machine it ran on ([`Meta`]) and one [`Row`] per measured
//! configuration (workload × target × mode × tasks), each metric summarized over the
//! repeated runs ([`Summary`]).

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::measure::Target;

use crate::stats;

/// Where a result was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// `nproc`: CPUs available to the run.
    pub nproc: usize,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The vfscale commit (`git rev-parse --short HEAD`, or `unknown`).
    pub commit: String,
    /// When the run started, UTC, RFC 3339.
    pub date: String,
    /// The command line that produced it.
    pub command: String,
}

/// One metric over the repeated runs of a configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Arithmetic mean (harmonic mean for rates: see [`Metric::is_rate`]).
    pub mean: f64,
    /// Sample standard deviation (0 for one sample).
    pub stddev: f64,
    /// Number of samples.
    pub n: usize,
    /// 95% confidence interval of the mean (Student t), `[low, high]`.
    pub ci95: [f64; 2],
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Indices of samples flagged as outliers (modified Z-score > 3.5). Shown, never dropped.
    pub outliers: Vec<usize>,
    /// The samples, in run order.
    pub samples: Vec<f64>,
}

impl Summary {
    /// Summarizes `samples` of metric `metric` (a [`Metric`] or its name).
    pub fn of(metric: impl AsRef<str>, samples: &[f64]) -> Summary {
        stats::summarize(samples, Metric::from(metric.as_ref()).is_rate())
    }
}

/// A metric's name (`ops_per_sec`, `set_unset_ns`, ...), which says what it measures:
/// its [`Unit`], whether it is a rate and which way is better all follow from it, here
/// and nowhere else. Compares and borrows as its name, so a row's metrics can be looked
/// up by a `&str`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metric(Cow<'static, str>);

impl Metric {
    /// The metric named `name`.
    pub const fn named(name: &'static str) -> Metric {
        Metric(Cow::Borrowed(name))
    }

    // The metrics the headline and the exporters read by name.
    /// `ops_per_sec`.
    pub const OPS_PER_SEC: &'static Metric = &Metric::named("ops_per_sec");
    /// `total_lock_seconds`.
    pub const TOTAL_LOCK_SECONDS: &'static Metric = &Metric::named("total_lock_seconds");
    /// `set_unset_ns`.
    pub const SET_UNSET_NS: &'static Metric = &Metric::named("set_unset_ns");
    /// `acquisitions_per_sec`.
    pub const ACQUISITIONS_PER_SEC: &'static Metric = &Metric::named("acquisitions_per_sec");
    /// `lock_wait_sec`.
    pub const LOCK_WAIT_SEC: &'static Metric = &Metric::named("lock_wait_sec");
    /// `jain_index`.
    pub const JAIN_INDEX: &'static Metric = &Metric::named("jain_index");
    /// `getlk_ns`.
    pub const GETLK_NS: &'static Metric = &Metric::named("getlk_ns");
    /// `ctl_lock_acquisitions_per_op`.
    pub const CTL_LOCK_ACQUISITIONS_PER_OP: &'static Metric = &Metric::named("ctl_lock_acquisitions_per_op");
    /// `bytes_per_inode`.
    pub const BYTES_PER_INODE: &'static Metric = &Metric::named("bytes_per_inode");
    /// `wait_p99_sec`.
    pub const WAIT_P99_SEC: &'static Metric = &Metric::named("wait_p99_sec");
    /// `unused_inodes`.
    pub const UNUSED_INODES: &'static Metric = &Metric::named("unused_inodes");
    /// `table_lock_acquisitions_per_install`.
    pub const TABLE_LOCK_ACQUISITIONS_PER_INSTALL: &'static Metric =
        &Metric::named("table_lock_acquisitions_per_install");
    /// `min_per_worker`.
    pub const MIN_PER_WORKER: &'static Metric = &Metric::named("min_per_worker");
    /// `llc_bytes`.
    pub const LLC_BYTES: &'static Metric = &Metric::named("llc_bytes");
    /// `left_after_umount`.
    pub const LEFT_AFTER_UMOUNT: &'static Metric = &Metric::named("left_after_umount");
    /// `global_lock_acquisitions_per_op`.
    pub const GLOBAL_LOCK_ACQUISITIONS_PER_OP: &'static Metric =
        &Metric::named("global_lock_acquisitions_per_op");
    /// `evicted_inodes`.
    pub const EVICTED_INODES: &'static Metric = &Metric::named("evicted_inodes");
    /// `evict_ns_per_inode`.
    pub const EVICT_NS_PER_INODE: &'static Metric = &Metric::named("evict_ns_per_inode");
    /// `direct_ops_per_sec`.
    pub const DIRECT_OPS_PER_SEC: &'static Metric = &Metric::named("direct_ops_per_sec");
    /// `devices`.
    pub const DEVICES: &'static Metric = &Metric::named("devices");
    /// `data_bytes_per_inode`.
    pub const DATA_BYTES_PER_INODE: &'static Metric = &Metric::named("data_bytes_per_inode");
    /// `bytes_per_lock`.
    pub const BYTES_PER_LOCK: &'static Metric = &Metric::named("bytes_per_lock");
    /// `wakeups_per_acquisition`.
    pub const WAKEUPS_PER_ACQUISITION: &'static Metric = &Metric::named("wakeups_per_acquisition");
    /// `table_lock_acquisitions_per_lookup`.
    pub const TABLE_LOCK_ACQUISITIONS_PER_LOOKUP: &'static Metric =
        &Metric::named("table_lock_acquisitions_per_lookup");
    /// `mean_per_worker`.
    pub const MEAN_PER_WORKER: &'static Metric = &Metric::named("mean_per_worker");
    /// `loads_per_distinct_inode`.
    pub const LOADS_PER_DISTINCT_INODE: &'static Metric = &Metric::named("loads_per_distinct_inode");
    /// `inode_bytes_per_inode`.
    pub const INODE_BYTES_PER_INODE: &'static Metric = &Metric::named("inode_bytes_per_inode");
    /// `hash_table_bytes_per_inode`.
    pub const HASH_TABLE_BYTES_PER_INODE: &'static Metric = &Metric::named("hash_table_bytes_per_inode");

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Whether it is a rate (per second), averaged with the harmonic mean.
    pub fn is_rate(&self) -> bool {
        self.unit() == Unit::Rate
    }

    /// What it measures, read off its name: the lab's one unit classifier.
    pub fn unit(&self) -> Unit {
        let name = self.name();
        if name.ends_with("_per_sec") {
            Unit::Rate
        } else if name.ends_with("_seconds") || name.ends_with("_sec") {
            Unit::Seconds
        } else if name.ends_with("_ns") {
            Unit::Nanoseconds
        } else if name.ends_with("_bytes") || name.starts_with("bytes_per_") {
            Unit::Bytes
        } else {
            Unit::Plain
        }
    }

    /// Whether larger is better (rates and counts of work done), for comparisons.
    pub fn higher_is_better(&self) -> bool {
        let name = self.name();
        name.ends_with("_per_sec") || name.ends_with("_per_worker")
    }
}

impl From<&str> for Metric {
    fn from(name: &str) -> Metric {
        Metric(Cow::Owned(name.to_string()))
    }
}

impl From<String> for Metric {
    fn from(name: String) -> Metric {
        Metric(Cow::Owned(name))
    }
}

impl From<&Metric> for Metric {
    fn from(m: &Metric) -> Metric {
        m.clone()
    }
}

impl AsRef<str> for Metric {
    fn as_ref(&self) -> &str {
        self.name()
    }
}

impl Borrow<str> for Metric {
    fn borrow(&self) -> &str {
        self.name()
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a metric measures, read off its name by [`Metric::unit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Per second (`*_per_sec`): `12.6 M/s`.
    Rate,
    /// Seconds (`*_seconds`, `*_sec`): `93.1 ns`, `1.25 s`.
    Seconds,
    /// Nanoseconds (`*_ns`): shown as a time, `1.45 µs`.
    Nanoseconds,
    /// Bytes (`*_bytes`, `bytes_per_*`): `96 B`, `1.50 KiB`.
    Bytes,
    /// A plain number (counts, counters per operation, ratios): `0.0014`, `431 k`.
    Plain,
}

impl Unit {
    /// The unit's symbol, as results.csv's `unit` column carries it: `1/s`, `s`, `ns`,
    /// `B`, or nothing.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Rate => "1/s",
            Unit::Seconds => "s",
            Unit::Nanoseconds => "ns",
            Unit::Bytes => "B",
            Unit::Plain => "",
        }
    }

    /// The unit as a column header shows it: `1/s`, `s`, `B`, or nothing.
    pub fn header(self) -> &'static str {
        match self {
            Unit::Rate => "/s",
            Unit::Seconds | Unit::Nanoseconds => "time",
            Unit::Bytes => "B",
            Unit::Plain => "",
        }
    }
}

/// One measured configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The workload (`herd`, `posix01`, ...).
    pub workload: String,
    /// The system measured (written by its name: `kernel`, `library`, ...).
    #[serde(with = "target_name")]
    pub target: Target,
    /// The lock mode (`flock`, `ofd`, `posix`), or the task kind (`processes`, `threads`).
    pub mode: String,
    /// Number of tasks.
    pub tasks: usize,
    /// Locks held on the file (lockmany).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// Files per task (inodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    /// The filesystem a kernel target ran on: its type and mount source
    /// (`tmpfs tmpfs`, `fuse.vfscalefs /srv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<String>,
    /// Every metric, by its name.
    #[serde(flatten)]
    pub metrics: BTreeMap<Metric, Summary>,
}

impl Row {
    /// A row of one configuration with no size, filesystem or metrics yet.
    pub fn new(workload: &str, target: Target, mode: &str, tasks: usize) -> Row {
        Row {
            workload: workload.into(),
            target,
            mode: mode.into(),
            tasks,
            held: None,
            files: None,
            fs: None,
            metrics: BTreeMap::new(),
        }
    }

    /// The configuration as one string, for messages and matching rows across reports.
    pub fn key(&self) -> String {
        let mut k = format!(
            "{}/{}/{}/{}",
            self.workload,
            self.target.name(),
            self.mode,
            self.tasks
        );
        if let Some(h) = self.held {
            k.push_str(&format!("/held={h}"));
        }
        if let Some(f) = self.files {
            k.push_str(&format!("/files={f}"));
        }
        if let Some(fs) = &self.fs {
            k.push_str(&format!("/fs={fs}"));
        }
        k
    }

    /// The size column a table shows for this row: `held` or `files`, when set.
    pub fn size(&self) -> Option<u64> {
        self.held.or(self.files)
    }
}

/// A whole run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The machine.
    pub meta: Meta,
    /// One row per configuration.
    pub results: Vec<Row>,
    /// Configurations that could not run here, with why.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

/// A configuration that was not measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// The workload.
    pub workload: String,
    /// The target.
    #[serde(with = "target_name")]
    pub target: Target,
    /// Why.
    pub reason: String,
}

/// A [`Target`] in results.json and results.csv: by its name, as the command line takes it.
pub mod target_name {
    use serde::{de, Deserialize, Deserializer, Serializer};

    use crate::measure::Target;

    /// Writes the target's name.
    pub fn serialize<S: Serializer>(t: &Target, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.name())
    }

    /// Reads a target's name.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Target, D::Error> {
        let name = String::deserialize(d)?;
        Target::from_name(&name).ok_or_else(|| de::Error::custom(format!("unknown target `{name}`")))
    }
}
