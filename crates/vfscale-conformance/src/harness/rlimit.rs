//! Resource limits a workload needs raised before it starts.

use std::io;

/// Raises the soft `RLIMIT_NOFILE` to at least `n`, and the hard limit too (as far as
/// `fs.nr_open`, which needs `CAP_SYS_RESOURCE`) when it is below `n`; or says why it
/// cannot.
pub fn raise_nofile(n: u64) -> io::Result<()> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("getrlimit: {e}")));
    }
    if rl.rlim_cur >= n {
        return Ok(());
    }
    if rl.rlim_max < n {
        let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(rl.rlim_max);
        if n > nr_open {
            return Err(io::Error::other(format!(
                "{n} open files needed, the system allows {} (fs.nr_open)",
                rl.rlim_max.max(nr_open)
            )));
        }
    }
    let want = libc::rlimit {
        rlim_cur: n,
        rlim_max: rl.rlim_max.max(n),
    };
    // SAFETY: setrlimit reads the local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "{n} open files needed, hard limit is {}: setrlimit(RLIMIT_NOFILE, {n}): {e}",
                rl.rlim_max
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_limit_is_enough() {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the local.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
        raise_nofile(rl.rlim_cur).unwrap();
        assert!(raise_nofile(u64::MAX).is_err());
    }
}
