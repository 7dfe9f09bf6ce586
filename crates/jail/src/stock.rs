//! A stock of things a cold create would otherwise make on its own path (its cgroups, its
//! network namespace), made ahead on a thread of their own in the pauses between creates.
//!
//! How many are held follows demand: one at first, twice as many each time a create found none
//! ready, up to [`MAX_DEPTH`]. Nothing is made until a create asked, and reconciliation clears
//! and pauses the stock again ([`Stock::clear`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lock;

/// How long without a take a thing is made after: not beside a create's clone and agent
/// start, nor beside the next create of a loop.
const REFILL_DELAY: Duration = Duration::from_millis(30);

/// The most things held ready.
const MAX_DEPTH: usize = 4;

/// What a [`Stock`] holds and how one is made and thrown away.
pub(crate) trait Make: Send + Sync + 'static {
    type Item: Send + 'static;
    /// Names the filling thread and the log lines.
    const WHAT: &'static str;
    fn make(&self) -> Result<Self::Item, String>;
    fn discard(&self, item: Self::Item);
}

pub(crate) struct Stock<M: Make> {
    maker: M,
    state: Mutex<State<M::Item>>,
    /// Held while a thing is made and stocked: [`Stock::clear`] waits for it, so none appears
    /// after it returned (a daemon exiting then leaves none behind).
    making: Mutex<()>,
}

struct State<T> {
    ready: Vec<T>,
    depth: usize,
    filling: bool,
    /// Cleared by reconciliation: nothing is made until a create asks again.
    paused: bool,
    /// Takes since the stock was last cleared: after the first, finding none means creates
    /// outpace the refill.
    takes: u64,
}

impl<M: Make> Stock<M> {
    pub(crate) fn new(maker: M) -> Arc<Self> {
        Arc::new(Self {
            maker,
            state: Mutex::new(State {
                ready: Vec::new(),
                depth: 1,
                filling: false,
                paused: false,
                takes: 0,
            }),
            making: Mutex::default(),
        })
    }

    pub(crate) fn maker(&self) -> &M {
        &self.maker
    }

    /// A made thing, if one is ready; either way the stock is wanted again, deeper when it
    /// had none. [`Stock::refill`] after the create made its use of it.
    pub(crate) fn take(&self) -> Option<M::Item> {
        let mut state = lock(&self.state);
        state.paused = false;
        state.takes += 1;
        let made = state.ready.pop();
        if made.is_none() && state.takes > 1 {
            state.depth = (state.depth * 2).min(MAX_DEPTH);
        }
        made
    }

    /// Starts a thread making things until the stock's depth is ready, unless one is at it or
    /// nothing is missing. It makes one only after [`REFILL_DELAY`] without a take: while
    /// creates keep arriving, its work would share the cores (and the kernel's locks) with
    /// theirs and slow each of them more than a thing made ahead saves (a create loop measured
    /// so with cgroups), so the stock fills in the pauses between them.
    pub(crate) fn refill(self: &Arc<Self>) {
        let mut seen = {
            let mut state = lock(&self.state);
            if state.paused || state.filling || state.ready.len() >= state.depth {
                return;
            }
            state.filling = true;
            state.takes
        };
        let me = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name(format!("ready-{}", M::WHAT))
            .spawn(move || loop {
                std::thread::sleep(REFILL_DELAY);
                // A runtime dropped meanwhile wants none.
                let Some(me) = me.upgrade() else { return };
                let _making = lock(&me.making);
                let takes = lock(&me.state).takes;
                if std::mem::replace(&mut seen, takes) != takes {
                    continue;
                }
                if !me.still_wanted() {
                    return;
                }
                match me.maker.make() {
                    Ok(item) => me.put(item),
                    Err(e) => {
                        tracing::warn!(error = %e, "making a sandbox {} ahead", M::WHAT);
                        lock(&me.state).filling = false;
                        return;
                    }
                }
            });
        if started.is_err() {
            lock(&self.state).filling = false;
        }
    }

    /// Whether the filling thread should make another; when not, it is done.
    fn still_wanted(&self) -> bool {
        let mut state = lock(&self.state);
        let wanted = !state.paused && state.ready.len() < state.depth;
        state.filling = wanted;
        wanted
    }

    /// Adds a made thing to the stock, or discards it if the stock was cleared meanwhile.
    fn put(&self, item: M::Item) {
        let mut state = lock(&self.state);
        if !state.paused {
            return state.ready.push(item);
        }
        state.filling = false;
        drop(state);
        self.maker.discard(item);
    }

    /// Discards everything held ready; nothing is made again until a create asks.
    pub(crate) fn clear(&self) {
        let _making = lock(&self.making);
        let ready = {
            let mut state = lock(&self.state);
            state.paused = true;
            state.takes = 0;
            state.depth = 1;
            std::mem::take(&mut state.ready)
        };
        for item in ready {
            self.maker.discard(item);
        }
    }
}

impl<M: Make> Drop for Stock<M> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counter {
        made: AtomicUsize,
        discarded: AtomicUsize,
        fail: std::sync::atomic::AtomicBool,
    }

    impl Make for Arc<Counter> {
        type Item = usize;
        const WHAT: &'static str = "test";
        fn make(&self) -> Result<usize, String> {
            if self.fail.load(Ordering::SeqCst) {
                return Err("refused".into());
            }
            Ok(self.made.fetch_add(1, Ordering::SeqCst))
        }
        fn discard(&self, _: usize) {
            self.discarded.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Waits (up to 10 s: the filling thread may be slow on a loaded host) for `done`.
    fn wait_for(done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() && std::time::Instant::now() < deadline {
            std::thread::sleep(REFILL_DELAY);
        }
    }

    fn ready(stock: &Stock<Arc<Counter>>) -> usize {
        lock(&stock.state).ready.len()
    }

    fn filling(stock: &Stock<Arc<Counter>>) -> bool {
        lock(&stock.state).filling
    }

    /// Asks for a refill and waits until its thread is done.
    fn refilled(stock: &Arc<Stock<Arc<Counter>>>) {
        stock.refill();
        wait_for(|| !filling(stock));
    }

    #[test]
    fn fills_on_demand_deepens_when_found_empty_and_clears() {
        let counter = Arc::new(Counter::default());
        let stock = Stock::new(counter.clone());
        refilled(&stock);
        assert_eq!(
            counter.made.load(Ordering::SeqCst),
            1,
            "fills before any take"
        );
        assert_eq!(stock.take(), Some(0));
        // Found none twice: the depth doubles to 2, then 4.
        assert_eq!(stock.take(), None);
        assert_eq!(stock.take(), None);
        refilled(&stock);
        assert_eq!(ready(&stock), MAX_DEPTH);
        stock.clear();
        assert_eq!(counter.discarded.load(Ordering::SeqCst), MAX_DEPTH);
        // Paused: a refill without a take makes nothing.
        stock.refill();
        assert!(!filling(&stock), "a paused stock starts no filling");
        assert_eq!(ready(&stock), 0);
        assert_eq!(counter.made.load(Ordering::SeqCst), 1 + MAX_DEPTH);
    }

    #[test]
    fn a_failed_make_stops_the_filling_until_the_next_refill() {
        let counter = Arc::new(Counter::default());
        counter.fail.store(true, Ordering::SeqCst);
        let stock = Stock::new(counter.clone());
        assert_eq!(stock.take(), None);
        refilled(&stock);
        assert_eq!(ready(&stock), 0);
        counter.fail.store(false, Ordering::SeqCst);
        refilled(&stock);
        assert_eq!(stock.take(), Some(0));
    }

    #[test]
    fn dropping_the_stock_discards_what_it_holds() {
        let counter = Arc::new(Counter::default());
        let stock = Stock::new(counter.clone());
        refilled(&stock);
        assert_eq!(ready(&stock), 1);
        drop(stock);
        assert_eq!(counter.discarded.load(Ordering::SeqCst), 1);
    }
}
