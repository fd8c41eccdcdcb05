use std::sync::Arc;

use bytes::Bytes;
use narad_storage::{AppendBatch, BatchOrigin, LogConfig, NewRecord, PartitionId, Store};

use crate::cluster::commit_rpc::{COMMIT_PATH, CommitClient};
use crate::cluster::commit_wire::{CommitRequest, CommitResponse, MAX_COMMIT_REQUEST_BYTES};
use crate::cluster::receiver::{CommitReceiver, OwnerLookup};
use crate::metastore::PartitionOwner;

/// A commit of one record of `value_bytes` bytes at parent offset `offset`.
fn commit_of(offset: u64, value_bytes: usize) -> CommitRequest {
    let batch = AppendBatch {
        records: vec![NewRecord {
            value: Some(Bytes::from(vec![7u8; value_bytes])),
            ..NewRecord::default()
        }],
        origin: Some(BatchOrigin {
            epoch: [1; 8],
            parent_partition: 0,
            slab_start: offset,
            parent_offsets: vec![offset],
        }),
    };
    CommitRequest::from_batch("child", 0, 1, batch).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_order_commit_takes_two_slabs_of_bytes_and_the_single_commit_still_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Default::default()).unwrap());
    let id = PartitionId::new("child", 0);
    store.create_partition(&id, LogConfig::default()).unwrap();
    let owners: Arc<OwnerLookup> = Arc::new(|_: &PartitionId| Some(PartitionOwner::first("n1")));
    let receiver = Arc::new(CommitReceiver::new(
        "n1".to_owned(),
        Arc::clone(&store),
        owners,
    ));
    let app = crate::api::commit_router(receiver);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    // Two commits of 3 MiB each: more than one commit's limit, within the call's.
    let big = 3 * 1024 * 1024;
    let requests = [commit_of(0, big), commit_of(1, big)];
    let answers = CommitClient::new()
        .unwrap()
        .commit_in_order(&url, &requests)
        .await
        .unwrap();
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, CommitResponse::Committed { appended: 1, .. })),
        "{answers:?}"
    );
    assert_eq!(store.high_watermark(&id).unwrap(), 2);

    // The single commit keeps its own limit.
    let status = reqwest::Client::new()
        .post(format!("{url}{COMMIT_PATH}"))
        .body(vec![0u8; MAX_COMMIT_REQUEST_BYTES + 1])
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, reqwest::StatusCode::PAYLOAD_TOO_LARGE);
    server.abort();
}
