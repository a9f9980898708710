//! The `cluster` workload: several vfscalefs servers, one lock space on etcd.
//!
//! The rig (`Rig`): a 3-member etcd on loopback ports with its data on tmpfs
//! (`vfscale_conformance::etcd::EtcdCluster`), one source directory under `/dev/shm`,
//! and three vfscalefs servers over it, each on its own mountpoint: `a` and `b` with
//! `--cluster ENDPOINTS --node NAME --lease-ttl N`, and `single`, one server without
//! `--cluster` (and with `-o source_locks=off`, as a clustered server defaults to, so the
//! two differ in the cluster alone). The rig is set up at the first run and kept for the
//! repetitions until [`release`]; everything goes on drop, also on an error path, a
//! panic or `SIGINT`/`SIGTERM`/`SIGHUP` (the signal asks the run to stop; the rig's
//! guard raises it again once the servers are stopped, their mounts gone and etcd
//! stopped). Servers and etcd members also die with the lab (`PR_SET_PDEATHSIG`).
//!
//! One run measures every selected mode (rows by mode), each on files of its own that
//! no earlier run used, so every run engages the cluster anew:
//!
//! | mode | what | metrics |
//! |---|---|---|
//! | `uncontended` | one process locks and unlocks a file through `a`, and through `single`, in alternating slices (`uncontended.rs`) | `uncontended_ratio` (a's rate over single's), `etcd_txns_per_lock` (etcd KV requests over a's locks, the first one included: it claims the file's home, untimed), `cluster_locks_per_sec`, `single_locks_per_sec` |
//! | `pingpong` | `ping_pong FILE 3`, one process through `a`, one through `b` (`pingpong.rs`); then one client's serial compare-and-swap transactions against the same etcd (`etcd_load.rs`) | `locks_per_sec` (sum over the processes), `etcd_txn_per_sec`, `etcd_txns_per_lock` |
//! | `failover` | a holder through `a`, a waiter through `b`; `a` is killed (`failover.rs`), then started again as a new member | `failover_sec`, `lease_ttl_sec` |
//!
//! etcd requests are read off the members' `/metrics` (`etcd_load.rs`), so the figure
//! needs no cooperation from the servers and counts everything they sent.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use vfscale_conformance::etcd::EtcdCluster;
use vfscale_conformance::harness::mono_ns;

use super::interrupt::{interrupted, SignalGuard};
use super::{Config, Sample, Skip, Target, SHM_DIR};

pub mod etcd_load;
pub mod failover;
pub mod pingpong;
pub mod server;
pub mod uncontended;

use server::Server;

/// The modes, in report order.
pub const MODES: [&str; 3] = ["uncontended", "pingpong", "failover"];

/// `--lease-ttl`'s default, the servers' own.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// The shortest lease a server accepts.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// The `fs` column of the workload's rows.
pub const FS: &str = "fuse.vfscalefs --cluster, source on tmpfs";

/// The byte locks of `ping_pong FILE N` (the issue's, and Samba's usual, 3).
const PING_PONG_LOCKS: u32 = 3;

/// One turn of a side in uncontended.
const UNCONTENDED_SLICE: Duration = Duration::from_millis(50);

/// How long the waiter may wait for its grant past the lease, before a failover
/// counts as failed.
const FAILOVER_SLACK: Duration = Duration::from_secs(15);

/// Whether the workload can run here: root, `/dev/fuse`, etcd and a vfscalefs that
/// takes `--cluster` (ping_pong is checked by its mode, which alone needs it).
pub fn available(target: Target) -> Result<(), Skip> {
    if target != Target::Kernel {
        return Err(Skip(format!("cluster has no {} target", target.name())));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Skip("needs root (it mounts vfscalefs servers)".into()));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err(Skip("no /dev/fuse".into()));
    }
    EtcdCluster::available().map_err(Skip)?;
    let bin = server::binary().map_err(Skip)?;
    if !server::has_flag(&bin, "--cluster").map_err(Skip)? {
        return Err(Skip(format!(
            "{} has no --cluster (an older build?)",
            bin.display()
        )));
    }
    Ok(())
}

/// What a run keeps: etcd, the servers and where they serve.
struct Rig {
    /// Field order is drop order: servers leave while etcd is up, the directories go
    /// once nothing is mounted on them, and the signal guard (which raises a signal
    /// that came) goes last.
    a: Option<Server>,
    b: Option<Server>,
    single: Option<Server>,
    etcd: EtcdCluster,
    dirs: RigDirs,
    bin: PathBuf,
    lease_ttl: Duration,
    /// Servers started so far (each new `a` is a new member, `a2`, `a3`, ...).
    starts: usize,
    /// Runs so far: each run's files are new.
    runs: usize,
    _signals: SignalGuard,
}

/// The rig's directories under `/dev/shm`: `src` and one mountpoint per server.
struct RigDirs {
    base: PathBuf,
}

impl RigDirs {
    fn create() -> Result<RigDirs, String> {
        let base = PathBuf::from(SHM_DIR).join(format!("vfscale-cluster-{}", std::process::id()));
        for d in ["src", "a", "b", "single"] {
            std::fs::create_dir_all(base.join(d)).map_err(|e| format!("{}: {e}", base.join(d).display()))?;
        }
        Ok(RigDirs { base })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }
}

impl Drop for RigDirs {
    fn drop(&mut self) {
        // Never a recursive removal through a mount: the mountpoints must be empty
        // directories by now, and only `src` is removed with what is in it.
        for m in ["a", "b", "single"] {
            let p = self.path(m);
            server::unmount(&p);
            let _ = std::fs::remove_dir(&p);
        }
        let _ = std::fs::remove_dir_all(self.path("src"));
        let _ = std::fs::remove_dir(&self.base);
        for m in ["a.log", "b.log", "single.log"] {
            let _ = std::fs::remove_file(self.path(m));
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

impl Rig {
    fn start(lease_ttl: Duration) -> Result<Rig, String> {
        let signals = SignalGuard::install(None);
        let bin = server::binary()?;
        let dirs = RigDirs::create()?;
        let etcd = EtcdCluster::start(3).map_err(|e| format!("etcd: {e}"))?;
        let mut rig = Rig {
            a: None,
            b: None,
            single: None,
            etcd,
            dirs,
            bin,
            lease_ttl,
            starts: 0,
            runs: 0,
            _signals: signals,
        };
        rig.b = Some(rig.start_clustered("b")?);
        rig.a = Some(rig.start_clustered("a")?);
        let single = Server::start(
            "single",
            &rig.bin,
            &rig.dirs.path("src"),
            &rig.dirs.path("single"),
            &["-o".into(), "source_locks=off".into()],
            &rig.dirs.path("single.log"),
        )?;
        rig.single = Some(single);
        Ok(rig)
    }

    /// Starts a clustered server on mountpoint `mnt` as a new member.
    fn start_clustered(&mut self, mnt: &str) -> Result<Server, String> {
        self.starts += 1;
        let node = format!("{mnt}{}", self.starts);
        let args = vec![
            "--cluster".to_string(),
            self.etcd.endpoints_arg(),
            "--node".into(),
            node,
            "--lease-ttl".into(),
            self.lease_ttl.as_secs().to_string(),
        ];
        Server::start(
            mnt,
            &self.bin,
            &self.dirs.path("src"),
            &self.dirs.path(mnt),
            &args,
            &self.dirs.path(&format!("{mnt}.log")),
        )
    }

    /// One run's file `name` as server `s` shows it, while it runs.
    fn file(s: &Option<Server>, name: &str) -> Result<PathBuf, String> {
        s.as_ref()
            .map(|s| s.mnt().join(name))
            .ok_or_else(|| "a server of the rig is not running (it did not start again)".into())
    }

    fn uncontended(&self, secs: Duration, sample: &mut Sample) -> Result<(), String> {
        let name = format!("uncontended-{}", self.runs);
        let test = uncontended::LockFile::open(&Rig::file(&self.a, &name)?)?;
        let base = uncontended::LockFile::open(&Rig::file(&self.single, &name)?)?;
        let endpoints = self.etcd.endpoints();
        let before = etcd_load::kv_requests(&endpoints)?;
        // The first lock on the file claims its home in etcd: counted, not timed.
        test.warm_up()?;
        base.warm_up()?;
        // Short slices, alternated, so that a burst of the machine's other work falls
        // on both sides alike.
        let slices = (secs.as_secs_f64() / (2.0 * UNCONTENDED_SLICE.as_secs_f64()))
            .round()
            .max(2.0);
        let sides = uncontended::alternate(&test, &base, UNCONTENDED_SLICE, slices as usize)?;
        let requests = etcd_load::kv_requests(&endpoints)?.saturating_sub(before);
        let locks = sides.test.0 + 1;
        let m = "uncontended";
        sample.insert_in(
            m,
            "uncontended_ratio".into(),
            sides.test_rate() / sides.base_rate(),
        );
        sample.insert_in(m, "etcd_txns_per_lock".into(), requests as f64 / locks as f64);
        sample.insert_in(m, "cluster_locks_per_sec".into(), sides.test_rate());
        sample.insert_in(m, "single_locks_per_sec".into(), sides.base_rate());
        Ok(())
    }

    fn pingpong(&self, secs: Duration, sample: &mut Sample) -> Result<(), String> {
        let bin = pingpong::available()?;
        let name = format!("pingpong-{}", self.runs);
        let files = [Rig::file(&self.a, &name)?, Rig::file(&self.b, &name)?];
        let endpoints = self.etcd.endpoints();
        let before = etcd_load::kv_requests(&endpoints)?;
        let readings = secs.as_secs().max(1) as usize;
        let rate = pingpong::run(&bin, &files, PING_PONG_LOCKS, readings)?;
        let requests = etcd_load::kv_requests(&endpoints)?.saturating_sub(before);
        // The locks of the whole time the processes ran, warm-up included, roughly.
        let locks = rate * (readings + 1) as f64;
        let reference = etcd_load::serial_cas_rate(
            &endpoints,
            &format!("/vfscale-lab/reference-{}", self.runs),
            (secs / 3).max(Duration::from_millis(300)),
        )?;
        let m = "pingpong";
        sample.insert_in(m, "locks_per_sec".into(), rate);
        sample.insert_in(m, "etcd_txn_per_sec".into(), reference);
        sample.insert_in(m, "etcd_txns_per_lock".into(), requests as f64 / locks.max(1.0));
        Ok(())
    }

    fn failover(&mut self, sample: &mut Sample) -> Result<(), String> {
        let name = format!("failover-{}", self.runs);
        let (holder, waiter) = (Rig::file(&self.a, &name)?, Rig::file(&self.b, &name)?);
        let Some(mut a) = self.a.take() else {
            return Err("server a is not running".into());
        };
        let secs = failover::measure(
            &holder,
            &waiter,
            |_| {
                let t = mono_ns();
                a.kill();
                t
            },
            self.lease_ttl + FAILOVER_SLACK,
        );
        drop(a);
        // The next run needs an `a` again, whatever this one found.
        let restart = self.start_clustered("a").map(|s| self.a = Some(s));
        let secs = secs?;
        sample.insert_in("failover", "failover_sec".into(), secs);
        sample.insert_in("failover", "lease_ttl_sec".into(), self.lease_ttl.as_secs_f64());
        restart.map_err(|e| format!("server a did not start again: {e}"))
    }
}

/// The rig, kept between the runs of one plan.
static RIG: Mutex<Option<Rig>> = Mutex::new(None);

/// Drops the rig: the runs are over.
pub fn release() {
    let rig = RIG.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(rig);
}

/// Measures `cfg`'s modes once (rows by mode).
pub fn run(cfg: &Config) -> Result<Sample, Skip> {
    if cfg.lease_ttl < MIN_LEASE_TTL {
        return Err(Skip(format!("a lease TTL under {MIN_LEASE_TTL:?}")));
    }
    let mut guard = RIG.lock().unwrap_or_else(|e| e.into_inner());
    let stale = guard.as_ref().is_some_and(|r| r.lease_ttl != cfg.lease_ttl);
    if stale {
        *guard = None;
    }
    if guard.is_none() {
        *guard = Some(Rig::start(cfg.lease_ttl).map_err(Skip)?);
    }
    let rig = guard.as_mut().expect("just started");
    rig.runs += 1;
    let mut sample = Sample::new();
    let duration = if cfg.duration.is_zero() {
        Duration::from_secs(1)
    } else {
        cfg.duration
    };
    for mode in &cfg.modes {
        let r = match *mode {
            "uncontended" => rig.uncontended(duration, &mut sample),
            "pingpong" => rig.pingpong(duration, &mut sample),
            "failover" => rig.failover(&mut sample),
            m => Err(format!("cluster has no mode {m}")),
        };
        if interrupted() {
            // Stop here: dropping the rig stops everything and raises the signal.
            *guard = None;
            return Err(Skip("interrupted".into()));
        }
        if let Err(why) = r {
            sample.skip(format!("{mode}: {why}"));
        }
    }
    if rig.a.is_none() {
        // `a` did not start again after a failover: the next run starts a new rig.
        *guard = None;
    }
    Ok(sample)
}
