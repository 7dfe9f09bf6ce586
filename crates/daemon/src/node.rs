//! This daemon as a node of the store it may share with others: registered at start, a
//! heartbeat with its load every `[node] heartbeat_s`, every silent node (its own heartbeat
//! included, after a pause) marked lost after `[node] lost_after_s`, and a clean leave at
//! shutdown. Placement and forwarding (later) read the same table.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use koder_sessions::Manager;
use koder_store::{NodeInfo, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::keyfile;

/// File in the data dir holding the node's id when `[node] id` is unset.
const NODE_ID_FILE: &str = "node-id";

/// The running heartbeat; [`Node::leave`] ends it.
pub struct Node {
    id: String,
    store: Store,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// This node's id: `[node] id`, else the one kept in the data dir (made on first start).
pub fn id(cfg: &Config, data_dir: &Path) -> anyhow::Result<String> {
    match &cfg.node.id {
        Some(id) => Ok(id.clone()),
        None => keyfile::read_or_create(
            &data_dir.join(NODE_ID_FILE),
            |id| !id.is_empty(),
            || format!("node-{}", hex::encode(rand::random::<[u8; 8]>())),
        ),
    }
}

/// Who this node is (`id`), the address other nodes reach it at (`[node] advertise`, else the
/// address the daemon listens on), where they forward gRPC calls (when it serves gRPC on
/// `grpc`), and whether its microVM runtime is usable.
pub fn info(
    cfg: &Config,
    id: String,
    listening: std::net::SocketAddr,
    grpc: Option<std::net::SocketAddr>,
    microvm: bool,
) -> anyhow::Result<NodeInfo> {
    let mut runtimes = vec!["jail".to_string()];
    if microvm {
        runtimes.push("microvm".into());
    }
    Ok(NodeInfo {
        id,
        address: cfg
            .node
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{listening}")),
        grpc_address: grpc.map(|grpc| grpc_address(cfg, grpc)).transpose()?,
        runtimes,
        capacity_sandboxes: u64::from(crate::jail_max_sandboxes(cfg)),
    })
}

/// `[node] advertise_grpc`, else the advertised host with the gRPC port, else the address gRPC
/// listens on.
fn grpc_address(cfg: &Config, grpc: std::net::SocketAddr) -> anyhow::Result<String> {
    if let Some(address) = &cfg.node.advertise_grpc {
        return Ok(address.clone());
    }
    let Some(advertise) = &cfg.node.advertise else {
        return Ok(format!("http://{grpc}"));
    };
    let uri: axum::http::Uri = advertise
        .parse()
        .with_context(|| format!("[node] advertise {advertise:?} is not a URL"))?;
    let host = uri
        .host()
        .with_context(|| format!("[node] advertise {advertise:?} has no host"))?;
    Ok(format!("http://{host}:{}", grpc.port()))
}

impl Node {
    /// Registers the node and starts its heartbeat.
    pub async fn start(
        cfg: &Config,
        store: Store,
        info: NodeInfo,
        manager: Arc<Manager>,
    ) -> anyhow::Result<Node> {
        store
            .register_node(&info, Utc::now())
            .await
            .context("registering this node")?;
        tracing::info!(node = info.id, address = info.address, "node registered");
        // Nodes lost while this one was down still hold sessions nobody ended.
        for lost in store.list_nodes().await.context("listing nodes")? {
            if lost.state == koder_store::NodeState::Lost {
                take_over(&manager, &lost.info.id).await;
            }
        }
        let (stop, stopping) = watch::channel(false);
        let every = Duration::from_secs_f64(cfg.node.heartbeat_s);
        let lost_after = chrono::Duration::from_std(Duration::from_secs_f64(cfg.node.lost_after_s))
            .context("[node] lost_after_s")?;
        let task = tokio::spawn(heartbeat(
            store.clone(),
            info.clone(),
            manager,
            every,
            lost_after,
            stopping,
        ));
        Ok(Node {
            id: info.id,
            store,
            stop,
            task,
        })
    }

    /// Stops the heartbeat and records a clean leave (so the others do not count this node
    /// lost).
    pub async fn leave(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Err(e) = self.store.leave_node(&self.id, Utc::now()).await {
            tracing::warn!(error = %e, "recording this node's leave");
        }
    }
}

async fn heartbeat(
    store: Store,
    info: NodeInfo,
    manager: Arc<Manager>,
    every: Duration,
    lost_after: chrono::Duration,
    mut stopping: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.wait_for(|s| *s) => return,
        }
        let now = Utc::now();
        let load = koder_store::NodeLoad {
            sandboxes: manager.live_ids().len() as u64,
            warm: manager.warm_lanes(),
        };
        match store.heartbeat_node(&info.id, &load, now).await {
            Ok(true) => {}
            // Marked lost while silent (a long pause, a partition): up again from now on.
            Ok(false) | Err(koder_store::StoreError::NotFound) => {
                tracing::warn!(
                    node = info.id,
                    "this node was marked lost; registering again"
                );
                if let Err(e) = store.register_node(&info, now).await {
                    tracing::warn!(error = %e, "registering this node again");
                }
                match manager.release_sessions_ended_elsewhere().await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        count = n,
                        "released sessions other nodes ended while this one was counted lost"
                    ),
                    Err(e) => tracing::warn!(error = %e, "releasing sessions ended elsewhere"),
                }
            }
            Err(e) => tracing::warn!(error = %e, "node heartbeat"),
        }
        match store.mark_lost_nodes(now - lost_after, now).await {
            Ok(lost) => {
                for id in lost {
                    tracing::warn!(
                        node = id,
                        "node lost: no heartbeat for {}s",
                        lost_after.num_seconds()
                    );
                    take_over(&manager, &id).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "marking lost nodes"),
        }
    }
}

/// Ends the sessions a lost node held (their sandboxes went with it).
async fn take_over(manager: &Manager, node: &str) {
    match manager.take_over_lost_node(node).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(node, count = n, "ended the sessions of a lost node"),
        Err(e) => tracing::warn!(node, error = %e, "ending the sessions of a lost node"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc_of(node: &str) -> String {
        let cfg: Config = toml::from_str(node).unwrap();
        grpc_address(&cfg, "0.0.0.0:7071".parse().unwrap()).unwrap()
    }

    #[test]
    fn the_grpc_address_follows_the_advertised_one() {
        assert_eq!(grpc_of(""), "http://0.0.0.0:7071");
        assert_eq!(
            grpc_of("[node]\nadvertise = \"http://node-a.internal:7070\"\n"),
            "http://node-a.internal:7071"
        );
        assert_eq!(
            grpc_of("[node]\nadvertise = \"http://a:7070\"\nadvertise_grpc = \"http://b:9000\"\n"),
            "http://b:9000"
        );
        let cfg: Config = toml::from_str("[node]\nadvertise = \"not a url\"\n").unwrap();
        assert!(grpc_address(&cfg, "127.0.0.1:1".parse().unwrap()).is_err());
    }
}
