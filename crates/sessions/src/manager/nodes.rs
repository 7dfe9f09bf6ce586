//! Sharing a store with other daemons: the sessions of a node that was lost are ended by
//! whoever notices (their sandboxes went with it), and a node that was counted lost while it
//! still ran (a long pause, a partition) lets go of the sessions the others ended meanwhile.

use koder_api_types::SessionState;

use super::lifecycle::{orphan_reason, stop_orphan};
use super::Manager;
use crate::Error;

impl Manager {
    /// Ends the sessions recorded on `node` (marked lost: its heartbeat stopped), as a
    /// restart of it would: durable pauses stay paused. Returns how many ended.
    pub async fn take_over_lost_node(&self, node: &str) -> Result<usize, Error> {
        if self.cfg.node_id.as_deref() == Some(node) {
            return Ok(0);
        }
        let cause = format!("its node {node} was lost");
        let mut ended = 0;
        for s in self.store.live_sessions_on_node(node).await? {
            let pause = self.store.session_durable(&s.id).await?.pause;
            if let Some(reason) = orphan_reason(s.state, pause, &cause, true) {
                stop_orphan(&self.store, &self.events, &s.id, &s.tenant_id, &reason).await?;
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
