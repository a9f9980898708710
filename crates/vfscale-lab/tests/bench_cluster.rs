//! `vfscale bench cluster`: its flags, the etcd side of its figures, a whole run and an
//! interrupted one, which must leave no server, mount, etcd member or directory behind.
//!
//! The runs use `$VFSCALEFS`, or the vfscalefs next to `vfscale` when it takes
//! `--cluster`; otherwise a stand-in: a script that drops the cluster flags and starts a plain
//! vfscalefs, whose servers share locks through the source (`source_locks=mirror`), so
//! that the lab's set-up, modes and tear-down are tested before a clustered server
//! exists. They say `SKIP` without root, /dev/fuse, etcd, ping_pong or any vfscalefs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vfscale_lab::measure::cluster::{etcd_load, pingpong, server};

mod common;
use common::text;

fn vfscale() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vfscale"))
}

#[test]
fn flags_are_checked() {
    for (args, says) in [
        (&["--lease-ttl", "1"][..], "--lease-ttl"),
        (
            &["--mode", "bogus"][..],
            "cluster has modes uncontended, pingpong, failover",
        ),
        (&["--tasks", "3"][..], "no --tasks or --dir"),
    ] {
        let o = vfscale().args(["bench", "cluster"]).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    let o = vfscale()
        .args(["bench", "herd", "--lease-ttl", "5"])
        .output()
        .unwrap();
    assert!(
        text(&o).contains("--lease-ttl applies to cluster, not herd"),
        "{}",
        text(&o)
    );
}

#[test]
fn etcd_counts_the_reference_clients_requests() {
    use vfscale_conformance::etcd::EtcdCluster;
    if let Err(why) = EtcdCluster::available() {
        eprintln!("SKIP: {why}");
        return;
    }
    let etcd = EtcdCluster::start(3).unwrap();
    let e = etcd.endpoints();
    let before = etcd_load::kv_requests(&e).unwrap();
    let secs = Duration::from_millis(500);
    let rate = etcd_load::serial_cas_rate(&e, "/vfscale-lab-test/cas", secs).unwrap();
    let after = etcd_load::kv_requests(&e).unwrap();
    assert!(rate > 0.0, "{rate}");
    // One put, the transactions, one delete: each counted once, at one member.
    let txns = (rate * secs.as_secs_f64()).round() as u64;
    let counted = after - before;
    assert!(
        counted + 2 >= txns && counted <= txns + 10,
        "{counted} requests counted for about {txns} transactions"
    );
}

/// Why the whole-run tests cannot run here, if they cannot.
fn whole_run_missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (mounts)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    if let Err(why) = vfscale_conformance::etcd::EtcdCluster::available() {
        return Some(why);
    }
    pingpong::available().err()
}

/// The stand-in's directory (removed on drop).
struct StandIn(PathBuf);

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `$VFSCALEFS` for a run: none when the test's own `$VFSCALEFS` names a server or
/// the vfscalefs next to vfscale takes --cluster, else a stand-in over a plain
/// vfscalefs of this build; `Err` when there is none.
fn vfscalefs_env() -> Result<Option<StandIn>, String> {
    if std::env::var_os("VFSCALEFS").is_some() {
        return Ok(None);
    }
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_vfscale"));
    let dir = exe.parent().unwrap();
    let next = dir.join("vfscalefs");
    if next.is_file() && server::has_flag(&next, "--cluster")? {
        return Ok(None);
    }
    let plain = [next, dir.join("../release/vfscalefs")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or("no vfscalefs built (cargo build -p vfscalefs)")?;
    let d = std::env::temp_dir().join(format!(
        "vfscale-standin-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    let script = format!(
        "#!/bin/sh\n\
         [ \"$1\" = --help ] && {{ echo '--cluster ENDPOINTS (stand-in)'; exit 0; }}\n\
         s=$1 m=$2; shift 2\n\
         while [ $# -gt 0 ]; do case $1 in --cluster|--node|--lease-ttl) shift 2;; *) break;; esac; done\n\
         exec {} \"$s\" \"$m\" \"$@\"\n",
        plain.canonicalize().map_err(|e| e.to_string())?.display()
    );
    let p = d.join("vfscalefs");
    std::fs::write(&p, script).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    Ok(Some(StandIn(d)))
}

fn bench(env: &Option<StandIn>, args: &[&str]) -> Command {
    let mut c = vfscale();
    c.args(["bench", "cluster"]).args(args);
    if let Some(s) = env {
        c.env("VFSCALEFS", s.0.join("vfscalefs"));
    }
    c
}

/// What a run of process `pid` could have left: mounts, directories, processes.
fn leftovers(pid: u32) -> Vec<String> {
    let mut left = Vec::new();
    let rig = format!("vfscale-cluster-{pid}");
    let etcd = format!("vfscale-etcd-{pid}-");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(info.lines().filter(|l| l.contains(&rig)).map(str::to_string));
    for e in std::fs::read_dir("/dev/shm").unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        if n == rig || n.starts_with(&etcd) {
            left.push(format!("/dev/shm/{n}"));
        }
    }
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&rig) || cmd.contains(&etcd) {
            left.push(cmd);
        }
    }
    left
}

/// One whole run at a time: each starts its own etcd and servers.
static RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What a whole run needs: the `$VFSCALEFS` to give it and the turn to run; `None`
/// (having said `SKIP` and why) when it cannot run here.
fn whole_run() -> Option<(Option<StandIn>, std::sync::MutexGuard<'static, ()>)> {
    let env = whole_run_missing().map_or_else(vfscalefs_env, Err);
    match env {
        Ok(env) => Some((env, RUNS.lock().unwrap_or_else(|e| e.into_inner()))),
        Err(why) => {
            eprintln!("SKIP: {why}");
            None
        }
    }
}

#[test]
fn a_run_measures_every_mode_and_leaves_nothing() {
    let Some((env, _one)) = whole_run() else {
        return;
    };
    let child = bench(
        &env,
        &["--json", "--runs", "1", "--duration", "1", "--lease-ttl", "2"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["skipped"], serde_json::json!([]), "{}", text(&o));
    let rows = v["results"].as_array().unwrap();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["uncontended", "pingpong", "failover"], "{}", text(&o));
    let mean = |mode: &str, m: &str| {
        let r = rows.iter().find(|r| r["mode"] == mode).unwrap();
        r[m]["mean"].as_f64().unwrap_or_else(|| panic!("{mode} {m}: {r}"))
    };
    for r in rows {
        assert_eq!(r["workload"], "cluster");
        assert_eq!(r["target"], "kernel");
    }
    assert!(mean("uncontended", "uncontended_ratio") > 0.0);
    assert!(mean("uncontended", "etcd_txns_per_lock") >= 0.0);
    assert!(mean("pingpong", "locks_per_sec") > 0.0);
    assert!(mean("pingpong", "etcd_txn_per_sec") > 0.0);
    assert!(mean("failover", "failover_sec") >= 0.0);
    assert_eq!(mean("failover", "lease_ttl_sec"), 2.0);
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

/// Waits up to `timeout` for `cond`.
fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Kills a run the test lost control of.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_interrupted_run_stops_servers_and_etcd() {
    use std::os::unix::process::ExitStatusExt as _;
    let Some((env, _one)) = whole_run() else {
        return;
    };
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let mut cmd = bench(&env, &["--runs", "50", "--lease-ttl", "2"]);
        // As a run in a terminal gets them: the lab keeps ignoring a signal it was
        // started with ignored (a background job's SIGINT), and this test may run in one.
        // SAFETY: signal(2) is async-signal-safe and touches only the child's own state.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                libc::signal(sig, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut run = Run(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
        let pid = run.0.id();
        let mnt = PathBuf::from(format!("/dev/shm/vfscale-cluster-{pid}/b"));
        assert!(
            wait_for(Duration::from_secs(60), || server::mounted(&mnt)),
            "the run never mounted {}",
            mnt.display()
        );
        // Into the measuring.
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: kill(2) of our own child.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
        let mut status = None;
        assert!(
            wait_for(Duration::from_secs(30), || {
                status = run.0.try_wait().unwrap();
                status.is_some()
            }),
            "the run did not end within 30 s of signal {sig}"
        );
        assert_eq!(
            status.unwrap().signal(),
            Some(sig),
            "it ends by the signal it got"
        );
        assert_eq!(leftovers(pid), Vec::<String>::new());
    }
}
