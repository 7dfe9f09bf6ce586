//! Warm pool: sandboxes started ahead of demand, per language, so a create only hands one out.
//! Each language's sandboxes run on that language's image (`host`, or its configured pack), and
//! only a create asking for that image gets one.
//!
//! Each language has two lanes: sandboxes without network, sized as configured, and sandboxes
//! started with egress (network `open` or `allowlist`: the agent's redirect to the daemon is set
//! up at boot and is the same for every session; the session's own policy is bound when it is
//! handed out), between 0 and the configured `max` and filled only by demand — E2B's SDK asks
//! for internet access by default, so its creates would otherwise always start cold.
//!
//! Each language keeps between `min` and `max` ready sandboxes ([`PoolSize`]). The target in
//! between is the number of creates that asked for that language in the last
//! [`DEMAND_WINDOW`], clamped to `[min, max]`: the recent create rate times a refill horizon as
//! long as the window, which needs nothing but the take times (no rate estimate to tune), lets a
//! burst raise the target by its own size at once (the next burst of that size is met from the
//! pool), and lets the target sink back to `min` by itself once a window passes without creates;
//! sandboxes above the target are then destroyed, so an idle pool returns to `min`.
//!
//! A filler task starts refills on their own tasks, up to one per core at a time, so a drained
//! pool fills in parallel. Refills hold back while creates are arriving ([`QUIET`], at most
//! [`MAX_DEFER`]): the request that just took a sandbox gets the CPU for its first calls instead
//! of sharing it with the sandbox replacing it. A create that finds the pool empty starts a
//! sandbox itself. Pool sandboxes carry default limits until handed out, when the session's own
//! limits are applied.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use koder_runtime::{Limits, Runtime, RuntimeError, Sandbox, SandboxSpec};
use parking_lot::Mutex;
use prometheus::{IntCounter, IntGauge};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::PoolSize;
use crate::metrics::Metrics;

/// How far back creates count towards the target, and so how long a burst keeps the pool large.
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(60);
/// Refills wait until no sandbox was taken for this long...
pub(crate) const QUIET: Duration = Duration::from_millis(50);
/// ...but no longer than this, so a steady stream of creates still gets its pool back.
pub(crate) const MAX_DEFER: Duration = Duration::from_millis(500);
/// How often the filler looks again without being woken (the target sinks as demand ages).
const TICK: Duration = Duration::from_secs(1);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct Pool {
    runtime: Arc<dyn Runtime>,
    limits: Limits,
    /// Refills in flight at most (all languages together).
    parallelism: usize,
    state: Mutex<State>,
    /// Wakes the filler: a take, a finished refill, a discarded sandbox.
    wake: Notify,
    /// A refill finished (what `drain` waits for).
    settled: Notify,
    metrics: Arc<Metrics>,
    /// Languages whose image has start/ready commands (run before a sandbox is pooled).
    startups: BTreeMap<String, Arc<crate::startup::Prepare>>,
}

struct State {
    lanes: BTreeMap<LaneKey, Lane>,
    /// Refills in flight, all languages.
    starting: usize,
    last_take: Option<Instant>,
    /// Since when refills have been held back for a quiet moment.
    deferred_since: Option<Instant>,
    /// After a failed start, no refill before this; `backoff` doubles per failure.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Set by `drain`: nothing new starts, finished refills are destroyed.
    closed: bool,
}

/// Which lane: a language's sandboxes without network, or with egress.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct LaneKey {
    language: String,
    egress: bool,
}

/// One lane of the pool.
struct Lane {
    size: PoolSize,
    /// The image its sandboxes run on.
    image: String,
    ready: VecDeque<Arc<dyn Sandbox>>,
    starting: usize,
    /// Times of recent creates, oldest first; never more than `size.max` (the target's cap).
    demand: VecDeque<Instant>,
    metrics: LaneMetrics,
}

/// A lane's series: `pool_*` for a lane without network, `pool_egress_*` for one with
/// egress, each by language and image.
struct LaneMetrics {
    ready: IntGauge,
    target: IntGauge,
    hit: IntCounter,
    miss: IntCounter,
}

impl LaneMetrics {
    fn of(metrics: &Metrics, key: &LaneKey, image: &str) -> Self {
        let labels = [key.language.as_str(), image];
        let (ready, target, takes) = match key.egress {
            false => (
                &metrics.pool_ready,
                &metrics.pool_target,
                &metrics.pool_takes,
            ),
            true => (
                &metrics.pool_egress_ready,
                &metrics.pool_egress_target,
                &metrics.pool_egress_takes,
            ),
        };
        let take = |result| takes.with_label_values(&[labels[0], labels[1], result]);
        Self {
            ready: ready.with_label_values(&labels),
            target: target.with_label_values(&labels),
            hit: take("hit"),
            miss: take("miss"),
        }
    }
}

impl Lane {
    fn new(key: &LaneKey, size: PoolSize, image: String, metrics: &Metrics) -> Self {
        let metrics = LaneMetrics::of(metrics, key, &image);
        metrics.ready.set(0);
        metrics.target.set(size.min as i64);
        Self {
            size,
            image,
            ready: VecDeque::new(),
            starting: 0,
            demand: VecDeque::new(),
            metrics,
        }
    }

    fn record_demand(&mut self, now: Instant) {
        if self.size.max == 0 {
            return;
        }
        if self.demand.len() == self.size.max {
            self.demand.pop_front();
        }
        self.demand.push_back(now);
    }

    fn target(&mut self, now: Instant) -> usize {
        while self
            .demand
            .front()
            .is_some_and(|t| now.duration_since(*t) >= DEMAND_WINDOW)
        {
            self.demand.pop_front();
        }
        self.demand.len().clamp(self.size.min, self.size.max)
    }

    fn held(&self) -> usize {
        self.ready.len() + self.starting
    }
}

/// What one look at the pool decided.
struct Plan {
    start: Vec<LaneKey>,
    surplus: Vec<Arc<dyn Sandbox>>,
    /// When to look again unless woken.
    next: Instant,
}

impl Pool {
    /// `images`: the image of each language's sandboxes (`host` for a language not listed).
    pub fn new(
        runtime: Arc<dyn Runtime>,
        sizes: BTreeMap<String, PoolSize>,
        images: &BTreeMap<String, String>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut lanes = BTreeMap::new();
        for (language, size) in sizes {
            let image = images
                .get(&language)
                .map_or(koder_image::HOST, String::as_str);
            let on_demand = PoolSize {
                min: 0,
                max: size.max,
            };
            for (egress, size) in [(false, size), (true, on_demand)] {
                let key = LaneKey {
                    language: language.clone(),
                    egress,
                };
                let lane = Lane::new(&key, size, image.to_string(), &metrics);
                lanes.insert(key, lane);
            }
        }
        Self {
            runtime,
            limits,
            parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
            state: Mutex::new(State {
                lanes,
                starting: 0,
                last_take: None,
                deferred_since: None,
                retry_at: None,
                backoff: FIRST_BACKOFF,
                closed: false,
            }),
            wake: Notify::new(),
            settled: Notify::new(),
            metrics,
            startups: BTreeMap::new(),
        }
    }

    /// Runs each listed language's image start and ready commands in its warm sandboxes
    /// before they are pooled.
    pub(crate) fn with_startups(
        mut self,
        startups: BTreeMap<String, Arc<crate::startup::Prepare>>,
    ) -> Self {
        self.startups = startups;
        self
    }

    /// A ready sandbox for `language` on `image`, with egress or without, if the pool has one
    /// that fits: CPU, memory and pids limits can change at hand-out, the size of its disk, its
    /// image and whether it has egress cannot. Every call for the lane's image counts as
    /// demand, a miss too (that create is what the pool should have had ready).
    pub fn take(
        &self,
        language: &str,
        image: &str,
        disk_mib: Option<u64>,
        egress: bool,
    ) -> Option<Arc<dyn Sandbox>> {
        if disk_mib != self.limits.disk_mib {
            return None;
        }
        let now = Instant::now();
        let taken = {
            let mut state = self.state.lock();
            state.last_take = Some(now);
            let key = LaneKey {
                language: language.to_string(),
                egress,
            };
            let lane = state
                .lanes
                .get_mut(&key)
                .filter(|lane| lane.image == image)?;
            lane.record_demand(now);
            // A dead one not yet removed by its watcher stays for the watcher to destroy.
            let sb = lane
                .ready
                .iter()
                .position(|sb| !sb.agent().is_closed())
                .and_then(|at| lane.ready.remove(at));
            Self::publish(lane, now);
            match sb.is_some() {
                true => lane.metrics.hit.inc(),
                false => lane.metrics.miss.inc(),
            }
            sb
        };
        self.wake.notify_one();
        taken
    }

    /// When the runtime has no slot left, destroys one ready sandbox, of the lane holding
    /// most, so the create about to be made gets its slot: warm sandboxes are there to make
    /// creates faster, never to refuse them. Refills wait for a quiet moment as after a take.
    pub async fn make_room(&self) {
        if !self.runtime.is_full() {
            return;
        }
        let now = Instant::now();
        let given = {
            let mut state = self.state.lock();
            state.last_take = Some(now);
            let lane = state
                .lanes
                .values_mut()
                .filter(|lane| !lane.ready.is_empty())
                .max_by_key(|lane| lane.ready.len());
            lane.and_then(|lane| {
                let sb = lane.ready.pop_front();
                Self::publish(lane, now);
                sb
            })
        };
        let Some(sb) = given else { return };
        tracing::info!(
            sandbox = sb.id(),
            "a warm sandbox gives its slot to a create"
        );
        if let Err(e) = sb.destroy().await {
            tracing::warn!(error = %e, "destroying a warm sandbox");
        }
    }

    /// (language, image, ready sandboxes) of every language with one ready without network.
    pub fn ready_lanes(&self) -> Vec<(String, String, usize)> {
        self.state
            .lock()
            .lanes
            .iter()
            .filter(|(key, lane)| !key.egress && !lane.ready.is_empty())
            .map(|(key, lane)| (key.language.clone(), lane.image.clone(), lane.ready.len()))
            .collect()
    }

    /// Ready sandboxes of `language`'s lane, with egress or without.
    pub fn depth(&self, language: &str, egress: bool) -> usize {
        let key = LaneKey {
            language: language.to_string(),
            egress,
        };
        self.state
            .lock()
            .lanes
            .get(&key)
            .map_or(0, |lane| lane.ready.len())
    }

    /// Keeps every language at its target until drained; start once as a task.
    pub async fn run_filler(self: Arc<Self>) {
        loop {
            let plan = self.plan(Instant::now());
            for sb in plan.surplus {
                tokio::spawn(async move {
                    if let Err(e) = sb.destroy().await {
                        tracing::warn!(error = %e, "destroying a surplus warm sandbox");
                    }
                });
            }
            for key in plan.start {
                self.spawn_refill(key);
            }
            let _ = tokio::time::timeout_at(plan.next, self.wake.notified()).await;
        }
    }

    /// Under the lock: surplus above each target out, and as many refills as may start now
    /// marked as starting (the language furthest below its target first).
    fn plan(&self, now: Instant) -> Plan {
        let mut state = self.state.lock();
        let mut plan = Plan {
            start: Vec::new(),
            surplus: Vec::new(),
            next: now + TICK,
        };
        if state.closed {
            return plan;
        }
        let mut missing: Vec<(LaneKey, usize)> = Vec::new();
        for (key, lane) in state.lanes.iter_mut() {
            let target = lane.target(now);
            while lane.held() > target {
                let Some(sb) = lane.ready.pop_front() else {
                    break;
                };
                plan.surplus.push(sb);
            }
            Self::publish(lane, now);
            if lane.held() < target {
                missing.push((key.clone(), target - lane.held()));
            }
        }
        if missing.is_empty() {
            state.deferred_since = None;
            return plan;
        }
        if let Some(hold) = state.hold_until(now) {
            plan.next = plan.next.min(hold);
            return plan;
        }
        state.deferred_since = None;
        while state.starting < self.parallelism {
            let Some((key, left)) = missing.iter_mut().max_by_key(|(_, left)| *left) else {
                break;
            };
            if *left == 0 {
                break;
            }
            *left -= 1;
            if let Some(lane) = state.lanes.get_mut(key) {
                lane.starting += 1;
            }
            state.starting += 1;
            plan.start.push(key.clone());
        }
        plan
    }

    /// Starts one sandbox for the lane `key` on its own task (already counted as starting).
    fn spawn_refill(self: &Arc<Self>, key: LaneKey) {
        let pool = self.clone();
        let image = {
            let state = self.state.lock();
            state.lanes.get(&key).map(|lane| lane.image.clone())
        };
        tokio::spawn(async move {
            let spec = SandboxSpec {
                id: format!("w{}", uuid::Uuid::new_v4().simple()),
                image: image.unwrap_or_else(|| koder_image::HOST.into()),
                limits: pool.limits,
                env: Vec::new(),
                egress: key.egress,
                layers: Vec::new(),
                volumes: Vec::new(),
                ..Default::default()
            };
            let mut created = pool.runtime.create(spec).await;
            if let (Ok(sb), Some(prepare)) = (&created, pool.startups.get(&key.language)) {
                if let Err(e) = prepare.run(&**sb).await {
                    let _ = sb.destroy().await;
                    created = Err(RuntimeError::Start(e.to_string()));
                }
            }
            pool.finish_refill(&key, created).await;
        });
    }

    async fn finish_refill(
        self: &Arc<Self>,
        key: &LaneKey,
        created: Result<Arc<dyn Sandbox>, RuntimeError>,
    ) {
        match created {
            Ok(sb) => {
                if self.add_ready(key, &sb) {
                    self.watch(key, &sb);
                } else {
                    // Drained meanwhile: destroyed before it stops counting as starting, so
                    // `drain` returns only once it is gone.
                    if let Err(e) = sb.destroy().await {
                        tracing::warn!(error = %e, "destroying a warm sandbox after drain");
                    }
                    self.done_starting(key, Ok(()));
                }
            }
            Err(e) => {
                self.metrics.pool_failures.inc();
                tracing::warn!(language = %key.language, egress = key.egress, error = %e,
                    "warm sandbox failed to start");
                self.done_starting(key, Err(()));
            }
        }
        self.settled.notify_waiters();
        self.wake.notify_one();
    }

    /// Puts a started sandbox into its queue; false once the pool is drained.
    fn add_ready(&self, key: &LaneKey, sb: &Arc<dyn Sandbox>) -> bool {
        let mut state = self.state.lock();
        if state.closed {
            return false;
        }
        state.starting -= 1;
        state.backoff = FIRST_BACKOFF;
        let now = Instant::now();
        if let Some(lane) = state.lanes.get_mut(key) {
            lane.starting -= 1;
            lane.ready.push_back(sb.clone());
            Self::publish(lane, now);
        }
        true
    }

    /// A refill that added nothing stops counting as starting; a failed one delays the next.
    fn done_starting(&self, key: &LaneKey, outcome: Result<(), ()>) {
        let mut state = self.state.lock();
        state.starting -= 1;
        if let Some(lane) = state.lanes.get_mut(key) {
            lane.starting -= 1;
        }
        if outcome.is_err() {
            state.retry_at = Some(Instant::now() + state.backoff);
            state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn publish(lane: &mut Lane, now: Instant) {
        lane.metrics.ready.set(lane.ready.len() as i64);
        let target = lane.target(now) as i64;
        lane.metrics.target.set(target);
    }

    /// A warm sandbox whose agent dies is taken out and destroyed at once: it is never handed
    /// out, and its resources do not wait for the next create.
    fn watch(self: &Arc<Self>, key: &LaneKey, sb: &Arc<dyn Sandbox>) {
        let closed = sb.agent().closed();
        let (pool, watched, key) = (Arc::downgrade(self), Arc::downgrade(sb), key.clone());
        tokio::spawn(async move {
            closed.await;
            let (Some(pool), Some(watched)) = (pool.upgrade(), watched.upgrade()) else {
                return;
            };
            if pool.remove(&key, &watched) {
                tracing::warn!(language = %key.language, egress = key.egress,
                    "warm sandbox died; discarding it");
                pool.metrics.pool_failures.inc();
                let _ = watched.destroy().await;
                pool.wake.notify_one();
            }
        });
    }

    /// Takes `sb` out of the ready queue; false if it was no longer there (handed out, drained).
    fn remove(&self, key: &LaneKey, sb: &Arc<dyn Sandbox>) -> bool {
        let mut state = self.state.lock();
        let Some(lane) = state.lanes.get_mut(key) else {
            return false;
        };
        let before = lane.ready.len();
        lane.ready.retain(|q| !Arc::ptr_eq(q, sb));
        let removed = lane.ready.len() != before;
        Self::publish(lane, Instant::now());
        removed
    }

    /// Destroys every ready sandbox and every one still starting, once it has started
    /// (shutdown); nothing is refilled afterwards.
    pub async fn drain(&self) {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let (ready, starting) = {
                let mut state = self.state.lock();
                state.closed = true;
                let ready: Vec<_> = state
                    .lanes
                    .values_mut()
                    .flat_map(|lane| lane.ready.drain(..))
                    .collect();
                (ready, state.starting)
            };
            for sb in ready {
                if let Err(e) = sb.destroy().await {
                    tracing::warn!(error = %e, "destroying a warm sandbox");
                }
            }
            if starting == 0 {
                break;
            }
            settled.await;
        }
        let state = self.state.lock();
        for lane in state.lanes.values() {
            lane.metrics.ready.set(0);
        }
    }
}

impl State {
    /// Until when refills wait (a recent take, a recent failure), if they must.
    fn hold_until(&mut self, now: Instant) -> Option<Instant> {
        let mut hold = self.retry_at.filter(|at| *at > now);
        if let Some(quiet) = self.last_take.map(|t| t + QUIET).filter(|at| *at > now) {
            let limit = *self.deferred_since.get_or_insert(now) + MAX_DEFER;
            if limit > now {
                hold = Some(hold.map_or(quiet.min(limit), |h| h.max(quiet.min(limit))));
            }
        }
        hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_runtime_memory::MemoryRuntime;

    fn pool(runtime: &MemoryRuntime, size: PoolSize) -> Arc<Pool> {
        let pool = Arc::new(Pool::new(
            Arc::new(runtime.clone()),
            [("python".to_string(), size)].into(),
            &[("python".to_string(), "python".to_string())].into(),
            Limits::default(),
            Arc::new(Metrics::new()),
        ));
        tokio::spawn(pool.clone().run_filler());
        pool
    }

    /// Lets the (paused) clock run until `cond` holds.
    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..10_000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened: {what}");
    }

    fn target(pool: &Pool) -> i64 {
        pool.metrics
            .pool_target
            .with_label_values(&["python", "python"])
            .get()
    }

    #[tokio::test(start_paused = true)]
    async fn the_target_follows_a_burst_then_decays_to_min() {
        let rt = MemoryRuntime::new();
        let pool = pool(&rt, PoolSize { min: 1, max: 4 });
        until("min is ready", || pool.depth("python", false) == 1).await;
        // One hit, five misses (which cold creates would serve): demand all the same.
        let taken: Vec<_> = (0..6)
            .filter_map(|_| pool.take("python", "python", None, false))
            .collect();
        assert_eq!(taken.len(), 1);
        assert_eq!(target(&pool), 4, "six creates, capped at max");
        until("the pool grows to max", || pool.depth("python", false) == 4).await;
        // Held while demand is recent...
        tokio::time::sleep(DEMAND_WINDOW / 2).await;
        assert_eq!(pool.depth("python", false), 4);
        // ...and back to min once a window passed without creates, the surplus destroyed.
        tokio::time::sleep(DEMAND_WINDOW).await;
        assert_eq!(target(&pool), 1);
        until("surplus destroyed", || rt.live().len() == taken.len() + 1).await;
        assert_eq!(pool.depth("python", false), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn refills_wait_for_a_quiet_moment_but_not_forever() {
        let rt = MemoryRuntime::new();
        let pool = pool(&rt, PoolSize::fixed(1));
        until("ready", || pool.depth("python", false) == 1).await;
        assert!(pool.take("python", "python", None, false).is_some());
        tokio::time::sleep(QUIET / 2).await;
        assert_eq!(rt.live().len(), 1, "no refill right after a take");
        until("refilled after the quiet gap", || {
            pool.depth("python", false) == 1
        })
        .await;
        // A take every QUIET/2 never leaves a quiet gap; the refill still comes.
        let started = tokio::time::Instant::now();
        while pool.depth("python", false) == 0 || started.elapsed() < QUIET {
            pool.take("python", "python", None, false);
            tokio::time::sleep(QUIET / 2).await;
            assert!(
                started.elapsed() <= MAX_DEFER + QUIET,
                "refill deferred too long"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_holds_its_image_and_serves_only_it() {
        let rt = MemoryRuntime::new();
        let pool = pool(&rt, PoolSize::fixed(1));
        until("ready", || pool.depth("python", false) == 1).await;
        let id = rt.live().pop().unwrap();
        assert_eq!(rt.sandbox(&id).unwrap().spec().image, "python");
        assert!(pool.take("python", "host", None, false).is_none());
        assert_eq!(
            pool.depth("python", false),
            1,
            "another image's create takes nothing"
        );
        assert!(pool.take("python", "python", None, false).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_egress_lane_fills_by_demand_with_egress_sandboxes() {
        let rt = MemoryRuntime::new();
        let pool = pool(&rt, PoolSize::fixed(1));
        until("ready", || pool.depth("python", false) == 1).await;
        assert_eq!(pool.depth("python", true), 0, "none held before any demand");
        assert!(pool.take("python", "python", None, true).is_none());
        until("filled after a miss", || pool.depth("python", true) == 1).await;
        let egress = pool.take("python", "python", None, true).unwrap();
        assert!(rt.sandbox(egress.id()).unwrap().spec().egress);
        let plain = pool.take("python", "python", None, false).unwrap();
        assert!(!rt.sandbox(plain.id()).unwrap().spec().egress);
        let hits =
            |m: &prometheus::IntCounterVec| m.with_label_values(&["python", "python", "hit"]).get();
        assert_eq!(hits(&pool.metrics.pool_egress_takes), 1);
        assert_eq!(hits(&pool.metrics.pool_takes), 1);
        // Back to none once a window passed without such creates.
        tokio::time::sleep(DEMAND_WINDOW * 2).await;
        assert_eq!(pool.depth("python", true), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_start_backs_off() {
        let rt = MemoryRuntime::new();
        rt.fail_next_create(RuntimeError::Start("no".into()));
        let pool = pool(&rt, PoolSize::fixed(1));
        until("ready after the retry", || pool.depth("python", false) == 1).await;
        assert_eq!(pool.metrics.pool_failures.get(), 1);
    }
}
