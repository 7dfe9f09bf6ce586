//! Lifecycle events the manager emits for whoever listens (webhooks), each also appended to
//! its session's log in the store (read back as the session's events and E2B's sandbox logs).
//! Emitting never waits: a sink takes the event and queues it, the log has a queue of its own.

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

use koder_store::{SessionEventRecord, Store, StoreError};

/// How many events of one session its log keeps (the newest): lifecycle events are a handful,
/// but exec verdicts are one per killed exec and a loop of timeouts must not grow it forever.
pub const LOG_KEEP: u32 = 500;

/// Event types, as deliveries name them.
pub mod kinds {
    pub const SESSION_CREATED: &str = "session.created";
    pub const SESSION_PAUSED: &str = "session.paused";
    pub const SESSION_RESUMED: &str = "session.resumed";
    pub const SESSION_STOPPED: &str = "session.stopped";
    /// An exec that did not end on its own (timeout, OOM, pids limit, killed).
    pub const EXEC_VERDICT: &str = "exec.verdict";
    pub const ALL: &[&str] = &[
        SESSION_CREATED,
        SESSION_PAUSED,
        SESSION_RESUMED,
        SESSION_STOPPED,
        EXEC_VERDICT,
    ];
}

/// One thing that happened to a tenant's session.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Unique per event: receivers deduplicate redeliveries with it.
    pub id: String,
    pub kind: &'static str,
    pub tenant: String,
    pub created_at: DateTime<Utc>,
    pub data: Value,
}

/// Whoever wants the manager's events. `emit` is called on the manager's own paths and must
/// not block.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: Event);
}

/// Why a session stopped, from the reason the manager recorded, in a closed vocabulary.
pub fn stop_cause(reason: &str) -> &'static str {
    match reason {
        "deleted" => "deleted",
        "expired" => "expired",
        "session-minutes quota used up" => "quota",
        crate::error::AGENT_EXITED => "agent_exited",
        "daemon shutdown" => "daemon_shutdown",
        r if r.starts_with("daemon restarted") => "daemon_restart",
        _ => "other",
    }
}

/// The manager's side: events before a sink is set (the reconciliation at start runs before
/// anyone could listen) wait for it.
#[derive(Clone, Default)]
pub(crate) struct Events {
    sink: Arc<OnceLock<Arc<dyn EventSink>>>,
    early: Arc<Mutex<Vec<Event>>>,
    /// Into the sessions' logs (none in tests that only look at the sink).
    log: Option<mpsc::UnboundedSender<Event>>,
}

impl Events {
    /// Events also appended to their session's log in `store`, by a task of their own (in
    /// the order emitted), so no emitter waits on the database.
    pub(crate) fn logged_in(store: Store) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(append_forever(store, rx));
        Self {
            log: Some(tx),
            ..Self::default()
        }
    }

    pub(crate) fn set_sink(&self, sink: Arc<dyn EventSink>) {
        if self.sink.set(sink.clone()).is_err() {
            tracing::warn!("an event sink was set already; the new one is ignored");
            return;
        }
        for event in std::mem::take(&mut *self.early.lock()) {
            sink.emit(event);
        }
    }

    pub(crate) fn emit(&self, tenant: &str, kind: &'static str, data: Value) {
        let event = Event {
            id: format!("evt_{}", uuid::Uuid::new_v4().simple()),
            kind,
            tenant: tenant.to_string(),
            created_at: Utc::now(),
            data,
        };
        if let Some(log) = &self.log {
            let _ = log.send(event.clone());
        }
        match self.sink.get() {
            Some(sink) => sink.emit(event),
            None => self.early.lock().push(event),
        }
    }
}

/// Appends each event naming a session to that session's log until every sender is gone.
async fn append_forever(store: Store, mut rx: mpsc::UnboundedReceiver<Event>) {
    while let Some(event) = rx.recv().await {
        let Some(session_id) = event.data["session_id"].as_str() else {
            continue;
        };
        let record = SessionEventRecord {
            session_id: session_id.to_string(),
            event_id: event.id,
            kind: event.kind.to_string(),
            at: event.created_at,
            data: event.data,
        };
        match store.append_session_event(&record, LOG_KEEP).await {
            Ok(()) => {}
            // Its record is gone already (a create that failed before storing it).
            Err(StoreError::NotFound) => {
                tracing::debug!(session = %record.session_id, kind = %record.kind, "no record to log an event to")
            }
            Err(e) => {
                tracing::warn!(session = %record.session_id, kind = %record.kind, error = %e, "logging a session event")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Collect(Mutex<Vec<Event>>);

    impl EventSink for Collect {
        fn emit(&self, event: Event) {
            self.0.lock().push(event);
        }
    }

    #[test]
    fn events_before_the_sink_wait_for_it() {
        let events = Events::default();
        events.emit("t", kinds::SESSION_STOPPED, serde_json::json!({"n": 1}));
        let sink = Arc::new(Collect(Mutex::default()));
        events.set_sink(sink.clone());
        events.emit("t", kinds::SESSION_CREATED, serde_json::json!({"n": 2}));
        let got = sink.0.lock();
        let kinds: Vec<_> = got.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [kinds::SESSION_STOPPED, kinds::SESSION_CREATED]);
        assert_ne!(got[0].id, got[1].id);
    }

    #[test]
    fn stop_reasons_map_to_causes() {
        assert_eq!(stop_cause("deleted"), "deleted");
        assert_eq!(stop_cause("agent exited"), "agent_exited");
        assert_eq!(
            stop_cause("daemon restarted (a memory pause does not survive it)"),
            "daemon_restart"
        );
        assert_eq!(stop_cause("session-minutes quota used up"), "quota");
        assert_eq!(stop_cause("fork failed"), "other");
    }
}
