//! One fan-out cursor against a real store on a fault-injecting file system: commit before
//! advance, retrying only failed buckets, fsync errors on the child, epochs, drop-behind, and
//! the delay gate on an injected clock.

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_host::fanout::FanoutTiming;
use narad_host::fanout::committer::{
    BlockingCommitter, ChildCommitError, ChildCommitter, InOrderFailure,
};
use narad_host::fanout::cursor::{CursorExit, LinkGone, run_cursor};
use narad_host::fanout::metrics::{CursorLabels, FanoutMetrics};
use narad_host::fanout::position::{Deferred, cursor_path};
use narad_host::fanout::route::{RouteFailure, RouteInput, SlabRouter};
use narad_host::fanout::status::{CursorState, CursorStatus, HaltedGap, SeekError};
use narad_host::fanout::{CursorDeps, CursorKey, LinkRuntime};
use narad_host::metastore::link::{AcceptedGap, LinkMeta, OnGap, PluginRef, PluginVersion};
use narad_host::metastore::{
    BoxFuture, Change, FileMetastore, LinkTopics, Metastore, Outcome, Snapshot, TopicMeta, Versions,
};
use narad_host::shutdown;
use narad_storage::cursor::gaps::{self, GapLedger, GapReason, GapsLoad};
use narad_storage::cursor::{self as cursor_file, CursorFile, CursorLoad, CursorRecord};
use narad_storage::fault::{CrashMode, Fault, FaultFs, FaultOp};
use narad_storage::fs::FileSystem;
use narad_storage::{
    AppendBatch, Appended, Clock, EncodedBatch, LogConfig, ManualClock, NewRecord, PartitionId,
    ReadOptions, StorageError, Store, StoreOptions, StoredRecord,
};

const EPOCH: &str = "00112233445566aa";
/// Bound on waiting for the cursor to reach a state; generous for a busy machine.
const WAIT: Duration = Duration::from_secs(60);

/// The cursors' waits, shortened so that retries, back-offs and delay wake-ups happen within
/// milliseconds: a test proves "not yet" by many of them, not by sleeping for seconds.
const TIMING: FanoutTiming = FanoutTiming {
    slab_long_poll: Duration::from_millis(50),
    slab_linger: Duration::from_millis(5),
    quick_retry_pauses: [Duration::from_millis(2), Duration::from_millis(4)],
    retry_backoff: Duration::from_millis(20),
    delay_max_sleep: Duration::from_millis(5),
    remote_backoff_max: Duration::from_millis(50),
    // Never due while a test runs: every slab's position is written unsynced, as at full speed,
    // so the tests below check what the coalesced path writes, and the power-loss tests what
    // it leaves durable.
    offset_sync_every: Duration::from_secs(3600),
    slabs_per_commit: narad_host::fanout::SLABS_PER_COMMIT,
    no_progress_after: narad_host::fanout::NO_PROGRESS_AFTER,
};

/// Routes keyed records by Kafka's partitioner and keyless ones to partition 0.
struct KeyRouter;

impl SlabRouter for KeyRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        Ok(records
            .iter()
            .map(|r| match &r.key {
                Some(key) => {
                    narad_abi::partition_for_key(key, input.child_partition_count).unwrap_or(0)
                }
                None => 0,
            })
            .collect())
    }
}

/// Commits through the store, except to child partitions marked down (a dead owner, a full
/// disk): those fail, counting every attempt.
struct GatedCommitter {
    store: Arc<Store>,
    down: Vec<AtomicBool>,
    /// Commits still allowed to any partition; past it every commit fails (a child that goes
    /// down after exactly that many batches).
    budget: std::sync::atomic::AtomicU64,
    /// Every error the store returned to a child commit.
    store_errors: std::sync::Mutex<Vec<String>>,
    /// While set, `(child partition, slab start)`: batches of that slab for that partition
    /// fail (one slab's bucket lost to a failure that spares the next slab's).
    refused_slab: std::sync::Mutex<Option<(u32, u64)>>,
}

impl GatedCommitter {
    /// Why `batch` is not taken for `partition` now, if it is not.
    fn refusal(&self, partition: &PartitionId, batch: &EncodedBatch) -> Option<ChildCommitError> {
        let refused = *self.refused_slab.lock().unwrap();
        if let Some((p, slab_start)) = refused
            && p == partition.partition
            && batch.decode().unwrap().origin.map(|o| o.slab_start) == Some(slab_start)
        {
            return Some(down(partition));
        }
        let spent = self
            .budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
            .is_err();
        (spent || self.down[partition.partition as usize].load(Ordering::SeqCst))
            .then(|| down(partition))
    }

    fn note(&self, partition: &PartitionId, error: &StorageError) {
        self.store_errors
            .lock()
            .unwrap()
            .push(format!("{partition}: {error}"));
    }
}

/// A child commit that failed because the test took the child partition down.
fn down(partition: &PartitionId) -> ChildCommitError {
    StorageError::Io {
        context: format!("{partition} is down"),
        source: std::io::Error::other("down"),
    }
    .into()
}

impl BlockingCommitter for GatedCommitter {
    fn append(
        &self,
        partition: &PartitionId,
        batch: &mut EncodedBatch,
    ) -> Result<Appended, ChildCommitError> {
        if let Some(refused) = self.refusal(partition, batch) {
            return Err(refused);
        }
        let result = self.store.append_encoded(partition, batch);
        if let Err(error) = &result {
            self.note(partition, error);
        }
        Ok(result?)
    }

    /// The store's own (one append for all) for the batches the gate lets through, in
    /// order, stopping at the first it refuses.
    fn append_in_order(
        &self,
        partition: &PartitionId,
        batches: &mut [EncodedBatch],
    ) -> Result<(), InOrderFailure> {
        let mut refused = None;
        for (i, batch) in batches.iter().enumerate() {
            if let Some(error) = self.refusal(partition, batch) {
                refused = Some((i, error));
                break;
            }
        }
        let allowed = refused.as_ref().map_or(batches.len(), |(i, _)| *i);
        if let Err(e) = self
            .store
            .append_encoded_in_order(partition, &mut batches[..allowed])
        {
            self.note(partition, &e.error);
            return Err(InOrderFailure {
                durable: e.durable,
                error: e.error.into(),
            });
        }
        match refused {
            Some((durable, error)) => Err(InOrderFailure { durable, error }),
            None => Ok(()),
        }
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    fault: FaultFs,
    store: Arc<Store>,
    metastore: Arc<FileMetastore>,
    committer: Arc<GatedCommitter>,
    clock: Arc<ManualClock>,
}

const T0_MS: i64 = 1_700_000_000_000;

async fn fixture(
    parent_partitions: u32,
    child_partitions: u32,
    parent_config: LogConfig,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let fault = FaultFs::new();
    let clock = Arc::new(ManualClock::new(T0_MS));
    let store = Arc::new(
        Store::open(
            std::path::Path::new("/data"),
            StoreOptions {
                fs: Arc::new(fault.clone()),
                clock: Arc::clone(&clock) as Arc<dyn Clock>,
                ..StoreOptions::default()
            },
        )
        .unwrap(),
    );
    let metastore = Arc::new(FileMetastore::open(dir.path()).unwrap());
    for (name, partitions, config) in [
        ("parent", parent_partitions, parent_config),
        ("child", child_partitions, LogConfig::default()),
    ] {
        for p in 0..partitions {
            store
                .create_partition(&PartitionId::new(name, p), config.clone())
                .unwrap();
        }
        metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: name.into(),
                partitions,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: 0,
                owners: Vec::new(),
            })
            .await
            .unwrap();
    }
    // The link's router names this (native) plugin; the metastore only links recorded ones.
    metastore
        .add_plugin(PluginVersion {
            name: "native-key".into(),
            digest: "0".repeat(64),
            size_bytes: 0,
            version: "test".into(),
            description: "routes natively by Kafka's partitioner".into(),
            uploaded_at_ms: 0,
        })
        .await
        .unwrap();
    let committer = Arc::new(GatedCommitter {
        store: Arc::clone(&store),
        // Room for a child that grows.
        down: (0..16).map(|_| AtomicBool::new(false)).collect(),
        budget: std::sync::atomic::AtomicU64::new(u64::MAX),
        store_errors: std::sync::Mutex::new(Vec::new()),
        refused_slab: std::sync::Mutex::new(None),
    });
    Fixture {
        _dir: dir,
        fault,
        store,
        metastore,
        committer,
        clock,
    }
}

fn link(attach_offsets: Vec<u64>, delay_ms: u64) -> LinkMeta {
    LinkMeta {
        parent: "parent".into(),
        child: "child".into(),
        attach_epoch: EPOCH.into(),
        attach_offsets: Some(attach_offsets),
        delay_ms,
        router: vec![PluginRef {
            name: "native-key".into(),
            digest: "0".repeat(64),
        }],
        config: String::new(),
        attached_at_ms: 0,
        paused: Vec::new(),
        shadow: None,
        on_gap: Default::default(),
        accepted_gaps: Vec::new(),
        dead_letter: None,
        remote: None,
    }
}

struct Running {
    status: Arc<CursorStatus>,
    metrics: Arc<FanoutMetrics>,
    stop: shutdown::ShutdownTrigger,
    task: tokio::task::JoinHandle<CursorExit>,
    /// The link as the cursor sees it (what the reconciler swaps).
    runtime: Arc<LinkRuntime>,
}

impl Running {
    /// How the cursor exits on its own, failing (not hanging) if it does not within [`WAIT`].
    async fn exit(self) -> CursorExit {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the cursor did not exit")
            .unwrap()
    }

    /// Tells the cursor to stop and returns how it exited.
    async fn stop(self) -> CursorExit {
        self.stop.trigger();
        self.exit().await
    }

    /// Bucket commits that failed and were retried so far.
    fn commit_retries(&self) -> u64 {
        self.metrics
            .commit_retries
            .get_or_create(self.status.labels())
            .get()
    }
}

async fn start(f: &Fixture, link_meta: LinkMeta) -> Running {
    f.metastore.attach_link(link_meta.clone()).await.unwrap();
    spawn_cursor(f, link_meta)
}

/// Runs a cursor for `link_meta` without attaching it in the metastore first.
fn spawn_cursor(f: &Fixture, link_meta: LinkMeta) -> Running {
    spawn_cursor_routing(f, link_meta, Box::new(KeyRouter))
}

/// [`spawn_cursor`] with `router` as the link's router.
fn spawn_cursor_routing(f: &Fixture, link_meta: LinkMeta, router: Box<dyn SlabRouter>) -> Running {
    let metastore = Arc::clone(&f.metastore) as Arc<dyn Metastore>;
    spawn_cursor_on(f, link_meta, router, metastore)
}

/// [`spawn_cursor_routing`] reading its metadata from `metastore`.
fn spawn_cursor_on(
    f: &Fixture,
    link_meta: LinkMeta,
    router: Box<dyn SlabRouter>,
    metastore: Arc<dyn Metastore>,
) -> Running {
    let deps = Arc::new(CursorDeps {
        store: Arc::clone(&f.store),
        fs: Arc::new(f.fault.clone()),
        committer: Arc::clone(&f.committer) as Arc<dyn ChildCommitter>,
        metastore,
        clock: Arc::clone(&f.clock) as Arc<dyn Clock>,
        timing: TIMING,
        remote_tails: None,
        node: None,
        leave_out_held: true,
    });
    let key = CursorKey {
        parent: "parent".into(),
        partition: 0,
        child: "child".into(),
        epoch: link_meta.attach_epoch.clone(),
    };
    let runtime = Arc::new(LinkRuntime::new(
        link_meta,
        Arc::new(std::sync::Mutex::new(router)),
    ));
    let cursor_runtime = Arc::clone(&runtime);
    let labels = CursorLabels {
        parent: "parent".into(),
        child: "child".into(),
        partition: 0,
    };
    let metrics = Arc::new(FanoutMetrics::default());
    let status = Arc::new(CursorStatus::new(labels, Arc::clone(&metrics)));
    let (stop, signal) = shutdown::channel();
    let task = tokio::spawn(run_cursor(
        deps,
        key,
        cursor_runtime,
        Arc::clone(&status),
        signal,
    ));
    Running {
        status,
        metrics,
        stop,
        task,
        runtime,
    }
}

fn produce(store: &Store, values: std::ops::Range<u32>) {
    for i in values {
        let record = NewRecord {
            key: Some(Bytes::from(format!("key-{}", i % 7))),
            headers: Vec::new(),
            value: Some(Bytes::from(format!("v{i}"))),
        };
        store
            .append(
                &PartitionId::new("parent", 0),
                AppendBatch {
                    records: vec![record],
                    origin: None,
                },
            )
            .unwrap();
    }
}

fn child_values(store: &Store, partition: u32) -> Vec<String> {
    let id = PartitionId::new("child", partition);
    let read = store
        .read(
            &id,
            &ReadOptions {
                offset: 0,
                max_records: 100_000,
                max_bytes: usize::MAX,
                max_committed_at_ms: None,
            },
        )
        .unwrap();
    read.records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default().to_vec()).unwrap())
        .collect()
}

fn all_child_values(store: &Store, partitions: u32) -> Vec<String> {
    let mut all: Vec<String> = (0..partitions)
        .flat_map(|p| child_values(store, p))
        .collect();
    all.sort();
    all
}

fn expected(range: std::ops::Range<u32>) -> Vec<String> {
    let mut v: Vec<String> = range.map(|i| format!("v{i}")).collect();
    v.sort();
    v
}

/// Runs a cursor of `link_meta` until it has copied up to `next_offset`, then stops it.
/// A cursor of a link of partition 0 started on 30 parent records, once it has copied them.
async fn caught_up_on_30_records(f: &Fixture) -> Running {
    produce(&f.store, 0..30);
    let running = start(f, link(vec![0], 0)).await;
    wait_for("the first copy", || {
        running.status.report().next_offset == Some(30)
    })
    .await;
    running
}

async fn copy_until(f: &Fixture, link_meta: LinkMeta, next_offset: u64, what: &str) {
    let running = start(f, link_meta).await;
    wait_for(what, || {
        running.status.report().next_offset == Some(next_offset)
    })
    .await;
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn file_position(f: &Fixture) -> Option<CursorRecord> {
    let path = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    match cursor_file::load(&f.fault, &path).unwrap() {
        CursorLoad::Found { record, .. } => Some(record),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_bucket_holds_the_cursor_and_only_that_bucket_is_retried() {
    let f = fixture(1, 3, LogConfig::default()).await;
    produce(&f.store, 0..60);
    // Partition 1 of the child is down from the start.
    f.committer.down[1].store(true, Ordering::SeqCst);
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the cursor to stall", || {
        running.status.report().state == CursorState::Stalled
    })
    .await;
    // Let it retry a few times (each after its quick tries and the back-off).
    wait_for("three retries of the failed bucket", || {
        running.commit_retries() >= 3
    })
    .await;
    assert_eq!(
        file_position(&f).map(|r| r.next_offset),
        Some(0),
        "advanced past an uncommitted bucket"
    );
    let healthy_before: Vec<Vec<String>> =
        [0, 2].iter().map(|&p| child_values(&f.store, p)).collect();
    assert!(healthy_before.iter().any(|v| !v.is_empty()));
    assert!(child_values(&f.store, 1).is_empty());
    assert!(
        running
            .status
            .report()
            .last_error
            .unwrap_or_default()
            .contains("child/p00001")
    );

    f.committer.down[1].store(false, Ordering::SeqCst);
    wait_for("the slab to commit", || {
        running.status.report().next_offset == Some(60)
    })
    .await;
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(60));
    // The healthy buckets were not sent again.
    let healthy_after: Vec<Vec<String>> =
        [0, 2].iter().map(|&p| child_values(&f.store, p)).collect();
    assert_eq!(healthy_after, healthy_before);
    assert_eq!(all_child_values(&f.store, 3), expected(0..60));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_slab_stalls_the_pipelined_cursor_files_only_the_slab_before_it() {
    // Three slabs of backlog, one child partition: one batch per slab.
    let f = fixture(1, 1, LogConfig::default()).await;
    let slab = narad_host::fanout::SLAB_MAX_RECORDS as u32;
    produce(&f.store, 0..3 * slab);
    // The child takes the first slab, then goes down.
    f.committer.budget.store(1, Ordering::SeqCst);
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the second slab to stall", || running.commit_retries() >= 3).await;
    // The third slab was read ahead and the first one's position written meanwhile: the file
    // is past the first slab exactly, never past the stalled one or the one read ahead.
    wait_for("the first slab's position on file", || {
        file_position(&f).map(|r| r.next_offset) == Some(u64::from(slab))
    })
    .await;
    for _ in 0..3 {
        let before = running.commit_retries();
        wait_for("another retry", || running.commit_retries() > before).await;
        assert_eq!(
            file_position(&f).map(|r| r.next_offset),
            Some(u64::from(slab)),
            "the offset file ran ahead of the child"
        );
    }
    assert_eq!(all_child_values(&f.store, 1), expected(0..slab));

    f.committer.budget.store(u64::MAX, Ordering::SeqCst);
    wait_for("every slab on file", || {
        file_position(&f).map(|r| r.next_offset) == Some(u64::from(3 * slab))
    })
    .await;
    assert_eq!(all_child_values(&f.store, 1), expected(0..3 * slab));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_committed_two_slabs_at_a_time_each_batch_naming_its_commits_start() {
    // Four slabs of backlog, one child partition: one batch per slab.
    let f = fixture(1, 1, LogConfig::default()).await;
    let slab = narad_host::fanout::SLAB_MAX_RECORDS as u64;
    produce(&f.store, 0..4 * slab as u32);
    let before = f.store.append_stats();
    copy_until(&f, link(vec![0], 0), 4 * slab, "the backlog copied").await;
    let after = f.store.append_stats();
    // The first slab goes alone (nothing was read ahead yet); the next two were read while
    // it committed and go together; the last one, read while they committed, alone.
    assert_eq!(
        (after.appends - before.appends, after.syncs - before.syncs),
        (4, 3),
        "four slabs, one child fdatasync for each commit of one or two"
    );
    let copied = f
        .store
        .read(
            &PartitionId::new("child", 0),
            &ReadOptions {
                offset: 0,
                max_records: usize::MAX,
                max_bytes: usize::MAX,
                max_committed_at_ms: None,
            },
        )
        .unwrap()
        .records;
    assert_eq!(copied.len() as u64, 4 * slab);
    for (i, record) in copied.iter().enumerate() {
        let origin = record.origin.as_ref().unwrap();
        assert_eq!(origin.parent_offset, i as u64, "in parent order");
        // Where a cursor without its offset file resumes: the start of the first slab of
        // the batch's commit, also for the second slab of a commit.
        let commit_start = match i as u64 / slab {
            0 => 0,
            1 | 2 => slab,
            _ => 3 * slab,
        };
        assert_eq!(origin.slab_start, commit_start, "record {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slab_committed_with_the_one_before_never_lands_ahead_of_its_failed_bucket() {
    // Three slabs, two child partitions: the second and third slabs commit together, and
    // the second's bucket for partition 1 fails while the third's would not.
    let f = fixture(1, 2, LogConfig::default()).await;
    let slab = narad_host::fanout::SLAB_MAX_RECORDS as u32;
    produce(&f.store, 0..3 * slab);
    *f.committer.refused_slab.lock().unwrap() = Some((1, u64::from(slab)));
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the second slab's bucket to be retried", || {
        running.commit_retries() >= 2
    })
    .await;
    // Nothing of the third slab is in partition 1 while the second's bucket there is not.
    let held: Vec<u32> = child_values(&f.store, 1)
        .iter()
        .map(|v| v[1..].parse().unwrap())
        .collect();
    let ahead = held.iter().find(|&&i| i >= slab);
    assert_eq!(
        ahead, None,
        "a later slab's record landed ahead of an earlier slab's failed bucket"
    );
    assert!(file_position(&f).map_or(0, |r| r.next_offset) <= u64::from(slab));
    *f.committer.refused_slab.lock().unwrap() = None;
    wait_for("every slab copied", || {
        running.status.report().next_offset == Some(u64::from(3 * slab))
    })
    .await;
    for p in 0..2 {
        let order: Vec<u32> = child_values(&f.store, p)
            .iter()
            .map(|v| v[1..].parse().unwrap())
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of parent order or with a duplicate"
        );
    }
    assert_eq!(all_child_values(&f.store, 2), expected(0..3 * slab));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_offset_file_after_a_partly_failed_two_slab_commit_delivers_every_record() {
    // The second and third slabs commit together; the second's bucket for partition 1 fails,
    // so partition 0 holds the third slab while partition 1 lacks the second. The offset
    // file (past the first slab) is then lost: the position rebuilt from the child must not
    // start past the second slab.
    let f = fixture(1, 2, LogConfig::default()).await;
    let slab = narad_host::fanout::SLAB_MAX_RECORDS as u32;
    produce(&f.store, 0..3 * slab);
    *f.committer.refused_slab.lock().unwrap() = Some((1, u64::from(slab)));
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the second slab's bucket to be retried", || {
        running.commit_retries() >= 2
    })
    .await;
    let third_in_partition_0 = child_values(&f.store, 0)
        .iter()
        .any(|v| v[1..].parse::<u32>().unwrap() >= 2 * slab);
    assert!(
        third_in_partition_0,
        "the scenario needs the third slab in partition 0"
    );
    assert_eq!(running.stop().await, CursorExit::Stopped);
    let path = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    f.fault.remove_file(&path).unwrap();
    *f.committer.refused_slab.lock().unwrap() = None;
    f.metastore.detach_link("parent", "child").await.unwrap();
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("every slab copied", || {
        running.status.report().next_offset == Some(u64::from(3 * slab))
    })
    .await;
    let held: std::collections::BTreeSet<String> =
        all_child_values(&f.store, 2).into_iter().collect();
    let missing = expected(0..3 * slab)
        .into_iter()
        .filter(|v| !held.contains(v))
        .count();
    assert_eq!(missing, 0, "records skipped");
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

/// Syncs the directories above the parent's and the child's partition 0 (as an installed
/// data directory's are), so a simulated power loss keeps the files the tests look at.
fn make_directories_durable(f: &Fixture) {
    let parent_dir = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    let child_dir = parent_dir
        .ancestors()
        .nth(3)
        .unwrap()
        .join("child")
        .join(PartitionId::new("child", 0).dir_name());
    for dir in [parent_dir.parent().unwrap(), child_dir.as_path()] {
        for ancestor in dir.ancestors() {
            f.fault.sync_dir(ancestor).unwrap();
        }
    }
}

/// A cursor on four slabs of backlog into one child partition whose commits fail after the
/// first three slabs (committed as the first alone, then the second and third together):
/// returns once the third slab's position is written and the fourth stalls.
async fn three_slabs_delivered_then_a_stall(f: &Fixture) -> Running {
    make_directories_durable(f);
    let slab = narad_host::fanout::SLAB_MAX_RECORDS as u32;
    produce(&f.store, 0..4 * slab);
    f.committer.budget.store(3, Ordering::SeqCst);
    let running = start(f, link(vec![0], 0)).await;
    wait_for("the fourth slab to stall", || running.commit_retries() >= 1).await;
    wait_for("the third slab's position on file", || {
        file_position(f).map(|r| r.next_offset) == Some(u64::from(3 * slab))
    })
    .await;
    assert_eq!(all_child_values(&f.store, 1), expected(0..3 * slab));
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_full_speed_a_power_loss_leaves_the_offset_file_behind_the_child_never_ahead() {
    let f = fixture(1, 1, LogConfig::default()).await;
    let running = three_slabs_delivered_then_a_stall(&f).await;
    // The positions past the three slabs were written (a restart after kill -9 reads them),
    // but their syncs are coalesced: a power loss now keeps the position synced last, the
    // attach point, while the child's commits (each synced and verified) survive. A restart
    // from there copies the three slabs again: duplicates, no gap.
    f.fault.crash(CrashMode::DropAll);
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(0));
    // The store as it comes back from the power loss.
    let rebooted = Store::open(
        std::path::Path::new("/data"),
        StoreOptions {
            fs: Arc::new(f.fault.clone()),
            clock: Arc::clone(&f.clock) as Arc<dyn Clock>,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    rebooted
        .create_partition(&PartitionId::new("child", 0), LogConfig::default())
        .unwrap();
    assert_eq!(
        all_child_values(&rebooted, 1),
        expected(0..3 * narad_host::fanout::SLAB_MAX_RECORDS as u32)
    );
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cursor_syncs_the_position_it_wrote_so_a_power_loss_repeats_nothing() {
    let f = fixture(1, 1, LogConfig::default()).await;
    let running = three_slabs_delivered_then_a_stall(&f).await;
    assert_eq!(running.stop().await, CursorExit::Stopped);
    f.fault.crash(CrashMode::DropAll);
    assert_eq!(
        file_position(&f).map(|r| r.next_offset),
        Some(3 * narad_host::fanout::SLAB_MAX_RECORDS as u64),
        "a stop must leave the delivered position durable (a move hands this file over)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_that_reaches_the_parents_end_syncs_its_position_before_it_waits() {
    let f = fixture(1, 1, LogConfig::default()).await;
    make_directories_durable(&f);
    let end = 2 * narad_host::fanout::SLAB_MAX_RECORDS as u32 + 100;
    produce(&f.store, 0..end);
    let running = start(&f, link(vec![0], 0)).await;
    // The cursor reports its position only after the slab that reached the end is on file.
    wait_for("the copy to reach the parent's end", || {
        running.status.report().next_offset == Some(u64::from(end))
    })
    .await;
    f.fault.crash(CrashMode::DropAll);
    assert_eq!(
        file_position(&f).map(|r| r.next_offset),
        Some(u64::from(end)),
        "an idle cursor's position must be durable, not one sync interval behind"
    );
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cursor_copies_nothing_more_counts_its_lag_and_resumes_exactly_where_it_stopped() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..20);
    let meta = link(vec![0], 0);
    let running = start(&f, meta.clone()).await;
    wait_for("the first records copied", || {
        running.status.report().next_offset == Some(20)
    })
    .await;
    running.runtime.set_meta(LinkMeta {
        paused: vec![0],
        ..meta.clone()
    });
    wait_for("the cursor to pause", || {
        running.status.report().state == CursorState::Paused
    })
    .await;
    produce(&f.store, 20..50);
    wait_for("the lag to count what arrived while paused", || {
        running.status.report().lag_messages == Some(30)
    })
    .await;
    assert_eq!(all_child_values(&f.store, 1), expected(0..20));
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(20));

    running.runtime.set_meta(meta);
    wait_for("every record copied after the resume", || {
        file_position(&f).map(|r| r.next_offset) == Some(50)
    })
    .await;
    assert_eq!(running.status.report().state, CursorState::Running);
    // Exactly once: nothing skipped at the pause, nothing repeated at the resume.
    assert_eq!(all_child_values(&f.store, 1), expected(0..50));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cursor_seeks_back_to_replay_and_forward_to_skip_counting_only_the_skip() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..40);
    let meta = link(vec![0], 0);
    let running = start(&f, meta.clone()).await;
    wait_for("the records copied", || {
        running.status.report().next_offset == Some(40)
    })
    .await;
    // Not paused: refused, nothing moves.
    let refused = running.status.order_seek(10).await.unwrap();
    assert!(matches!(
        refused.unwrap_err(),
        SeekError::NotPaused { partition: 0 }
    ));
    running.runtime.set_meta(LinkMeta {
        paused: vec![0],
        ..meta.clone()
    });
    wait_for("the cursor to pause", || {
        running.status.report().state == CursorState::Paused
    })
    .await;
    // Outside the parent's records: refused.
    let outside = running.status.order_seek(41).await.unwrap();
    assert!(
        matches!(outside.unwrap_err(), SeekError::OutOfRange { to: 41, .. }),
        "past the end"
    );
    // Back to 30: the last ten are copied again, nothing counted as skipped.
    let back = running.status.order_seek(30).await.unwrap().unwrap();
    assert_eq!((back.from, back.to, back.skipped), (40, 30, 0));
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(30));
    // Forward past records written while paused: 50..60 skipped on purpose.
    produce(&f.store, 40..70);
    let forward = running.status.order_seek(60).await.unwrap().unwrap();
    assert_eq!((forward.from, forward.to, forward.skipped), (30, 60, 30));
    let report = running.status.report();
    assert_eq!((report.skipped_by_seek, report.dropped_messages), (30, 0));
    let ledger = gap_ledger(&f).expect("a ledger");
    assert_eq!(
        ledger
            .gaps
            .iter()
            .map(|g| (g.from, g.to, g.reason))
            .collect::<Vec<_>>(),
        vec![(30, 60, GapReason::Seek)],
        "only the forward seek is on record"
    );

    running.runtime.set_meta(meta);
    wait_for("the copy to go on from the sought position", || {
        file_position(&f).map(|r| r.next_offset) == Some(70)
    })
    .await;
    let mut want = expected(0..40);
    want.extend(expected(60..70));
    want.sort();
    let mut got = all_child_values(&f.store, 1);
    got.sort();
    assert_eq!(got, want);
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_error_short_write_or_full_disk_on_a_child_commit_loses_and_duplicates_nothing() {
    for (op, fault) in [
        (FaultOp::SyncData, Fault::Eio),
        (FaultOp::Write, Fault::ShortWrite),
        (FaultOp::Write, Fault::Enospc),
    ] {
        let f = fixture(1, 2, LogConfig::default()).await;
        // Hold the child back while the parent is written, so the injected fault can only hit
        // a child commit.
        for down in &f.committer.down {
            down.store(true, Ordering::SeqCst);
        }
        let running = start(&f, link(vec![0], 0)).await;
        wait_for("the cursor to anchor", || {
            running.status.report().next_offset == Some(0)
        })
        .await;
        produce(&f.store, 0..40);
        wait_for("the cursor to stall", || {
            running.status.report().state == CursorState::Stalled
        })
        .await;
        f.fault.inject(op, 1, fault);
        for down in &f.committer.down {
            down.store(false, Ordering::SeqCst);
        }
        wait_for("all records to be copied", || {
            running.status.report().next_offset == Some(40)
        })
        .await;
        let errors = f.committer.store_errors.lock().unwrap().clone();
        // A short write is finished by the log's write loop; the others fail the commit.
        if fault != Fault::ShortWrite {
            assert!(!errors.is_empty(), "{fault:?} never reached a child commit");
        }
        // The failed append was cut back and retried: every record exactly once.
        assert_eq!(
            all_child_values(&f.store, 2),
            expected(0..40),
            "{fault:?}: {errors:?}"
        );
        assert_eq!(running.stop().await, CursorExit::Stopped);
    }
}

/// Sends the records of each slab to child partitions in turn, starting at `next`: a stateful
/// router, which places a repeated slab elsewhere than the first time.
struct TurnRouter {
    next: u32,
}

impl SlabRouter for TurnRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        Ok(records
            .iter()
            .map(|_| {
                let p = self.next % input.child_partition_count;
                self.next += 1;
                p
            })
            .collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_restarted_cursor_repeats_are_not_stored_again_wherever_its_router_puts_them() {
    let f = fixture(1, 2, LogConfig::default()).await;
    produce(&f.store, 0..20);
    let meta = link(vec![0], 0);
    f.metastore.attach_link(meta.clone()).await.unwrap();
    let first = spawn_cursor_routing(&f, meta.clone(), Box::new(TurnRouter { next: 0 }));
    wait_for("the first copy", || {
        first.status.report().next_offset == Some(20)
    })
    .await;
    assert_eq!(first.stop().await, CursorExit::Stopped);
    // A crash left the offset file behind the child (as it may be by a commit or two).
    let path = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    let fs: Arc<dyn FileSystem> = Arc::new(f.fault.clone());
    CursorFile::anchor(
        fs,
        &path,
        CursorRecord {
            epoch: EPOCH.into(),
            next_offset: 8,
        },
    )
    .unwrap();
    produce(&f.store, 20..30);
    // The restarted router starts its turns elsewhere: offsets 8 to 19 go to the other
    // partition than before.
    let again = spawn_cursor_routing(&f, meta, Box::new(TurnRouter { next: 1 }));
    wait_for("the copy after the restart", || {
        again.status.report().next_offset == Some(30)
    })
    .await;
    assert_eq!(again.stop().await, CursorExit::Stopped);
    let mut values = all_child_values(&f.store, 2);
    let stored = values.len();
    values.sort();
    values.dedup();
    let mut wanted = expected(0..30);
    wanted.sort();
    assert_eq!(values, wanted, "every record");
    assert_eq!(
        stored, 30,
        "each once: the repeated 8 to 19 were not stored again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_file_of_another_epoch_is_not_resumed() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..30);
    let path = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    let fs: Arc<dyn FileSystem> = Arc::new(f.fault.clone());
    CursorFile::anchor(
        fs,
        &path,
        CursorRecord {
            epoch: "ffffffffffffffff".into(),
            next_offset: 25,
        },
    )
    .unwrap();
    // This attach recorded 10 as its attach point: it must start there, not at 25.
    let running = start(&f, link(vec![10], 0)).await;
    wait_for("the copy", || {
        running.status.report().next_offset == Some(30)
    })
    .await;
    assert_eq!(all_child_values(&f.store, 1), expected(10..30));
    assert_eq!(file_position(&f).map(|r| r.epoch), Some(EPOCH.to_string()));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_offset_file_resumes_from_the_childs_newest_slab_without_a_gap() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..20);
    copy_until(&f, link(vec![0], 0), 20, "the first copy").await;
    produce(&f.store, 20..35);
    // Damage the offset file.
    let path = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    let handle = f
        .fault
        .open(&path, narad_storage::fs::OpenMode::ReadWrite)
        .unwrap();
    handle.write_all_at(b"#", 30).unwrap();
    drop(handle);
    f.metastore.detach_link("parent", "child").await.unwrap();
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the second copy", || {
        running.status.report().next_offset == Some(35)
    })
    .await;
    let mut values = all_child_values(&f.store, 1);
    values.dedup();
    // Nothing missing; at most the newest slab (here: all 20 of the first) repeated, never
    // a replay from before it.
    assert_eq!(values, expected(0..35));
    assert!(child_values(&f.store, 0).len() <= 35 + 20);
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_behind_the_log_start_skips_counts_and_records_exactly_the_aged_out_records() {
    let (f, log_start) = behind_retention().await;
    assert!(
        log_start > 0 && log_start < 50,
        "retention must leave a partial log: {log_start}"
    );
    let meta = link(vec![0], 0);
    let running = start(&f, meta.clone()).await;
    wait_for("the copy", || {
        running.status.report().next_offset == Some(50)
    })
    .await;
    assert_eq!(running.status.report().dropped_messages, log_start);
    assert_eq!(
        all_child_values(&f.store, 1),
        expected(log_start as u32..50)
    );
    assert_eq!(running.stop().await, CursorExit::Stopped);

    // The skip is on the gap ledger, with its reason.
    let ledger = gap_ledger(&f).expect("a ledger");
    assert_eq!(ledger.epoch, meta.attach_epoch);
    assert_eq!(
        ledger
            .gaps
            .iter()
            .map(|g| (g.from, g.to, g.reason))
            .collect::<Vec<_>>(),
        vec![(0, log_start, GapReason::Retention)]
    );
    // A new process: the loss is still counted, from the ledger.
    let again = spawn_cursor(&f, meta);
    wait_for("the restarted cursor", || {
        again.status.report().next_offset == Some(50)
    })
    .await;
    assert_eq!(again.status.report().dropped_messages, log_start);
    assert_eq!(again.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_halts_on_a_gap_skips_nothing_until_the_exact_gap_is_accepted() {
    let (f, log_start) = behind_retention().await;
    assert!(
        log_start > 0 && log_start < 50,
        "a partial log: {log_start}"
    );
    let (running, meta) = halted(&f).await;
    let report = running.status.report();
    assert_eq!(
        report.halted_gap,
        Some(HaltedGap {
            from: 0,
            to: log_start
        })
    );
    assert!(
        report
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("--accept-gap")),
        "the reason says how to go on: {report:?}"
    );
    // An acceptance of another position (an older halt) does not cover this one.
    running.runtime.set_meta(LinkMeta {
        accepted_gaps: vec![AcceptedGap {
            partition: 0,
            from: 7,
        }],
        ..meta.clone()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(running.status.report().state, CursorState::Halted);
    assert_eq!(running.status.report().dropped_messages, 0);
    assert!(all_child_values(&f.store, 1).is_empty());
    assert!(
        gap_ledger(&f).is_none_or(|l| l.gaps.is_empty()),
        "nothing on the ledger"
    );
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(0));

    running.runtime.set_meta(LinkMeta {
        accepted_gaps: vec![AcceptedGap {
            partition: 0,
            from: 0,
        }],
        ..meta.clone()
    });
    wait_for("the copy after the acceptance", || {
        running.status.report().next_offset == Some(50)
    })
    .await;
    assert_eq!(running.status.report().state, CursorState::Running);
    assert_eq!(running.status.report().halted_gap, None);
    assert_eq!(running.status.report().dropped_messages, log_start);
    assert_eq!(
        all_child_values(&f.store, 1),
        expected(log_start as u32..50)
    );
    assert_eq!(running.stop().await, CursorExit::Stopped);
    let ledger = gap_ledger(&f).expect("a ledger");
    assert_eq!(
        ledger
            .gaps
            .iter()
            .map(|g| (g.from, g.to, g.reason))
            .collect::<Vec<_>>(),
        vec![(0, log_start, GapReason::Retention)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_cursor_goes_on_when_its_link_is_set_to_skip() {
    let (f, _) = behind_retention().await;
    let (running, meta) = halted(&f).await;
    running.runtime.set_meta(LinkMeta {
        on_gap: OnGap::Skip,
        ..meta
    });
    wait_for("the copy after the policy change", || {
        running.status.report().next_offset == Some(50)
    })
    .await;
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

/// A cursor of a link that halts on a gap, started on `f` and halted; with its link.
async fn halted(f: &Fixture) -> (Running, LinkMeta) {
    let meta = LinkMeta {
        on_gap: OnGap::Halt,
        ..link(vec![0], 0)
    };
    let running = start(f, meta.clone()).await;
    wait_for("the cursor to halt", || {
        running.status.report().state == CursorState::Halted
    })
    .await;
    (running, meta)
}

/// Parent records 0 to 49 in 256-byte segments, of which retention (one byte) kept only the
/// newest segment; with the parent's log start.
async fn behind_retention() -> (Fixture, u64) {
    let config = LogConfig {
        segment_bytes: 256,
        retention_ms: None,
        retention_bytes: Some(1),
    };
    let f = fixture(1, 1, config).await;
    produce(&f.store, 0..50);
    f.store.enforce_retention().unwrap();
    let log_start = f
        .store
        .peek(&PartitionId::new("parent", 0))
        .unwrap()
        .log_start_offset;
    (f, log_start)
}

/// The gap ledger beside the offset file.
fn gap_ledger(f: &Fixture) -> Option<GapLedger> {
    let offsets = cursor_path(&f.store, &PartitionId::new("parent", 0), "child");
    let path = offsets.with_file_name(gaps::gaps_file_name("child"));
    match gaps::load(&f.fault, &path).unwrap() {
        GapsLoad::Found(ledger) => Some(ledger),
        GapsLoad::Missing => None,
        GapsLoad::Damaged(reason) => panic!("damaged ledger: {reason}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_child_is_never_early_on_the_owners_clock() {
    const DELAY_MS: u64 = 1_000;
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..5); // committed at T0
    f.clock.set(T0_MS + 400);
    let running = start(&f, link(vec![0], DELAY_MS)).await;
    wait_for("the cursor to wait", || {
        running.status.report().state == CursorState::Waiting
    })
    .await;
    // However often it wakes (every 5 ms here) to look at the gate again, the owner's clock
    // says "not yet".
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        child_values(&f.store, 0).is_empty(),
        "copied before it was due"
    );
    // A clock stepping back holds records back longer, never less.
    f.clock.set(T0_MS + 100);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(child_values(&f.store, 0).is_empty());
    f.clock.set(T0_MS + DELAY_MS as i64);
    wait_for("the copy once due", || {
        running.status.report().next_offset == Some(5)
    })
    .await;
    assert_eq!(all_child_values(&f.store, 1), expected(0..5));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_grown_mid_stream_is_routed_under_its_new_partition_count() {
    let f = fixture(1, 2, LogConfig::default()).await;
    let running = start(&f, link(vec![0], 0)).await;
    produce(&f.store, 0..30);
    wait_for("the first records", || {
        running.status.report().next_offset == Some(30)
    })
    .await;
    for p in 2..4 {
        f.store
            .create_partition(&PartitionId::new("child", p), LogConfig::default())
            .unwrap();
    }
    f.metastore.grow_partitions("child", 4).await.unwrap();
    produce(&f.store, 30..90);
    wait_for("the records after the growth", || {
        running.status.report().next_offset == Some(90)
    })
    .await;
    assert_eq!(all_child_values(&f.store, 4), expected(0..90));
    // Records produced after the growth land where Kafka's partitioner puts them among 4.
    for partition in 0..4u32 {
        let id = PartitionId::new("child", partition);
        let read = f
            .store
            .read(
                &id,
                &ReadOptions {
                    offset: 0,
                    max_records: 1_000,
                    max_bytes: usize::MAX,
                    max_committed_at_ms: None,
                },
            )
            .unwrap();
        for record in read.records {
            let n: u32 = String::from_utf8(record.value.clone().unwrap_or_default().to_vec())
                .unwrap()[1..]
                .parse()
                .unwrap();
            let count = if n < 30 { 2 } else { 4 };
            let want = narad_abi::partition_for_key(record.key.as_deref().unwrap(), count);
            assert_eq!(want, Some(partition), "v{n}");
        }
    }
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_ahead_of_a_wiped_child_is_rewound_and_redelivers() {
    let f = fixture(1, 2, LogConfig::default()).await;
    produce(&f.store, 0..40);
    copy_until(&f, link(vec![5], 0), 40, "the first copy").await;
    // The child loses everything it had acknowledged (say, restored from an empty backup).
    f.store.delete_topic("child").unwrap();
    for p in 0..2 {
        f.store
            .create_partition(&PartitionId::new("child", p), LogConfig::default())
            .unwrap();
    }
    f.metastore.detach_link("parent", "child").await.unwrap();
    let running = start(&f, link(vec![5], 0)).await;
    wait_for("the copy again", || {
        running.status.report().next_offset == Some(40)
    })
    .await;
    assert_eq!(all_child_values(&f.store, 2), expected(5..40));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

/// Closes partition 0 of the parent as idle (the clock moved past the idle limit).
async fn close_the_parents_log(f: &Fixture) {
    let parent = PartitionId::new("parent", 0);
    wait_for("the parent log to close", || {
        f.clock.advance(10 * 60 * 1000);
        f.store.close_idle();
        f.store.peek(&parent).unwrap().state == narad_storage::PartitionState::Closed
    })
    .await;
}

/// Closes the parent log for idleness, then loses its last record the way a crash can: the
/// high-watermark file deleted and the last frame torn. The next open cuts it.
async fn tear_the_parents_last_record(f: &Fixture) {
    close_the_parents_log(f).await;
    let dir = std::path::Path::new("/data/topics/parent/p00000");
    f.fault.remove_file(&dir.join("high-watermark")).unwrap();
    let mut segments: Vec<_> = f
        .fault
        .read_dir(dir)
        .unwrap()
        .into_iter()
        .filter(|e| e.name.ends_with(".log"))
        .map(|e| dir.join(e.name))
        .collect();
    segments.sort();
    let last = segments.pop().unwrap();
    let file = f
        .fault
        .open(&last, narad_storage::fs::OpenMode::ReadWrite)
        .unwrap();
    file.set_len(file.len().unwrap() - 3).unwrap();
    file.sync_data().unwrap();
}

/// Appends `new-0`, `new-1`, ... to the parent, asserting they get the offsets from `first` on.
fn produce_new(store: &Store, first: u64, count: u64) {
    for i in 0..count {
        let record = NewRecord {
            key: Some(Bytes::from_static(b"k")),
            headers: Vec::new(),
            value: Some(Bytes::from(format!("new-{i}"))),
        };
        let appended = store
            .append(
                &PartitionId::new("parent", 0),
                AppendBatch {
                    records: vec![record],
                    origin: None,
                },
            )
            .unwrap();
        assert_eq!(appended.base_offset, first + i, "the lost offset is reused");
    }
}

fn assert_child_has_new(store: &Store, count: u64) {
    let copied = child_values(store, 0);
    for i in 0..count {
        assert!(
            copied.contains(&format!("new-{i}")),
            "new-{i} never reached the child: {copied:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_cursor_past_a_reopened_parents_end_rewinds_and_copies_the_reused_offsets() {
    let f = fixture(1, 1, LogConfig::default()).await;
    let running = caught_up_on_30_records(&f).await;
    // Hold the cursor in a delivery (the child is down) so it does not touch the parent log.
    f.committer.down[0].store(true, Ordering::SeqCst);
    produce(&f.store, 30..31);
    wait_for("the cursor to stall", || {
        running.status.report().state == CursorState::Stalled
    })
    .await;
    tear_the_parents_last_record(&f).await;

    // The slab in hand (offset 30) is delivered; the next read at 31 reopens the parent, which
    // now ends at 30.
    f.committer.down[0].store(false, Ordering::SeqCst);
    wait_for("the rewind to the parent's end", || {
        let report = running.status.report();
        report.parent_end_rewinds == 1 && report.next_offset == Some(30)
    })
    .await;
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(30));
    produce_new(&f.store, 30, 3);
    wait_for("the new records to be copied", || {
        running.status.report().next_offset == Some(33)
    })
    .await;
    assert_child_has_new(&f.store, 3);
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cursor_leaves_its_parents_closed_log_closed_and_copies_what_comes_next() {
    let f = fixture(1, 1, LogConfig::default()).await;
    let running = caught_up_on_30_records(&f).await;
    close_the_parents_log(&f).await;
    let parent = PartitionId::new("parent", 0);
    // Ten of the cursor's long polls: a caught-up cursor that read its parent to learn that it
    // is idle would open the log at the first (thousands of such cursors on a node keep
    // evicting each other's logs from the open-log limit, a write and a sync per close).
    tokio::time::sleep(TIMING.slab_long_poll * 10).await;
    assert_eq!(
        f.store.peek(&parent).unwrap().state,
        narad_storage::PartitionState::Closed,
        "the idle cursor opened its parent's closed log"
    );
    assert_eq!(running.status.report().state, CursorState::Running);
    // New records (the append opens the log) wake it and are copied.
    produce_new(&f.store, 30, 3);
    wait_for("the new records to be copied", || {
        running.status.report().next_offset == Some(33)
    })
    .await;
    assert_child_has_new(&f.store, 3);
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_started_after_lost_offsets_were_written_again_rewinds_to_the_first_reused_one() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..30);
    copy_until(&f, link(vec![0], 0), 30, "the first copy").await;
    f.metastore.detach_link("parent", "child").await.unwrap();

    // The parent loses record 29 and gets three new records (29, 30, 31) before the cursor
    // starts again: its position, 30, is not past the parent's end any more.
    tear_the_parents_last_record(&f).await;
    produce_new(&f.store, 29, 3);
    let running = start(&f, link(vec![0], 0)).await;
    wait_for("the new records to be copied", || {
        running.status.report().next_offset == Some(32)
    })
    .await;
    assert_child_has_new(&f.store, 3);
    assert_eq!(running.status.report().parent_end_rewinds, 1);
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_whose_link_was_detached_exits_saying_the_link_is_gone() {
    let f = fixture(1, 1, LogConfig::default()).await;
    let running = caught_up_on_30_records(&f).await;
    f.metastore.detach_link("parent", "child").await.unwrap();
    // The next slab's epoch check finds the link gone.
    produce(&f.store, 30..40);
    let exit = running.exit().await;
    let CursorExit::LinkGone(gone) = exit else {
        panic!("expected the link to be gone, got {exit:?}");
    };
    assert_eq!(
        gone,
        LinkGone::DetachedOrReattached {
            parent: "parent".into(),
            child: "child".into(),
        }
    );
    assert_eq!(
        gone.to_string(),
        "parent -> child was detached or re-attached"
    );
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_whose_epoch_the_metastore_does_not_confirm_is_deferred_without_writing_a_position()
 {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..10);
    // Never attached: the metastore has no link with this epoch.
    let running = spawn_cursor(&f, link(vec![0], 0));
    let exit = running.exit().await;
    let CursorExit::Deferred(deferred) = exit else {
        panic!("expected the start to be deferred, got {exit:?}");
    };
    assert_eq!(
        deferred,
        Deferred::EpochNotConfirmed {
            epoch: EPOCH.into(),
            parent: "parent".into(),
            child: "child".into(),
        }
    );
    assert_eq!(
        deferred.to_string(),
        format!("epoch {EPOCH} of parent -> child not confirmed by the metastore")
    );
    assert_eq!(file_position(&f), None);
    assert!(child_values(&f.store, 0).is_empty());
}

/// A router that panics on every slab.
struct PanickingRouter;

impl SlabRouter for PanickingRouter {
    fn route(
        &mut self,
        _input: &RouteInput,
        _records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        panic!("the router broke");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_panics_stalls_the_cursor_without_skipping_the_slab() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..10);
    f.metastore.attach_link(link(vec![0], 0)).await.unwrap();
    let running = spawn_cursor_routing(&f, link(vec![0], 0), Box::new(PanickingRouter));
    // The panic on the first routing, then the lock it poisoned on the next ones.
    wait_for("two failed routings", || {
        running
            .metrics
            .route_failures
            .get_or_create(running.status.labels())
            .get()
            >= 2
    })
    .await;
    let report = running.status.report();
    assert_eq!(report.state, CursorState::Stalled);
    assert!(
        report
            .last_error
            .unwrap_or_default()
            .contains("routing failed"),
    );
    // The slab is neither copied nor passed: the position stays before it.
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(0));
    assert_eq!(report.next_offset, Some(0));
    assert!(child_values(&f.store, 0).is_empty());
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

/// Fails every slab that holds the record `v5` (answers no decisions): a poison record.
struct PoisonRouter;

impl SlabRouter for PoisonRouter {
    fn route(
        &mut self,
        _input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        let poisoned = records
            .iter()
            .any(|r| r.value.as_deref() == Some(b"v5".as_slice()));
        Ok(if poisoned {
            Vec::new()
        } else {
            vec![0; records.len()]
        })
    }
}

/// Tried as a new operator would: a cursor stalled on a poison record answered "paused" to a
/// pause and stayed stalled, and a seek then said "not paused", so nothing got past the record
/// but swapping the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_stalled_on_a_poison_record_pauses_and_is_sought_past_it() {
    let f = fixture(1, 1, LogConfig::default()).await;
    produce(&f.store, 0..10);
    let meta = link(vec![0], 0);
    f.metastore.attach_link(meta.clone()).await.unwrap();
    let running = spawn_cursor_routing(&f, meta.clone(), Box::new(PoisonRouter));
    wait_for("the cursor to stall on the poison record", || {
        running.status.report().state == CursorState::Stalled
    })
    .await;

    running.runtime.set_meta(LinkMeta {
        paused: vec![0],
        ..meta.clone()
    });
    wait_for("the stalled cursor to pause", || {
        running.status.report().state == CursorState::Paused
    })
    .await;
    // Nothing of the stalled slab is on file: the position is still before it.
    assert_eq!(file_position(&f).map(|r| r.next_offset), Some(0));
    let sought = running.status.order_seek(6).await.unwrap().unwrap();
    assert_eq!((sought.from, sought.to, sought.skipped), (0, 6, 6));

    running.runtime.set_meta(meta);
    wait_for("the records after the poison one copied", || {
        file_position(&f).map(|r| r.next_offset) == Some(10)
    })
    .await;
    assert_eq!(child_values(&f.store, 0), expected(6..10));
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

/// The file metastore, counting the cursor's reads: whole snapshots and one-link views.
struct CountingMetastore {
    inner: Arc<FileMetastore>,
    snapshots: AtomicU64,
    link_views: AtomicU64,
}

impl Metastore for CountingMetastore {
    fn snapshot(&self) -> BoxFuture<'_, narad_host::metastore::Result<Snapshot>> {
        self.snapshots.fetch_add(1, Ordering::SeqCst);
        self.inner.snapshot()
    }

    fn confirm(&self) -> BoxFuture<'_, narad_host::metastore::Result<Snapshot>> {
        self.inner.confirm()
    }

    fn versions(&self) -> BoxFuture<'_, narad_host::metastore::Result<Versions>> {
        self.inner.versions()
    }

    fn topic<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, narad_host::metastore::Result<Option<TopicMeta>>> {
        self.inner.topic(name)
    }

    fn link_view<'a>(
        &'a self,
        parent: &'a str,
        child: &'a str,
    ) -> BoxFuture<'a, narad_host::metastore::Result<Option<LinkTopics>>> {
        self.link_views.fetch_add(1, Ordering::SeqCst);
        self.inner.link_view(parent, child)
    }

    fn apply(&self, change: Change) -> BoxFuture<'_, narad_host::metastore::Result<Outcome>> {
        self.inner.apply(change)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copying_cursor_reads_only_its_link_per_slab_never_a_whole_metadata_snapshot() {
    let f = fixture(1, 2, LogConfig::default()).await;
    f.metastore.attach_link(link(vec![0], 0)).await.unwrap();
    let counting = Arc::new(CountingMetastore {
        inner: Arc::clone(&f.metastore),
        snapshots: AtomicU64::new(0),
        link_views: AtomicU64::new(0),
    });
    let metastore = Arc::clone(&counting) as Arc<dyn Metastore>;
    let running = spawn_cursor_on(&f, link(vec![0], 0), Box::new(KeyRouter), metastore);
    // Two waves, so at least two slabs are routed.
    produce(&f.store, 0..30);
    wait_for("the first wave", || {
        running.status.report().next_offset == Some(30)
    })
    .await;
    produce(&f.store, 30..60);
    wait_for("the second wave", || {
        running.status.report().next_offset == Some(60)
    })
    .await;
    assert_eq!(running.stop().await, CursorExit::Stopped);
    assert_eq!(all_child_values(&f.store, 2), expected(0..60));
    // Each routing attempt read the link and its topics, and nothing else.
    let snapshots = counting.snapshots.load(Ordering::SeqCst);
    assert_eq!(snapshots, 0, "whole snapshots read while copying");
    assert!(counting.link_views.load(Ordering::SeqCst) >= 2);
}

/// [`KeyRouter`], noting the first parent offset of every slab it routes.
struct NotingRouter {
    starts: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl SlabRouter for NotingRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        if let Some(first) = records.first() {
            self.starts.lock().unwrap().push(first.offset);
        }
        KeyRouter.route(input, records)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slabs_routed_ahead_of_a_child_growth_are_routed_again_under_the_new_count() {
    const SLAB: u64 = narad_host::fanout::SLAB_MAX_RECORDS as u64;
    let total = 2 * SLAB as u32 + 1_000;
    let f = fixture(1, 2, LogConfig::default()).await;
    produce(&f.store, 0..total);
    // The first slab's bucket for partition 1 cannot commit, so the cursor stalls on it while
    // it reads and routes the two slabs after it under 2 partitions.
    f.committer.down[1].store(true, Ordering::SeqCst);
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let link_meta = link(vec![0], 0);
    f.metastore.attach_link(link_meta.clone()).await.unwrap();
    let router = NotingRouter {
        starts: Arc::clone(&starts),
    };
    let running = spawn_cursor_routing(&f, link_meta, Box::new(router));
    wait_for("the slabs after the stalled one to be routed ahead", || {
        let starts = starts.lock().unwrap();
        starts.contains(&SLAB) && starts.contains(&(2 * SLAB))
    })
    .await;
    assert_eq!(running.status.report().state, CursorState::Stalled);
    for p in 2..4 {
        f.store
            .create_partition(&PartitionId::new("child", p), LogConfig::default())
            .unwrap();
    }
    f.metastore.grow_partitions("child", 4).await.unwrap();
    f.committer.down[1].store(false, Ordering::SeqCst);
    wait_for("the whole parent to be copied", || {
        running.status.report().next_offset == Some(u64::from(total))
    })
    .await;
    assert_eq!(all_child_values(&f.store, 4), expected(0..total));
    // The slabs routed ahead under 2 partitions were committed under 4, as routed again.
    for partition in 0..4u32 {
        for record in child_records(&f.store, partition) {
            let n: u64 = String::from_utf8(record.value.clone().unwrap_or_default().to_vec())
                .unwrap()[1..]
                .parse()
                .unwrap();
            if n >= SLAB {
                let want = narad_abi::partition_for_key(record.key.as_deref().unwrap(), 4);
                assert_eq!(want, Some(partition), "v{n}");
            }
        }
    }
    assert_eq!(running.stop().await, CursorExit::Stopped);
}

fn child_records(store: &Store, partition: u32) -> Vec<StoredRecord> {
    store
        .read(
            &PartitionId::new("child", partition),
            &ReadOptions {
                offset: 0,
                max_records: 100_000,
                max_bytes: usize::MAX,
                max_committed_at_ms: None,
            },
        )
        .unwrap()
        .records
}
