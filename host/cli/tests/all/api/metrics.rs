//! `GET /metrics`: valid OpenMetrics text, and every series `docs/metrics.md` documents is
//! there with HELP text, with samples once the traffic that feeds it has happened.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::api::common::Daemon;

/// The series names in the tables of docs/metrics.md (first column, in backquotes).
fn documented_series() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let names: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `narad_"))
        .map(|rest| format!("narad_{}", &rest[..rest.find('`').unwrap()]))
        .collect();
    assert!(
        names.len() >= 20,
        "docs/metrics.md lists too few series: {names:?}"
    );
    names
}

/// A parsed scrape: family name -> (type, help), and sample name -> label sets seen.
#[derive(Debug, Default)]
struct Scrape {
    families: BTreeMap<String, (String, String)>,
    samples: BTreeMap<String, Vec<String>>,
}

/// Parses OpenMetrics text, failing on anything malformed: every sample belongs to a family
/// announced with TYPE and HELP before it, values are numbers, and `# EOF` ends the text.
fn parse(text: &str) -> Scrape {
    let mut scrape = Scrape::default();
    let mut help: BTreeMap<String, String> = BTreeMap::new();
    let mut saw_eof = false;
    for line in text.lines() {
        assert!(!saw_eof, "text after # EOF: {line}");
        if line == "# EOF" {
            saw_eof = true;
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap();
            assert!(!text.trim().is_empty(), "empty HELP for {name}");
            help.insert(name.to_owned(), text.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                [
                    "counter",
                    "gauge",
                    "histogram",
                    "info",
                    "stateset",
                    "summary",
                    "unknown"
                ]
                .contains(&kind),
                "bad type {kind}"
            );
            let h = help
                .get(name)
                .unwrap_or_else(|| panic!("TYPE before HELP for {name}"));
            scrape
                .families
                .insert(name.to_owned(), (kind.to_owned(), h.clone()));
        } else if line.starts_with('#') {
            assert!(line.starts_with("# UNIT "), "unknown comment line: {line}");
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap();
            value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("sample value is not a number: {line}"));
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => {
                    assert!(l.ends_with('}'), "unterminated labels: {line}");
                    (n, l.trim_end_matches('}').to_owned())
                }
                None => (series, String::new()),
            };
            let family = ["_total", "_bucket", "_count", "_sum", "_created"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| scrape.families.contains_key(*f))
                })
                .unwrap_or(name);
            assert!(
                scrape.families.contains_key(family),
                "sample of an unannounced family: {line}"
            );
            scrape
                .samples
                .entry(name.to_owned())
                .or_default()
                .push(labels);
        }
    }
    assert!(saw_eof, "no # EOF at the end");
    scrape
}

fn family_of(series: &str) -> &str {
    series.strip_suffix("_total").unwrap_or(series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_openmetrics_and_carry_every_documented_series() {
    let d = Daemon::start().await;
    d.create_topic("orders", 2).await;
    let (status, body) = d
        .put("/v1/topics/orders/children/copy", json!({"partitions": 2}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // A chain that fails: header-route alone leaves a record without its header undecided.
    // (Without a config it would be refused at attach: that is a config it can never accept.)
    let (status, body) = d
        .put(
            "/v1/topics/orders/children/broken",
            json!({"partitions": 1, "router": ["header-route"], "config": "header = h\nv = 0\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    d.produce(
        "orders",
        json!([{"key": "a", "value": "hello"}, {"value": "world", "headers": {"h": "v"}}]),
    )
    .await;
    d.fetch_all("orders", 0).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let scrape = loop {
        let resp = reqwest::get(format!("{}/metrics", d.url)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
        let scrape = parse(&resp.text().await.unwrap());
        let copied: bool = scrape
            .samples
            .get("narad_fanout_records_copied_total")
            .is_some_and(|s| s.iter().any(|l| l.contains("child=\"copy\"")));
        // The poison-record search runs from the failing slab's second attempt on.
        let failed = scrape.samples.contains_key("narad_plugin_errors_total")
            && scrape
                .samples
                .contains_key("narad_plugin_search_calls_total");
        if copied && failed {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "the cursors never reported: {scrape:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The Kafka listener's labelled series (per API, topic, close reason) appear only with
    // Kafka traffic, which this in-process test sends none of; tests/all/kafka.rs reads them
    // from a daemon that serves Kafka clients. A plugin's dropped log lines appear once a plugin floods its log: tests/plugins_api.rs
    // reads that series after deploying one that does. Commits in flight to another node
    // exist only in a cluster: e2e/cluster_failures.rs reads them while a node hangs.
    for series in documented_series().into_iter().filter(|s| {
        !s.starts_with("narad_kafka_")
            && s != "narad_plugin_log_lines_dropped_total"
            && s != "narad_fanout_peer_commits_in_flight"
    }) {
        let family = family_of(&series);
        let (kind, _help) = scrape
            .families
            .get(family)
            .unwrap_or_else(|| panic!("{series} is documented but not served"));
        if series.ends_with("_total") {
            assert_eq!(kind, "counter", "{series}");
        }
    }
    // Series this traffic must have fed.
    for series in [
        "narad_fanout_lag_messages",
        "narad_fanout_due_lag_seconds",
        "narad_fanout_records_copied_total",
        "narad_fanout_slabs_total",
        "narad_fanout_route_failures_total",
        "narad_fanout_cursor_state",
        "narad_plugin_calls_total",
        "narad_plugin_records_total",
        "narad_plugin_errors_total",
        "narad_plugin_call_duration_seconds_bucket",
        "narad_plugin_call_duration_seconds_count",
        "narad_reconciler_pass_seconds_count",
        "narad_produce_records_total",
        "narad_produce_bytes_total",
        "narad_fetch_records_total",
        "narad_fetch_bytes_total",
        "narad_partition_size_bytes",
        "narad_partition_segments",
        "narad_partition_log_start_offset",
        "narad_partition_high_watermark",
        "narad_partition_unavailable",
        "narad_log_appends_total",
        "narad_log_append_syncs_total",
    ] {
        assert!(scrape.samples.contains_key(series), "no sample of {series}");
    }
    let errors = &scrape.samples["narad_plugin_errors_total"];
    assert!(
        errors
            .iter()
            .any(|l| l.contains("plugin=\"header-route\"") && l.contains("kind=\"undecided\"")),
        "{errors:?}"
    );
    let sizes = &scrape.samples["narad_partition_size_bytes"];
    // orders (2), copy (2) and broken (1).
    assert_eq!(sizes.len(), 5, "{sizes:?}");
    assert!(scrape.families["narad_plugin_call_duration_seconds"].0 == "histogram");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_fetch_counters_count_records_and_bytes() {
    let d = Daemon::start().await;
    d.create_topic("t", 1).await;
    // 3 + 2 bytes, then 1 + 4 + (1 + 2) bytes.
    d.produce("t", json!([{"key": "abc", "value": "de"}])).await;
    d.produce(
        "t",
        json!([{"key": "k", "value": "vvvv", "headers": {"h": "xy"}}]),
    )
    .await;
    d.fetch_all("t", 0).await;
    let text = reqwest::get(format!("{}/metrics", d.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (series, value) in [
        ("narad_produce_records_total{topic=\"t\"}", "2"),
        ("narad_produce_bytes_total{topic=\"t\"}", "13"),
        ("narad_fetch_records_total{topic=\"t\"}", "2"),
        ("narad_fetch_bytes_total{topic=\"t\"}", "13"),
        // One after the other, so each append had its own sync.
        ("narad_log_appends_total", "2"),
        ("narad_log_append_syncs_total", "2"),
    ] {
        assert!(
            text.lines().any(|l| l == format!("{series} {value}")),
            "{series} is not {value}:\n{text}"
        );
    }
    // A deleted topic's series go away.
    let (status, _) = d.delete("/v1/topics/t").await;
    assert_eq!(status, StatusCode::OK);
    let text = reqwest::get(format!("{}/metrics", d.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("topic=\"t\""), "{text}");
}

#[test]
fn the_grafana_dashboard_charts_only_documented_series() {
    let documented = documented_series();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/grafana-dashboard.json"
    ))
    .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    let mut stack = vec![&dashboard];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(e)) = map.get("expr") {
                    exprs.push(e.clone());
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(exprs.len() >= 15, "too few panels: {exprs:?}");
    let mut used = BTreeSet::new();
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("narad_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            let base = name.strip_suffix("_bucket").unwrap_or(name);
            assert!(
                documented.contains(base),
                "{name} in {expr:?} is not documented"
            );
            used.insert(base.to_owned());
            rest = &tail[end..];
        }
    }
    for must in [
        "narad_fanout_lag_messages",
        "narad_fanout_due_lag_seconds",
        "narad_fanout_child_dropped_messages",
        "narad_plugin_errors_total",
        "narad_plugin_call_duration_seconds",
    ] {
        assert!(used.contains(must), "the dashboard does not chart {must}");
    }
}
