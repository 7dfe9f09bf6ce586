//! The network of a multi-node test: one namespace per node, each joined by a veth pair to a
//! bridge the test creates in the host namespace, on a private /24 the test picks (10.249.n.0:
//! the bridge is .1, node k is .k+2). The nodes reach each other across the bridge, and the
//! host's services (PostgreSQL through a relay, the S3 server) on the bridge's address.
//! Nothing leaves these interfaces. Everything is removed on drop, from the first `ip` call on.

use std::path::PathBuf;
use std::process::{Command, Stdio};

pub struct ClusterNet {
    bridge: String,
    namespaces: Vec<String>,
    /// Host ends of the veth pairs (gone with their namespace once moved; not before).
    links: Vec<String>,
    prefix: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?} failed");
}

impl ClusterNet {
    pub fn up(nodes: usize) -> ClusterNet {
        let id = std::process::id() % 100_000;
        let mut net = ClusterNet {
            bridge: format!("kcb{id}"),
            namespaces: Vec::new(),
            links: Vec::new(),
            prefix: format!("10.249.{}", id % 250),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.host_ip()),
            "dev",
            &net.bridge,
        ]);
        ip(&["link", "set", &net.bridge, "up"]);
        for k in 0..nodes {
            let ns = format!("kcn{id}-{k}");
            ip(&["netns", "add", &ns]);
            net.namespaces.push(ns.clone());
            let (host_if, peer) = (format!("kch{id}-{k}"), format!("kcp{id}-{k}"));
            net.links.push(host_if.clone());
            ip(&[
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
            ]);
            ip(&["link", "set", &peer, "netns", &ns]);
            ip(&["link", "set", &host_if, "master", &net.bridge]);
            ip(&["link", "set", &host_if, "up"]);
            let addr = format!("{}/24", net.node_ip(k));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &peer]);
            ip(&["-n", &ns, "link", "set", &peer, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// The bridge's address: where the nodes reach the host's test services.
    pub fn host_ip(&self) -> String {
        format!("{}.1", self.prefix)
    }

    pub fn node_ip(&self, k: usize) -> String {
        format!("{}.{}", self.prefix, k + 2)
    }

    /// The file naming node `k`'s namespace, for `setns`.
    pub fn netns(&self, k: usize) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.namespaces[k])
    }
}

impl Drop for ClusterNet {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the host's end.
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for link in self.links.iter().chain([&self.bridge]) {
            let _ = Command::new("ip")
                .args(["link", "del", link])
                .stderr(Stdio::null())
                .status();
        }
    }
}
