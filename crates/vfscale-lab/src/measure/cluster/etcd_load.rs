//! What etcd carries, seen from etcd: the KV requests its members handled (read off
//! their Prometheus `/metrics`, so the servers need not count for us), and the
//! reference a lock rate is judged against: one client's serial compare-and-swap
//! transactions.
//!
//! A request counts once, at the member that handled it:
//! `grpc_server_handled_total{grpc_service="etcdserverpb.KV"}` summed over methods
//! (`Range`, `Put`, `DeleteRange`, `Txn`, `Compact`), result codes and members. Lease
//! keep-alives and watches are other services and are not counted; `etcd_mvcc_*_total`
//! are not used because every member counts every replicated write there.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long one `/metrics` read may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The KV requests the members at `endpoints` (`http://127.0.0.1:2379`) have handled
/// since they started, summed.
pub fn kv_requests(endpoints: &[String]) -> Result<u64, String> {
    endpoints.iter().map(|e| Ok(kv_requests_in(&scrape(e)?))).sum()
}

/// The KV requests one member's `/metrics` text counts.
pub fn kv_requests_in(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{") && l.contains("grpc_service=\"etcdserverpb.KV\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// `GET /metrics` of the member at `endpoint`, over plain HTTP/1.0 (the body ends
/// with the connection).
fn scrape(endpoint: &str) -> Result<String, String> {
    let hostport = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint}: not an http:// endpoint"))?
        .trim_end_matches('/');
    let fail = |e: std::io::Error| format!("{endpoint}/metrics: {e}");
    let mut s = TcpStream::connect(hostport).map_err(fail)?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT)).map_err(fail)?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {hostport}\r\n\r\n").as_bytes())
        .map_err(fail)?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(fail)?;
    let (head, rest) = body
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{endpoint}/metrics: no HTTP response"))?;
    let status = head.split(' ').nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        return Err(format!(
            "{endpoint}/metrics: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(rest.to_string())
}

/// One client's serial compare-and-swap transactions against `endpoints` for `secs`:
/// each transaction puts a key if its mod revision is still the one the previous
/// transaction left, as a lock built on etcd would take a lock. Returns commits per
/// second (a failed compare is not a commit, and none fails here: the client is alone
/// on its key).
pub fn serial_cas_rate(endpoints: &[String], key: &str, secs: Duration) -> Result<f64, String> {
    use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime for the etcd client: {e}"))?;
    rt.block_on(async {
        let fail = |e: etcd_client::Error| format!("etcd {}: {e}", endpoints.join(","));
        let mut c = Client::connect(endpoints, None).await.map_err(fail)?;
        let put = c.put(key, "0", None).await.map_err(fail)?;
        let mut rev = put.header().map_or(0, |h| h.revision());
        let (mut commits, start) = (0u64, Instant::now());
        while start.elapsed() < secs {
            let txn = Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key, commits.to_string(), None)]);
            let r = c.txn(txn).await.map_err(fail)?;
            if !r.succeeded() {
                return Err(format!(
                    "etcd: the compare on {key} failed though no one else writes it"
                ));
            }
            rev = r.header().map_or(rev, |h| h.revision());
            commits += 1;
            if crate::measure::interrupt::interrupted() {
                break;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        c.delete(key, None).await.map_err(fail)?;
        Ok(commits as f64 / secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_requests_are_summed_over_methods_and_codes_only() {
        let text = "\
# HELP grpc_server_handled_total Total number of RPCs completed on the server.
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 2
grpc_server_handled_total{grpc_code=\"Unavailable\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"LeaseGrant\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"unary\"} 40
grpc_server_started_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 500
etcd_mvcc_put_total 9
";
        assert_eq!(kv_requests_in(text), 6);
        assert_eq!(kv_requests_in(""), 0);
    }

    #[test]
    fn a_bad_endpoint_is_named() {
        let e = kv_requests(&["127.0.0.1:1".into()]).unwrap_err();
        assert!(e.contains("not an http:// endpoint"), "{e}");
    }
}
