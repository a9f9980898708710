//! A throwaway etcd cluster for tests and benches: `n` members of the installed etcd
//! (Debian `etcd-server`) on free loopback ports, data directories on tmpfs, stopped and
//! removed on drop.
//!
//! * Members are children of one spawner thread that lives as long as the process, and
//!   each asks the kernel to SIGKILL it when that thread dies (`PR_SET_PDEATHSIG` follows
//!   the spawning *thread*), so an interrupted test or bench leaves no etcd behind and a
//!   cluster outlives the thread that started it.
//! * Health and leadership are read over etcd's HTTP gateway on the client port
//!   (`/health`, `/v3/maintenance/status`), so this module needs no etcd client.
//! * Auto-compaction is on (revision mode), as a production cluster would run it.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long `start` and `restart` wait for members to report healthy.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);

/// Revisions etcd keeps before auto-compaction drops older ones.
const COMPACTION_RETENTION: &str = "10000";

/// One etcd member: its ports, its data directory and its process while it runs.
struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    child: Option<Child>,
}

impl EtcdMember {
    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// A running etcd cluster; dropping it stops every member and removes its data.
pub struct EtcdCluster {
    etcd: PathBuf,
    root: PathBuf,
    token: String,
    members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// The etcd binary (`/usr/bin/etcd`, else `etcd` on `PATH`), or why there is none.
    pub fn available() -> Result<PathBuf, String> {
        let system = Path::new("/usr/bin/etcd");
        if system.is_file() {
            return Ok(system.to_path_buf());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join("etcd"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                "etcd is not installed (no /usr/bin/etcd and no etcd on PATH; \
                 Debian: apt-get install etcd-server)"
                    .to_string()
            })
    }

    /// Starts `n` members on free loopback ports with data directories under /dev/shm
    /// (tmpfs) and auto-compaction on; returns once every member reports healthy
    /// (within 20 s, else an error naming the members that did not).
    pub fn start(n: usize) -> io::Result<EtcdCluster> {
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an etcd cluster needs at least one member",
            ));
        }
        let etcd = Self::available().map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let token = format!("vfscale-etcd-{}-{}", std::process::id(), unique_suffix());
        let root = base.join(&token);
        std::fs::create_dir_all(&root)?;
        let mut cluster = EtcdCluster {
            etcd,
            root,
            token,
            members: Vec::with_capacity(n),
        };
        // Hold every listener until all ports are chosen so no two members get one port.
        let mut held = Vec::with_capacity(2 * n);
        for i in 0..n {
            let (client, client_port) = free_port()?;
            let (peer, peer_port) = free_port()?;
            held.push(client);
            held.push(peer);
            let name = format!("m{i}");
            let data_dir = cluster.root.join(&name);
            cluster.members.push(EtcdMember {
                name,
                client_port,
                peer_port,
                data_dir,
                child: None,
            });
        }
        drop(held);
        for i in 0..n {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_healthy(&(0..n).collect::<Vec<_>>())?;
        Ok(cluster)
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::client_url).collect()
    }

    /// The client URLs comma-joined, as `--cluster` takes them.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// The number of members (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: `start` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i)?.child.as_ref().map(Child::id)
    }

    /// The index of the current leader, as the running members report it; an error when
    /// none of them knows a leader (e.g. during an election) or none answers.
    pub fn leader(&self) -> io::Result<usize> {
        let mut leader_id = None;
        let mut ids = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() {
                continue;
            }
            let Ok(status) = http_post_json(m.client_port, "/v3/maintenance/status", "{}") else {
                continue;
            };
            let id = status.pointer("/header/member_id").and_then(json_u64);
            let leader = status.get("leader").and_then(json_u64);
            if let Some(id) = id {
                ids.push((i, id));
            }
            if let Some(l) = leader.filter(|&l| l != 0) {
                leader_id = Some(l);
            }
        }
        let leader_id =
            leader_id.ok_or_else(|| io::Error::other("no running etcd member reports a leader"))?;
        ids.into_iter()
            .find(|&(_, id)| id == leader_id)
            .map(|(i, _)| i)
            .ok_or_else(|| io::Error::other(format!("the etcd leader {leader_id:x} did not answer")))
    }

    /// Stops member `i` with SIGKILL and reaps it (a no-op when it is not running).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members.get_mut(i).and_then(|m| m.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP): its process stays, its ports stop answering.
    pub fn pause(&self, i: usize) -> io::Result<()> {
        self.signal(i, libc::SIGSTOP)
    }

    /// Thaws member `i` (SIGCONT) after [`EtcdCluster::pause`].
    pub fn resume(&self, i: usize) -> io::Result<()> {
        self.signal(i, libc::SIGCONT)
    }

    /// Starts member `i` again on its ports and data directory (killing it first if it
    /// runs) and waits until it reports healthy.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        if i >= self.members.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no etcd member {i}"),
            ));
        }
        self.kill(i);
        self.spawn(i, "existing")?;
        self.wait_healthy(&[i])
    }

    fn signal(&self, i: usize, sig: libc::c_int) -> io::Result<()> {
        let pid = self.pid(i).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("etcd member {i} is not running"))
        })?;
        // SAFETY: kill(2) on our own child's pid; the child is not reaped while `self`
        // holds it, so the pid cannot have been reused.
        if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn spawn(&mut self, i: usize, state: &str) -> io::Result<()> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        std::fs::create_dir_all(&self.root)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("{}.log", m.name)))?;
        let mut cmd = Command::new(&self.etcd);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &m.client_url()])
            .args(["--advertise-client-urls", &m.client_url()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--auto-compaction-mode", "revision"])
            .args(["--auto-compaction-retention", COMPACTION_RETENTION])
            .args([
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = spawn_with_deathsig(cmd)?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self, which: &[usize]) -> io::Result<()> {
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        loop {
            let mut sick = Vec::new();
            for &i in which {
                let m = &mut self.members[i];
                if let Some(Some(status)) = m.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                    return Err(io::Error::other(format!(
                        "etcd member {} exited at start ({status}); its log: {}",
                        m.name,
                        self.root.join(format!("{}.log", m.name)).display()
                    )));
                }
                if !healthy(m.client_port) {
                    sick.push(m.name.clone());
                }
            }
            if sick.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "etcd members {} not healthy after {:?}; logs in {}",
                        sick.join(","),
                        HEALTHY_TIMEOUT,
                        self.root.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A paused member must be thawed to be reaped promptly; SIGKILL works anyway.
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A loopback port nobody listens on, held open by the returned listener.
fn free_port() -> io::Result<(TcpListener, u16)> {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    let port = l.local_addr()?.port();
    Ok((l, port))
}

fn unique_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    (NEXT.fetch_add(1, Ordering::Relaxed) << 32) | nanos
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from the process-wide spawner thread, with SIGKILL as its parent-death
/// signal: the thread never exits, so the child dies exactly when this process does.
fn spawn_with_deathsig(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_child(&mut cmd));
                }
            })
            .expect("spawning the etcd spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| io::Error::other("the etcd spawner lock is poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the etcd spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the etcd spawner thread is gone"))?
}

fn spawn_child(cmd: &mut Command) -> io::Result<Child> {
    // SAFETY: getpid is async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit would be; we return an error instead).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Whether the member on `port` answers `/health` with `"health":"true"`.
fn healthy(port: u16) -> bool {
    http_request(port, "GET", "/health", "")
        .ok()
        .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).ok())
        .is_some_and(|v| v.get("health").and_then(|h| h.as_str()) == Some("true"))
}

fn http_post_json(port: u16, path: &str, body: &str) -> io::Result<serde_json::Value> {
    let text = http_request(port, "POST", path, body)?;
    serde_json::from_str(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// One HTTP/1.0 request (no chunked replies, the connection closes after the body).
fn http_request(port: u16, method: &str, path: &str, body: &str) -> io::Result<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let timeout = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP header end"))?;
    let code = head.split_whitespace().nth(1);
    if !head.starts_with("HTTP/1.") || code != Some("200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(io::Error::other(format!("{method} {path}: {status}")));
    }
    Ok(body.to_string())
}

/// etcd's gateway writes uint64 fields as JSON strings.
fn json_u64(v: &serde_json::Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_members_elect_a_leader_and_survive_its_loss() {
        if let Err(why) = EtcdCluster::available() {
            println!("SKIP: {why}");
            return;
        }
        let mut c = EtcdCluster::start(3).expect("start etcd");
        assert_eq!(c.endpoints().len(), 3);
        assert_eq!(c.endpoints_arg().split(',').count(), 3);
        let leader = c.leader().expect("a leader");
        assert!(leader < 3);
        c.kill(leader);
        // The other two elect a new leader within a few election timeouts.
        let deadline = Instant::now() + Duration::from_secs(10);
        let new = loop {
            match c.leader() {
                Ok(l) => break l,
                Err(e) if Instant::now() >= deadline => panic!("no new leader: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        assert_ne!(new, leader);
        c.restart(leader).expect("restart");
        assert!(c.pid(leader).is_some());
        let root = c.root.clone();
        drop(c);
        assert!(!root.exists(), "drop removes the data directories");
    }
}
