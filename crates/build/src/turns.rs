//! Whose build runs next. The builder runs one build at a time; the waiting builds queue per
//! owner (a tenant, or the operator for native builds) and the owners take turns, so one
//! owner's queue delays another's next build by at most one build of its own, where a single
//! first-come queue would make it wait for all of them.
//!
//! Written here rather than taken from a crate: tokio's semaphore is first come, first served,
//! and what is needed is a handful of lines over a lock and a `Notify`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
    /// Wakes the waiters when the turn passes (each checks whether it is its own).
    passed: Notify,
}

#[derive(Default)]
struct State {
    /// The waiter whose build runs.
    running: Option<u64>,
    /// Waiters by owner, first come first.
    queues: BTreeMap<String, VecDeque<u64>>,
    /// Owners with waiters, in the order of their next turn.
    order: VecDeque<String>,
    next_id: u64,
}

impl State {
    /// The next waiter in turn, its owner moved to the back of the order.
    fn pop_next(&mut self) -> Option<u64> {
        while let Some(owner) = self.order.pop_front() {
            let Some(queue) = self.queues.get_mut(&owner) else {
                continue;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                self.queues.remove(&owner);
            } else {
                self.order.push_back(owner);
            }
            if next.is_some() {
                return next;
            }
        }
        None
    }

    fn forget(&mut self, id: u64) {
        for queue in self.queues.values_mut() {
            queue.retain(|w| *w != id);
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.order.retain(|o| queues.contains_key(o));
    }
}

/// The turn to build, held while the build runs; dropping it passes the turn on.
pub(crate) struct Turn {
    turns: Arc<Turns>,
    id: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.pass(self.id);
    }
}

/// A waiter not granted yet: dropped (its build's task cancelled), it leaves the queue, and
/// passes the turn on if it was granted meanwhile.
struct Waiting {
    turns: Arc<Turns>,
    id: u64,
    /// Became a [`Turn`], which passes it on.
    taken: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let granted = {
            let mut s = self.turns.state.lock();
            s.forget(self.id);
            s.running == Some(self.id)
        };
        if granted {
            self.turns.pass(self.id);
        }
    }
}

impl Turns {
    /// Waits for `owner`'s build's turn.
    pub(crate) async fn wait(self: &Arc<Self>, owner: &str) -> Turn {
        let id = {
            let mut s = self.state.lock();
            let id = s.next_id;
            s.next_id += 1;
            if s.running.is_none() && s.order.is_empty() {
                s.running = Some(id);
                return Turn {
                    turns: self.clone(),
                    id,
                };
            }
            s.queues.entry(owner.to_string()).or_default().push_back(id);
            if !s.order.iter().any(|o| o == owner) {
                s.order.push_back(owner.to_string());
            }
            id
        };
        let mut waiting = Waiting {
            turns: self.clone(),
            id,
            taken: false,
        };
        loop {
            let passed = self.passed.notified();
            tokio::pin!(passed);
            passed.as_mut().enable();
            if self.state.lock().running == Some(id) {
                waiting.taken = true;
                return Turn {
                    turns: self.clone(),
                    id,
                };
            }
            passed.await;
        }
    }

    /// Ends `id`'s turn: the next waiter in turn gets it.
    fn pass(&self, id: u64) {
        {
            let mut s = self.state.lock();
            if s.running != Some(id) {
                return;
            }
            s.running = s.pop_next();
        }
        self.passed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Starts a waiter for `owner` that records its label when granted and holds its turn
    /// until told; returns the release.
    fn waiter(
        turns: &Arc<Turns>,
        owner: &'static str,
        label: &'static str,
        ran: &Arc<Mutex<Vec<&'static str>>>,
    ) -> tokio::sync::oneshot::Sender<()> {
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        let (turns, ran) = (turns.clone(), ran.clone());
        tokio::spawn(async move {
            let _turn = turns.wait(owner).await;
            ran.lock().push(label);
            let _ = hold.await;
        });
        release
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn owners_take_turns_one_build_at_a_time() {
        let turns = Arc::new(Turns::default());
        let ran = Arc::new(Mutex::new(Vec::new()));
        let mut releases = std::collections::HashMap::new();
        releases.insert("a0", waiter(&turns, "a", "a0", &ran));
        settle().await;
        // While a0 runs, a queues three more and b one, after them.
        for (owner, label) in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")] {
            releases.insert(label, waiter(&turns, owner, label, &ran));
            settle().await;
        }
        assert_eq!(*ran.lock(), ["a0"], "one at a time");
        for ended in 1..=5 {
            let running = *ran.lock().last().unwrap();
            releases.remove(running).unwrap().send(()).ok();
            settle().await;
            // Each build ending hands the turn to one more, never two.
            assert_eq!(ran.lock().len(), (ended + 1).min(5));
        }
        // b's build runs after one more of a's, not after all three.
        assert_eq!(*ran.lock(), ["a0", "a1", "b1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_neither_runs_nor_holds_the_turn() {
        let turns = Arc::new(Turns::default());
        let first = turns.wait("a").await;
        let cancelled = tokio::spawn({
            let turns = turns.clone();
            async move {
                let _turn = turns.wait("b").await;
                std::future::pending::<()>().await;
            }
        });
        settle().await;
        cancelled.abort();
        let _ = cancelled.await;
        let next = tokio::spawn({
            let turns = turns.clone();
            async move { turns.wait("c").await.id }
        });
        settle().await;
        drop(first);
        let id = tokio::time::timeout(Duration::from_secs(5), next).await;
        assert!(id.is_ok(), "the turn passed over the cancelled waiter");
        // And with nothing waiting, the next build runs at once.
        let _again = tokio::time::timeout(Duration::from_secs(5), turns.wait("a"))
            .await
            .expect("free");
    }
}
