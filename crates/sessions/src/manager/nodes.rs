//! Sharing a store with other daemons: which node holds a session (transports forward requests
//! to it), where a new one should go (placement), the sessions of a node that was lost are
//! ended by whoever notices (their sandboxes went with it), and a node that was counted lost
//! while it still ran (a long pause, a partition) lets go of the sessions the others ended
//! meanwhile. A durable pause is resumed by whichever node is asked (its own when up: requests
//! are forwarded there), which records the session as its own first, so its old node's
//! start-up reconciliation never touches it.

use koder_api_types::SessionState;
use koder_store::{NodeRecord, NodeState};

use super::lifecycle::{lose_orphan, orphan_reason};
use super::Manager;
use crate::Error;

/// Another node, up, as transports reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub node_id: String,
    /// Its base URL (`[node] advertise`).
    pub address: String,
}

impl Peer {
    fn of(n: &NodeRecord) -> Peer {
        Peer {
            node_id: n.info.id.clone(),
            address: n.info.address.clone(),
        }
    }
}

impl Manager {
    /// This node's id, when it shares its store as a node.
    pub fn node_id(&self) -> Option<&str> {
        self.cfg.node_id.as_deref()
    }

    /// The other node, up, that holds session `id` (its sandbox, or its pause when that node
    /// keeps it); `None` when this node serves it: its own, an unknown or stopped one (answered
    /// from the store), one recorded on no node, or one whose node is down (this node answers,
    /// and resumes a durable pause itself). Tenancy is not checked here: the owner checks it.
    pub async fn owner_of(&self, id: &str) -> Result<Option<Peer>, Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(None);
        };
        if self.live.lock().contains_key(id) {
            return Ok(None);
        }
        let Some(record) = self.store.get_session(id).await? else {
            return Ok(None);
        };
        match record.node_id {
            Some(node) if node != me && record.state != SessionState::Stopped => Ok(self
                .store
                .get_node(&node)
                .await?
                .and_then(|n| (n.state == NodeState::Up).then(|| Peer::of(&n)))),
            _ => Ok(None),
        }
    }

    /// Where a new session on `runtime` should be created: `None` for this node (it offers
    /// the runtime and has room, or no node has room and offers it, in which case this node
    /// answers why not), else the up node offering it with the most room, by the sandboxes the
    /// store records on each against the capacity each registered.
    pub async fn place(&self, runtime: &str) -> Result<Option<Peer>, Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(None);
        };
        let nodes = self.store.list_nodes().await?;
        let held = self.store.sandboxes_by_node().await?;
        let room = |n: &NodeRecord| {
            let used = held.get(&n.info.id).copied().unwrap_or(0);
            n.info.capacity_sandboxes.saturating_sub(used)
        };
        let offers = |n: &NodeRecord| n.info.runtimes.iter().any(|r| r == runtime);
        if nodes
            .iter()
            .any(|n| n.info.id == me && offers(n) && room(n) > 0)
        {
            return Ok(None);
        }
        Ok(nodes
            .iter()
            .filter(|n| n.state == NodeState::Up && n.info.id != me && offers(n))
            .filter(|n| room(n) > 0)
            .max_by_key(|n| (room(n), std::cmp::Reverse(n.info.id.clone())))
            .map(Peer::of))
    }

    /// Makes a session that holds no sandbox this node's before it boots here (a durable
    /// pause resumed on another node than the one that paused it). Refused when another node
    /// moved it first.
    pub(super) async fn claim(&self, record: &koder_store::SessionRecord) -> Result<(), Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(());
        };
        if record.node_id.as_deref() == Some(me) {
            return Ok(());
        }
        if self
            .store
            .move_session_node(&record.id, record.node_id.as_deref(), me)
            .await?
        {
            tracing::info!(
                session = %record.id,
                from = record.node_id.as_deref().unwrap_or("-"),
                "session moved to this node"
            );
            return Ok(());
        }
        Err(Error::Conflict(
            "the session is being resumed on another node".into(),
        ))
    }

    /// Ends the sessions recorded on `node` (marked lost: its heartbeat stopped) as `lost`,
    /// with the reason; durable pauses stay paused (another node resumes them). Returns how
    /// many ended.
    pub async fn take_over_lost_node(&self, node: &str) -> Result<usize, Error> {
        if self.cfg.node_id.as_deref() == Some(node) {
            return Ok(0);
        }
        let cause = format!("its node {node} was lost");
        let mut ended = 0;
        for s in self.store.live_sessions_on_node(node).await? {
            let pause = self.store.session_durable(&s.id).await?.pause;
            let Some(reason) = orphan_reason(s.state, pause, &cause, true) else {
                continue;
            };
            if lose_orphan(
                &self.store,
                &self.events,
                &s.id,
                &s.tenant_id,
                &reason,
                self.now(),
            )
            .await?
            {
                ended += 1;
            }
        }
        Ok(ended)
    }

    /// Destroys the sandboxes of sessions the store says are stopped (ended by another node
    /// while this one was counted lost). Returns how many.
    pub async fn release_sessions_ended_elsewhere(&self) -> Result<usize, Error> {
        let mut released = 0;
        for id in self.live_ids() {
            let Some(record) = self.store.get_session(&id).await? else {
                continue;
            };
            if record.state == SessionState::Stopped {
                let reason = record
                    .end_reason
                    .unwrap_or_else(|| "ended by another node".into());
                self.end(&id, &reason).await;
                released += 1;
            }
        }
        Ok(released)
    }
}
