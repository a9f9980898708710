//! `vfscalefs SOURCE MOUNTPOINT [MOUNTPOINT...] [-o OPTIONS]`: serves SOURCE on every
//! MOUNTPOINT in the foreground until they are all unmounted (`umount`, or `SIGINT` /
//! `SIGTERM` / `SIGHUP`, which unmount them all). Exit status 0 after a clean unmount,
//! 1 when SOURCE or a mountpoint cannot be used or a connection fails, 2 on bad usage.

use std::path::PathBuf;
use std::process::ExitCode;

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
    match vfscalefs::serve(&args.source, &args.mountpoints, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vfscalefs: {e}");
            ExitCode::from(1)
        }
    }
}
