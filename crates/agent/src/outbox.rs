//! The handle every operation answers through: one stream of one daemon connection. A leaf, so
//! the operations depend on it and not on the server that creates it.

use std::sync::Arc;

use koder_agent_protocol::flow::{self, SendCredit};
use koder_agent_protocol::{Frame, FromAgent};
use tokio::sync::mpsc;

/// Sends messages of one stream back to the daemon.
#[derive(Clone)]
pub struct Outbox {
    stream: u64,
    tx: mpsc::Sender<Frame<FromAgent>>,
    /// What the daemon lets this stream send before it has read more.
    credit: Arc<SendCredit>,
}

impl Outbox {
    pub(crate) fn new(
        stream: u64,
        tx: mpsc::Sender<Frame<FromAgent>>,
        credit: Arc<SendCredit>,
    ) -> Self {
        Self { stream, tx, credit }
    }

    /// The stream this outbox answers on.
    pub(crate) fn stream(&self) -> u64 {
        self.stream
    }

    /// Sends `msg` once the daemon has credit for it: waiting here is the back-pressure of a
    /// slow reader, on this stream alone. `Err` once the stream or the connection is gone.
    pub async fn send(&self, msg: FromAgent) -> Result<(), ()> {
        let permit = self
            .credit
            .reserve(flow::cost(&msg))
            .await
            .map_err(|_| ())?;
        self.tx
            .send(Frame {
                stream: self.stream,
                msg,
            })
            .await
            .map_err(|_| ())?;
        permit.forget();
        Ok(())
    }
}
