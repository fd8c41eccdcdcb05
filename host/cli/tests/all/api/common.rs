//! The test harness: a daemon in this process, and small JSON HTTP helpers.

use std::path::{Path, PathBuf};

use narad_host::shutdown::{self, ShutdownTrigger};
use narad_host::{Config, RunningServer, run_server};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub struct Daemon {
    pub url: String,
    pub dir: PathBuf,
    trigger: ShutdownTrigger,
    server: Option<RunningServer>,
    http: reqwest::Client,
    _temp: Option<tempfile::TempDir>,
}

/// Bound on a graceful shutdown in these tests: far above the few milliseconds one takes, so
/// only a shutdown that waits for something that never ends runs into it.
pub const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

pub fn test_config(dir: &Path) -> Config {
    let mut config = Config::new(dir);
    config.listen = "127.0.0.1:0".parse().unwrap();
    config
}

impl Daemon {
    /// A daemon on a fresh temporary data dir, default limits.
    pub async fn start() -> Daemon {
        Daemon::start_with(|_| {}).await
    }

    /// A daemon on a fresh temporary data dir, config adjusted by `adjust`.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Daemon {
        let temp = tempfile::tempdir().unwrap();
        let mut config = test_config(temp.path());
        adjust(&mut config);
        let mut d = Daemon::start_config(config).await.unwrap();
        d._temp = Some(temp);
        d
    }

    /// A daemon with exactly `config`.
    pub async fn start_config(config: Config) -> Result<Daemon, narad_host::ServerError> {
        let (trigger, signal) = shutdown::channel();
        let dir = config.data_dir.clone();
        let server = run_server(config, signal).await?;
        Ok(Daemon {
            url: format!("http://{}", server.local_addr()),
            dir,
            trigger,
            server: Some(server),
            http: reqwest::Client::new(),
            _temp: None,
        })
    }

    /// Shuts down gracefully and waits for the store to close; keeps the data dir. A shutdown
    /// that does not finish within [`STOP_WAIT`] fails the test instead of hanging it.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        self.trigger.trigger();
        let server = self.server.take().unwrap();
        tokio::time::timeout(STOP_WAIT, server.wait())
            .await
            .expect("the daemon did not shut down")
            .unwrap();
        self._temp.take()
    }

    /// Stops and starts again on the same data dir.
    pub async fn restart(self) -> Daemon {
        let dir = self.dir.clone();
        let temp = self.stop().await;
        let mut d = Daemon::start_config(test_config(&dir)).await.unwrap();
        d._temp = temp;
        d
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {status} {text:?}"));
        if !status.is_success() {
            assert!(
                body["error"].as_str().is_some_and(|m| !m.is_empty()),
                "error answer without an error message: {body}"
            );
        }
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.get(format!("{}{path}", self.url)))
            .await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.delete(format!("{}{path}", self.url)))
            .await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.http.post(format!("{}{path}", self.url)).json(&body))
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.http.put(format!("{}{path}", self.url)).json(&body))
            .await
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.http.patch(format!("{}{path}", self.url)).json(&body))
            .await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
    ) -> (StatusCode, Value) {
        self.send(self.http.post(format!("{}{path}", self.url)).body(body))
            .await
    }

    pub async fn create_topic(&self, name: &str, partitions: u32) {
        let (status, body) = self
            .post(
                "/v1/topics",
                json!({"name": name, "partitions": partitions}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    pub async fn produce(&self, topic: &str, records: Value) -> Vec<(u32, u64)> {
        let (status, body) = self
            .post(
                &format!("/v1/topics/{topic}/records"),
                json!({"records": records}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["partition"].as_u64().unwrap() as u32,
                    o["offset"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// Every record of a partition, from the log start.
    pub async fn fetch_all(&self, topic: &str, partition: u32) -> Vec<Value> {
        let mut out = Vec::new();
        let mut offset = None;
        loop {
            let query = offset.map_or(String::new(), |o: u64| format!("?offset={o}"));
            let (status, body) = self
                .get(&format!(
                    "/v1/topics/{topic}/partitions/{partition}/records{query}"
                ))
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            out.extend(body["records"].as_array().unwrap().iter().cloned());
            let next = body["next_offset"].as_u64().unwrap();
            offset = Some(next);
            if next >= body["high_watermark"].as_u64().unwrap() {
                return out;
            }
        }
    }

    /// A daemon whose retention trims soon after a topic outgrows it: 1 KiB segments, checked
    /// every 50 ms.
    pub async fn start_trimming() -> Daemon {
        Daemon::start_with(|c| {
            c.segment_bytes = 1024;
            c.retention_check_interval = std::time::Duration::from_millis(50);
        })
        .await
    }

    /// Creates `topic`: one partition that keeps about 2 KiB.
    pub async fn create_trimmed_topic(&self, topic: &str) {
        let (status, body) = self
            .post(
                "/v1/topics",
                json!({"name": topic, "partitions": 1, "retention_bytes": 2048}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// Produces [`TRIMMED_RECORDS`] records of 300 bytes to `topic` (record `n` holds
    /// [`trimmed_value`]`(n)`), more than its retention keeps, and waits until retention has
    /// moved its log start and left it there for five checks; returns the log start.
    pub async fn produce_past_retention(&self, topic: &str) -> u64 {
        for n in 0..TRIMMED_RECORDS {
            self.produce(topic, json!([{"value": trimmed_value(n)}]))
                .await;
        }
        let (mut log_start, mut steady) = (0, 0);
        // Retention runs in the background: poll (bounded) until it has moved and stopped.
        for _ in 0..600 {
            let (_, desc) = self.get(&format!("/v1/topics/{topic}")).await;
            let now = desc["partition_stats"][0]["log_start_offset"]
                .as_u64()
                .unwrap();
            steady = if now == log_start && now > 0 {
                steady + 1
            } else {
                0
            };
            log_start = now;
            if steady == 5 {
                return log_start;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("retention never moved the log start of {topic} and left it (at {log_start})");
    }

    /// High watermark of each partition, by fetching (which opens the log, so it is exact).
    pub async fn high_watermarks(&self, topic: &str) -> Vec<u64> {
        let (status, body) = self.get(&format!("/v1/topics/{topic}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let n = body["partitions"].as_u64().unwrap() as u32;
        let mut out = Vec::new();
        for p in 0..n {
            let (status, body) = self
                .get(&format!("/v1/topics/{topic}/partitions/{p}/records?max=1"))
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            out.push(body["high_watermark"].as_u64().unwrap());
        }
        out
    }
}

/// Records [`Daemon::produce_past_retention`] writes.
pub const TRIMMED_RECORDS: u64 = 20;

/// The value of record `n` of [`Daemon::produce_past_retention`]: `n` zero-padded to 300
/// bytes.
pub fn trimmed_value(n: u64) -> String {
    format!("{n:0>300}")
}
