//! A parent that lost acknowledged records (a torn tail cut at start-up, its high-watermark file
//! gone) reuses their offsets for new records; every one of those must still reach the child.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::e2e::harness::{Daemon, fetch_all, http_client, send_json};

/// How long the child may take to copy records, or a cursor to show its position. Generous for a
/// busy CI machine; a healthy daemon needs well under a second.
const WAIT: Duration = Duration::from_secs(60);

/// How long the test waits for a record that must never arrive on the old code before it
/// concludes it was skipped: several reconciler ticks and slab long-polls (1 s each).
const SKIP_VERDICT: Duration = Duration::from_secs(30);

/// Bytes cut off the end of the last segment, as in the report: less than one of the frames
/// written below, so exactly the last record is torn.
const CUT_BYTES: u64 = 100;

/// Bytes of padding in each record's value, so each frame is well over [`CUT_BYTES`].
const PADDING_BYTES: usize = 300;

fn ok(status: u16, body: &Value, what: &str) {
    assert!((200..300).contains(&status), "{what}: {status} {body}");
}

fn request(
    client: &reqwest::blocking::Client,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> Value {
    let (status, answer) = send_json(client, method, url, body.as_ref()).expect(url);
    ok(status, &answer, url);
    answer
}

/// Produces one record (one frame) with `value` to partition 1 of `orders`; its offset.
fn produce(client: &reqwest::blocking::Client, base: &str, value: &str) -> u64 {
    let answer = request(
        client,
        Method::POST,
        &format!("{base}/v1/topics/orders/records"),
        Some(json!({"records": [{"value": value, "partition": 1}]})),
    );
    answer["offsets"][0]["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("no offset in {answer}"))
}

/// The listing entry of parent partition 1 of `orders -> copy`, if the cursor reports one.
fn cursor_report(client: &reqwest::blocking::Client, base: &str) -> Option<Value> {
    let listing = request(
        client,
        Method::GET,
        &format!("{base}/v1/topics/orders/children"),
        None,
    );
    listing["children"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "copy")?["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["partition"] == 1)
        .cloned()
}

fn child_values(client: &reqwest::blocking::Client, base: &str) -> Vec<String> {
    (0..2)
        .flat_map(|p| fetch_all(client, base, "copy", p))
        .filter_map(|r| r["value"].as_str().map(str::to_owned))
        .collect()
}

/// The value of the counter `name` for `orders -> copy`, parent partition 1, from `/metrics`.
fn rewind_metric(client: &reqwest::blocking::Client, base: &str, name: &str) -> Option<f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("scrape /metrics");
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter(|line| {
            line.contains(r#"parent="orders""#)
                && line.contains(r#"child="copy""#)
                && line.contains(r#"partition="1""#)
        })
        .find_map(|line| line.rsplit(' ').next()?.parse().ok())
}

/// The newest segment file of a partition directory.
fn last_segment(dir: &Path) -> std::path::PathBuf {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .expect("list the partition directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    segments.pop().expect("the partition has a segment")
}

#[test]
fn records_written_again_at_offsets_a_torn_tail_freed_all_reach_the_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&data);
    let base = daemon.url();
    let client = http_client();
    request(
        &client,
        Method::POST,
        &format!("{base}/v1/topics"),
        Some(json!({"name": "orders", "partitions": 2})),
    );
    // Keyless records keep their parent partition index when the counts match.
    request(
        &client,
        Method::PUT,
        &format!("{base}/v1/topics/orders/children/copy"),
        Some(json!({"partitions": 2})),
    );
    let padding = "x".repeat(PADDING_BYTES);
    for i in 0..30 {
        assert_eq!(produce(&client, &base, &format!("old-{i}-{padding}")), i);
    }
    // The child copies all 30: its cursor file now says 30.
    let deadline = Instant::now() + WAIT;
    while cursor_report(&client, &base).and_then(|r| r["next_offset"].as_u64()) != Some(30) {
        assert!(
            Instant::now() < deadline,
            "the child did not copy the 30 records"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(child_values(&client, &base).len(), 30);

    // Stop; delete the high-watermark file; cut the last 100 bytes of the last segment.
    daemon.kill9();
    let partition_dir = data.join("topics").join("orders").join("p00001");
    std::fs::remove_file(partition_dir.join("high-watermark")).expect("delete high-watermark");
    let segment = last_segment(&partition_dir);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .expect("open the last segment");
    let len = file.metadata().expect("segment metadata").len();
    file.set_len(len - CUT_BYTES).expect("cut the segment");
    file.sync_all().expect("sync the segment");
    drop(file);

    daemon.restart();
    let base = daemon.url();
    // Let the cursor resolve its start before anything is produced.
    let deadline = Instant::now() + WAIT;
    let report = loop {
        if let Some(report) = cursor_report(&client, &base)
            && report["next_offset"].as_u64().is_some()
        {
            break report;
        }
        assert!(
            Instant::now() < deadline,
            "the cursor never reported a position"
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    let offsets: Vec<u64> = (0..3)
        .map(|i| produce(&client, &base, &format!("new-{i}")))
        .collect();
    assert_eq!(offsets, [29, 30, 31], "the torn record's offset is reused");

    let deadline = Instant::now() + SKIP_VERDICT;
    let missing = loop {
        let values = child_values(&client, &base);
        let missing: Vec<String> = (0..3)
            .map(|i| format!("new-{i}"))
            .filter(|v| !values.contains(v))
            .collect();
        if missing.is_empty() || Instant::now() >= deadline {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        missing.is_empty(),
        "records {missing:?} never reached the child; cursor after restart: {report}, now: {:?}",
        cursor_report(&client, &base)
    );
    assert_eq!(
        rewind_metric(
            &client,
            &base,
            "narad_fanout_cursor_parent_end_rewinds_total"
        ),
        Some(1.0),
        "the rewind is counted"
    );
    let now = cursor_report(&client, &base).expect("listed");
    assert_eq!(
        now["parent_end_rewinds"], 1,
        "the listing shows the rewind: {now}"
    );
    assert_eq!(now["state"], "running", "{now}");
    assert!(
        daemon.log().contains("cursor is past the parent's end"),
        "the rewind is logged"
    );
}
