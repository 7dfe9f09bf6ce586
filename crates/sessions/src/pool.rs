//! Warm pool: sandboxes started ahead of demand, per language, so a create only hands one out.
//!
//! A filler task keeps each language at its target; a create that finds the pool empty starts a
//! sandbox itself. Pool sandboxes carry default limits until handed out, when the session's own
//! limits are applied.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use koder_runtime::{Limits, Runtime, Sandbox, SandboxSpec};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::metrics::Metrics;

pub struct Pool {
    runtime: Arc<dyn Runtime>,
    targets: BTreeMap<String, usize>,
    limits: Limits,
    ready: Mutex<HashMap<String, VecDeque<Arc<dyn Sandbox>>>>,
    wake: Notify,
    metrics: Arc<Metrics>,
}

impl Pool {
    pub fn new(
        runtime: Arc<dyn Runtime>,
        targets: BTreeMap<String, usize>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            runtime,
            targets,
            limits,
            ready: Mutex::default(),
            wake: Notify::new(),
            metrics,
        }
    }

    /// A ready sandbox for `language`, if the pool has one that fits: CPU, memory and pids
    /// limits can change at hand-out, the size of its disk cannot.
    pub fn take(&self, language: &str, disk_mib: Option<u64>) -> Option<Arc<dyn Sandbox>> {
        if disk_mib != self.limits.disk_mib {
            return None;
        }
        let taken = {
            let mut ready = self.ready.lock();
            let queue = ready.get_mut(language)?;
            // A dead one not yet removed by its watcher stays for the watcher to destroy.
            let sb = queue
                .iter()
                .position(|sb| !sb.agent().is_closed())
                .and_then(|at| queue.remove(at));
            self.metrics
                .pool_ready
                .with_label_values(&[language])
                .set(queue.len() as i64);
            sb
        };
        self.wake.notify_one();
        taken
    }

    pub fn depth(&self, language: &str) -> usize {
        self.ready.lock().get(language).map_or(0, VecDeque::len)
    }

    /// Refills forever; start once as a task.
    pub async fn run_filler(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.fill_one().await {
                Fill::Added => backoff = Duration::from_millis(100),
                Fill::Full => {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), self.wake.notified()).await;
                }
                Fill::Failed => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Starts one sandbox for the language furthest below its target.
    async fn fill_one(self: &Arc<Self>) -> Fill {
        let language = {
            let ready = self.ready.lock();
            self.targets
                .iter()
                .map(|(lang, target)| {
                    (
                        lang,
                        target.saturating_sub(ready.get(lang).map_or(0, VecDeque::len)),
                    )
                })
                .filter(|(_, missing)| *missing > 0)
                .max_by_key(|(_, missing)| *missing)
                .map(|(lang, _)| lang.clone())
        };
        let Some(language) = language else {
            return Fill::Full;
        };
        let spec = SandboxSpec {
            id: format!("w{}", uuid::Uuid::new_v4().simple()),
            image: "host".into(),
            limits: self.limits,
            env: Vec::new(),
            egress: false,
            layers: Vec::new(),
            volumes: Vec::new(),
        };
        match self.runtime.create(spec).await {
            Ok(sb) => {
                self.watch(&language, &sb);
                let mut ready = self.ready.lock();
                let queue = ready.entry(language.clone()).or_default();
                queue.push_back(sb);
                self.metrics
                    .pool_ready
                    .with_label_values(&[&language])
                    .set(queue.len() as i64);
                Fill::Added
            }
            Err(e) => {
                self.metrics.pool_failures.inc();
                tracing::warn!(%language, error = %e, "warm sandbox failed to start");
                Fill::Failed
            }
        }
    }

    /// A warm sandbox whose agent dies is taken out and destroyed at once: it is never handed
    /// out, and its resources do not wait for the next create.
    fn watch(self: &Arc<Self>, language: &str, sb: &Arc<dyn Sandbox>) {
        let closed = sb.agent().closed();
        let (pool, watched, language) = (
            Arc::downgrade(self),
            Arc::downgrade(sb),
            language.to_string(),
        );
        tokio::spawn(async move {
            closed.await;
            let (Some(pool), Some(watched)) = (pool.upgrade(), watched.upgrade()) else {
                return;
            };
            if pool.remove(&language, &watched) {
                tracing::warn!(%language, "warm sandbox died; discarding it");
                pool.metrics.pool_failures.inc();
                let _ = watched.destroy().await;
                pool.wake.notify_one();
            }
        });
    }

    /// Takes `sb` out of the ready queue; false if it was no longer there (handed out, drained).
    fn remove(&self, language: &str, sb: &Arc<dyn Sandbox>) -> bool {
        let mut ready = self.ready.lock();
        let Some(queue) = ready.get_mut(language) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|q| !Arc::ptr_eq(q, sb));
        self.metrics
            .pool_ready
            .with_label_values(&[language])
            .set(queue.len() as i64);
        queue.len() != before
    }

    /// Destroys every ready sandbox (shutdown).
    pub async fn drain(&self) {
        let all: Vec<_> = self.ready.lock().drain().flat_map(|(_, q)| q).collect();
        for sb in all {
            if let Err(e) = sb.destroy().await {
                tracing::warn!(error = %e, "destroying a warm sandbox");
            }
        }
    }
}

enum Fill {
    Added,
    Full,
    Failed,
}
