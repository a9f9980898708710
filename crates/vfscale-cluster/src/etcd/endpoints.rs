//! The etcd endpoints: one client per endpoint, one of them current. Requests go to the
//! current endpoint; one that fails or does not answer in time makes the next endpoint
//! current (as etcd's own Go client pins one endpoint and switches on failure). A
//! balanced channel over all endpoints would keep sending a share of the requests to a
//! dead member, each failing, for as long as it is down.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Error as EtcdError};
use tracing::debug;

use super::fence::{now_nanos, FenceClock};
use crate::ClusterError;

/// How long one request (or one keep-alive renewal) may go unanswered before it is
/// retried, on the next endpoint: a request a follower forwarded to a leader that died
/// hangs until then.
pub(crate) const ATTEMPT: Duration = Duration::from_secs(1);

/// The clients, and which one is current.
pub(crate) struct Endpoints {
    clients: Vec<(String, Client)>,
    current: AtomicUsize,
}

/// A client picked for one request or stream, remembered so that its failure moves on
/// from that endpoint only (not from one another request already moved to).
pub(crate) struct Pick {
    pub(crate) client: Client,
    at: usize,
}

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// etcd (or the transport to it) answered with an error.
    Etcd(EtcdError),
    /// No answer within the limit.
    Timeout(Duration),
}

impl Failure {
    /// Whether etcd says the lease does not exist (an answer, not a failure of the endpoint).
    pub(crate) fn lease_not_found(&self) -> bool {
        matches!(self, Failure::Etcd(e) if lease_not_found(e))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Etcd(e) => write!(f, "{e}"),
            Failure::Timeout(d) => write!(f, "no answer within {d:?}"),
        }
    }
}

/// Whether etcd says the lease does not exist.
pub(crate) fn lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::LeaseKeepAliveError(m) => m.contains("not found"),
        EtcdError::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

/// Attempts at one operation, for up to a time budget: the operation ends when this
/// member is fenced or the budget is spent, with the last failure in the message.
pub(crate) struct Retries {
    give_up: u64,
    /// What went wrong last.
    pub(crate) last_error: String,
}

impl Retries {
    pub(crate) fn new(budget: Duration) -> Retries {
        Retries {
            give_up: now_nanos() + budget.as_nanos() as u64,
            last_error: String::from("no attempt"),
        }
    }

    /// Whether another attempt may be made; `doing` names the operation in the error.
    pub(crate) fn next(&self, fence: &FenceClock, doing: fmt::Arguments<'_>) -> Result<(), ClusterError> {
        if fence.fenced() {
            return Err(ClusterError::Fenced);
        }
        if now_nanos() >= self.give_up {
            return Err(ClusterError::Etcd(format!("{doing}: {}", self.last_error)));
        }
        Ok(())
    }
}

impl Endpoints {
    /// One client per URL (connections are made on first use).
    pub(crate) async fn connect(urls: &[String]) -> Result<Endpoints, ClusterError> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_keep_alive_while_idle(true)
            // A member cut off from the others answers at once instead of waiting.
            .with_require_leader(true);
        let mut clients = Vec::with_capacity(urls.len());
        for url in urls {
            let client = Client::connect([url.as_str()], Some(opts.clone()))
                .await
                .map_err(|e| ClusterError::Config(format!("etcd endpoint {url:?}: {e}")))?;
            clients.push((url.clone(), client));
        }
        Ok(Endpoints {
            clients,
            current: AtomicUsize::new(0),
        })
    }

    /// The current endpoint's client.
    pub(crate) fn pick(&self) -> Pick {
        let at = self.current.load(Ordering::Acquire) % self.clients.len();
        Pick {
            client: self.clients[at].1.clone(),
            at,
        }
    }

    /// `pick`'s endpoint failed: the next one becomes current, unless another failure
    /// moved on already.
    pub(crate) fn failed(&self, pick: &Pick) {
        let next = (pick.at + 1) % self.clients.len();
        if self
            .current
            .compare_exchange(pick.at, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            debug!(from = %self.clients[pick.at].0, to = %self.clients[next].0, "etcd endpoint failed, switching");
        }
    }

    /// One request on the current endpoint, bounded by `limit`; a failure other than
    /// an answer about the lease moves on to the next endpoint.
    pub(crate) async fn request<T, F, Fut>(&self, limit: Duration, f: F) -> Result<T, Failure>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, EtcdError>>,
    {
        let pick = self.pick();
        let failure = match tokio::time::timeout(limit, f(pick.client.clone())).await {
            Ok(Ok(t)) => return Ok(t),
            Ok(Err(e)) => Failure::Etcd(e),
            Err(_) => Failure::Timeout(limit),
        };
        if !failure.lease_not_found() {
            self.failed(&pick);
        }
        Err(failure)
    }
}
