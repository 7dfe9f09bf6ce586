//! Sharing a store with other daemons: which node holds a session (transports forward requests
//! to it), where a new one should go (placement), the sessions of a node that was lost are
//! ended by whoever notices (their sandboxes went with it), and a node that was counted lost
//! while it still ran (a long pause, a partition) lets go of the sessions the others ended
//! meanwhile. A durable pause is resumed by whichever node is asked (its own when up and with
//! room: requests are forwarded there; a pause to disk whose node is full is placed as a
//! create is), which records the session as its own first, so its old node's start-up
//! reconciliation never touches it.

use std::collections::{BTreeMap, HashMap};

use koder_api_types::{CreateSession, NetworkMode, SessionState};
use koder_store::{DurablePause, NodeRecord, NodeState};

use super::lifecycle::{lose_orphan, orphan_reason};
use super::Manager;
use crate::Error;

/// Another node, up, as transports reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub node_id: String,
    /// Its base URL (`[node] advertise`).
    pub address: String,
    /// `http://host:port` of its gRPC face, when it serves one.
    pub grpc_address: Option<String>,
}

impl Peer {
    fn of(n: &NodeRecord) -> Peer {
        Peer {
            node_id: n.info.id.clone(),
            address: n.info.address.clone(),
            grpc_address: n.info.grpc_address.clone(),
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
    /// and resumes a durable pause itself). A session paused to disk on a node with no room
    /// goes where [`Manager::place`] puts a create of its runtime (its resume boots it there).
    /// Tenancy is not checked here: the owner checks it.
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
        let node = match record.node_id.as_deref() {
            Some(node) if record.state != SessionState::Stopped => node,
            _ => return Ok(None),
        };
        if record.state == SessionState::Paused {
            // It runs where its volumes are, whichever node paused it.
            let mounts = self.store.session_volume_mounts(id).await?;
            if !mounts.is_empty() {
                let keys: Vec<&str> = mounts.iter().map(|m| m.volume_id.as_str()).collect();
                return self.volumes_owner(None, &keys).await;
            }
        }
        // The node that would serve it: its own while up, else this one.
        let up = (self.store.get_node(node).await?).filter(|n| n.state == NodeState::Up);
        let serving = match up {
            Some(n) => n,
            None => match self.store.get_node(me).await? {
                Some(n) => n,
                None => return Ok(None),
            },
        };
        if record.state == SessionState::Paused && !self.has_room(&serving).await? {
            let pause = self.store.session_durable(id).await?.pause;
            if pause == Some(DurablePause::Disk) {
                // Paused to disk it holds no sandbox anywhere: its resume boots one where
                // there is room, as a create is placed, instead of failing on a full node.
                return self
                    .place(&record.runtime, None, Some(&record.tenant_id))
                    .await;
            }
        }
        Ok((serving.info.id != me).then(|| Peer::of(&serving)))
    }

    /// Whether `node` has room for one more sandbox, by the sandboxes the store records on it.
    async fn has_room(&self, node: &NodeRecord) -> Result<bool, Error> {
        let held = self.store.sandboxes_by_node().await?;
        Ok(held.get(&node.info.id).copied().unwrap_or(0) < node.info.capacity_sandboxes)
    }

    /// This node's warm sandboxes ready to be handed out, by lane (`runtime/language/image`),
    /// as its heartbeat reports them for the other nodes' placement.
    pub fn warm_lanes(&self) -> BTreeMap<String, u64> {
        let jail = Some(("jail", &self.pool));
        let microvm = self.microvm.as_ref().ok().map(|vm| ("microvm", &vm.pool));
        jail.into_iter()
            .chain(microvm)
            .flat_map(|(runtime, pool)| {
                pool.ready_lanes()
                    .into_iter()
                    .map(move |(language, image, n)| {
                        (lane_key(runtime, &language, &image), n as u64)
                    })
            })
            .collect()
    }

    /// The warm-pool lane `req` would take its sandbox from, if it could take one: none for a
    /// create that always gets a fresh sandbox (network, volumes, a snapshot) or one that does
    /// not resolve here (the node it lands on answers why).
    pub fn lane_of(&self, req: &CreateSession) -> Option<String> {
        let fresh = req.from_snapshot.is_some()
            || !req.volumes.is_empty()
            || req
                .network
                .as_ref()
                .is_some_and(|n| n.mode != NetworkMode::None);
        if fresh {
            return None;
        }
        let image = self
            .images
            .choose(req.image.as_deref(), req.language.as_deref())
            .ok()?;
        let runtime = req.runtime.as_deref().unwrap_or("jail");
        let pooled = self.pool_image_of(&image.spec_image, image.language);
        Some(lane_key(runtime, image.language, &pooled))
    }

    /// Where a new session of `tenant` (when the caller is known) on `runtime` (taking from
    /// warm-pool `lane`, when it can) should be created: `None` for this node, else another
    /// node, up ([`choose`]).
    pub async fn place(
        &self,
        runtime: &str,
        lane: Option<&str>,
        tenant: Option<&str>,
    ) -> Result<Option<Peer>, Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(None);
        };
        let nodes = self.store.list_nodes().await?;
        let held = self.store.sandboxes_by_node().await?;
        let tenant_held = match tenant {
            Some(tenant) => self.store.tenant_sandboxes_by_node(tenant).await?,
            None => HashMap::new(),
        };
        // This node's own pool as it is now, not as of its last heartbeat.
        let warm_here = lane.is_some_and(|l| self.warm_lanes().contains_key(l));
        let want = Want {
            runtime,
            lane,
            warm_here,
            tenant_held: &tenant_held,
        };
        Ok(choose(me, &nodes, &held, &want).map(Peer::of))
    }

    /// The other node holding the volumes `keys` name (ids, or names of `tenant`'s): a
    /// volume's data lives on the disk of the node that made it, so its file operations, the
    /// copies made of it and the sessions mounting it are served there. `None`: this node
    /// (or volumes it does not know: it answers why). Volumes of two nodes are a conflict;
    /// a volume whose node is not up cannot be used until it is back.
    pub async fn volumes_owner(
        &self,
        tenant: Option<&str>,
        keys: &[&str],
    ) -> Result<Option<Peer>, Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(None);
        };
        let mut homes = Vec::new();
        for key in keys {
            let record = match self.store.get_volume(key).await? {
                Some(found) => Some(found),
                None => match tenant {
                    Some(tenant) => self.store.find_volume(tenant, key).await?,
                    None => None,
                },
            };
            homes.extend(record.and_then(|v| v.node_id));
        }
        if homes.iter().all(|h| h == me) {
            return Ok(None);
        }
        let nodes = self.store.list_nodes().await?;
        Ok(volumes_home(me, &nodes, &homes)?.map(Peer::of))
    }

    /// The node that runs the cluster's image builds: the up node with the smallest id, so
    /// every node names the same one. `None` for this node (or no cluster). A build's queue,
    /// log and uploaded files live where it runs, so every request of a build goes there; the
    /// image it makes is shared with the others (`Manager::publish_image`).
    pub async fn builder(&self) -> Result<Option<Peer>, Error> {
        let Some(me) = self.cfg.node_id.as_deref() else {
            return Ok(None);
        };
        let nodes = self.store.list_nodes().await?;
        Ok(builder_of(&nodes).filter(|n| n.info.id != me).map(Peer::of))
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

/// How long an unreferenced layer is spared while other nodes share the store: their
/// captures record a layer before the session or snapshot that refers to it, and only the
/// capturing daemon's pins say so; an hour covers the slowest capture and upload.
const SHARED_LAYER_GRACE: chrono::Duration = chrono::Duration::hours(1);

/// The time after which recorded layers are spared by garbage collection (see
/// [`SHARED_LAYER_GRACE`]): none while no other node is up.
pub(super) async fn layer_grace(
    store: &koder_store::Store,
    me: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Error> {
    let others = store
        .list_nodes()
        .await?
        .into_iter()
        .any(|n| n.state == NodeState::Up && Some(n.info.id.as_str()) != me);
    Ok(others.then(|| now - SHARED_LAYER_GRACE))
}

/// The node among `nodes` holding volumes whose data lives on `homes` (node ids): see
/// [`Manager::volumes_owner`]. `None` for this node `me`.
fn volumes_home<'a>(
    me: &str,
    nodes: &'a [NodeRecord],
    homes: &[String],
) -> Result<Option<&'a NodeRecord>, Error> {
    let Some(home) = homes.first() else {
        return Ok(None);
    };
    if let Some(other) = homes.iter().find(|h| *h != home) {
        return Err(Error::Conflict(format!(
            "the volumes live on two nodes ({home} and {other}): a session mounts volumes of \
             one node"
        )));
    }
    if home == me {
        return Ok(None);
    }
    match nodes.iter().find(|n| n.info.id == *home) {
        Some(n) if n.state == NodeState::Up => Ok(Some(n)),
        _ => Err(Error::NodeUnreachable(format!(
            "the volume's data lives on node {home}, which is not up"
        ))),
    }
}

/// The builder among `nodes`: see [`Manager::builder`].
fn builder_of(nodes: &[NodeRecord]) -> Option<&NodeRecord> {
    nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .min_by(|a, b| a.info.id.cmp(&b.info.id))
}

fn lane_key(runtime: &str, language: &str, image: &str) -> String {
    format!("{runtime}/{language}/{image}")
}

/// What a create needs of a node.
struct Want<'a> {
    runtime: &'a str,
    lane: Option<&'a str>,
    /// This node has a warm sandbox for `lane`.
    warm_here: bool,
    /// The creating tenant's sandboxes, by node.
    tenant_held: &'a HashMap<String, u64>,
}

/// The node a create goes to: `None` for this node `me` when it offers the runtime and has
/// room and either has a warm sandbox for the create itself or no other node with room has
/// one (a pool hit elsewhere beats a cold start here; the receiving node beats an equal
/// other); otherwise the other up node offering the runtime with room, one with a warm
/// sandbox for the create first, then the one holding fewest of the tenant's sandboxes (a
/// node lost takes fewer of one tenant's sessions), then the one with the most room (by the
/// sandboxes the store records on each against the capacity each registered). `None` as well when no node has
/// room: this node answers why not.
fn choose<'a>(
    me: &str,
    nodes: &'a [NodeRecord],
    held: &HashMap<String, u64>,
    want: &Want,
) -> Option<&'a NodeRecord> {
    let room = |n: &NodeRecord| {
        let used = held.get(&n.info.id).copied().unwrap_or(0);
        n.info.capacity_sandboxes.saturating_sub(used)
    };
    let fits = |n: &&NodeRecord| {
        n.state == NodeState::Up && room(n) > 0 && n.info.runtimes.iter().any(|r| r == want.runtime)
    };
    let warm = |n: &NodeRecord| {
        want.lane
            .is_some_and(|l| n.warm.get(l).is_some_and(|&ready| ready > 0))
    };
    let here = nodes.iter().filter(fits).any(|n| n.info.id == me);
    let best = nodes
        .iter()
        .filter(fits)
        .filter(|n| n.info.id != me)
        .max_by_key(|n| {
            let tenant_there = want.tenant_held.get(&n.info.id).copied().unwrap_or(0);
            (
                warm(n),
                std::cmp::Reverse(tenant_there),
                room(n),
                std::cmp::Reverse(n.info.id.clone()),
            )
        });
    match best {
        Some(other) if !here || (warm(other) && !want.warm_here) => Some(other),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_store::NodeInfo;

    fn node(id: &str, capacity: u64, warm: &[(&str, u64)]) -> NodeRecord {
        let at = chrono::Utc::now();
        NodeRecord {
            info: NodeInfo {
                id: id.into(),
                address: format!("http://{id}:7070"),
                grpc_address: None,
                runtimes: vec!["jail".into()],
                capacity_sandboxes: capacity,
            },
            load_sandboxes: 0,
            warm: warm.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            state: NodeState::Up,
            started_at: at,
            heartbeat_at: at,
            down_at: None,
        }
    }

    fn placed(nodes: &[NodeRecord], held: &[(&str, u64)], want: &Want) -> Option<String> {
        let held = held.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        choose("a", nodes, &held, want).map(|n| n.info.id.clone())
    }

    const PY: &str = "jail/python/python";

    static NO_TENANT: std::sync::LazyLock<HashMap<String, u64>> =
        std::sync::LazyLock::new(HashMap::new);

    fn want(lane: Option<&'static str>, warm_here: bool) -> Want<'static> {
        Want {
            runtime: "jail",
            lane,
            warm_here,
            tenant_held: &NO_TENANT,
        }
    }

    #[test]
    fn volumes_are_used_where_their_data_is() {
        let mut nodes = [node("a", 3, &[]), node("b", 3, &[]), node("c", 3, &[])];
        let homes = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let home = |nodes: &[NodeRecord], ids: &[&str]| {
            volumes_home("a", nodes, &homes(ids)).map(|n| n.map(|n| n.info.id.clone()))
        };
        assert_eq!(home(&nodes, &[]).unwrap(), None, "no volume of a node");
        assert_eq!(home(&nodes, &["a", "a"]).unwrap(), None, "here");
        assert_eq!(home(&nodes, &["b", "b"]).unwrap(), Some("b".into()));
        assert!(matches!(
            home(&nodes, &["b", "c"]),
            Err(Error::Conflict(m)) if m.contains("(b and c)")
        ));
        assert!(matches!(home(&nodes, &["a", "b"]), Err(Error::Conflict(_))));
        nodes[1].state = NodeState::Lost;
        assert!(matches!(
            home(&nodes, &["b"]),
            Err(Error::NodeUnreachable(m)) if m.contains("node b")
        ));
        assert!(matches!(
            home(&nodes, &["gone"]),
            Err(Error::NodeUnreachable(_))
        ));
    }

    #[test]
    fn every_node_names_the_same_builder() {
        let mut nodes = [node("c", 3, &[]), node("a", 3, &[]), node("b", 3, &[])];
        assert_eq!(builder_of(&nodes).unwrap().info.id, "a");
        nodes[1].state = NodeState::Lost;
        assert_eq!(builder_of(&nodes).unwrap().info.id, "b");
        nodes[2].state = NodeState::Left;
        assert_eq!(builder_of(&nodes).unwrap().info.id, "c");
        nodes[0].state = NodeState::Lost;
        assert!(builder_of(&nodes).is_none());
    }

    #[test]
    fn a_tenant_is_spread_over_the_other_nodes() {
        let nodes = [
            node("a", 3, &[]),
            node("b", 9, &[]),
            node("c", 3, &[(PY, 1)]),
            node("d", 3, &[]),
        ];
        let held = [("a", 3), ("b", 2)];
        let tenant = HashMap::from([("b".to_string(), 2), ("d".to_string(), 1)]);
        let spread = |lane| Want {
            tenant_held: &tenant,
            ..want(lane, false)
        };
        // Here is full. b has the most room but two of the tenant's, d one, c none.
        assert_eq!(placed(&nodes, &held, &spread(None)), Some("c".into()));
        // Without the tenant's counts: the most room.
        assert_eq!(placed(&nodes, &held, &want(None, false)), Some("b".into()));
        // A warm sandbox still comes first.
        let tenant_on_c = HashMap::from([("c".to_string(), 2)]);
        let warm = Want {
            tenant_held: &tenant_on_c,
            ..want(Some(PY), false)
        };
        assert_eq!(placed(&nodes, &held, &warm), Some("c".into()));
        // Here has room: here, whatever the tenant holds.
        let mine = HashMap::from([("a".to_string(), 2)]);
        let here = Want {
            tenant_held: &mine,
            ..want(None, false)
        };
        assert_eq!(placed(&nodes, &[], &here), None);
    }

    #[test]
    fn here_while_there_is_room_unless_a_warm_sandbox_waits_elsewhere() {
        let nodes = [
            node("a", 3, &[]),
            node("b", 3, &[(PY, 1)]),
            node("c", 3, &[]),
        ];
        // No pool hit anywhere, or one here: this node.
        assert_eq!(placed(&nodes, &[], &want(None, false)), None);
        assert_eq!(
            placed(&nodes, &[], &want(Some("jail/bash/host"), false)),
            None
        );
        assert_eq!(placed(&nodes, &[], &want(Some(PY), true)), None);
        // A warm python sandbox on b, none here: b, even with less room than c.
        assert_eq!(
            placed(&nodes, &[("b", 2)], &want(Some(PY), false)),
            Some("b".into())
        );
        // b full: here after all.
        assert_eq!(placed(&nodes, &[("b", 3)], &want(Some(PY), false)), None);
        // This node full: the most room, a warm one first.
        assert_eq!(
            placed(&nodes, &[("a", 3), ("b", 1)], &want(None, false)),
            Some("c".into())
        );
        assert_eq!(
            placed(&nodes, &[("a", 3), ("b", 2)], &want(Some(PY), false)),
            Some("b".into())
        );
    }

    #[tokio::test]
    async fn layers_are_spared_while_another_node_is_up() {
        let store = koder_store::Store::open_in_memory().await.unwrap();
        let now = chrono::Utc::now();
        assert_eq!(layer_grace(&store, Some("a"), now).await.unwrap(), None);
        store
            .register_node(&node("a", 3, &[]).info, now)
            .await
            .unwrap();
        assert_eq!(layer_grace(&store, Some("a"), now).await.unwrap(), None);
        store
            .register_node(&node("b", 3, &[]).info, now)
            .await
            .unwrap();
        assert_eq!(
            layer_grace(&store, Some("a"), now).await.unwrap(),
            Some(now - SHARED_LAYER_GRACE)
        );
        store.leave_node("b", now).await.unwrap();
        assert_eq!(layer_grace(&store, Some("a"), now).await.unwrap(), None);
    }

    #[test]
    fn only_nodes_up_offering_the_runtime() {
        let mut lost = node("b", 9, &[(PY, 4)]);
        lost.state = NodeState::Lost;
        let mut vm = node("c", 9, &[]);
        vm.info.runtimes = vec!["microvm".into()];
        let nodes = [node("a", 1, &[]), lost, vm];
        assert_eq!(placed(&nodes, &[("a", 1)], &want(Some(PY), false)), None);
        let micro = Want {
            runtime: "microvm",
            ..want(None, false)
        };
        assert_eq!(placed(&nodes, &[], &micro), Some("c".into()));
    }
}
