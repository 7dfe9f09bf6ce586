//! Sandbox cgroups made ahead, so that a create with no warm sandbox to hand out renames a made
//! group (its agent and workload leaves with it) to its sandbox's name instead of making them:
//! on cgroup v1 that is fifteen `mkdir`s across five hierarchies, the slowest part of a cold
//! create's set-up (~1.3 ms here, against five renames' 0.03 ms). cgroup2 cannot rename a
//! group, so there each create makes its own (three `mkdir`s in one hierarchy).
//!
//! Held in a [`Stock`]; a made group has no limits and no process; the create that takes it
//! sets its limits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use koder_cgroups::{Cgroup, CgroupDriver, CgroupVersion};

use crate::stock::{Make, Stock};

/// Marks the names of groups made ahead. Sandbox ids never hold a '.', so reconciliation, which
/// tears down the groups of sandbox ids, leaves these to [`ReadyCgroups`].
const READY_MARK: &str = "ready.";

pub(crate) struct ReadyCgroups(Arc<Stock<GroupMaker>>);

struct GroupMaker {
    driver: Box<dyn CgroupDriver>,
    /// `<runtime's cgroup prefix>ready.`: this runtime's groups made ahead.
    prefix: String,
    /// The leaves every sandbox cgroup has.
    leaves: [&'static str; 2],
}

impl ReadyCgroups {
    /// A stock for the runtime whose cgroups are named `<prefix><sandbox id>`, each with
    /// `leaves`; `None` where groups cannot be renamed (cgroup2). Groups a previous run made
    /// ahead are destroyed now.
    pub(crate) fn new(
        driver: Box<dyn CgroupDriver>,
        prefix: &str,
        leaves: [&'static str; 2],
    ) -> Option<Self> {
        if driver.version() != CgroupVersion::V1 {
            return None;
        }
        let maker = GroupMaker {
            driver,
            prefix: format!("{prefix}{READY_MARK}"),
            leaves,
        };
        let leftovers = maker.driver.list().unwrap_or_default();
        for name in leftovers.iter().filter(|n| n.starts_with(&maker.prefix)) {
            maker.destroy(name);
        }
        Some(Self(Stock::new(maker)))
    }

    /// A made group renamed to `name`, if one is ready: the caller opens its leaves.
    pub(crate) fn take(&self, name: &str) -> Option<Box<dyn Cgroup>> {
        let made = self.0.take()?;
        let maker = self.0.maker();
        match maker.driver.rename(&made, name) {
            Ok(group) => Some(group),
            Err(e) => {
                tracing::warn!(group = %made, error = %e, "a cgroup made ahead could not be used");
                maker.destroy(&made);
                None
            }
        }
    }

    pub(crate) fn refill(&self) {
        self.0.refill();
    }

    /// Destroys every group held ready; none is made again until a create asks.
    pub(crate) fn clear(&self) {
        self.0.clear();
    }
}

impl GroupMaker {
    fn destroy(&self, name: &str) {
        if let Err(e) = self.driver.open(name).and_then(|g| g.destroy()) {
            tracing::warn!(group = %name, error = %e, "removing a cgroup made ahead");
        }
    }
}

impl Make for GroupMaker {
    type Item = String;
    const WHAT: &'static str = "cgroup";

    fn make(&self) -> Result<String, String> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let name = format!("{}{}", self.prefix, MADE.fetch_add(1, Ordering::Relaxed));
        let group = self.driver.create(&name).map_err(|e| e.to_string())?;
        let leaves = self
            .leaves
            .iter()
            .try_for_each(|leaf| group.create_child(leaf).map(drop));
        match leaves {
            Ok(()) => Ok(name),
            Err(e) => {
                let _ = group.destroy();
                Err(e.to_string())
            }
        }
    }

    fn discard(&self, name: String) {
        self.destroy(&name);
    }
}
