//! `PUT .../network`: a running session's policy replaced, effective for its next connection.

use koder_api_types::{Network, Session, SessionState};
use koder_auth::Identity;

use super::Manager;
use crate::egress;
use crate::Error;

impl Manager {
    /// Replaces the session's network policy (allow and deny together, as on create). Applied
    /// to every connection and lookup from now on (open connections keep running), recorded,
    /// and audited. A session created with mode `none` has no egress path to open later.
    pub async fn set_network(
        &self,
        who: &Identity,
        id: &str,
        requested: Network,
    ) -> Result<Session, Error> {
        let mut record = self.record(who, id).await?;
        if record.state == SessionState::Stopped {
            return Err(Error::Conflict("the session has ended".into()));
        }
        let live = self.live.lock().get(id).cloned();
        let shared = match &live {
            Some(l) => Some(l.policy.clone().ok_or_else(|| {
                Error::Conflict(
                    "the session was created with network mode none: its sandbox has no egress \
                     path to change; create it with mode open or allowlist (an empty allowlist \
                     reaches nothing) to change its policy later"
                        .into(),
                )
            })?),
            // Paused to disk or saved: the record is what its next boot builds on.
            None => None,
        };
        let policy = egress::policy_for(&requested, &self.cfg.network).await?;
        record.network = egress::network_of(requested.mode, &policy);
        self.store.set_session_network(id, &record.network).await?;
        if let Some(shared) = shared {
            *shared.lock().await = policy;
        }
        egress::audit_change(&self.store, &record).await;
        self.view(&record).await
    }
}
