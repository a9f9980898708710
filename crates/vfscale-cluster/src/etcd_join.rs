//! Joining through etcd: the one place that names the etcd directory, so that the
//! lock service builds and is tested without it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::{BoxFuture, ClusterConfig, ClusterError, Directory};

/// The directory's orderly leave, run by [`crate::ClusterLocks::leave`].
pub(crate) type LeaveFn = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// Joins the cluster `cfg` names as member `node`, publishing peer address `addr`;
/// also returns how to leave in order (revoke the lease).
pub(crate) async fn join_etcd(
    cfg: ClusterConfig,
    node: String,
    addr: SocketAddr,
) -> Result<(Arc<dyn Directory>, LeaveFn), ClusterError> {
    let _ = (&cfg, &node, addr);
    Err(ClusterError::Config(
        "this build has no etcd directory (vfscale_cluster::etcd)".into(),
    ))
}
