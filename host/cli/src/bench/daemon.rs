//! Real `narad serve` processes for the benches that measure the daemon from outside
//! ([`super::cluster`], [`super::requests`]): started on free loopback ports, waited for,
//! their CPU read from `/proc`, stopped (SIGTERM, then SIGKILL) and killed when dropped; and
//! the benches' HTTP calls to them.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_host::api::types::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::BenchError;

/// How long a daemon may take to answer `/healthz`.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at starting a daemon whose process exits at once (its free port was taken).
const START_ATTEMPTS: u32 = 5;
/// Longest wait for one HTTP call; a busy debug build answers large produces in seconds.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections idle longer than this are not reused: the daemon closes idle ones after 5 s,
/// and a request sent on a connection the daemon is closing fails.
const POOL_IDLE: Duration = Duration::from_secs(2);
/// How long a daemon gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Lines of a daemon's log quoted in an error.
const LOG_TAIL_LINES: usize = 20;
/// Bytes read from the end of a daemon's log for that.
const LOG_TAIL_BYTES: u64 = 16 << 10;

/// One `narad serve` child process. Dropping it kills the process (SIGKILL) and reaps it.
pub(super) struct Node {
    /// Its name in errors (and its node id in a cluster).
    pub(super) id: String,
    /// `http://127.0.0.1:<port>`.
    pub(super) url: String,
    log_path: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Starts `narad serve --data-dir {data_dir} --listen 127.0.0.1:<free port> {extra}` and
    /// waits until it answers `/healthz`.
    pub(super) async fn start(
        http: &reqwest::Client,
        id: &str,
        data_dir: &Path,
        extra: &[String],
    ) -> Result<Node, BenchError> {
        let binary =
            std::env::current_exe().map_err(BenchError::io("finding this program's path"))?;
        Node::start_binary(http, &binary, id, data_dir, extra).await
    }

    /// [`Node::start`] with another `narad` executable (another build, to compare).
    pub(super) async fn start_binary(
        http: &reqwest::Client,
        binary: &Path,
        id: &str,
        data_dir: &Path,
        extra: &[String],
    ) -> Result<Node, BenchError> {
        let log_path = data_dir.with_extension("log");
        let mut node = Node {
            id: id.to_owned(),
            url: String::new(),
            log_path,
            child: None,
        };
        for _attempt in 0..START_ATTEMPTS {
            let port = free_port()?;
            node.url = format!("http://127.0.0.1:{port}");
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&node.log_path)
                .map_err(BenchError::io(format!(
                    "opening {}",
                    node.log_path.display()
                )))?;
            let log_err = log.try_clone().map_err(BenchError::io(format!(
                "opening {}",
                node.log_path.display()
            )))?;
            let child = Command::new(binary)
                .arg("serve")
                .arg("--data-dir")
                .arg(data_dir)
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .args(extra)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .spawn()
                .map_err(BenchError::io(format!(
                    "starting {} serve",
                    binary.display()
                )))?;
            node.child = Some(child);
            if node.wait_healthy(http).await? {
                return Ok(node);
            }
            // It exited: most likely another process took the port in between. Try another.
            node.kill();
        }
        Err(node.failed(format!(
            "`narad serve` exited at start {START_ATTEMPTS} times"
        )))
    }

    /// Waits until `/healthz` answers: true, or false when the process exited first.
    async fn wait_healthy(&mut self, http: &reqwest::Client) -> Result<bool, BenchError> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_status)) = child.try_wait()
            {
                return Ok(false);
            }
            let answer = http
                .get(format!("{}/healthz", self.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(self.failed(format!(
            "did not answer /healthz within {} s",
            START_TIMEOUT.as_secs()
        )))
    }

    /// Its process id while it runs.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// An error naming this node, with the end of its log.
    pub(super) fn failed(&self, reason: String) -> BenchError {
        BenchError::Daemon {
            node: self.id.clone(),
            reason,
            log: log_tail(&self.log_path),
        }
    }

    /// SIGTERM, up to [`STOP_GRACE`] to exit, then SIGKILL.
    pub(super) async fn stop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let pid = rustix::process::Pid::from_child(child);
        if rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_ok() {
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.kill();
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Already gone is fine: either way it is reaped below.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last [`LOG_TAIL_LINES`] lines of a log file, or a note that it could not be read.
fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            format!("\n--- end of {}:\n{}", path.display(), tail.join("\n"))
        }
        Err(e) => format!("\n(its log {} could not be read: {e})", path.display()),
    }
}

/// A free loopback port: bound and released, so another process may take it before the
/// daemon binds it ([`Node::start`] tries again then).
pub(super) fn free_port() -> Result<u16, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(BenchError::io("binding a free loopback port"))?;
    Ok(listener
        .local_addr()
        .map_err(BenchError::io("reading a bound port"))?
        .port())
}

/// CPU time a process has used so far, user space and kernel apart.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ProcessCpu {
    /// Time in user space.
    pub(super) user: Duration,
    /// Time in the kernel (system calls: writes, syncs, sockets).
    pub(super) system: Duration,
}

impl ProcessCpu {
    /// User plus system.
    pub(super) fn total(self) -> Duration {
        self.user + self.system
    }

    /// What was used between `earlier` and this sample.
    pub(super) fn since(self, earlier: ProcessCpu) -> ProcessCpu {
        ProcessCpu {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// CPU time of process `pid` (`/proc/<pid>/stat`; [`super::sys::cpu_time`] reads only this
/// process's), to the kernel's tick of 10 ms.
pub(super) fn process_cpu(pid: u32) -> Option<ProcessCpu> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3; utime and stime are fields 14 and 15, in USER_HZ (100) ticks.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(ProcessCpu {
        user: Duration::from_millis(utime * 10),
        system: Duration::from_millis(stime * 10),
    })
}

/// The HTTP client of the bench: timeouts on every call, no reuse of near-idle connections.
pub(super) fn http_client() -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .pool_idle_timeout(POOL_IDLE)
        .build()
        .map_err(|e| BenchError::Http {
            context: "building the HTTP client".into(),
            reason: e.to_string(),
        })
}

/// One call; a non-2xx answer is an error carrying the daemon's message.
pub(super) async fn call<T: DeserializeOwned>(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Bytes>,
) -> Result<T, BenchError> {
    let failed = |reason: String| BenchError::Http {
        context: format!("{method} {url}"),
        reason,
    };
    let mut request = http.request(method.clone(), url);
    if let Some(body) = body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
    }
    let answer = request.send().await.map_err(|e| failed(e.to_string()))?;
    let status = answer.status();
    let bytes = answer.bytes().await.map_err(|e| failed(e.to_string()))?;
    if !status.is_success() {
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|b| b.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        return Err(failed(format!("HTTP {status}: {message}")));
    }
    serde_json::from_slice(&bytes).map_err(|e| failed(format!("unexpected answer: {e}")))
}

/// `value` as a JSON request body.
pub(super) fn json_body(value: &impl Serialize) -> Result<Bytes, BenchError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| BenchError::Http {
            context: "encoding a request".into(),
            reason: e.to_string(),
        })
}
