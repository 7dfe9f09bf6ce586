//! Sandbox cgroups made ahead, so that a create with no warm sandbox to hand out renames a made
//! group (its agent and workload leaves with it) to its sandbox's name instead of making them:
//! on cgroup v1 that is fifteen `mkdir`s across five hierarchies, the slowest part of a cold
//! create's set-up (~1.3 ms here, against five renames' 0.03 ms). cgroup2 cannot rename a
//! group, so there each create makes its own (three `mkdir`s in one hierarchy).
//!
//! How many are held follows demand, as for the disks: one at first, twice as many each time a
//! create found none ready, up to [`MAX_DEPTH`]; they are made in the pauses between creates
//! (see [`ReadyCgroups::refill`]). A made group has no limits and no process; the create that
//! takes it sets its limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use koder_cgroups::{Cgroup, CgroupDriver, CgroupVersion};

use crate::lock;

/// How long without a create asking a group is made after: not beside a create's clone and
/// agent start, nor beside the next create of a loop.
const REFILL_DELAY: Duration = Duration::from_millis(30);

/// The most groups held ready.
const MAX_DEPTH: usize = 4;

/// Marks the names of groups made ahead. Sandbox ids never hold a '.', so reconciliation, which
/// tears down the groups of sandbox ids, leaves these to [`ReadyCgroups`].
const READY_MARK: &str = "ready.";

pub(crate) struct ReadyCgroups {
    driver: Box<dyn CgroupDriver>,
    /// `<runtime's cgroup prefix>ready.`: this runtime's groups made ahead.
    prefix: String,
    /// The leaves every sandbox cgroup has.
    leaves: [&'static str; 2],
    stock: Mutex<Stock>,
    /// Held while a group is made and stocked: [`ReadyCgroups::clear`] waits for it, so none
    /// appears after it returned (a daemon exiting then leaves none behind).
    making: Mutex<()>,
}

#[derive(Default)]
struct Stock {
    ready: Vec<String>,
    depth: usize,
    filling: bool,
    /// Cleared by reconciliation: nothing is made until a create asks again.
    paused: bool,
    /// Creates that asked since the stock was last cleared: after the first, finding none
    /// means creates outpace the refill.
    takes: u64,
}

impl ReadyCgroups {
    /// A stock for the runtime whose cgroups are named `<prefix><sandbox id>`, each with
    /// `leaves`; `None` where groups cannot be renamed (cgroup2). Groups a previous run made
    /// ahead are destroyed now.
    pub(crate) fn new(
        driver: Box<dyn CgroupDriver>,
        prefix: &str,
        leaves: [&'static str; 2],
    ) -> Option<Arc<Self>> {
        if driver.version() != CgroupVersion::V1 {
            return None;
        }
        let me = Self {
            driver,
            prefix: format!("{prefix}{READY_MARK}"),
            leaves,
            stock: Mutex::new(Stock {
                depth: 1,
                ..Stock::default()
            }),
            making: Mutex::default(),
        };
        let leftovers = me.driver.list().unwrap_or_default();
        for name in leftovers.iter().filter(|n| n.starts_with(&me.prefix)) {
            me.destroy(name);
        }
        Some(Arc::new(me))
    }

    /// A made group renamed to `name`, if one is ready: the caller opens its leaves.
    pub(crate) fn take(&self, name: &str) -> Option<Box<dyn Cgroup>> {
        let made = {
            let mut stock = lock(&self.stock);
            stock.paused = false;
            stock.takes += 1;
            let made = stock.ready.pop();
            if made.is_none() && stock.takes > 1 {
                stock.depth = (stock.depth * 2).min(MAX_DEPTH);
            }
            made
        }?;
        match self.driver.rename(&made, name) {
            Ok(group) => Some(group),
            Err(e) => {
                tracing::warn!(group = %made, error = %e, "a cgroup made ahead could not be used");
                self.destroy(&made);
                None
            }
        }
    }

    /// Starts a thread making groups until the stock's depth is ready, unless one is at it or
    /// nothing is missing. It makes one only after [`REFILL_DELAY`] without a take: while
    /// creates keep arriving, its `mkdir`s would share the cores and the cgroup lock with
    /// theirs and slow each of them more than a group made ahead saves (a create loop measured
    /// so), so the stock fills in the pauses between them.
    pub(crate) fn refill(self: &Arc<Self>) {
        let mut seen = {
            let mut stock = lock(&self.stock);
            if stock.paused || stock.filling || stock.ready.len() >= stock.depth {
                return;
            }
            stock.filling = true;
            stock.takes
        };
        let me = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("ready-cgroups".into())
            .spawn(move || loop {
                std::thread::sleep(REFILL_DELAY);
                // A runtime dropped meanwhile wants none.
                let Some(me) = me.upgrade() else { return };
                let _making = lock(&me.making);
                let takes = lock(&me.stock).takes;
                if std::mem::replace(&mut seen, takes) != takes {
                    continue;
                }
                if !me.still_wanted() {
                    return;
                }
                match me.make() {
                    Ok(name) => me.put(name),
                    Err(e) => {
                        tracing::warn!(error = %e, "making a sandbox cgroup ahead");
                        lock(&me.stock).filling = false;
                        return;
                    }
                }
            });
        if started.is_err() {
            lock(&self.stock).filling = false;
        }
    }

    /// Whether the filling thread should make another; when not, it is done.
    fn still_wanted(&self) -> bool {
        let mut stock = lock(&self.stock);
        let wanted = !stock.paused && stock.ready.len() < stock.depth;
        stock.filling = wanted;
        wanted
    }

    /// Adds a made group to the stock, or destroys it if the stock was cleared meanwhile.
    fn put(&self, name: String) {
        let mut stock = lock(&self.stock);
        if !stock.paused {
            return stock.ready.push(name);
        }
        stock.filling = false;
        drop(stock);
        self.destroy(&name);
    }

    fn make(&self) -> Result<String, koder_cgroups::CgroupError> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let name = format!("{}{}", self.prefix, MADE.fetch_add(1, Ordering::Relaxed));
        let group = self.driver.create(&name)?;
        let leaves = self
            .leaves
            .iter()
            .try_for_each(|leaf| group.create_child(leaf).map(drop));
        match leaves {
            Ok(()) => Ok(name),
            Err(e) => {
                let _ = group.destroy();
                Err(e)
            }
        }
    }

    fn destroy(&self, name: &str) {
        if let Err(e) = self.driver.open(name).and_then(|g| g.destroy()) {
            tracing::warn!(group = %name, error = %e, "removing a cgroup made ahead");
        }
    }

    /// Destroys every group held ready; none is made again until a create asks.
    pub(crate) fn clear(&self) {
        let _making = lock(&self.making);
        let ready = {
            let mut stock = lock(&self.stock);
            stock.paused = true;
            stock.takes = 0;
            stock.depth = 1;
            std::mem::take(&mut stock.ready)
        };
        for name in &ready {
            self.destroy(name);
        }
    }
}

impl Drop for ReadyCgroups {
    fn drop(&mut self) {
        self.clear();
    }
}
