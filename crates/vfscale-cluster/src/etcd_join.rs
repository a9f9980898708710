//! Joining through etcd: the one place that names the etcd directory, so that the
//! rest of the lock service is built and tested over any [`Directory`] (and builds in
//! a tree without `src/etcd/`, where joining says so).

use std::net::SocketAddr;
use std::sync::Arc;

use crate::{BoxFuture, ClusterConfig, ClusterError, Directory};

/// The directory's orderly leave, run by [`crate::ClusterLocks::leave`].
pub(crate) type LeaveFn = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// Joins the cluster `cfg` names as member `node`, publishing peer address `addr`;
/// also returns how to leave in order (revoke the lease).
#[cfg(vfscale_etcd)]
pub(crate) async fn join_etcd(
    cfg: ClusterConfig,
    node: String,
    addr: SocketAddr,
) -> Result<(Arc<dyn Directory>, LeaveFn), ClusterError> {
    use crate::etcd::{EtcdConfig, EtcdDirectory};
    let mut ec = EtcdConfig::new(cfg.endpoints, &cfg.cluster_name, &node, addr);
    ec.lease_ttl = cfg.lease_ttl;
    let dir = EtcdDirectory::join(ec).await?;
    let d = dir.clone();
    let leave: LeaveFn = Box::new(move || Box::pin(async move { d.leave().await }));
    Ok((dir as Arc<dyn Directory>, leave))
}

/// Without the etcd directory in the tree: joining fails, saying why.
#[cfg(not(vfscale_etcd))]
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
