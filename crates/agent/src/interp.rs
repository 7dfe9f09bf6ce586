//! Code-interpreter contexts: long-lived Python/Node interpreters inside the sandbox.
//! (Being written: every request is refused until then.)

use koder_agent_protocol::{AgentError, ErrorCode, FromAgent, ToAgent};
use tokio::sync::mpsc;

use crate::server::Outbox;

#[derive(Default)]
pub struct Contexts {}

impl Contexts {
    pub fn new() -> Self {
        Self::default()
    }
}

pub async fn handle(_contexts: &Contexts, msg: ToAgent, _rx: mpsc::Receiver<ToAgent>, out: Outbox) {
    let err = AgentError::new(
        ErrorCode::InvalidRequest,
        format!("{} is not available yet", msg.kind()),
    );
    let _ = out.send(FromAgent::Error(err)).await;
}
