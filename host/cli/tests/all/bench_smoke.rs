//! `narad bench` at tiny sizes: the benches run end to end, report every figure, and the
//! fan-out's children hold every parent record. No timing is asserted.

#![allow(clippy::unwrap_used, missing_docs)]

use std::process::Command;
use std::time::Duration;

use narad_cli::bench::fanout::{FanoutOptions, run_fanout};
use narad_cli::bench::idle::{IdleOptions, run_idle};
use serde_json::Value;

fn field<'a>(json: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(json, |v, key| {
        v.get(key)
            .unwrap_or_else(|| panic!("the report has no {path:?}: {json}"))
    })
}

fn positive(json: &Value, path: &str) -> f64 {
    let v = field(json, path)
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {json}"));
    assert!(v > 0.0, "{path} is {v}: {json}");
    v
}

#[test]
fn bench_produce_prints_one_json_object_with_both_throughputs_and_their_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args([
            "bench",
            "produce",
            "--batch-bytes",
            "256KiB",
            "--total-bytes",
            "2MiB",
        ])
        .arg("--dir")
        .arg(dir.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "not one JSON line: {stdout}");
    let json: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(field(&json, "bench"), "produce");
    assert_eq!(field(&json, "batches"), 8);
    assert_eq!(field(&json, "records_per_batch"), 256);
    let log = positive(&json, "log.mb_per_s");
    let raw = positive(&json, "raw.mb_per_s");
    let ratio = positive(&json, "ratio");
    assert!((ratio - log / raw).abs() < 1e-9 * ratio.max(1.0));
    positive(&json, "log.batch_ms_p50");
    positive(&json, "raw.batch_ms_p99");
    assert_eq!(field(&json, "goal_ratio"), 0.8);
    // Nothing is left behind in the directory it ran in.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fanout_copies_every_record_into_every_child_and_reports_every_figure() {
    let dir = tempfile::tempdir().unwrap();
    let records = 2_000;
    let report = run_fanout(FanoutOptions {
        records,
        children: 2,
        partitions: 4,
        child_partitions: 4,
        key_bytes: 16,
        value_bytes: 100,
        dir: Some(dir.path().to_path_buf()),
        progress: false,
        ..FanoutOptions::default()
    })
    .await
    .unwrap();
    // The bench read each child back; here its findings are checked against the parent.
    assert_eq!(report.verified.child_records, vec![records, records]);
    assert_eq!(report.verified.duplicates, 0);
    assert_eq!(report.fill.per_partition.iter().sum::<u64>(), records);

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(field(&json, "bench"), "fanout");
    for path in [
        "fanout.records_per_s",
        "fanout.records_per_s_per_child_min",
        "fanout.mb_per_s",
        "fanout.fsyncs_per_slab",
        "fanout.commits_per_slab",
        "fanout.routing_seconds",
        "fanout.routing_share_of_slab_time",
        "fanout.cpu_ns_per_copy",
        "raw.records_per_s",
        "raw.mb_per_s",
        "raw_read_back.records_per_s",
        "disk.in_place_256b_ms",
        "disk.append_512kib_ms",
        "ratio",
        "ratio_to_read_back_loop",
        // Every commit was read back from the device.
        "fanout.device_reads_per_fsync",
        "fanout.device_read_mb_per_s",
    ] {
        positive(&json, path);
    }
    // The report names how often the cursors synced their offset files (the daemon's default).
    assert_eq!(
        field(&json, "offset_sync_every_ms").as_u64(),
        u64::try_from(narad_host::fanout::OFFSET_SYNC_EVERY.as_millis()).ok()
    );
    // And how many slabs they committed together at most.
    assert_eq!(
        field(&json, "slabs_per_commit").as_u64(),
        Some(narad_host::fanout::SLABS_PER_COMMIT as u64)
    );
    assert_eq!(
        field(&json, "fanout.records_per_s_per_child")
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // The raw loop ran before and after the fan-out, each run copying every record per child.
    assert_eq!(report.raw_runs.len(), 2);
    assert!(report.raw_runs.iter().all(|r| r.records_per_s > 0.0));
    // So did the loop with the read-back, the baseline under the engine's durability rule.
    assert_eq!(report.raw_read_back_runs.len(), 2);
    assert!(report.raw_read_back_runs.iter().all(|r| r.slabs > 0));
    assert!(
        (report.ratio_to_read_back_loop
            - report.fanout.records_per_s / report.raw_read_back.records_per_s)
            .abs()
            < 1e-9
    );
    // Every slab is committed in at least one bucket and its offset file is synced.
    assert!(report.fanout.fsyncs_per_slab >= 2.0, "{json}");
    assert!(report.fanout.routing_share_of_slab_time < 1.0);
    assert!(field(&json, "fanout.peak_rss_bytes").is_u64());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_delay_cursors_all_wait_and_copy_nothing_early() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_idle(IdleOptions {
        cursors: 8,
        records: 2_000,
        key_bytes: 16,
        value_bytes: 100,
        window: Duration::from_secs(1),
        dir: Some(dir.path().to_path_buf()),
        progress: false,
    })
    .await
    .unwrap();
    assert_eq!(report.cursors, 8);
    assert_eq!(report.waiting_at_end, 8);
    assert_eq!(report.copied_early, 0);
    assert_eq!(report.fsyncs, 0);
    let json = serde_json::to_value(&report).unwrap();
    for path in [
        "cpu_cores_used",
        "cpu_us_per_cursor_per_s",
        "window_seconds",
    ] {
        assert!(field(&json, path).is_f64(), "{path}: {json}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_once_runs_both_sides_with_and_without_the_checks_and_reports_their_ratios() {
    use narad_cli::bench::once::{OnceOptions, run_once};
    let dir = tempfile::tempdir().unwrap();
    let report = run_once(OnceOptions {
        records: 2_000,
        partitions: 2,
        rounds: 2,
        target_records: 2_000,
        dir: Some(dir.path().to_path_buf()),
        progress: false,
    })
    .await
    .unwrap();
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(field(&json, "bench"), "once");
    for side in ["cursor", "target"] {
        let checked = positive(&json, &format!("{side}.checked_records_per_s"));
        let unchecked = positive(&json, &format!("{side}.unchecked_records_per_s"));
        let ratio = positive(&json, &format!("{side}.ratio"));
        assert!((ratio - checked / unchecked).abs() < 1e-9 * ratio.max(1.0));
        // One timing per round and variant.
        for variant in ["checked_seconds", "unchecked_seconds"] {
            let rounds = field(&json, &format!("{side}.{variant}"))
                .as_array()
                .unwrap();
            assert_eq!(rounds.len(), 2, "{json}");
        }
    }
    assert_eq!(field(&json, "goal_ratio"), 0.95);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn bench_requests_sends_both_sizes_of_request_to_a_real_daemon_and_reports_its_cpu_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args([
            "bench",
            "requests",
            "--records",
            "400",
            "--large-records",
            "50",
            "--connections",
            "2",
            "--json",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(field(&json, "bench"), "requests");
    // Two rounds of 400 records: one per request, then 50 per request.
    assert_eq!(field(&json, "small.requests"), 800);
    assert_eq!(field(&json, "large.requests"), 16);
    assert_eq!(field(&json, "small.records"), 800);
    assert_eq!(field(&json, "large.records"), 800);
    positive(&json, "small.requests_per_s");
    positive(&json, "large.records_per_s");
    // 800 requests cost the daemon more than one 10 ms tick of CPU in each mode.
    positive(&json, "small.user_ms_per_request");
    positive(&json, "small.system_ms_per_request");
    assert_eq!(field(&json, "goal_user_ms_per_request"), 0.05);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn bench_metadata_on_etcd_creates_its_topics_there_and_removes_its_keys() {
    let etcd = narad_host::metastore::test_etcd::TestEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["bench", "metadata", "--topics", "40", "--partitions", "3"])
        .args(["--etcd", &etcd.endpoint(), "--json", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(field(&report, "metastore"), "etcd", "{report}");
    assert_eq!(field(&report, "topics"), 40);
    // 40 topics of 3 owned partitions were in etcd at the end of the run.
    assert!(
        positive(&report, "metastore_bytes") > 40.0 * 100.0,
        "{report}"
    );
    positive(&report, "create_first_median_us");
    positive(&report, "create_last_median_us");
    // A starting node's watched copy at that size: its read time and what it holds.
    positive(&report, "restart.millis");
    positive(&report, "restart.copy_bytes");
    // And nothing of the run is left in etcd.
    let left = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .unwrap();
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        client
            .get("/narad/", Some(options))
            .await
            .unwrap()
            .kvs()
            .len()
    });
    assert_eq!(left, 0, "keys of the run were left in etcd");
}
