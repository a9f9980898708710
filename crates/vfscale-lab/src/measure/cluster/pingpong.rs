//! Samba's `ping_pong` (Debian `ctdb`): `ping_pong FILE N` takes byte locks 0..N of
//! FILE in a ring, locking the next byte before unlocking the current one, so processes
//! that share FILE hand the locks to each other; each prints its own rate,
//! `%8u locks/sec\r`, once a second.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::measure::interrupt::interrupted;

/// Where Debian's `ctdb` puts it.
pub const PING_PONG: &str = "/usr/bin/ping_pong";

/// Readings a process prints before the measured ones: its first second includes its
/// start and the other processes' (alone on the file it runs without waiting).
const WARMUP_READINGS: usize = 1;

/// Whether `ping_pong` is installed.
pub fn available() -> Result<PathBuf, String> {
    let p = Path::new(PING_PONG);
    if p.is_file() {
        Ok(p.to_path_buf())
    } else {
        Err(format!("{PING_PONG} is missing (Debian: apt-get install ctdb)"))
    }
}

/// The rates in `ping_pong`'s output so far, in order (a last reading without its
/// `\r` is incomplete and left out).
pub fn readings(output: &str) -> Vec<f64> {
    let Some((done, _)) = output.rsplit_once('\r') else {
        return Vec::new();
    };
    done.split('\r')
        .filter_map(|r| r.trim().strip_suffix("locks/sec")?.trim().parse::<f64>().ok())
        .collect()
}

/// The `ping_pong` processes of one measurement; dropping kills and reaps them.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `ping_pong FILE locks` once per file of `files` (the same file seen through
/// different mounts) until each has printed `readings` measured rates after its
/// warm-up, and returns the sum over the processes of their mean measured rate.
pub fn run(bin: &Path, files: &[PathBuf], locks: u32, readings_wanted: usize) -> Result<f64, String> {
    let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let mut procs = Processes(Vec::with_capacity(files.len()));
    for (i, f) in files.iter().enumerate() {
        let mut child = Command::new(bin)
            .arg(f)
            .arg(locks.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mut out = child.stdout.take().expect("piped");
        procs.0.push(child);
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send((i, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let want = WARMUP_READINGS + readings_wanted;
    let mut text = vec![String::new(); files.len()];
    // A reading a second; a process that prints nothing for long is stuck.
    let deadline = Instant::now() + Duration::from_secs(want as u64 + 10);
    while text.iter().any(|t| readings(t).len() < want) {
        if interrupted() {
            return Err("interrupted".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok((i, bytes)) => text[i].push_str(&String::from_utf8_lossy(&bytes)),
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
            Err(_) => {
                let got: Vec<usize> = text.iter().map(|t| readings(t).len()).collect();
                return Err(format!(
                    "ping_pong on {} printed {got:?} readings in time, not {want} each (stuck on a lock?)",
                    files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" and ")
                ));
            }
        }
    }
    drop(procs);
    Ok(text
        .iter()
        .map(|t| {
            let r = readings(t);
            let measured = &r[WARMUP_READINGS..want];
            measured.iter().sum::<f64>() / measured.len() as f64
        })
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_the_complete_rates_in_order() {
        assert_eq!(
            readings(" 2657963 locks/sec\r 2832951 locks/sec\r   1234"),
            [2657963.0, 2832951.0]
        );
        assert_eq!(readings("     17 locks/sec\r"), [17.0]);
        assert!(readings("  99 locks/s").is_empty());
        assert!(readings("").is_empty());
    }

    #[test]
    fn two_processes_on_one_file_hand_locks_over() {
        let Ok(bin) = available() else {
            eprintln!("SKIP: {PING_PONG} is missing");
            return;
        };
        let dir =
            vfscale_conformance::harness::ScratchDir::create(Path::new("/dev/shm"), "pingpong").unwrap();
        let f = dir.path().join("f");
        let rate = run(&bin, &[f.clone(), f], 3, 1).unwrap();
        assert!(rate > 0.0, "{rate}");
    }
}
