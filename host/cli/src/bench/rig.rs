//! The daemon's fan-out machinery assembled in-process for a bench: the store on a counting
//! file system, the file metastore, the plugin registry with the built-ins, the production
//! child committer, and helpers to create topics, attach links through the default chain and
//! start the real cursors.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use narad_storage::{
    Appended, Clock, EncodedBatch, LogConfig, PartitionId, Store, StoreOptions, SystemClock,
};

use super::counting_fs::CountingFs;
use super::progress::Progress;
use super::timed_router::{RouteTiming, TimedRouter};
use super::{BenchError, blocking};
use narad_host::api::children::DEFAULT_ROUTER;
use narad_host::fanout::committer::{
    BlockingCommitter, ChildCommitError, ChildCommitter, InOrderFailure,
};
use narad_host::fanout::cursor::{CursorExit, run_cursor};
use narad_host::fanout::metrics::{CursorLabels, FanoutMetrics};
use narad_host::fanout::route::wasm::WasmRouterFactory;
use narad_host::fanout::route::{RouterFactory as _, SlabRouter};
use narad_host::fanout::status::{CursorState, CursorStatus};
use narad_host::fanout::{CursorDeps, CursorKey, LinkRuntime};
use narad_host::metastore::link::new_epoch;
use narad_host::metastore::{FileMetastore, LinkMeta, Metastore, TopicMeta};
use narad_host::plugins::PluginRegistry;
use narad_host::produce::Producer;
use narad_host::shutdown::ShutdownSignal;

/// The production child committer (a produce commit) that also counts its commits.
#[derive(Debug)]
pub struct CountingCommitter {
    producer: Producer,
    commits: AtomicU64,
    nanos: AtomicU64,
}

impl CountingCommitter {
    /// Bucket commits so far (each one an append + `fdatasync` + verify).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Time spent in those commits, summed over threads.
    pub fn time(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

impl BlockingCommitter for CountingCommitter {
    fn append(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, ChildCommitError> {
        let start = std::time::Instant::now();
        let result = self.producer.append(partition, batch);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        result
    }

    /// The production path's, so consecutive slabs share one append: counted as one commit
    /// per batch.
    fn append_in_order(
        &self,
        partition: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> Result<(), InOrderFailure> {
        let start = std::time::Instant::now();
        let result = self.producer.append_in_order(partition, batches);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.commits
            .fetch_add(batches.len() as u64, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        result
    }
}

/// What [`Rig::with_filled_parent`] writes: a parent topic and its backlog.
pub struct Backlog<'a> {
    /// The parent topic's name.
    pub parent: &'a str,
    /// Its partitions.
    pub partitions: u32,
    /// Records spread over them.
    pub records: u64,
    /// Key bytes per record.
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
}

impl Rig {
    /// A rig in `data_dir` (the reference timing) whose parent topic holds `backlog`, filled
    /// with progress shown when `progress`.
    pub async fn with_filled_parent(
        data_dir: &Path,
        backlog: &Backlog<'_>,
        progress: bool,
    ) -> Result<Arc<Rig>, BenchError> {
        let rig = Arc::new(Rig::open(data_dir, narad_host::fanout::FanoutTiming::default()).await?);
        rig.create_topic(backlog.parent, backlog.partitions).await?;
        let spec = super::fill::FillSpec {
            topic: backlog.parent.to_owned(),
            partitions: backlog.partitions,
            records: backlog.records,
            key_bytes: backlog.key_bytes,
            value_bytes: backlog.value_bytes,
        };
        let store = Arc::clone(&rig.store);
        blocking(move || super::fill::fill_parent(&store, &spec, &mut Progress::new(progress)))
            .await??;
        Ok(rig)
    }
}

/// Waits until every cursor of `cursors` reports `state` (named `what` in messages and
/// progress), at most `limit`, looking every `poll`. An error names a cursor that ended
/// meanwhile or, past the limit, one not there yet with its report.
pub async fn wait_for_state(
    cursors: &[RunningCursor],
    state: CursorState,
    what: &str,
    (limit, poll): (std::time::Duration, std::time::Duration),
    progress: &mut Progress,
) -> Result<(), BenchError> {
    let start = std::time::Instant::now();
    loop {
        let mut there = 0usize;
        for cursor in cursors {
            if cursor.task.is_finished() {
                return Err(BenchError::Cursor {
                    cursor: cursor.name(),
                    reason: format!(
                        "it ended before it was {what} ({:?})",
                        cursor.status.report().last_error
                    ),
                });
            }
            if cursor.status.report().state == state {
                there += 1;
            }
        }
        if there == cursors.len() {
            progress.finish();
            return Ok(());
        }
        if start.elapsed() > limit {
            let late = cursors
                .iter()
                .find(|c| c.status.report().state != state)
                .map(|c| (c.name(), c.status.report()));
            return Err(BenchError::Cursor {
                cursor: late.as_ref().map_or_else(String::new, |l| l.0.clone()),
                reason: format!(
                    "not {what} after {} s: {:?}",
                    limit.as_secs(),
                    late.map(|l| l.1)
                ),
            });
        }
        progress.update(|| format!("{there}/{} cursors {what}", cursors.len()));
        tokio::time::sleep(poll).await;
    }
}

/// One started cursor.
pub struct RunningCursor {
    /// Which cursor.
    pub key: CursorKey,
    /// Its live status.
    pub status: Arc<CursorStatus>,
    /// Its task.
    pub task: tokio::task::JoinHandle<CursorExit>,
}

impl RunningCursor {
    /// `parent/pNNNNN -> child`, for messages.
    pub fn name(&self) -> String {
        format!(
            "{} -> {}",
            PartitionId::new(self.key.parent.clone(), self.key.partition),
            self.key.child
        )
    }
}

/// The in-process fan-out host of a bench.
pub struct Rig {
    /// The store (on [`Rig::fs`]).
    pub store: Arc<Store>,
    /// The counting file system under the store and the offset files.
    pub fs: CountingFs,
    /// The metastore.
    pub metastore: Arc<FileMetastore>,
    /// The plugin registry (built-ins registered).
    pub registry: Arc<PluginRegistry>,
    /// The child committer.
    pub committer: Arc<CountingCommitter>,
    /// What every cursor uses.
    pub deps: Arc<CursorDeps>,
    /// The same without the check that leaves out records a child already holds
    /// ([`CursorDeps::leave_out_held`]): the baseline of `narad bench once`.
    pub deps_without_held_check: Arc<CursorDeps>,
    /// The fan-out series the cursors update.
    pub metrics: Arc<FanoutMetrics>,
    routers: WasmRouterFactory,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Rig {
    /// Opens a store, metastore and plugin registry in `data_dir` (as `narad serve` would).
    pub async fn open(
        data_dir: &Path,
        timing: narad_host::fanout::FanoutTiming,
    ) -> Result<Rig, BenchError> {
        let fs = CountingFs::new();
        let (store, metastore) = {
            let (dir, fs) = (data_dir.to_path_buf(), fs.clone());
            blocking(move || -> Result<(Store, FileMetastore), BenchError> {
                // Owner-only, as the store wants its directory.
                narad_storage::fs::FileSystem::create_dir_all(&narad_storage::fs::RealFs, &dir)
                    .map_err(BenchError::io(format!("creating {}", dir.display())))?;
                let store = Store::open(
                    &dir,
                    StoreOptions {
                        fs: Arc::new(fs),
                        ..StoreOptions::default()
                    },
                )
                .map_err(BenchError::storage("opening the store"))?;
                let metastore = FileMetastore::open(&dir)
                    .map_err(BenchError::metastore("opening the metastore"))?;
                Ok((store, metastore))
            })
            .await??
        };
        let store = Arc::new(store);
        let metastore = Arc::new(metastore);
        let registry = Arc::new(
            PluginRegistry::open(
                data_dir,
                Arc::clone(&metastore) as Arc<dyn Metastore>,
                narad_runtime::Limits::default(),
            )
            .await?,
        );
        let committer = Arc::new(CountingCommitter {
            producer: Producer::new(Arc::clone(&store)),
            commits: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        });
        let deps_of = |leave_out_held: bool| {
            Arc::new(CursorDeps {
                store: Arc::clone(&store),
                fs: Arc::new(fs.clone()),
                committer: Arc::clone(&committer) as Arc<dyn ChildCommitter>,
                metastore: Arc::clone(&metastore) as Arc<dyn Metastore>,
                clock: Arc::new(SystemClock) as Arc<dyn Clock>,
                timing,
                remote_tails: None,
                node: None,
                leave_out_held,
            })
        };
        let (deps, deps_without_held_check) = (deps_of(true), deps_of(false));
        let loader = Arc::clone(&registry);
        let routers = WasmRouterFactory::new(Arc::new(move |digest: &str| {
            loader.load(digest).map_err(Into::into)
        }));
        Ok(Rig {
            store,
            fs,
            metastore,
            registry,
            committer,
            deps,
            deps_without_held_check,
            metrics: Arc::new(FanoutMetrics::default()),
            routers,
        })
    }

    /// Creates a topic of `partitions` partitions (default log settings, kept forever).
    pub async fn create_topic(&self, name: &str, partitions: u32) -> Result<(), BenchError> {
        let (store, topic) = (Arc::clone(&self.store), name.to_owned());
        blocking(move || -> Result<(), BenchError> {
            for p in 0..partitions {
                let id = PartitionId::new(topic.clone(), p);
                store
                    .create_partition(&id, LogConfig::default())
                    .map_err(BenchError::storage(format!("creating {id}")))?;
            }
            Ok(())
        })
        .await??;
        self.metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: name.to_owned(),
                partitions,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: now_ms(),
                owners: Vec::new(),
            })
            .await
            .map_err(BenchError::metastore(format!("creating topic {name}")))?;
        Ok(())
    }

    /// Attaches `child` to `parent` with the default chain (resolved through the registry, as
    /// an attach without a router does), starting at `attach_offsets`.
    pub async fn attach_default(
        &self,
        parent: &str,
        child: &str,
        delay_ms: u64,
        attach_offsets: Vec<u64>,
    ) -> Result<LinkMeta, BenchError> {
        let snapshot = self
            .metastore
            .snapshot()
            .await
            .map_err(BenchError::metastore("reading the metastore"))?;
        let router = DEFAULT_ROUTER
            .iter()
            .map(|name| self.registry.resolve(&snapshot, name))
            .collect::<Result<Vec<_>, _>>()?;
        self.metastore
            .attach_link(LinkMeta {
                parent: parent.to_owned(),
                child: child.to_owned(),
                attach_epoch: new_epoch(),
                attach_offsets: Some(attach_offsets),
                delay_ms,
                router,
                config: String::new(),
                attached_at_ms: now_ms(),
                paused: Vec::new(),
                shadow: None,
                on_gap: Default::default(),
                accepted_gaps: Vec::new(),
                dead_letter: None,
                remote: None,
            })
            .await
            .map_err(BenchError::metastore(format!(
                "attaching {child} to {parent}"
            )))
    }

    /// The link's runtime: its chain built by the production factory (fresh plugin
    /// instances), wrapped in a [`TimedRouter`] adding to `timing`.
    pub async fn link_runtime(
        self: &Arc<Self>,
        link: LinkMeta,
        timing: Arc<RouteTiming>,
    ) -> Result<Arc<LinkRuntime>, BenchError> {
        let rig = Arc::clone(self);
        let meta = link.clone();
        let router = blocking(move || rig.routers.build(&meta))
            .await?
            .map_err(|reason| BenchError::Router {
                link: format!("{} -> {}", link.parent, link.child),
                reason: reason.to_string(),
            })?;
        let timed: Box<dyn SlabRouter> = Box::new(TimedRouter::new(router, timing));
        Ok(Arc::new(LinkRuntime::new(
            link,
            Arc::new(std::sync::Mutex::new(timed)),
        )))
    }

    /// Starts the real cursor of `link`'s parent partition `partition`.
    pub fn spawn_cursor(
        &self,
        link: &Arc<LinkRuntime>,
        partition: u32,
        stop: ShutdownSignal,
    ) -> RunningCursor {
        self.spawn_cursor_on(&self.deps, link, partition, stop)
    }

    /// [`Rig::spawn_cursor`] with `deps` (one of the rig's).
    pub fn spawn_cursor_on(
        &self,
        deps: &Arc<CursorDeps>,
        link: &Arc<LinkRuntime>,
        partition: u32,
        stop: ShutdownSignal,
    ) -> RunningCursor {
        let meta = link.meta();
        let key = CursorKey {
            parent: meta.parent.clone(),
            partition,
            child: meta.child.clone(),
            epoch: meta.attach_epoch.clone(),
        };
        let status = Arc::new(CursorStatus::new(
            CursorLabels {
                parent: meta.parent.clone(),
                child: meta.child.clone(),
                partition,
            },
            Arc::clone(&self.metrics),
        ));
        let task = tokio::spawn(run_cursor(
            Arc::clone(deps),
            key.clone(),
            Arc::clone(link),
            Arc::clone(&status),
            stop,
        ));
        RunningCursor { key, status, task }
    }

    /// Slabs the cursor of `key` has committed, from its metric series.
    pub fn slabs_committed(&self, key: &CursorKey) -> u64 {
        self.metrics
            .slabs
            .get_or_create(&CursorLabels {
                parent: key.parent.clone(),
                child: key.child.clone(),
                partition: key.partition,
            })
            .get()
    }

    /// The high watermark of each partition of `topic` (`partitions` of them).
    pub async fn high_watermarks(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<Vec<u64>, BenchError> {
        let (store, topic) = (Arc::clone(&self.store), topic.to_owned());
        blocking(move || {
            (0..partitions)
                .map(|p| {
                    let id = PartitionId::new(topic.clone(), p);
                    store
                        .high_watermark(&id)
                        .map_err(BenchError::storage(format!("reading {id}")))
                })
                .collect::<Result<Vec<u64>, BenchError>>()
        })
        .await?
    }
}

/// Stops every cursor and waits for them; a cursor that did not stop because it was told to
/// is reported.
pub async fn stop_all(
    trigger: &narad_host::shutdown::ShutdownTrigger,
    cursors: Vec<RunningCursor>,
) -> Result<(), BenchError> {
    trigger.trigger();
    for cursor in cursors {
        let name = cursor.name();
        match cursor.task.await {
            Ok(CursorExit::Stopped) => {}
            Ok(other) => {
                return Err(BenchError::Cursor {
                    cursor: name,
                    reason: format!("{other:?}"),
                });
            }
            Err(source) => {
                return Err(BenchError::CursorTask {
                    cursor: name,
                    source,
                });
            }
        }
    }
    Ok(())
}
