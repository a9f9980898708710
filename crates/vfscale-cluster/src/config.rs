//! How a member joins its cluster: etcd endpoints, cluster name, node name, peer address
//! and lease TTL.

use std::net::SocketAddr;
use std::time::Duration;

use crate::ClusterError;

/// The shortest lease TTL accepted: shorter leases expire between two keep-alives on a
/// loaded machine.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// What [`crate::ClusterLocks::join`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// etcd client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Servers with the same name share one lock space (the etcd key prefix).
    pub cluster_name: String,
    /// This member's unique name; `None`: `<hostname>-<pid>`.
    pub node: Option<String>,
    /// Where the peer service listens (port 0: a free one); the bound address is
    /// published in etcd.
    pub peer_listen: SocketAddr,
    /// The etcd lease TTL: how long a dead member holds its locks and homes.
    pub lease_ttl: Duration,
    /// How long an inode homed here stays idle before it is given back (zero: never);
    /// see [`crate::ClusterLocks::set_home_idle`].
    pub home_idle: Duration,
}

impl ClusterConfig {
    /// The defaults (cluster `vfscale`, node `<hostname>-<pid>`, peer service on a free
    /// port of 127.0.0.1, lease TTL 5 s, homes given back after [`crate::HOME_IDLE`])
    /// with these endpoints.
    pub fn new(endpoints: Vec<String>) -> ClusterConfig {
        ClusterConfig {
            endpoints,
            cluster_name: "vfscale".into(),
            node: None,
            peer_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease_ttl: Duration::from_secs(5),
            home_idle: crate::HOME_IDLE,
        }
    }

    /// Parses `"http://a:1,http://b:2"`: comma-separated URLs, each `http://` or
    /// `https://` with a host and a port. The error names the bad item.
    ///
    /// ```
    /// use vfscale_cluster::ClusterConfig;
    /// assert_eq!(
    ///     ClusterConfig::parse_endpoints("http://127.0.0.1:2379, http://h:2479").unwrap(),
    ///     vec!["http://127.0.0.1:2379".to_string(), "http://h:2479".to_string()]
    /// );
    /// assert!(ClusterConfig::parse_endpoints("127.0.0.1").is_err());
    /// assert!(ClusterConfig::parse_endpoints("").is_err());
    /// ```
    pub fn parse_endpoints(s: &str) -> Result<Vec<String>, ClusterError> {
        let mut out = Vec::new();
        for item in s.split(',').map(str::trim) {
            let rest = item
                .strip_prefix("http://")
                .or_else(|| item.strip_prefix("https://"))
                .ok_or_else(|| {
                    ClusterError::Config(format!(
                        "etcd endpoint {item:?}: expected http://HOST:PORT or https://HOST:PORT"
                    ))
                })?;
            let rest = rest.trim_end_matches('/');
            let port_ok = rest
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok {
                return Err(ClusterError::Config(format!(
                    "etcd endpoint {item:?}: expected a host and a port, as in http://127.0.0.1:2379"
                )));
            }
            out.push(item.to_string());
        }
        Ok(out)
    }

    /// The node name: the configured one, or `<hostname>-<pid>`.
    pub fn node_name(&self) -> String {
        if let Some(n) = &self.node {
            return n.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        format!("{host}-{}", std::process::id())
    }

    /// Checks the values: a clear error naming the bad one.
    pub fn validate(&self) -> Result<(), ClusterError> {
        if self.endpoints.is_empty() {
            return Err(ClusterError::Config("no etcd endpoint given".into()));
        }
        check_key_part("cluster name", &self.cluster_name)?;
        if let Some(n) = &self.node {
            check_key_part("node name", n)?;
        }
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err(ClusterError::Config(format!(
                "lease TTL {:?}: must be at least {:?}",
                self.lease_ttl, MIN_LEASE_TTL
            )));
        }
        Ok(())
    }
}

/// A cluster or node name becomes one component of etcd keys: non-empty, without '/'.
pub(crate) fn check_key_part(what: &str, s: &str) -> Result<(), ClusterError> {
    if s.is_empty() || s.contains('/') {
        return Err(ClusterError::Config(format!(
            "{what} {s:?}: must be non-empty and contain no '/'"
        )));
    }
    Ok(())
}
