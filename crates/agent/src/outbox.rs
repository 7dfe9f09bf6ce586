//! The handle every operation answers through: one stream of one daemon connection. A leaf, so
//! the operations depend on it and not on the server that creates it.

use koder_agent_protocol::{Frame, FromAgent};
use tokio::sync::mpsc;

/// Sends messages of one stream back to the daemon.
#[derive(Clone)]
pub struct Outbox {
    stream: u64,
    tx: mpsc::Sender<Frame<FromAgent>>,
}

impl Outbox {
    pub(crate) fn new(stream: u64, tx: mpsc::Sender<Frame<FromAgent>>) -> Self {
        Self { stream, tx }
    }

    /// The stream this outbox answers on.
    pub(crate) fn stream(&self) -> u64 {
        self.stream
    }

    pub async fn send(&self, msg: FromAgent) -> Result<(), ()> {
        self.tx
            .send(Frame {
                stream: self.stream,
                msg,
            })
            .await
            .map_err(|_| ())
    }
}
