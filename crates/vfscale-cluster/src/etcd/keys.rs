//! The directory's etcd keys and the encoding of their values.

use std::net::SocketAddr;

use serde_json::{json, Value};

use crate::{InodeId, WaitEdge};

/// The keys of one cluster, all under `/vfscale/<cluster>/`.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    root: String,
}

impl Keys {
    pub(crate) fn new(cluster: &str) -> Keys {
        Keys {
            root: format!("/vfscale/{cluster}/"),
        }
    }

    /// `members/<node>`: the member's registration, under its lease.
    pub(crate) fn member(&self, node: &str) -> String {
        format!("{}members/{node}", self.root)
    }

    /// `homes/<ino>`: the node name of the inode's home, under the home's lease.
    pub(crate) fn home(&self, ino: InodeId) -> String {
        format!("{}homes/{}", self.root, ino.0)
    }

    /// `waits/<node>`: the member's published wait-for edges, under its lease.
    pub(crate) fn waits(&self, node: &str) -> String {
        format!("{}waits/{node}", self.root)
    }

    /// `waits-version`: rewritten by every publication, compared by the next one.
    pub(crate) fn waits_version(&self) -> String {
        format!("{}waits-version", self.root)
    }

    /// The prefix both `waits/` and `waits-version` share: one range reads the graph and
    /// its version at one revision.
    pub(crate) fn waits_prefix(&self) -> String {
        format!("{}waits", self.root)
    }

    /// The key range `[homes/, members0)`: exactly the homes and the members (nothing
    /// else sorts between them), so one range read and one watch see both in revision
    /// order.
    pub(crate) fn view_range(&self) -> (String, String) {
        (format!("{}homes/", self.root), format!("{}members0", self.root))
    }

    /// What a key of the view names.
    pub(crate) fn parse_view_key<'k>(&self, key: &'k str) -> Option<ViewKey<'k>> {
        let rest = key.strip_prefix(self.root.as_str())?;
        if let Some(node) = rest.strip_prefix("members/") {
            return Some(ViewKey::Member(node));
        }
        let ino = rest.strip_prefix("homes/")?.parse().ok()?;
        Some(ViewKey::Home(InodeId(ino)))
    }

    /// The node that published a `waits/<node>` key.
    pub(crate) fn parse_waits_key<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.root.as_str())?.strip_prefix("waits/")
    }
}

/// A key of the view (members and homes).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ViewKey<'k> {
    Member(&'k str),
    Home(InodeId),
}

/// `{"addr": "...", "lease": N}`.
pub(crate) fn encode_member(addr: SocketAddr, lease: i64) -> String {
    json!({ "addr": addr.to_string(), "lease": lease }).to_string()
}

/// The address a registration names; `None` for a value no member wrote.
pub(crate) fn decode_member_addr(value: &[u8]) -> Option<SocketAddr> {
    let v: Value = serde_json::from_slice(value).ok()?;
    v.get("addr")?.as_str()?.parse().ok()
}

/// `[[waiter, blocker], ...]`.
pub(crate) fn encode_edges(edges: &[WaitEdge]) -> String {
    Value::Array(edges.iter().map(|e| json!([e.waiter, e.blocker])).collect()).to_string()
}

/// The edges of a `waits/<node>` value; an unreadable value is no edges (a member
/// writes only what [`encode_edges`] makes).
pub(crate) fn decode_edges(value: &[u8]) -> Vec<WaitEdge> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(value) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|pair| {
            let waiter = pair.get(0)?.as_u64()?;
            let blocker = pair.get(1)?.as_u64()?;
            Some(WaitEdge { waiter, blocker })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_keys_parse_and_sort_inside_the_view_range() {
        let k = Keys::new("c");
        let (lo, hi) = k.view_range();
        for key in [k.member("n1"), k.home(InodeId(42))] {
            assert!(lo <= key && key < hi, "{key} outside [{lo}, {hi})");
        }
        for key in [k.waits("n1"), k.waits_version()] {
            assert!(!(lo <= key && key < hi), "{key} inside the view range");
            assert!(key.starts_with(&k.waits_prefix()));
        }
        assert_eq!(k.parse_view_key(&k.member("n1")), Some(ViewKey::Member("n1")));
        assert_eq!(
            k.parse_view_key(&k.home(InodeId(42))),
            Some(ViewKey::Home(InodeId(42)))
        );
        assert_eq!(k.parse_view_key("/vfscale/c/homes/x"), None);
        assert_eq!(k.parse_view_key("/vfscale/other/homes/1"), None);
        assert_eq!(k.parse_waits_key(&k.waits("n2")), Some("n2"));
    }

    #[test]
    fn values_round_trip() {
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(decode_member_addr(encode_member(addr, 7).as_bytes()), Some(addr));
        assert_eq!(decode_member_addr(b"junk"), None);
        let edges = vec![
            WaitEdge {
                waiter: u64::MAX,
                blocker: 3,
            },
            WaitEdge {
                waiter: 3,
                blocker: 1,
            },
        ];
        assert_eq!(decode_edges(encode_edges(&edges).as_bytes()), edges);
        assert!(decode_edges(b"{}").is_empty());
    }
}
