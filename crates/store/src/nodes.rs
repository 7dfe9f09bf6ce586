//! The daemons (nodes) sharing this store: registration, heartbeats (with the load and warm
//! sandboxes placement reads), and marking lost the nodes whose heartbeat stopped.
//!
//! Every transition is one conditional `UPDATE`, so concurrent daemons agree without a lock:
//! a node is marked lost by exactly one of the daemons that noticed (its id comes back from
//! that one's [`Store::mark_lost_nodes`] only), and a heartbeat arriving after that is refused
//! (`Ok(false)`), so the node knows to reconcile and register anew.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::db::{query, DbRow};
use crate::{from_json, from_ms, get, to_json, to_ms, Store, StoreError};

/// What a node says about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: String,
    /// Base URL the other nodes reach this one at.
    pub address: String,
    /// `http://host:port` of its gRPC face, when it serves one.
    pub grpc_address: Option<String>,
    /// The runtimes it offers (`jail`, `microvm`).
    pub runtimes: Vec<String>,
    /// Sandboxes it can hold at once.
    pub capacity_sandboxes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Up,
    /// Its heartbeat stopped for longer than the timeout.
    Lost,
    /// It shut down cleanly.
    Left,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Lost => "lost",
            NodeState::Left => "left",
        }
    }

    fn parse(s: &str) -> Option<NodeState> {
        [NodeState::Up, NodeState::Lost, NodeState::Left]
            .into_iter()
            .find(|n| n.as_str() == s)
    }
}

/// What a node reports with each heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLoad {
    /// Sandboxes it holds.
    pub sandboxes: u64,
    /// Warm sandboxes ready to be handed out, by pool lane (`runtime/language/image`).
    pub warm: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub info: NodeInfo,
    /// Sandboxes it held at its last heartbeat.
    pub load_sandboxes: u64,
    /// Its warm sandboxes at its last heartbeat ([`NodeLoad::warm`]).
    pub warm: BTreeMap<String, u64>,
    pub state: NodeState,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    /// When it was marked lost or left.
    pub down_at: Option<DateTime<Utc>>,
}

const NODE_COLUMNS: &str = "id, address, runtimes_json, capacity_sandboxes, load_sandboxes, \
     warm_json, state, started_at_ms, heartbeat_at_ms, down_at_ms, grpc_address";

impl Store {
    /// Registers the node as up at `at` (started and last heard of then, no load yet): a new
    /// node, or one coming back after a restart, a clean leave or being marked lost.
    pub async fn register_node(&self, n: &NodeInfo, at: DateTime<Utc>) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO nodes ({NODE_COLUMNS}) \
             VALUES ($1, $2, $3, $4, 0, '{{}}', 'up', $5, $5, NULL, $6) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, \
             grpc_address = excluded.grpc_address, \
             runtimes_json = excluded.runtimes_json, \
             capacity_sandboxes = excluded.capacity_sandboxes, load_sandboxes = 0, \
             warm_json = '{{}}', state = 'up', \
             started_at_ms = excluded.started_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms, \
             down_at_ms = NULL"
        ))
        .bind(&n.id)
        .bind(&n.address)
        .bind(to_json(&n.runtimes)?)
        .bind(to_i64(n.capacity_sandboxes, "capacity")?)
        .bind(to_ms(at))
        .bind(&n.grpc_address)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a heartbeat with the node's load. `Ok(false)` when the node is no longer up
    /// (marked lost, or left): it must reconcile and [`Store::register_node`] again.
    /// `NotFound` if it never registered.
    pub async fn heartbeat_node(
        &self,
        id: &str,
        load: &NodeLoad,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = query(
            "UPDATE nodes SET heartbeat_at_ms = $2, load_sandboxes = $3, warm_json = $4 \
             WHERE id = $1 AND state = 'up'",
        )
        .bind(id)
        .bind(to_ms(at))
        .bind(to_i64(load.sandboxes, "load")?)
        .bind(to_json(&load.warm)?)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() > 0 {
            return Ok(true);
        }
        match self.get_node(id).await? {
            Some(_) => Ok(false),
            None => Err(StoreError::NotFound),
        }
    }

    /// Marks lost, at `now`, every node up whose last heartbeat is older than `before`;
    /// the ids this call marked (a node another daemon marked first is not among them).
    pub async fn mark_lost_nodes(
        &self,
        before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let rows = query(
            "UPDATE nodes SET state = 'lost', down_at_ms = $2 \
             WHERE state = 'up' AND heartbeat_at_ms < $1 RETURNING id",
        )
        .bind(to_ms(before))
        .bind(to_ms(now))
        .fetch_all(&self.pool)
        .await?;
        let mut ids: Vec<String> = rows
            .iter()
            .map(|r| get(r, "id"))
            .collect::<Result<_, _>>()?;
        ids.sort();
        Ok(ids)
    }

    /// The node shut down cleanly at `at` (a no-op unless it is up).
    pub async fn leave_node(&self, id: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        query("UPDATE nodes SET state = 'left', down_at_ms = $2 WHERE id = $1 AND state = 'up'")
            .bind(id)
            .bind(to_ms(at))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn get_node(&self, id: &str) -> Result<Option<NodeRecord>, StoreError> {
        let row = query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(node_from_row).transpose()
    }

    /// Every node ever registered, by id.
    pub async fn list_nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let rows = query(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(node_from_row).collect()
    }
}

fn to_i64(n: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Invalid(format!("node {what} {n} is too large")))
}

fn node_from_row(row: &DbRow) -> Result<NodeRecord, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("node {id:?} {col}");
    let count = |col: &str| -> Result<u64, StoreError> {
        let n: i64 = get(row, col)?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("{}: {n}", what(col))))
    };
    let state_text: String = get(row, "state")?;
    let state = NodeState::parse(&state_text)
        .ok_or_else(|| StoreError::Corrupt(format!("{}: {state_text:?}", what("state"))))?;
    Ok(NodeRecord {
        load_sandboxes: count("load_sandboxes")?,
        warm: from_json(&get::<String>(row, "warm_json")?, &what("warm"))?,
        state,
        started_at: from_ms(get(row, "started_at_ms")?, &what("started_at"))?,
        heartbeat_at: from_ms(get(row, "heartbeat_at_ms")?, &what("heartbeat_at"))?,
        down_at: get::<Option<i64>>(row, "down_at_ms")?
            .map(|ms| from_ms(ms, &what("down_at")))
            .transpose()?,
        info: NodeInfo {
            address: get(row, "address")?,
            grpc_address: get(row, "grpc_address")?,
            runtimes: from_json(&get::<String>(row, "runtimes_json")?, &what("runtimes"))?,
            capacity_sandboxes: count("capacity_sandboxes")?,
            id,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::t;

    fn load(sandboxes: u64) -> NodeLoad {
        NodeLoad {
            sandboxes,
            warm: BTreeMap::new(),
        }
    }

    fn node(id: &str) -> NodeInfo {
        NodeInfo {
            id: id.into(),
            address: format!("http://{id}.internal:7070"),
            grpc_address: Some(format!("http://{id}.internal:7071")),
            runtimes: vec!["jail".into(), "microvm".into()],
            capacity_sandboxes: 64,
        }
    }

    async fn register_heartbeat_lost_and_back(db: TestDb) {
        let store = db.open().await;
        store.register_node(&node("a"), t(0)).await.unwrap();
        store.register_node(&node("b"), t(0)).await.unwrap();
        let warm = BTreeMap::from([("jail/python/python".to_string(), 2)]);
        assert!(store.heartbeat_node("a", &load(3), t(10)).await.unwrap());
        let b_load = NodeLoad {
            sandboxes: 1,
            warm: warm.clone(),
        };
        assert!(store.heartbeat_node("b", &b_load, t(25)).await.unwrap());
        let b = store.get_node("b").await.unwrap().unwrap();
        assert_eq!((b.load_sandboxes, b.warm), (1, warm));
        let err = store
            .heartbeat_node("nobody", &load(0), t(25))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NotFound), "{err}");

        // Timeout 20 s at t=35: a (last heard at 10) is lost, b (25) is not.
        assert_eq!(store.mark_lost_nodes(t(15), t(35)).await.unwrap(), ["a"]);
        assert!(store
            .mark_lost_nodes(t(15), t(36))
            .await
            .unwrap()
            .is_empty());
        let a = store.get_node("a").await.unwrap().unwrap();
        assert_eq!(
            (a.state, a.load_sandboxes, a.heartbeat_at, a.down_at),
            (NodeState::Lost, 3, t(10), Some(t(35)))
        );
        assert_eq!(a.info, node("a"));
        // A late heartbeat of a lost node is refused: it re-registers.
        assert!(!store.heartbeat_node("a", &load(3), t(40)).await.unwrap());
        store.register_node(&node("a"), t(41)).await.unwrap();
        let a = store.get_node("a").await.unwrap().unwrap();
        assert_eq!(
            (a.state, a.load_sandboxes, a.started_at, a.down_at),
            (NodeState::Up, 0, t(41), None)
        );

        store.leave_node("b", t(50)).await.unwrap();
        let states: Vec<_> = store
            .list_nodes()
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.info.id, n.state))
            .collect();
        assert_eq!(
            states,
            [
                ("a".to_string(), NodeState::Up),
                ("b".into(), NodeState::Left)
            ]
        );
        // A node that left is not "lost" later.
        assert_eq!(store.mark_lost_nodes(t(45), t(99)).await.unwrap(), ["a"]);
    }

    /// Daemons noticing the same silent nodes at once: each node is marked by exactly one.
    async fn concurrent_markers_each_mark_a_node_once(db: TestDb) {
        let store = db.open().await;
        let ids: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        for id in &ids {
            store.register_node(&node(id), t(0)).await.unwrap();
        }
        let (m1, m2, m3) = match db {
            // One in-memory database: clones of one store.
            TestDb::Sqlite => (store.clone(), store.clone(), store.clone()),
            TestDb::Postgres { .. } => (db.open().await, db.open().await, db.open().await),
        };
        let (r1, r2, r3) = tokio::join!(
            m1.mark_lost_nodes(t(5), t(10)),
            m2.mark_lost_nodes(t(5), t(10)),
            m3.mark_lost_nodes(t(5), t(10)),
        );
        let mut marked: Vec<String> = [r1, r2, r3].into_iter().flat_map(|r| r.unwrap()).collect();
        marked.sort();
        assert_eq!(marked, ids);
    }

    on_both_backends!(
        register_heartbeat_lost_and_back,
        concurrent_markers_each_mark_a_node_once,
    );
}
