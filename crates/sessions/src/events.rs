//! Lifecycle events the manager emits for whoever listens (webhooks). Emitting never waits on
//! a listener: a sink takes the event and queues it.

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde_json::Value;

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
}

impl Events {
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
        match self.sink.get() {
            Some(sink) => sink.emit(event),
            None => self.early.lock().push(event),
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
