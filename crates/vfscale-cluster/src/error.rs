//! What can go wrong in the cluster layer, and the errno a client is given for it.

use std::fmt;

use vfscale_locks::Errno;

/// A failure of the cluster layer (not a lock conflict: those are [`Errno`]s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterError {
    /// etcd could not be reached or refused a request; the message says which and why.
    Etcd(String),
    /// A peer could not be reached or broke the connection.
    Peer(String),
    /// This member's lease may have expired: it grants nothing until it has rejoined.
    Fenced,
    /// A configuration value is unusable; the message names it.
    Config(String),
}

impl ClusterError {
    /// The errno a lock call gets for this failure: `EIO` (as the Linux NFS client
    /// answers for a lost lock), `EINVAL` for a bad configuration.
    pub fn errno(&self) -> Errno {
        match self {
            ClusterError::Config(_) => Errno::EINVAL,
            _ => Errno::Other(libc::EIO),
        }
    }
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Etcd(m) => write!(f, "etcd: {m}"),
            ClusterError::Peer(m) => write!(f, "peer: {m}"),
            ClusterError::Fenced => write!(f, "this server's lease may have expired; it is fenced"),
            ClusterError::Config(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for ClusterError {}
