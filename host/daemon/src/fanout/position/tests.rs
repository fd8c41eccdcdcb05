use super::*;

/// Tails that answer after `delay`, counting the scans in flight, within `permits` when set.
struct SlowTails {
    delay: Duration,
    permits: Option<Arc<tokio::sync::Semaphore>>,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl RemoteTails for SlowTails {
    fn scan<'a>(
        &'a self,
        _child: &'a str,
        _partition: u32,
        _epoch: [u8; 8],
        _parent_partition: u32,
    ) -> crate::metastore::BoxFuture<
        'a,
        Result<(provenance::ChildScan, provenance::TailCopies), TailScanError>,
    > {
        use std::sync::atomic::Ordering::SeqCst;
        Box::pin(async move {
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(self.delay).await;
            self.in_flight.fetch_sub(1, SeqCst);
            Ok((
                provenance::ChildScan {
                    evidence: None,
                    empty: true,
                },
                provenance::TailCopies::new(),
            ))
        })
    }

    fn admit(&self) -> crate::metastore::BoxFuture<'_, Option<tokio::sync::OwnedSemaphorePermit>> {
        Box::pin(async move {
            match &self.permits {
                Some(permits) => Arc::clone(permits).acquire_owned().await.ok(),
                None => None,
            }
        })
    }
}

fn slow_tails(permits: Option<usize>) -> Arc<SlowTails> {
    Arc::new(SlowTails {
        delay: Duration::from_millis(50),
        permits: permits.map(|n| Arc::new(tokio::sync::Semaphore::new(n))),
        in_flight: Default::default(),
        most: Default::default(),
    })
}

#[tokio::test]
async fn remote_tail_scans_stay_within_what_admit_allows() {
    let partitions: Vec<u32> = (0..12).collect();
    let bounded = slow_tails(Some(3));
    let tails = Arc::clone(&bounded) as Arc<dyn RemoteTails>;
    let scans = scan_remote_tails(&tails, "child", &partitions, [0; 8], 0).await;
    assert_eq!(bounded.most.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(scans.len(), 12);
    assert!(scans.iter().all(|(_, scan)| scan.is_ok()), "{scans:?}");

    let unbounded = slow_tails(None);
    let tails = Arc::clone(&unbounded) as Arc<dyn RemoteTails>;
    scan_remote_tails(&tails, "child", &partitions, [0; 8], 0).await;
    assert_eq!(unbounded.most.load(std::sync::atomic::Ordering::SeqCst), 12);
}
use crate::metastore::{
    BoxFuture, Change, FileMetastore, LinkMeta, Metastore, Outcome, Snapshot, TopicMeta, Versions,
};

/// A node's copy of the metadata that stopped at `stale` (a watch that fell behind), in
/// front of the real metadata, which `confirm` and writes reach.
struct StaleCopy {
    stale: Snapshot,
    real: Arc<FileMetastore>,
}

impl Metastore for StaleCopy {
    fn snapshot(&self) -> BoxFuture<'_, crate::metastore::Result<Snapshot>> {
        Box::pin(async move { Ok(self.stale.clone()) })
    }
    fn confirm(&self) -> BoxFuture<'_, crate::metastore::Result<Snapshot>> {
        self.real.confirm()
    }
    fn versions(&self) -> BoxFuture<'_, crate::metastore::Result<Versions>> {
        Box::pin(async move { Ok(self.stale.versions) })
    }
    fn topic<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, crate::metastore::Result<Option<TopicMeta>>> {
        Box::pin(async move { Ok(self.stale.topics.get(name).cloned()) })
    }
    fn apply(&self, change: Change) -> BoxFuture<'_, crate::metastore::Result<Outcome>> {
        self.real.apply(change)
    }
}

#[tokio::test]
async fn a_cursor_whose_metadata_copy_is_stale_never_anchors_a_detached_link() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            &dir.path().join("data"),
            narad_storage::StoreOptions::default(),
        )
        .unwrap(),
    );
    let real = Arc::new(FileMetastore::open(dir.path()).unwrap());
    for name in ["parent", "child"] {
        store
            .create_partition(
                &PartitionId::new(name, 0),
                narad_storage::LogConfig::default(),
            )
            .unwrap();
        real.create_topic(TopicMeta {
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
    let link = LinkMeta {
        parent: "parent".into(),
        child: "child".into(),
        attach_epoch: "00112233445566aa".into(),
        attach_offsets: Some(vec![0]),
        delay_ms: 0,
        router: Vec::new(),
        config: String::new(),
        attached_at_ms: 0,
        paused: Vec::new(),
        shadow: None,
        on_gap: Default::default(),
        accepted_gaps: Vec::new(),
        dead_letter: None,
        remote: None,
    };
    real.attach_link(link.clone()).await.unwrap();
    let stale = real.snapshot().await.unwrap();
    // Detached everywhere but in this node's copy.
    real.detach_link("parent", "child").await.unwrap();
    struct Refuses;
    impl crate::fanout::committer::BlockingCommitter for Refuses {
        fn append(
            &self,
            partition: &PartitionId,
            _batch: &mut narad_storage::EncodedBatch,
        ) -> Result<narad_storage::Appended, crate::fanout::committer::ChildCommitError> {
            panic!("nothing may be committed to {partition}")
        }
    }
    let deps = Arc::new(CursorDeps {
        store: Arc::clone(&store),
        fs: Arc::new(narad_storage::fs::RealFs),
        committer: Arc::new(Refuses),
        metastore: Arc::new(StaleCopy { stale, real }),
        clock: Arc::new(narad_storage::SystemClock),
        timing: crate::fanout::FanoutTiming::default(),
        remote_tails: None,
        node: None,
        leave_out_held: true,
    });
    let key = CursorKey {
        parent: "parent".into(),
        partition: 0,
        child: "child".into(),
        epoch: link.attach_epoch.clone(),
    };
    let status = CursorStatus::new(
        crate::fanout::metrics::CursorLabels {
            parent: "parent".into(),
            child: "child".into(),
            partition: 0,
        },
        Arc::new(crate::fanout::metrics::FanoutMetrics::default()),
    );
    let opened = open(&deps, &key, &link, &status).await.unwrap();
    assert!(
        matches!(opened, Opened::Deferred(Deferred::EpochNotConfirmed { .. })),
        "the stale copy's link was anchored"
    );
    let path = cursor_path(&store, &PartitionId::new("parent", 0), "child");
    assert!(
        !path.exists(),
        "an offset file was written: {}",
        path.display()
    );
}

#[test]
fn a_bad_epoch_stalls_with_the_epochs_own_reason() {
    let error = OpenError::from(epoch_bytes("xyz").unwrap_err());
    assert!(matches!(error, OpenError::BadEpoch(BadEpoch(ref e)) if e == "xyz"));
    assert_eq!(
        error.to_string(),
        "attach epoch \"xyz\" is not 16 lowercase hex digits"
    );
}
