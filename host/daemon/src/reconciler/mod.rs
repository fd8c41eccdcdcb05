//! The reconciler: once a second, make the running cursors match the desired ones.
//!
//! Desired cursors are every link times every parent partition this node owns. The pure
//! comparison lives in [`reducer`], the decision whether a tick needs a full pass in
//! [`schedule`], which partitions an orphan sweep lists in `sweep_order`; this module carries
//! the actions out: it starts and stops cursor tasks, keeps one router chain per link (shared
//! by the link's cursors), swaps a link's chain when its router changes, starts and stops each
//! link's shadow (a candidate chain beside the real one) without touching the real chain, and
//! sweeps offset files that no link explains.
//!
//! The words it works in belong to the fan-out, below it: a cursor's identity
//! ([`CursorKey`]), the [`RouterFactory`] it builds chains with, and the [`FanoutView`] it fills
//! with the status of every cursor it starts (the API reads that view, never the reconciler).

pub(crate) mod reducer;
pub mod schedule;
mod sweep_order;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_storage::PartitionId;
use narad_storage::cursor as cursor_file;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::fanout::cursor::{CursorExit, run_cursor};
use crate::fanout::metrics::{CursorLabels, FanoutMetrics, PassKind, PassLabels};
use crate::fanout::position::cursor_path;
use crate::fanout::route::{RouterBuildError, RouterFactory, SlabRouter, replace_router};
use crate::fanout::shadow::Shadow;
use crate::fanout::status::{CursorStatus, FanoutView};
use crate::fanout::{CursorDeps, CursorKey, LinkRuntime};
use crate::metastore::Snapshot;
use crate::metastore::{LinkMeta, ShadowSpec};
use crate::ownership::PartitionOwnership;
use crate::shutdown::{self, ShutdownSignal, ShutdownTrigger};
use reducer::Action;
use schedule::Schedule;

/// How often the reconciler ticks (engine reference: reconcile interval 1 s).
pub(crate) const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);

/// Most partition directories one orphan sweep lists for offset files. Listing one takes about
/// 7 us on the build machine, so a sweep tick costs a few milliseconds however many partitions
/// the node owns; one owning 60,000 visits all of them in 118 sweeps (about an hour at one
/// sweep every 30 ticks). An orphan offset file is 256 bytes a detached link left behind:
/// nothing reads it, so it can wait its turn.
pub(crate) const SWEEP_DIRS_PER_PASS: usize = 512;
/// Most partitions one orphan sweep looks at to find its [`SWEEP_DIRS_PER_PASS`] local ones: a
/// node that owns few of the cluster's partitions still pays a bounded ownership check per
/// sweep, and still gets round the whole ring in turn.
pub(crate) const SWEEP_VISITS_PER_PASS: usize = 16 * SWEEP_DIRS_PER_PASS;

struct RunningCursor {
    stop: ShutdownTrigger,
    task: JoinHandle<CursorExit>,
    status: Arc<CursorStatus>,
}

struct RunningLink {
    runtime: Arc<LinkRuntime>,
}

/// Awaits a cursor's task that has ended (or is told to stop, at shutdown), logs its exit and
/// takes its status off the view and its series off `/metrics`.
async fn finish(view: &FanoutView, key: &CursorKey, running: RunningCursor, what: &str) {
    let (parent, partition, child, epoch) = (&key.parent, key.partition, &key.child, &key.epoch);
    match running.task.await {
        Ok(exit) => tracing::info!(%parent, partition, %child, %epoch, %exit, "{what}"),
        Err(error) => {
            tracing::error!(%parent, partition, %child, %epoch, %error, "cursor task panicked");
        }
    }
    running.status.retire();
    view.remove(key);
}

/// The reconciler's state between ticks.
pub struct Reconciler {
    deps: Arc<CursorDeps>,
    ownership: Arc<dyn PartitionOwnership>,
    routers: Arc<dyn RouterFactory>,
    metrics: Arc<FanoutMetrics>,
    view: Arc<FanoutView>,
    schedule: Schedule,
    cursors: HashMap<CursorKey, RunningCursor>,
    /// Cursors told to stop whose tasks have not ended yet (one stuck in a commit to a hung
    /// node sees the stop only when the commit returns). Reaped at each tick, never awaited
    /// by one: a stuck cursor holds back nothing but its own successor.
    stopping: HashMap<CursorKey, RunningCursor>,
    links: HashMap<(String, String), RunningLink>,
    /// The last partition the orphan sweep visited: the next sweep starts after it.
    sweep_after: Option<sweep_order::SweepMark>,
}

impl Reconciler {
    /// A reconciler with no cursors running yet.
    pub fn new(
        deps: Arc<CursorDeps>,
        ownership: Arc<dyn PartitionOwnership>,
        routers: Arc<dyn RouterFactory>,
        metrics: Arc<FanoutMetrics>,
        view: Arc<FanoutView>,
    ) -> Reconciler {
        Reconciler {
            deps,
            ownership,
            routers,
            metrics,
            view,
            schedule: Schedule::new(),
            cursors: HashMap::new(),
            stopping: HashMap::new(),
            links: HashMap::new(),
            sweep_after: None,
        }
    }

    /// Ticks every [`RECONCILE_INTERVAL`] until `shutdown`, then stops every cursor.
    pub async fn run(mut self, shutdown: ShutdownSignal) {
        let mut ticker = tokio::time::interval(RECONCILE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.wait() => break,
            }
            self.tick().await;
        }
        let keys: Vec<CursorKey> = self.cursors.keys().cloned().collect();
        for key in keys {
            self.stop_cursor(&key);
        }
        // Shutting down: each writes its last position before the process ends.
        for (key, running) in self.stopping.drain() {
            finish(&self.view, &key, running, "cursor stopped").await;
        }
    }

    /// Keeps every cursor's lag series current, also for cursors stalled in a commit, from
    /// each parent partition's high watermark as the store holds it in memory. A closed
    /// parent log keeps the cursor's last known high watermark: nothing appends to a closed
    /// log, and describing one from its files (a directory listing and three file reads) for
    /// every cursor every second cost 0.3 to 0.4 s a tick at 4,400 cursors on one node.
    fn refresh_lags(&self) {
        let store = &self.deps.store;
        self.view.refresh_lags(
            |parent, partition| {
                store.open_high_watermark(&narad_storage::PartitionId::new(parent, partition))
            },
            self.deps.clock.now_ms(),
            self.deps.timing.no_progress_after,
        );
    }

    /// One tick: reap exited cursors, then run a full pass when the schedule says so.
    pub async fn tick(&mut self) {
        let started = Instant::now().into_std();
        let kind = self.tick_once().await;
        self.metrics
            .reconciler_pass
            .0
            .get_or_create(&PassLabels { kind })
            .observe(started.elapsed().as_secs_f64());
    }

    /// One tick; what it did.
    async fn tick_once(&mut self) -> PassKind {
        self.reap_exited().await;
        self.refresh_lags();
        let versions = match self.deps.metastore.versions().await {
            Ok(v) => v,
            Err(error) => {
                tracing::warn!(%error, "reconciler cannot read metastore versions");
                return PassKind::skip;
            }
        };
        let version_list = [versions.topics, versions.links, versions.plugins];
        let now = Instant::now().into_std();
        let plan = self.schedule.plan(&version_list, now);
        if !plan.full_pass {
            return PassKind::skip;
        }
        // A full pass compares links with running cursors: it needs the topics links name,
        // not the thousands no link touches. The orphan sweep walks local partitions of every
        // topic, so its ticks read everything.
        let read = if plan.sweep_orphans {
            self.deps.metastore.snapshot().await
        } else {
            self.deps.metastore.links_snapshot().await
        };
        let clean = match read {
            Ok(snapshot) => {
                let clean = self.full_pass(&snapshot).await;
                if plan.sweep_orphans {
                    self.sweep_orphans(&snapshot).await;
                }
                clean
            }
            Err(error) => {
                tracing::warn!(%error, "reconciler cannot read the metastore");
                false
            }
        };
        self.schedule.full_pass_done(&version_list, now, clean);
        if plan.sweep_orphans {
            PassKind::sweep
        } else {
            PassKind::full
        }
    }

    async fn reap_exited(&mut self) {
        let finished: Vec<CursorKey> = self
            .cursors
            .iter()
            .filter(|(_, running)| running.task.is_finished())
            .map(|(key, _)| key.clone())
            .collect();
        for key in finished {
            if let Some(running) = self.cursors.remove(&key) {
                finish(&self.view, &key, running, "cursor exited").await;
            }
            self.schedule.cursor_exited();
        }
        let stopped: Vec<CursorKey> = self
            .stopping
            .iter()
            .filter(|(_, running)| running.task.is_finished())
            .map(|(key, _)| key.clone())
            .collect();
        for key in stopped {
            if let Some(running) = self.stopping.remove(&key) {
                finish(&self.view, &key, running, "cursor stopped").await;
            }
        }
    }

    fn desired(&self, snapshot: &Snapshot) -> BTreeSet<CursorKey> {
        let mut desired = BTreeSet::new();
        for link in snapshot.links.values() {
            let Some(parent) = snapshot.topics.get(&link.parent) else {
                continue;
            };
            // A remote child has no local topic; a local one must exist.
            if link.remote.is_none() && !snapshot.topics.contains_key(&link.child) {
                continue;
            }
            for partition in 0..parent.partitions {
                let id = PartitionId::new(link.parent.clone(), partition);
                // A partition being moved runs no cursor: its cursor files go with it, and
                // the new owner resumes from them.
                if self.ownership.is_local(&id) && !self.ownership.is_moving(&id) {
                    desired.insert(CursorKey {
                        parent: link.parent.clone(),
                        partition,
                        child: link.child.clone(),
                        epoch: link.attach_epoch.clone(),
                    });
                }
            }
        }
        desired
    }

    /// Returns false when the pass left work behind (a router that could not be built).
    async fn full_pass(&mut self, snapshot: &Snapshot) -> bool {
        let mut clean = true;
        // Links: drop runtimes of links that are gone; refresh or rebuild the others.
        self.links
            .retain(|name, _| snapshot.links.contains_key(name));
        for (name, meta) in &snapshot.links {
            let previous = self.links.get(name).map(|l| l.runtime.meta());
            match previous {
                Some(previous) if *previous == *meta => {}
                Some(previous)
                    if previous.router == meta.router && previous.config == meta.config =>
                {
                    if let Some(link) = self.links.get(name) {
                        link.runtime.set_meta(meta.clone());
                    }
                }
                _ => match self.build_router(meta).await {
                    Ok(router) => match self.links.get(name) {
                        // Same epoch, new chain: swap it in place (clearing any poison an old
                        // chain's panic left); cursors pick it up at their next slab.
                        Some(link) if link.runtime.meta().attach_epoch == meta.attach_epoch => {
                            replace_router(&link.runtime.router, router);
                            link.runtime.set_meta(meta.clone());
                        }
                        _ => {
                            let runtime = Arc::new(LinkRuntime::new(
                                meta.clone(),
                                Arc::new(Mutex::new(router)),
                            ));
                            self.links.insert(name.clone(), RunningLink { runtime });
                        }
                    },
                    Err(error) => {
                        tracing::error!(parent = %meta.parent, child = %meta.child, %error, "cannot build the link's router chain");
                        clean = false;
                    }
                },
            }
        }

        self.sync_shadows(snapshot).await;

        let desired = self.desired(snapshot);
        let running: BTreeSet<CursorKey> = self.cursors.keys().cloned().collect();
        for action in reducer::reconcile(&desired, &running) {
            match action {
                Action::Stop(key) => self.stop_cursor(&key),
                Action::Start(key) => {
                    if !self.start_cursor(key) {
                        clean = false;
                    }
                }
            }
        }
        clean
    }

    /// Awaits every stopping cursor (tests: nothing left running when a test ends).
    #[cfg(test)]
    async fn reap_all(&mut self) {
        for (key, running) in self.stopping.drain() {
            finish(&self.view, &key, running, "cursor stopped").await;
        }
    }

    /// Starts, replaces or stops each link's shadow to match the metadata. A shadow is never
    /// a reason to touch the link's own chain (its change alone only swaps the link's
    /// metadata above), and a candidate that cannot be built is the shadow report's to say,
    /// not a failure of the pass: it is tried again at every full pass.
    async fn sync_shadows(&self, snapshot: &Snapshot) {
        let board = self.view.shadows();
        for (parent, child) in board.links() {
            let wanted = snapshot
                .links
                .get(&(parent.clone(), child.clone()))
                .is_some_and(|l| l.shadow.is_some());
            if !wanted {
                board.remove(&parent, &child);
            }
        }
        for (name, meta) in &snapshot.links {
            // A link whose chain is not built yet has no runtime: its shadow waits for it.
            let Some(link) = self.links.get(name) else {
                continue;
            };
            let running = link.runtime.shadow();
            match (&meta.shadow, running) {
                (None, None) => {}
                (None, Some(_)) => {
                    link.runtime.set_shadow(None);
                    board.remove(&meta.parent, &meta.child);
                    tracing::info!(parent = %meta.parent, child = %meta.child, "shadow cleared");
                }
                (Some(spec), Some(running)) if running.spec() == spec => {
                    if running.needs_build() {
                        match self.build_candidate(meta, spec).await {
                            Ok(candidate) => running.install(candidate),
                            Err(error) => running.build_failed(error.to_string()),
                        }
                    }
                }
                (Some(spec), _) => {
                    let built = self.build_candidate(meta, spec).await;
                    if let Err(error) = &built {
                        tracing::warn!(parent = %meta.parent, child = %meta.child, %error, "cannot build the shadow's candidate chain");
                    }
                    let shadow = Shadow::start(spec.clone(), built);
                    link.runtime.set_shadow(Some(Arc::clone(&shadow)));
                    board.insert(&meta.parent, &meta.child, shadow);
                    tracing::info!(parent = %meta.parent, child = %meta.child, "shadow started");
                }
            }
        }
    }

    /// Builds a shadow's candidate chain on the blocking pool, from the link with the
    /// candidate's router and config in place of its own.
    async fn build_candidate(
        &self,
        meta: &LinkMeta,
        spec: &ShadowSpec,
    ) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        let routers = Arc::clone(&self.routers);
        let candidate = LinkMeta {
            router: spec.router.clone(),
            config: spec.config.clone(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            ..meta.clone()
        };
        crate::blocking::run(move || routers.build_candidate(&candidate)).await?
    }

    /// Builds a link's chain on the blocking pool: a cold plugin load reads and compiles a
    /// module, which must not hold an async thread.
    async fn build_router(&self, meta: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
        let routers = Arc::clone(&self.routers);
        let meta = meta.clone();
        crate::blocking::run(move || routers.build(&meta)).await?
    }

    fn start_cursor(&mut self, key: CursorKey) -> bool {
        let Some(link) = self.links.get(&(key.parent.clone(), key.child.clone())) else {
            return false;
        };
        // The cursor it replaces (same offset file) has not ended yet: two would write it.
        // Tried again at the next tick.
        if self.stopping.keys().any(|old| {
            old.parent == key.parent && old.partition == key.partition && old.child == key.child
        }) {
            return false;
        }
        if link.runtime.meta().attach_epoch != key.epoch {
            return false;
        }
        let (trigger, signal) = shutdown::channel();
        let labels = CursorLabels {
            parent: key.parent.clone(),
            child: key.child.clone(),
            partition: key.partition,
        };
        let status = Arc::new(CursorStatus::new(labels, Arc::clone(&self.metrics)));
        self.view.insert(&key, Arc::clone(&status));
        let task = tokio::spawn(run_cursor(
            Arc::clone(&self.deps),
            key.clone(),
            Arc::clone(&link.runtime),
            Arc::clone(&status),
            signal,
        ));
        tracing::info!(parent = %key.parent, partition = key.partition, child = %key.child, epoch = %key.epoch, "cursor started");
        self.cursors.insert(
            key,
            RunningCursor {
                stop: trigger,
                task,
                status,
            },
        );
        true
    }

    /// Tells the cursor `key` to stop and lists it as stopping; it is reaped once its task
    /// ends (see [`Reconciler::reap_exited`]), without this tick waiting for it.
    fn stop_cursor(&mut self, key: &CursorKey) {
        if let Some(running) = self.cursors.remove(key) {
            running.stop.trigger();
            self.stopping.insert(key.clone(), running);
        }
    }

    /// Deletes offset files of links that no longer exist, after a linearizable read confirms
    /// that the link is really gone.
    async fn sweep_orphans(&mut self, snapshot: &Snapshot) {
        let mut links: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (parent, child) in snapshot.links.keys() {
            links
                .entry(parent.clone())
                .or_default()
                .insert(child.clone());
        }
        // At most SWEEP_DIRS_PER_PASS partition directories per sweep, taking up where the
        // last sweep stopped (wrapping round), so a node with tens of thousands of partitions
        // pays a bounded cost per sweep and still visits every directory in turn.
        let ownership = &self.ownership;
        let turn = sweep_order::next_sweep(
            &snapshot.topics,
            |topic| topic.partitions,
            self.sweep_after.as_ref(),
            SWEEP_DIRS_PER_PASS,
            SWEEP_VISITS_PER_PASS,
            |topic, partition| ownership.is_local(&PartitionId::new(topic, partition)),
        );
        self.sweep_after = turn.next;
        let dirs: Vec<((String, u32), std::path::PathBuf)> = turn
            .local
            .into_iter()
            .map(|(topic, partition)| {
                let id = PartitionId::new(topic.clone(), partition);
                let dir = self
                    .deps
                    .store
                    .data_dir()
                    .join("topics")
                    .join(&topic)
                    .join(id.dir_name());
                ((topic, partition), dir)
            })
            .collect();
        // One directory listing per local partition: thousands on a busy node, so on the
        // blocking pool, never on the runtime's threads.
        let fs = Arc::clone(&self.deps.fs);
        let listed = crate::blocking::run(move || {
            let mut files: BTreeMap<(String, u32), BTreeSet<String>> = BTreeMap::new();
            for (key, dir) in dirs {
                match cursor_file::list_cursor_children(fs.as_ref(), &dir) {
                    Ok(children) if !children.is_empty() => {
                        files.insert(key, children.into_iter().collect());
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "cannot list cursor files"),
                }
            }
            files
        })
        .await;
        let files = match listed {
            Ok(files) => files,
            Err(error) => {
                tracing::warn!(%error, "orphan sweep skipped: listing cursor files did not finish");
                return;
            }
        };
        let orphans = reducer::orphan_cursor_files(&links, &files);
        if orphans.is_empty() {
            return;
        }
        let confirmed = match self.deps.metastore.confirm().await {
            Ok(confirmed) => confirmed,
            Err(error) => {
                tracing::warn!(%error, "orphan sweep deferred: metastore not confirmed");
                return;
            }
        };
        for (parent, partition, child) in orphans {
            if confirmed
                .links
                .contains_key(&(parent.clone(), child.clone()))
            {
                continue;
            }
            let path = cursor_path(
                &self.deps.store,
                &PartitionId::new(parent.clone(), partition),
                &child,
            );
            match cursor_file::remove(self.deps.fs.as_ref(), &path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed orphan cursor file"),
                Err(error) => tracing::warn!(%error, "cannot remove orphan cursor file"),
            }
            // Its gap ledger goes with it: the link whose losses it lists is gone.
            let ledger = path.with_file_name(cursor_file::gaps::gaps_file_name(&child));
            if let Err(error) = cursor_file::gaps::remove(self.deps.fs.as_ref(), &ledger) {
                tracing::warn!(%error, "cannot remove an orphan cursor's gap ledger");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use narad_storage::{
        AppendBatch, Appended, EncodedBatch, LogConfig, NewRecord, ReadOptions, Store,
        StoreOptions, StoredRecord,
    };

    use super::*;
    use crate::fanout::FanoutTiming;
    use crate::fanout::committer::{BlockingCommitter, ChildCommitError, ChildCommitter};
    use crate::fanout::route::{RouteFailure, RouteInput};
    use crate::metastore::link::{PluginRef, PluginVersion};
    use crate::metastore::{FileMetastore, Metastore, TopicMeta};
    use crate::ownership::SingleNode;
    use crate::reconciler::schedule::ORPHAN_SWEEP_EVERY_TICKS;

    /// Bound on waiting for a cursor to get somewhere; generous for a busy machine.
    const WAIT: Duration = Duration::from_secs(60);

    /// The cursors' waits, shortened so a stalled cursor retries within milliseconds.
    const TIMING: FanoutTiming = FanoutTiming {
        slab_long_poll: Duration::from_millis(50),
        slab_linger: Duration::from_millis(5),
        quick_retry_pauses: [Duration::from_millis(2), Duration::from_millis(4)],
        retry_backoff: Duration::from_millis(20),
        delay_max_sleep: Duration::from_millis(5),
        remote_backoff_max: Duration::from_millis(50),
        offset_sync_every: crate::fanout::OFFSET_SYNC_EVERY,
        slabs_per_commit: crate::fanout::SLABS_PER_COMMIT,
        no_progress_after: Duration::from_millis(300),
    };

    /// Commits child buckets straight to the local store.
    struct StoreCommitter(Arc<Store>);

    impl BlockingCommitter for StoreCommitter {
        fn append(
            &self,
            partition: &PartitionId,
            batch: &mut EncodedBatch,
        ) -> Result<Appended, ChildCommitError> {
            Ok(self.0.append_encoded(partition, batch)?)
        }
    }

    /// Panics on every slab, or (any other config) sends every record to partition 0.
    struct NativeRouter {
        panics: bool,
    }

    impl SlabRouter for NativeRouter {
        fn route(
            &mut self,
            _input: &RouteInput,
            records: &[StoredRecord],
        ) -> Result<Vec<u32>, RouteFailure> {
            assert!(!self.panics, "the router broke");
            Ok(vec![0; records.len()])
        }
    }

    /// Builds a [`NativeRouter`] that panics when the link's config is `panic`.
    struct NativeFactory;

    impl RouterFactory for NativeFactory {
        fn build(&self, link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
            Ok(Box::new(NativeRouter {
                panics: link.config == "panic",
            }))
        }
    }

    fn plugin() -> PluginRef {
        PluginRef {
            name: "native".into(),
            digest: "0".repeat(64),
        }
    }

    /// A store and a file metastore in a fresh directory with topics `parent` and `child` (one
    /// partition each), the native plugin, and the link `parent -> child` routing with
    /// `config`.
    async fn one_link(config: &str) -> (tempfile::TempDir, Arc<Store>, Arc<FileMetastore>) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
        let metastore = Arc::new(FileMetastore::open(dir.path()).unwrap());
        for name in ["parent", "child"] {
            store
                .create_partition(&PartitionId::new(name, 0), LogConfig::default())
                .unwrap();
            metastore
                .create_topic(TopicMeta {
                    writable_as_child: false,
                    name: name.into(),
                    partitions: 1,
                    retention_ms: None,
                    retention_bytes: None,
                    created_at_ms: 0,
                    owners: Vec::new(),
                })
                .await
                .unwrap();
        }
        metastore
            .add_plugin(PluginVersion {
                name: "native".into(),
                digest: "0".repeat(64),
                size_bytes: 0,
                version: "test".into(),
                description: "routes natively".into(),
                uploaded_at_ms: 0,
            })
            .await
            .unwrap();
        metastore
            .attach_link(LinkMeta {
                parent: "parent".into(),
                child: "child".into(),
                attach_epoch: "00112233445566aa".into(),
                attach_offsets: Some(vec![0]),
                delay_ms: 0,
                router: vec![plugin()],
                config: config.into(),
                attached_at_ms: 0,
                paused: Vec::new(),
                shadow: None,
                on_gap: Default::default(),
                accepted_gaps: Vec::new(),
                dead_letter: None,
                remote: None,
            })
            .await
            .unwrap();
        (dir, store, metastore)
    }

    /// The cursors' dependencies over `store` and `metastore` (real files, the system clock,
    /// [`TIMING`]), committing through `committer`.
    fn test_deps(
        store: &Arc<Store>,
        metastore: &Arc<FileMetastore>,
        committer: Arc<dyn ChildCommitter>,
    ) -> Arc<CursorDeps> {
        Arc::new(CursorDeps {
            store: Arc::clone(store),
            fs: Arc::new(narad_storage::fs::RealFs),
            committer,
            metastore: Arc::clone(metastore) as Arc<dyn Metastore>,
            clock: Arc::new(narad_storage::SystemClock),
            timing: TIMING,
            remote_tails: None,
            node: None,
            leave_out_held: true,
        })
    }

    async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_orphan_sweep_removes_offset_files_no_link_explains_and_keeps_the_others() {
        let (_dir, store, metastore) = one_link("").await;
        let fs: Arc<dyn narad_storage::fs::FileSystem> = Arc::new(narad_storage::fs::RealFs);
        let parent = PartitionId::new("parent", 0);
        // An offset file left by a link detached while this node was down.
        let orphan = cursor_path(&store, &parent, "gone");
        cursor_file::CursorFile::anchor(
            Arc::clone(&fs),
            &orphan,
            cursor_file::CursorRecord {
                epoch: "0011223344556677".into(),
                next_offset: 3,
            },
        )
        .unwrap();
        let deps = Arc::new(CursorDeps {
            store: Arc::clone(&store),
            fs,
            committer: Arc::new(StoreCommitter(Arc::clone(&store))),
            metastore: Arc::clone(&metastore) as Arc<dyn Metastore>,
            clock: Arc::new(narad_storage::SystemClock),
            timing: TIMING,
            remote_tails: None,
            node: None,
            leave_out_held: true,
        });
        let mut reconciler = Reconciler::new(
            deps,
            Arc::new(SingleNode::default()),
            Arc::new(NativeFactory),
            Arc::new(FanoutMetrics::default()),
            Arc::new(FanoutView::default()),
        );
        let live = cursor_path(&store, &parent, "child");
        // The first tick starts the link's cursor, which anchors its own offset file.
        reconciler.tick().await;
        wait_for("the live cursor's offset file", || live.exists()).await;
        assert!(orphan.exists(), "removed before any sweep");
        for _ in 1..ORPHAN_SWEEP_EVERY_TICKS {
            reconciler.tick().await;
        }
        assert!(
            !orphan.exists(),
            "the orphan sweep left the file of a detached link"
        );
        assert!(
            live.exists(),
            "the sweep removed the offset file of a live link"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_link_whose_router_panicked_copies_again_once_a_new_router_is_swapped_in() {
        let (_dir, store, metastore) = one_link("panic").await;
        store
            .append(
                &PartitionId::new("parent", 0),
                AppendBatch {
                    records: vec![NewRecord {
                        key: None,
                        headers: Vec::new(),
                        value: Some(Bytes::from_static(b"v0")),
                    }],
                    origin: None,
                },
            )
            .unwrap();
        let deps = test_deps(
            &store,
            &metastore,
            Arc::new(StoreCommitter(Arc::clone(&store))),
        );
        let metrics = Arc::new(FanoutMetrics::default());
        let mut reconciler = Reconciler::new(
            deps,
            Arc::new(SingleNode::default()),
            Arc::new(NativeFactory),
            Arc::clone(&metrics),
            Arc::new(FanoutView::default()),
        );
        reconciler.tick().await;
        let labels = CursorLabels {
            parent: "parent".into(),
            child: "child".into(),
            partition: 0,
        };
        // Two failures: the second routing came after the first panic had unwound.
        wait_for("the router to fail twice", || {
            metrics.route_failures.get_or_create(&labels).get() >= 2
        })
        .await;

        // A new config (the HTTP API's PATCH) makes the reconciler build and swap a new chain
        // for the same attachment; the cursor is not restarted.
        metastore
            .set_link_router("parent", "child", vec![plugin()], Some("good".into()))
            .await
            .unwrap();
        reconciler.tick().await;
        let copied = || {
            let read = store.read(
                &PartitionId::new("child", 0),
                &ReadOptions {
                    offset: 0,
                    max_records: 10,
                    max_bytes: usize::MAX,
                    max_committed_at_ms: None,
                },
            );
            read.is_ok_and(|r| r.records.len() == 1)
        };
        wait_for("the new router to copy the record", copied).await;
        // Still the first attachment's cursor: nothing was detached or attached again.
        let key = CursorKey {
            parent: "parent".into(),
            partition: 0,
            child: "child".into(),
            epoch: "00112233445566aa".into(),
        };
        let keys: Vec<&CursorKey> = reconciler.cursors.keys().collect();
        assert_eq!(keys, [&key]);
        reconciler.stop_cursor(&key);
        reconciler.reap_all().await;
    }

    /// Commits to the local store, except that commits to topic `child` hang (as on a child
    /// owner stopped with SIGSTOP) until released.
    struct HangingCommitter {
        store: Arc<Store>,
        hung: Arc<(Mutex<bool>, std::sync::Condvar)>,
        entered: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl BlockingCommitter for HangingCommitter {
        fn append(
            &self,
            partition: &PartitionId,
            batch: &mut EncodedBatch,
        ) -> Result<Appended, ChildCommitError> {
            if partition.topic == "child" {
                self.entered
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (lock, released) = &*self.hung;
                let mut hung = lock.lock().unwrap();
                while *hung {
                    hung = released.wait(hung).unwrap();
                }
            }
            Ok(self.store.append_encoded(partition, batch)?)
        }
    }

    /// Releases a [`HangingCommitter`] when dropped, so a failing test ends instead of
    /// leaving its runtime waiting on the hung commit.
    struct Release(Arc<(Mutex<bool>, std::sync::Condvar)>);

    impl Drop for Release {
        fn drop(&mut self) {
            *self
                .0
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = false;
            self.0.1.notify_all();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cursor_stuck_in_a_commit_delays_neither_the_tick_nor_another_links_start() {
        use std::sync::atomic::Ordering::SeqCst;
        let (_dir, store, metastore) = one_link("").await;
        let parent = PartitionId::new("parent", 0);
        store
            .append(
                &parent,
                AppendBatch {
                    records: vec![NewRecord {
                        key: None,
                        headers: Vec::new(),
                        value: Some(Bytes::from_static(b"v0")),
                    }],
                    origin: None,
                },
            )
            .unwrap();
        let hung = Arc::new((Mutex::new(true), std::sync::Condvar::new()));
        let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let release = Release(Arc::clone(&hung));
        let deps = test_deps(
            &store,
            &metastore,
            Arc::new(HangingCommitter {
                store: Arc::clone(&store),
                hung: Arc::clone(&hung),
                entered: Arc::clone(&entered),
            }),
        );
        let view = Arc::new(FanoutView::default());
        let mut reconciler = Reconciler::new(
            deps,
            Arc::new(SingleNode::default()),
            Arc::new(NativeFactory),
            Arc::new(FanoutMetrics::default()),
            Arc::clone(&view),
        );
        reconciler.tick().await;
        wait_for("the cursor to be stuck in its commit", || {
            entered.load(SeqCst) > 0
        })
        .await;
        // Its position does not move while it has a record to copy: after the bound (300 ms
        // here), the tick reports it stalled, though nothing failed.
        let stuck = view.status("parent", "child", 0).expect("listed");
        let deadline = Instant::now() + WAIT;
        while stuck.report().state != crate::fanout::status::CursorState::Stalled {
            assert!(
                Instant::now() < deadline,
                "never reported: {:?}",
                stuck.report()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            reconciler.refresh_lags();
        }
        assert!(
            stuck
                .report()
                .last_error
                .is_some_and(|e| e.contains("no progress for")),
            "{:?}",
            stuck.report()
        );

        // Detach the stuck link and attach another: the tick that stops the first must not
        // wait for its commit, and the second link's cursor starts in that same tick.
        metastore.detach_link("parent", "child").await.unwrap();
        store
            .create_partition(&PartitionId::new("other", 0), LogConfig::default())
            .unwrap();
        metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: "other".into(),
                partitions: 1,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: Vec::new(),
            })
            .await
            .unwrap();
        metastore
            .attach_link(LinkMeta {
                parent: "parent".into(),
                child: "other".into(),
                attach_epoch: "00112233445566bb".into(),
                attach_offsets: Some(vec![0]),
                delay_ms: 0,
                router: vec![plugin()],
                config: String::new(),
                attached_at_ms: 0,
                paused: Vec::new(),
                shadow: None,
                on_gap: Default::default(),
                accepted_gaps: Vec::new(),
                dead_letter: None,
                remote: None,
            })
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), reconciler.tick())
            .await
            .expect("a tick waited for a cursor stuck in a commit");
        assert!(view.status("parent", "other", 0).is_some(), "not started");
        assert!(
            view.status("parent", "child", 0).is_some(),
            "the stuck cursor left the view before its task ended"
        );

        // Released, the stuck cursor ends and is reaped at the next tick.
        drop(release);
        wait_for("the stopped cursor to end", || {
            reconciler.stopping.values().all(|r| r.task.is_finished())
        })
        .await;
        reconciler.tick().await;
        assert!(reconciler.stopping.is_empty());
        assert!(view.status("parent", "child", 0).is_none());
        let keys: Vec<CursorKey> = reconciler.cursors.keys().cloned().collect();
        for key in keys {
            reconciler.stop_cursor(&key);
        }
        reconciler.reap_all().await;
    }

    /// Counts the chains it builds: the links' own and the shadows' candidates.
    #[derive(Default)]
    struct CountingFactory {
        real: std::sync::atomic::AtomicUsize,
        candidates: std::sync::atomic::AtomicUsize,
    }

    impl RouterFactory for Arc<CountingFactory> {
        fn build(&self, _link: &LinkMeta) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
            self.real.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Box::new(NativeRouter { panics: false }))
        }

        fn build_candidate(
            &self,
            link: &LinkMeta,
        ) -> Result<Box<dyn SlabRouter>, RouterBuildError> {
            assert_eq!(link.config, "candidate config");
            self.candidates
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Box::new(NativeRouter { panics: false }))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn setting_and_clearing_a_shadow_never_rebuilds_the_link_s_chain_or_restarts_its_cursor()
    {
        use std::sync::atomic::Ordering::SeqCst;
        let (_dir, store, metastore) = one_link("real config").await;
        let deps = test_deps(
            &store,
            &metastore,
            Arc::new(StoreCommitter(Arc::clone(&store))),
        );
        let factory = Arc::new(CountingFactory::default());
        let view = Arc::new(FanoutView::default());
        let mut reconciler = Reconciler::new(
            deps,
            Arc::new(SingleNode::default()),
            Arc::new(Arc::clone(&factory)),
            Arc::new(FanoutMetrics::default()),
            Arc::clone(&view),
        );
        reconciler.tick().await;
        assert_eq!(factory.real.load(SeqCst), 1);
        let key = CursorKey {
            parent: "parent".into(),
            partition: 0,
            child: "child".into(),
            epoch: "00112233445566aa".into(),
        };
        let runtime = |r: &Reconciler| {
            Arc::clone(&r.links[&("parent".to_owned(), "child".to_owned())].runtime)
        };
        let (first_runtime, first_router) = {
            let rt = runtime(&reconciler);
            let router = Arc::clone(&rt.router);
            (rt, router)
        };

        let spec = ShadowSpec {
            router: vec![plugin()],
            config: "candidate config".into(),
            set_at_ms: 1,
        };
        metastore
            .set_shadow("parent", "child", Some(spec.clone()))
            .await
            .unwrap();
        reconciler.tick().await;
        assert_eq!(factory.real.load(SeqCst), 1, "the link's chain was rebuilt");
        assert_eq!(factory.candidates.load(SeqCst), 1);
        let shadow = view
            .shadows()
            .get("parent", "child")
            .expect("the shadow runs");
        assert_eq!(shadow.spec(), &spec);
        let rt = runtime(&reconciler);
        assert!(Arc::ptr_eq(&rt, &first_runtime));
        assert!(Arc::ptr_eq(&rt.router, &first_router));
        assert!(rt.shadow().is_some_and(|s| Arc::ptr_eq(&s, &shadow)));
        assert_eq!(rt.meta().config, "real config");

        // Set again (a fresh report): a new candidate, still the same chain and cursor.
        let again = ShadowSpec {
            set_at_ms: 2,
            ..spec
        };
        metastore
            .set_shadow("parent", "child", Some(again.clone()))
            .await
            .unwrap();
        reconciler.tick().await;
        assert_eq!(factory.candidates.load(SeqCst), 2);
        let replaced = view.shadows().get("parent", "child").unwrap();
        assert_eq!(replaced.spec(), &again);

        metastore.set_shadow("parent", "child", None).await.unwrap();
        reconciler.tick().await;
        assert!(view.shadows().get("parent", "child").is_none());
        assert!(runtime(&reconciler).shadow().is_none());
        assert_eq!(factory.real.load(SeqCst), 1);
        let keys: Vec<&CursorKey> = reconciler.cursors.keys().collect();
        assert_eq!(keys, [&key]);
        reconciler.stop_cursor(&key);
        reconciler.reap_all().await;
    }
}
