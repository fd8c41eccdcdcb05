//! Start-up, shutdown and damaged data dirs.

use std::fs;

use narad_host::ServerError;
use narad_host::metastore::MetastoreError;
use narad_storage::StorageError;
use reqwest::StatusCode;
use serde_json::json;

use crate::api::common::{Daemon, test_config};
use crate::metastore_files;

#[tokio::test]
async fn corrupt_metastore_stops_start_up_with_an_error_naming_the_file() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    d.create_topic("audit", 1).await;
    let temp = d.stop().await.unwrap();
    let path = temp.path().join("metastore.json");
    let mut bytes = fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    fs::write(&path, &bytes).unwrap();

    let err = Daemon::start_config(test_config(temp.path()))
        .await
        .err()
        .unwrap();
    let message = err.to_string();
    assert!(
        matches!(err, ServerError::Metastore(MetastoreError::Corrupt { .. })),
        "{err:?}"
    );
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("metastore.json.prev"), "{message}");

    // The advice works and loses nothing: restore the backup and start; the journal beside
    // it replays both creates.
    fs::copy(temp.path().join("metastore.json.prev"), &path).unwrap();
    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    assert_eq!(d.get("/v1/topics/orders").await.0, StatusCode::OK);
    assert_eq!(d.get("/v1/topics/audit").await.0, StatusCode::OK);
    d.stop().await;
}

#[tokio::test]
async fn a_second_daemon_on_the_same_data_dir_is_refused() {
    let d = Daemon::start().await;
    let err = Daemon::start_config(test_config(&d.dir))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, ServerError::Store(StorageError::DataDirLocked { .. })),
        "{err:?}"
    );
    // The first one is unaffected.
    assert_eq!(d.get("/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn topic_directories_unknown_to_the_metastore_are_set_aside_at_start_up_not_deleted() {
    let d = Daemon::start().await;
    let temp = d.stop().await.unwrap();
    // A directory nothing explains (no intent record of the daemon's), with a record byte.
    fs::create_dir_all(temp.path().join("topics/ghost/p00000")).unwrap();
    fs::write(
        temp.path()
            .join("topics/ghost/p00000/00000000000000000000.log"),
        b"x",
    )
    .unwrap();
    // What a crash between "create directories" and "record in the metastore" leaves behind:
    // the create's intent record and empty partition directories.
    fs::create_dir_all(temp.path().join("topics/half/p00000")).unwrap();
    fs::write(
        temp.path().join("topics/half/INTENT"),
        br#"{"op":"create","partitions":1}"#,
    )
    .unwrap();
    // A crash one step earlier: the topic directory made, its intent record not yet renamed
    // into place.
    fs::create_dir_all(temp.path().join("topics/first-step")).unwrap();
    fs::write(
        temp.path().join("topics/first-step/INTENT.tmp"),
        b"{\"op\":\"cre",
    )
    .unwrap();
    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    assert!(!temp.path().join("topics/ghost").exists());
    assert!(
        !temp.path().join("topics/half").exists(),
        "an unrecorded create is undone"
    );
    assert!(
        !temp.path().join("topics/first-step").exists(),
        "so is one stopped before its intent was in place"
    );
    assert_eq!(d.get("/v1/topics/ghost").await.0, StatusCode::NOT_FOUND);
    let (status, body) = d.get("/v1/admin/set-aside").await;
    assert_eq!(status, StatusCode::OK);
    let entries = body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{body}");
    assert_eq!(entries[0]["topic"], "ghost");
    let id = entries[0]["id"].as_str().unwrap();
    let kept = temp
        .path()
        .join("set-aside")
        .join(id)
        .join("p00000/00000000000000000000.log");
    assert_eq!(fs::read(kept).unwrap(), b"x");
    d.stop().await;
}

#[tokio::test]
async fn a_plugin_only_a_newer_metastore_names_is_set_aside_not_deleted_after_a_restore() {
    let d = Daemon::start().await;
    d.create_topic("orders", 1).await;
    let temp = d.stop().await.unwrap();
    let before_upload = metastore_files::save(temp.path());
    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    // The built-in key-hash with one more custom section: a distinct module of its own.
    let mut bytes = narad_builtin_plugins::get("key-hash").unwrap().to_vec();
    bytes.extend_from_slice(&[0, 5, 3, b'p', b'a', b'd', b'1']);
    let (status, body) = d.post_raw("/v1/plugins?name=my-hash", bytes.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let digest = body["digest"].as_str().unwrap().to_owned();
    d.stop().await;

    // Restore an older backup of the metastore, from before the upload.
    metastore_files::restore(temp.path(), &before_upload);
    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    let stored = temp
        .path()
        .join("plugins/sha256")
        .join(format!("{digest}.wasm"));
    assert!(!stored.exists());
    let kept = temp
        .path()
        .join("set-aside/plugins")
        .join(format!("{digest}.wasm"));
    assert_eq!(
        fs::read(kept).unwrap(),
        bytes,
        "the module's only copy is kept"
    );
    let (_, list) = d.get("/v1/plugins").await;
    assert!(!list.to_string().contains("my-hash"), "{list}");
    d.stop().await;
}

#[tokio::test]
async fn a_quarantined_partition_answers_503_and_the_others_keep_serving() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let records: Vec<_> = (0..20)
        .map(|i| json!({"value": format!("record number {i}"), "partition": 0}))
        .collect();
    d.produce("orders", serde_json::Value::Array(records)).await;
    d.produce("orders", json!([{"value": "fine", "partition": 1}]))
        .await;
    let temp = d.stop().await.unwrap();

    // Damage a byte below the durable boundary of partition 0.
    let dir = temp.path().join("topics/orders/p00000");
    let segment = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&segment, &bytes).unwrap();

    let d = Daemon::start_config(test_config(temp.path()))
        .await
        .unwrap();
    // Partition 0 is still closed: produce must open it (finding the damage) before writing
    // anything, so the healthy partition's share of the request is not written either.
    let (status, body) = d
        .post(
            "/v1/topics/orders/records",
            json!({"records": [{"value": "x", "partition": 1}, {"value": "y", "partition": 0}]}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("quarantined"),
        "{body}"
    );
    assert!(body["reason"].is_string());
    assert_eq!(d.fetch_all("orders", 1).await.len(), 1);

    let (status, body) = d.get("/v1/topics/orders/partitions/0/records").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("quarantined"),
        "{body}"
    );

    let (_, desc) = d.get("/v1/topics/orders").await;
    assert_eq!(desc["partition_stats"][0]["state"], "quarantined");
    assert!(desc["partition_stats"][0]["reason"].is_string());
    assert_eq!(desc["partition_stats"][1]["state"], "open");
    d.produce("orders", json!([{"value": "still", "partition": 1}]))
        .await;
    d.stop().await;
}

#[tokio::test]
async fn idle_partition_logs_are_closed_in_the_background_and_reopen_on_demand() {
    let d = Daemon::start_with(|c| c.idle_close_after = std::time::Duration::from_millis(1)).await;
    d.create_topic("orders", 1).await;
    d.produce("orders", json!([{"value": "a"}])).await;
    // The idle loop ticks every second here; wait (no deadline assertion) until it closed the log.
    let mut state = String::new();
    for _ in 0..300 {
        let (_, desc) = d.get("/v1/topics/orders").await;
        state = desc["partition_stats"][0]["state"]
            .as_str()
            .unwrap()
            .to_owned();
        if state == "closed" {
            assert_eq!(desc["partition_stats"][0]["high_watermark"], 1);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(state, "closed");
    let records = d.fetch_all("orders", 0).await;
    assert_eq!(records[0]["value"], "a");
    d.stop().await;
}
