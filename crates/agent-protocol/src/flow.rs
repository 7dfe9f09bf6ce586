//! Per-stream flow control: credit.
//!
//! Each direction of each stream has a window of [`STREAM_WINDOW`] cost units (a message costs
//! its encoded size, [`cost`]). A sender spends credit before it sends and, without any, waits
//! on that stream alone; a receiver queues what arrives without ever waiting (its one connection
//! reader serves every stream) and grants the credit back with a `Credit` message as its consumer
//! drains the queue. So one consumer that stops reading stops only its own stream, and a stream
//! never holds more than a window of unread messages. A peer that sends beyond its credit breaks
//! the protocol on that stream only: the stream ends, the connection and its other streams live
//! on.
//!
//! Exempt from credit: the message that opens a stream (bounded by the frame limit, and streams by
//! their cap), `Cancel` (the last word on a stream) and `Credit` itself; the receiver handles all
//! three at once, queueing nothing.

use std::sync::atomic::{AtomicU32, Ordering};

use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::messages::{ToAgent, MAX_FRAME_BYTES};

/// Cost units one direction of a stream may have in flight (sent, not yet granted back).
pub const STREAM_WINDOW: u32 = 2 * 1024 * 1024;

/// Credit is granted back once this much was consumed, so a stream of small messages does not
/// answer each with a `Credit`, and a short exchange sends none at all.
const GRANT_BATCH: u32 = STREAM_WINDOW / 4;

// Any frame must fit in an empty window, or a sender could wait for credit that never comes.
const _: () = assert!(MAX_FRAME_BYTES as u64 <= STREAM_WINDOW as u64);

/// What a message costs: its encoded size, at least 1 and at most the window. Both ends compute
/// it from the message itself, so they agree whatever the framing around it.
pub fn cost<M: Serialize>(msg: &M) -> u32 {
    postcard::experimental::serialized_size(msg)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .map_or(STREAM_WINDOW, |n| n.clamp(1, STREAM_WINDOW))
}

/// Whether a daemon → agent message is sent without credit (see the module docs; the message
/// opening a stream is exempt by position, not by kind).
pub fn is_exempt(msg: &ToAgent) -> bool {
    matches!(msg, ToAgent::Cancel | ToAgent::Credit(_))
}

/// The stream was closed: it ended, was cancelled, or its connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the stream is closed")]
pub struct StreamClosed;

/// The peer sent more than its credit allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the peer sent beyond its credit on this stream")]
pub struct CreditExceeded;

/// The sending half of one stream: the credit it may still spend.
#[derive(Debug)]
pub struct SendCredit {
    units: Semaphore,
}

impl Default for SendCredit {
    fn default() -> Self {
        Self {
            units: Semaphore::new(STREAM_WINDOW as usize),
        }
    }
}

impl SendCredit {
    /// Waits until `cost` units are available. Call [`SemaphorePermit::forget`] on the permit
    /// once the message is queued; a send abandoned before that gives its units back.
    pub async fn reserve(&self, cost: u32) -> Result<SemaphorePermit<'_>, StreamClosed> {
        self.units
            .acquire_many(cost.min(STREAM_WINDOW))
            .await
            .map_err(|_| StreamClosed)
    }

    /// The peer consumed `units` more. Capped at the window: a peer granting more than it was
    /// sent cannot make this side run further ahead (nor overflow the count).
    pub fn grant(&self, units: u32) {
        let room = (STREAM_WINDOW as usize).saturating_sub(self.units.available_permits());
        self.units.add_permits((units as usize).min(room));
    }

    /// Fails every waiting and later [`SendCredit::reserve`].
    pub fn close(&self) {
        self.units.close();
    }

    /// Stops the credit binding for good: the peer cancelled the stream, so it either dropped it
    /// (and discards what still comes) or keeps counting it against its window (and ends the
    /// stream if that overflows). Either way nothing is buffered there, and the operation winds
    /// down without waiting for credit that may never come.
    pub fn lift(&self) {
        let room = Semaphore::MAX_PERMITS.saturating_sub(self.units.available_permits());
        self.units.add_permits(room);
    }
}

/// The receiving half of one stream: what the peer sent and was not granted back yet.
#[derive(Debug, Default)]
pub struct RecvWindow {
    /// Admitted and not yet granted back; never above [`STREAM_WINDOW`] for an honest peer.
    outstanding: AtomicU32,
    /// Consumed and not yet granted back.
    unreported: AtomicU32,
}

impl RecvWindow {
    /// Counts an arriving message; `Err` when it goes beyond the peer's credit (the stream is
    /// then broken and must end).
    pub fn admit(&self, cost: u32) -> Result<(), CreditExceeded> {
        self.outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(cost).filter(|&m| m <= STREAM_WINDOW)
            })
            .map(|_| ())
            .map_err(|_| CreditExceeded)
    }

    /// The consumer took a message of `cost`; `Some(units)` is credit to grant back now.
    pub fn consumed(&self, cost: u32) -> Option<u32> {
        let pending = self.unreported.fetch_add(cost, Ordering::AcqRel) + cost;
        if pending < GRANT_BATCH {
            return None;
        }
        let units = self.unreported.swap(0, Ordering::AcqRel);
        self.outstanding.fetch_sub(units, Ordering::AcqRel);
        Some(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::FromAgent;

    #[test]
    fn cost_is_the_encoded_size_within_bounds() {
        let msg = FromAgent::Stdout(vec![7; 1000]);
        let encoded = postcard::to_allocvec(&msg).unwrap();
        assert_eq!(cost(&msg) as usize, encoded.len());
        assert_eq!(cost(&FromAgent::Done), 1);
        assert_eq!(cost(&vec![0u8; 3 * STREAM_WINDOW as usize]), STREAM_WINDOW);
    }

    #[test]
    fn a_window_admits_up_to_its_size_and_refuses_beyond() {
        let w = RecvWindow::default();
        w.admit(STREAM_WINDOW - 10).unwrap();
        w.admit(10).unwrap();
        assert_eq!(w.admit(1), Err(CreditExceeded));
        // A huge claimed cost cannot wrap the count around.
        assert_eq!(w.admit(u32::MAX), Err(CreditExceeded));
    }

    #[test]
    fn consumption_is_granted_back_in_batches_and_reopens_the_window() {
        let w = RecvWindow::default();
        w.admit(STREAM_WINDOW).unwrap();
        assert_eq!(w.consumed(GRANT_BATCH - 1), None);
        assert_eq!(w.admit(1), Err(CreditExceeded), "nothing granted back yet");
        assert_eq!(w.consumed(1), Some(GRANT_BATCH));
        w.admit(GRANT_BATCH).unwrap();
        assert_eq!(w.admit(1), Err(CreditExceeded));
    }

    #[tokio::test]
    async fn a_sender_waits_for_credit_and_over_grants_are_capped() {
        let c = SendCredit::default();
        c.reserve(STREAM_WINDOW).await.unwrap().forget();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), c.reserve(1));
        assert!(waiting.await.is_err(), "no credit left");
        c.grant(u32::MAX);
        c.reserve(STREAM_WINDOW).await.unwrap().forget();
        assert!(
            c.units.available_permits() == 0,
            "the grant was capped at the window"
        );
        // An abandoned send gives its units back.
        c.grant(5);
        drop(c.reserve(5).await.unwrap());
        c.reserve(5).await.unwrap().forget();
        c.close();
        assert_eq!(c.reserve(1).await.unwrap_err(), StreamClosed);
    }

    #[tokio::test]
    async fn a_lifted_credit_no_longer_binds() {
        let c = std::sync::Arc::new(SendCredit::default());
        c.reserve(STREAM_WINDOW).await.unwrap().forget();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move {
                for _ in 0..100 {
                    c.reserve(STREAM_WINDOW).await.unwrap().forget();
                }
            }
        });
        tokio::task::yield_now().await;
        c.lift();
        // A grant afterwards changes nothing (and cannot overflow the count).
        c.grant(u32::MAX);
        let wait = std::time::Duration::from_secs(5);
        tokio::time::timeout(wait, waiter).await.unwrap().unwrap();
    }
}
