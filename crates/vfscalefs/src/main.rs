//! `vfscalefs SOURCE MOUNTPOINT [MOUNTPOINT...] [-o OPTIONS] [--cluster ENDPOINTS ...]`:
//! serves SOURCE on every MOUNTPOINT in the foreground until they are all unmounted
//! (`umount`, or `SIGINT` / `SIGTERM` / `SIGHUP`, which unmount them all). Exit status 0
//! after a clean unmount, 1 when SOURCE or a mountpoint cannot be used, the cluster
//! cannot be joined or a connection fails, 2 on bad usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// A passthrough FUSE filesystem with server-side locks shared by all its mountpoints.
#[derive(Parser, Debug)]
#[command(name = "vfscalefs", version)]
struct Args {
    /// The directory to serve.
    source: PathBuf,
    /// Where to mount it (one or more; one lock manager for all).
    #[arg(required = true)]
    mountpoints: Vec<PathBuf>,
    /// Mount options, comma-separated: allow_other, ro, dev, suid, nopassthrough,
    /// threads=N (dispatch threads per mountpoint), nodispatch_gate (every thread reads
    /// /dev/fuse), ttl=MS (attribute and name cache), io_uring (carry requests over
    /// io_uring: Linux >= 6.14 with /sys/module/fuse/parameters/enable_uring=Y, else
    /// /dev/fuse as usual), io_uring_depth=N (entries per CPU queue, default 8; implies
    /// io_uring); README.md lists the rest.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Share one lock space with the other servers of a cluster, through these etcd
    /// endpoints (comma-separated, e.g. http://127.0.0.1:2379). Implies
    /// source_locks=off.
    #[arg(long, value_name = "ENDPOINTS")]
    cluster: Option<String>,
    /// Servers with the same cluster name share one lock space.
    #[arg(long, value_name = "NAME", default_value = "vfscale", requires = "cluster")]
    cluster_name: String,
    /// This server's name, unique in the cluster (default: HOSTNAME-PID).
    #[arg(long, value_name = "NAME", requires = "cluster")]
    node: Option<String>,
    /// Where the peer service listens (default: a free port on 127.0.0.1; give the
    /// host's address to serve other hosts). The bound address is published in etcd.
    #[arg(long, value_name = "ADDR", requires = "cluster")]
    peer_listen: Option<SocketAddr>,
    /// How long a server that stopped renewing its etcd lease keeps its locks, in
    /// seconds (at least 2).
    #[arg(long, value_name = "SECS", default_value_t = 5, requires = "cluster")]
    lease_ttl: u64,
    /// How long an inode whose locks this server keeps stays unused (no lock, no
    /// waiter) before the server gives it back, in seconds (fractions allowed; 0:
    /// never). A given-back inode costs etcd one claim when it is locked again.
    #[arg(long, value_name = "SECS", default_value_t = 5.0, requires = "cluster")]
    home_idle: f64,
}

impl Args {
    /// The cluster to join, if `--cluster` was given.
    fn cluster(&self) -> Result<Option<vfscalefs::ClusterConfig>, String> {
        let Some(list) = &self.cluster else {
            return Ok(None);
        };
        let endpoints =
            vfscalefs::ClusterConfig::parse_endpoints(list).map_err(|e| format!("--cluster: {e}"))?;
        let mut c = vfscalefs::ClusterConfig::new(endpoints);
        c.cluster_name = self.cluster_name.clone();
        c.node = self.node.clone();
        if let Some(a) = self.peer_listen {
            c.peer_listen = a;
        }
        if self.lease_ttl < 2 {
            return Err(format!("--lease-ttl {}: at least 2 seconds", self.lease_ttl));
        }
        c.lease_ttl = Duration::from_secs(self.lease_ttl);
        c.home_idle = Duration::try_from_secs_f64(self.home_idle)
            .map_err(|_| format!("--home-idle {}: a number of seconds, 0 or more", self.home_idle))?;
        c.validate().map_err(|e| format!("--cluster: {e}"))?;
        Ok(Some(c))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut opts = vfscalefs::Options::default();
    for o in &args.options {
        if let Err(e) = opts.parse_o(o) {
            eprintln!("vfscalefs: {e}");
            return ExitCode::from(2);
        }
    }
    let usage = args.cluster().and_then(|c| {
        opts.cluster = c;
        opts.source_locks().map(|_| ())
    });
    if let Err(e) = usage {
        eprintln!("vfscalefs: {e}");
        return ExitCode::from(2);
    }
    match vfscalefs::serve(&args.source, &args.mountpoints, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vfscalefs: {e}");
            ExitCode::from(1)
        }
    }
}
