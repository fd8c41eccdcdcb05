use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use narad_storage::{
    BatchOrigin, LogConfig, ReadOptions, RecordOrigin, Store, StoreOptions, StoredRecord,
};

use narad_storage::EncodedBatch;

use super::*;
use crate::cluster::commit_rpc::{
    COMMIT_FRAMES_PATH, COMMIT_IN_ORDER_PATH, COMMIT_PATH, commit_frames_route,
    commit_in_order_route, commit_route,
};
use crate::cluster::receiver::CommitReceiver;
use crate::fanout::FanoutTiming;
use crate::fanout::bucket::{SlabOrigin, bucket};
use crate::fanout::commit::{CommitFailure, commit};
use crate::metastore::PartitionOwner;

/// Bound on every wait of these tests (a commit on loopback takes milliseconds).
const WAIT: Duration = Duration::from_secs(30);

const EPOCH: [u8; 8] = [4; 8];

/// Who owns each child partition, as one node sees it.
type Owners = Arc<Mutex<HashMap<u32, PartitionOwner>>>;

fn owners_of(owners: &Owners) -> Arc<OwnerLookup> {
    let owners = Arc::clone(owners);
    Arc::new(move |id: &PartitionId| {
        owners
            .lock()
            .unwrap()
            .get(&id.partition)
            .filter(|_| id.topic == "child")
            .cloned()
    })
}

fn open(dir: &std::path::Path, partitions: u32) -> Arc<Store> {
    let store = Store::open(dir, StoreOptions::default()).unwrap();
    for p in 0..partitions {
        store
            .create_partition(&PartitionId::new("child", p), LogConfig::default())
            .unwrap();
    }
    Arc::new(store)
}

/// One node, n1, owning child partition 0 and applying its own commits through its
/// receiver (as in cluster mode): its directory, store, metrics and committer.
fn lone_node() -> (
    tempfile::TempDir,
    Arc<Store>,
    Arc<FanoutMetrics>,
    Arc<ClusterCommitter>,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1);
    let owners: Owners = Arc::new(Mutex::new(HashMap::from([(
        0,
        PartitionOwner::first("n1"),
    )])));
    let receiver = Arc::new(CommitReceiver::new(
        "n1".to_owned(),
        Arc::clone(&store),
        owners_of(&owners),
    ));
    let metrics = Arc::new(FanoutMetrics::default());
    let committer = Arc::new(
        ClusterCommitter::new(
            "n1".to_owned(),
            Arc::new(Producer::new(Arc::clone(&store))),
            owners_of(&owners),
            Arc::new(|_: &str| None),
            CommitClient::new().unwrap(),
            Arc::clone(&metrics),
        )
        .with_local_receiver(receiver),
    );
    (dir, store, metrics, committer)
}

/// Two nodes on loopback: n1 sends (its committer), n2 receives (a real HTTP server
/// running `commit_route` with a real receiver over its own store). Child partition 0 is
/// n1's, 1 is n2's (generation 1 in both views), 2 has no owner.
struct Pair {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    n1_store: Arc<Store>,
    n2_store: Arc<Store>,
    /// n2's view of the owners (what its receiver fences with).
    n2_owners: Owners,
    /// Whether n2 is alive in n1's directory of peers.
    n2_alive: Arc<AtomicBool>,
    /// Commit calls n2's server received.
    n2_calls: Arc<AtomicUsize>,
    /// The path of every call n2 got, in order.
    n2_paths: Arc<Mutex<Vec<String>>>,
    /// Whether n1 is fenced (lost etcd).
    n1_fenced: Arc<AtomicBool>,
    metrics: Arc<FanoutMetrics>,
    committer: Arc<ClusterCommitter>,
    _server: tokio::task::JoinHandle<()>,
}

async fn pair() -> Pair {
    pair_serving(Serves::Frames).await
}

/// Which commit calls n2 serves: an older binary serves fewer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// Every call: frames, in order, one commit.
    Frames,
    /// The in-order call and the one-commit call (the build before the frames call).
    InOrder,
    /// Only the one-commit call.
    OneEach,
}

/// [`pair`], with n2 serving the calls `serves` says.
async fn pair_serving(serves: Serves) -> Pair {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (n1_store, n2_store) = (open(dirs.0.path(), 3), open(dirs.1.path(), 3));
    let view = HashMap::from([
        (0, PartitionOwner::first("n1")),
        (1, PartitionOwner::first("n2")),
    ]);
    let n1_owners: Owners = Arc::new(Mutex::new(view.clone()));
    let n2_owners: Owners = Arc::new(Mutex::new(view));

    let receiver = Arc::new(CommitReceiver::new(
        "n2".to_owned(),
        Arc::clone(&n2_store),
        owners_of(&n2_owners),
    ));
    let n2_calls = Arc::new(AtomicUsize::new(0));
    let n2_paths = Arc::new(Mutex::new(Vec::new()));
    let (counted, paths) = (Arc::clone(&n2_calls), Arc::clone(&n2_paths));
    let mut app = axum::Router::new().route(COMMIT_PATH, axum::routing::post(commit_route));
    if serves != Serves::OneEach {
        app = app.route(
            COMMIT_IN_ORDER_PATH,
            axum::routing::post(commit_in_order_route),
        );
    }
    if serves == Serves::Frames {
        app = app.route(COMMIT_FRAMES_PATH, axum::routing::post(commit_frames_route));
    }
    let app = app.with_state(receiver).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            counted.fetch_add(1, Ordering::SeqCst);
            paths.lock().unwrap().push(request.uri().path().to_owned());
            next.run(request)
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let n2_url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let n2_alive = Arc::new(AtomicBool::new(true));
    let alive = Arc::clone(&n2_alive);
    let addresses: Arc<AddressLookup> = Arc::new(move |node: &str| {
        (node == "n2" && alive.load(Ordering::SeqCst)).then(|| n2_url.clone())
    });
    let metrics = Arc::new(FanoutMetrics::default());
    let n1_fenced = Arc::new(AtomicBool::new(false));
    let fenced = Arc::clone(&n1_fenced);
    let committer = Arc::new(
        ClusterCommitter::new(
            "n1".to_owned(),
            Arc::new(Producer::new(Arc::clone(&n1_store))),
            owners_of(&n1_owners),
            addresses,
            CommitClient::new().unwrap(),
            Arc::clone(&metrics),
        )
        .with_fence(Arc::new(move || {
            fenced
                .load(Ordering::SeqCst)
                .then(|| "this node lost etcd".to_owned())
        })),
    );
    Pair {
        _dirs: dirs,
        n1_store,
        n2_store,
        n2_owners,
        n2_alive,
        n2_calls,
        n2_paths,
        n1_fenced,
        metrics,
        committer,
        _server: server,
    }
}

/// A bucket of parent partition 7 holding the records at `parent_offsets`.
fn frame(parent_offsets: &[u64]) -> EncodedBatch {
    let records: Vec<StoredRecord> = parent_offsets
        .iter()
        .map(|&o| StoredRecord {
            offset: o,
            committed_at_ms: 0,
            key: Some(Bytes::from(format!("k{o}"))),
            headers: Vec::new(),
            value: Some(Bytes::from(format!("v{o}"))),
            origin: None,
        })
        .collect();
    let origin = BatchOrigin {
        epoch: EPOCH,
        parent_partition: 7,
        slab_start: parent_offsets[0],
        parent_offsets: parent_offsets.to_vec(),
    };
    EncodedBatch::encode(&records, Some(&origin)).unwrap()
}

/// Commits `batch` to child partition `partition`, as a cursor's commit lane does.
async fn commit_one(
    committer: &Arc<ClusterCommitter>,
    partition: u32,
    batch: EncodedBatch,
) -> Result<(), ChildCommitError> {
    let work = Arc::clone(committer).commit_in_order(
        PartitionId::new("child", partition),
        vec![ChildBatch::from_frame(batch)],
    );
    let answer = tokio::time::timeout(WAIT, work).await.unwrap();
    answer.result.map_err(|failure| failure.error)
}

/// Values and origins stored in child partition `partition` of `store`.
fn stored(store: &Store, partition: u32) -> Vec<(String, Option<RecordOrigin>)> {
    let read = store
        .read(
            &PartitionId::new("child", partition),
            &ReadOptions {
                offset: 0,
                max_records: 1_000,
                max_bytes: 1 << 20,
                max_committed_at_ms: None,
            },
        )
        .unwrap();
    read.records
        .into_iter()
        .map(|r| {
            (
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned(),
                r.origin,
            )
        })
        .collect()
}

fn origin(parent_offset: u64, slab_start: u64) -> Option<RecordOrigin> {
    Some(RecordOrigin {
        epoch: EPOCH,
        parent_partition: 7,
        parent_offset,
        slab_start,
    })
}

fn deduplicated(metrics: &FanoutMetrics) -> u64 {
    metrics
        .commit_deduplicated
        .get_or_create(&ChildLabels {
            child: "child".to_owned(),
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_for_a_partition_of_another_node_lands_there_with_its_provenance() {
    let p = pair().await;
    commit_one(&p.committer, 1, frame(&[10, 12, 13]))
        .await
        .unwrap();
    assert_eq!(
        stored(&p.n2_store, 1),
        [
            ("v10".to_owned(), origin(10, 10)),
            ("v12".to_owned(), origin(12, 10)),
            ("v13".to_owned(), origin(13, 10)),
        ]
    );
    assert!(stored(&p.n1_store, 1).is_empty());
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 1);
    assert_eq!(deduplicated(&p.metrics), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_bucket_is_absorbed_by_the_owner_and_counted_and_nothing_is_lost() {
    let p = pair().await;
    commit_one(&p.committer, 1, frame(&[10, 11])).await.unwrap();
    // The first answer was lost: the cursor sends the same bucket again.
    commit_one(&p.committer, 1, frame(&[10, 11])).await.unwrap();
    assert_eq!(stored(&p.n2_store, 1).len(), 2, "all held: nothing stored");
    assert_eq!(deduplicated(&p.metrics), 2);
    // A retry overlapping the last one: only the record not held is stored.
    commit_one(&p.committer, 1, frame(&[11, 12])).await.unwrap();
    assert_eq!(deduplicated(&p.metrics), 3);
    assert_eq!(
        stored(&p.n2_store, 1),
        [
            ("v10".to_owned(), origin(10, 10)),
            ("v11".to_owned(), origin(11, 10)),
            ("v12".to_owned(), origin(12, 11)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_is_not_alive_is_reported_without_any_call_and_stores_nothing() {
    let p = pair().await;
    p.n2_alive.store(false, Ordering::SeqCst);
    let error = commit_one(&p.committer, 1, frame(&[1])).await.unwrap_err();
    assert!(
        matches!(&error, ChildCommitError::OwnerDown { partition, node }
            if *partition == PartitionId::new("child", 1) && node == "n2"),
        "{error:?}"
    );
    assert_eq!(error.owner_node(), Some("n2"));
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 0);
    assert!(stored(&p.n2_store, 1).is_empty());

    // No owner at all: the same, without looking for an address.
    let error = commit_one(&p.committer, 2, frame(&[1])).await.unwrap_err();
    assert!(
        matches!(&error, ChildCommitError::OwnerUnknown { partition }
            if *partition == PartitionId::new("child", 2)),
        "{error:?}"
    );
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 0);

    // Back alive: the bucket the cursor held goes through.
    p.n2_alive.store(true, Ordering::SeqCst);
    commit_one(&p.committer, 1, frame(&[1])).await.unwrap();
    assert_eq!(stored(&p.n2_store, 1), [("v1".to_owned(), origin(1, 1))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_at_another_generation_answers_not_owner_and_stores_nothing() {
    let p = pair().await;
    // n2 took the partition again (a move back): generation 2, which n1 has not seen yet.
    p.n2_owners.lock().unwrap().insert(
        1,
        PartitionOwner {
            node: "n2".to_owned(),
            generation: 2,
            moving_to: None,
        },
    );
    let error = commit_one(&p.committer, 1, frame(&[5])).await.unwrap_err();
    assert!(
        matches!(
            &error,
            ChildCommitError::NotOwner { partition, node, generation: 1, owner, owner_generation: Some(2) }
                if *partition == PartitionId::new("child", 1) && node == "n2" && owner.as_deref() == Some("n2")
        ),
        "{error:?}"
    );
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 1);
    assert!(stored(&p.n2_store, 1).is_empty());
    assert_eq!(deduplicated(&p.metrics), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_for_a_partition_of_this_node_is_appended_here_without_a_call() {
    let p = pair().await;
    commit_one(&p.committer, 0, frame(&[3, 4])).await.unwrap();
    assert_eq!(
        stored(&p.n1_store, 0),
        [
            ("v3".to_owned(), origin(3, 3)),
            ("v4".to_owned(), origin(4, 3))
        ]
    );
    assert!(stored(&p.n2_store, 0).is_empty());
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_own_receiver_a_repeated_local_bucket_is_absorbed_and_counted() {
    let (_dir, store, metrics, committer) = lone_node();
    commit_one(&committer, 0, frame(&[3, 4])).await.unwrap();
    // The slab again, as after a crash before the cursor advanced: nothing is stored twice.
    commit_one(&committer, 0, frame(&[3, 4])).await.unwrap();
    assert_eq!(stored(&store, 0).len(), 2, "nothing stored twice");
    commit_one(&committer, 0, frame(&[4, 5])).await.unwrap();
    assert_eq!(
        stored(&store, 0),
        [
            ("v3".to_owned(), origin(3, 3)),
            ("v4".to_owned(), origin(4, 3)),
            ("v5".to_owned(), origin(5, 4))
        ]
    );
    assert_eq!(deduplicated(&metrics), 3);
}

/// Commits `offsets` (one batch each) to child partition `partition` in order through
/// `committer`.
async fn in_order(
    committer: &Arc<ClusterCommitter>,
    partition: u32,
    offsets: Vec<Vec<u64>>,
) -> Result<(), InOrderFailure> {
    let batches = offsets
        .iter()
        .map(|o| ChildBatch::from_frame(frame(o)))
        .collect();
    let work = Arc::clone(committer).commit_in_order(PartitionId::new("child", partition), batches);
    tokio::time::timeout(WAIT, work).await.unwrap().result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_order_for_another_node_take_one_call_and_one_append_there() {
    let p = pair().await;
    let (calls, syncs) = (
        p.n2_calls.load(Ordering::SeqCst),
        p.n2_store.append_stats().syncs,
    );
    in_order(&p.committer, 1, vec![vec![10, 11], vec![12]])
        .await
        .unwrap();
    assert_eq!(p.n2_calls.load(Ordering::SeqCst) - calls, 1, "one call");
    assert_eq!(
        p.n2_paths.lock().unwrap().last().unwrap(),
        COMMIT_FRAMES_PATH
    );
    assert_eq!(p.n2_store.append_stats().syncs - syncs, 1, "one fdatasync");
    let want = [
        ("v10".to_owned(), origin(10, 10)),
        ("v11".to_owned(), origin(11, 10)),
        ("v12".to_owned(), origin(12, 12)),
    ];
    assert_eq!(stored(&p.n2_store, 1), want);
    // Again, as after a crash before the cursor advanced: absorbed by n2.
    in_order(&p.committer, 1, vec![vec![10, 11], vec![12]])
        .await
        .unwrap();
    assert_eq!(stored(&p.n2_store, 1), want);
    assert_eq!(deduplicated(&p.metrics), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_the_in_order_call_takes_the_batches_one_call_each() {
    let p = pair_serving(Serves::OneEach).await;
    in_order(&p.committer, 1, vec![vec![10, 11], vec![12]])
        .await
        .unwrap();
    // The frames call and the in-order call answered 404, then one commit call per batch.
    assert_eq!(
        *p.n2_paths.lock().unwrap(),
        [
            COMMIT_FRAMES_PATH,
            COMMIT_IN_ORDER_PATH,
            COMMIT_PATH,
            COMMIT_PATH
        ]
    );
    assert_eq!(
        stored(&p.n2_store, 1),
        [
            ("v10".to_owned(), origin(10, 10)),
            ("v11".to_owned(), origin(11, 10)),
            ("v12".to_owned(), origin(12, 12)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_partly_held_by_the_owner_appends_only_the_records_it_lacks() {
    let p = pair().await;
    in_order(&p.committer, 1, vec![vec![10, 11]]).await.unwrap();
    // A retry that lost its first commit's answer, now longer (a later read of the parent).
    in_order(&p.committer, 1, vec![vec![10, 11, 12]])
        .await
        .unwrap();
    assert_eq!(
        stored(&p.n2_store, 1),
        [
            ("v10".to_owned(), origin(10, 10)),
            ("v11".to_owned(), origin(11, 10)),
            ("v12".to_owned(), origin(12, 10)),
        ]
    );
    assert_eq!(deduplicated(&p.metrics), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_without_the_frames_call_is_sent_records_and_not_asked_again_at_once() {
    let p = pair_serving(Serves::InOrder).await;
    in_order(&p.committer, 1, vec![vec![10, 11], vec![12]])
        .await
        .unwrap();
    in_order(&p.committer, 1, vec![vec![13]]).await.unwrap();
    // One 404 to the frames call, then the in-order call for both commits.
    assert_eq!(
        *p.n2_paths.lock().unwrap(),
        [
            COMMIT_FRAMES_PATH,
            COMMIT_IN_ORDER_PATH,
            COMMIT_IN_ORDER_PATH
        ]
    );
    assert_eq!(
        stored(&p.n2_store, 1),
        [
            ("v10".to_owned(), origin(10, 10)),
            ("v11".to_owned(), origin(11, 10)),
            ("v12".to_owned(), origin(12, 12)),
            ("v13".to_owned(), origin(13, 13)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_order_for_a_dead_owner_commit_none_and_name_it() {
    let p = pair().await;
    p.n2_alive.store(false, Ordering::SeqCst);
    let failed = in_order(&p.committer, 1, vec![vec![10], vec![11]])
        .await
        .unwrap_err();
    assert_eq!(failed.durable, 0);
    assert!(
        matches!(&failed.error, ChildCommitError::OwnerDown { node, .. } if node == "n2"),
        "{:?}",
        failed.error
    );
    assert!(stored(&p.n2_store, 1).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_own_receiver_batches_in_order_share_one_append_and_repeats_are_absorbed() {
    let (_dir, store, metrics, committer) = lone_node();
    let syncs = store.append_stats().syncs;
    in_order(&committer, 0, vec![vec![3, 4], vec![5]])
        .await
        .unwrap();
    assert_eq!(
        store.append_stats().syncs - syncs,
        1,
        "one fdatasync for both"
    );
    // Both again, as after a crash before the cursor advanced: nothing is stored twice.
    in_order(&committer, 0, vec![vec![3, 4], vec![5]])
        .await
        .unwrap();
    assert_eq!(
        stored(&store, 0),
        [
            ("v3".to_owned(), origin(3, 3)),
            ("v4".to_owned(), origin(4, 3)),
            ("v5".to_owned(), origin(5, 5))
        ]
    );
    assert_eq!(deduplicated(&metrics), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slab_split_across_nodes_commits_the_healthy_buckets_and_names_the_dead_owner() {
    let p = pair().await;
    p.n2_alive.store(false, Ordering::SeqCst);
    let committer: Arc<dyn ChildCommitter> = Arc::clone(&p.committer) as _;
    let records: Arc<Vec<StoredRecord>> = Arc::new(
        (20..24)
            .map(|offset| StoredRecord {
                offset,
                committed_at_ms: 0,
                key: None,
                headers: Vec::new(),
                value: Some(Bytes::from(format!("v{offset}"))),
                origin: None,
            })
            .collect(),
    );
    let slab = SlabOrigin {
        epoch: EPOCH,
        parent_partition: 7,
        slab_start: 20,
    };
    let timing = FanoutTiming {
        quick_retry_pauses: [Duration::from_millis(1); 2],
        ..FanoutTiming::default()
    };
    let buckets = bucket(&records, &[0, 1, 0, 1], "child", 2, slab).unwrap();
    let failed = tokio::time::timeout(WAIT, commit(buckets, &committer, &timing))
        .await
        .unwrap()
        .unwrap_err();
    // The local bucket is stored; the dead owner's bucket is held, and the stall text
    // (what the children listing shows) names the child partition and the node.
    assert_eq!(
        stored(&p.n1_store, 0),
        [
            ("v20".to_owned(), origin(20, 20)),
            ("v22".to_owned(), origin(22, 20))
        ]
    );
    assert_eq!(failed.indices, [1, 3]);
    assert!(matches!(
        failed.errors.as_slice(),
        [CommitFailure::Commit {
            error: ChildCommitError::OwnerDown { .. },
            ..
        }]
    ));
    assert_eq!(
        failed.reason(),
        "waiting for the owner of child partition child/p00001 (node n2): it is not alive"
    );
    assert_eq!(p.n2_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_sends_no_commit_anywhere_and_commits_again_once_it_is_not() {
    let pair = pair().await;
    pair.n1_fenced.store(true, Ordering::SeqCst);
    for partition in [0, 1] {
        let error = commit_one(&pair.committer, partition, frame(&[0, 1]))
            .await
            .unwrap_err();
        assert!(matches!(error, ChildCommitError::Fenced { .. }), "{error}");
        assert!(error.to_string().contains("lost etcd"), "{error}");
    }
    assert_eq!(pair.n2_calls.load(Ordering::SeqCst), 0);
    assert!(stored(&pair.n1_store, 0).is_empty());
    assert!(stored(&pair.n2_store, 1).is_empty());

    pair.n1_fenced.store(false, Ordering::SeqCst);
    commit_one(&pair.committer, 1, frame(&[0, 1]))
        .await
        .unwrap();
    assert_eq!(stored(&pair.n2_store, 1).len(), 2);
}
