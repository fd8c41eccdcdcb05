//! Starting, killing and talking to a real `narad serve` process.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a daemon may take to answer `/healthz` after start, recovery included. Generous
/// because CI machines are busy; a healthy start takes milliseconds.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Path of the `narad` binary: the one cargo built for these tests, from this package.
/// The random source of a crash loop or a random workload, one stream per `name`: derived from
/// one seed per test run, taken from `NARAD_TEST_SEED` when set, else from the OS, and printed
/// (shown with a failing test's output), so a failed run can be replayed with the same choices.
pub fn seeded_rng(name: &str) -> rand::rngs::StdRng {
    use rand::SeedableRng as _;
    static RUN_SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let run = *RUN_SEED.get_or_init(|| {
        std::env::var("NARAD_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random::<u64>)
    });
    eprintln!("{name}: random stream of run seed {run} (replay with NARAD_TEST_SEED={run})");
    // FNV-1a of the name: each stream differs, and the same name gets the same stream.
    let of_name = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    rand::rngs::StdRng::seed_from_u64(run ^ of_name)
}

pub fn narad_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

/// A free loopback port. The listener is dropped before the daemon binds it, so another
/// process could take it in between; `Daemon::start` retries on a failed bind.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// A running `narad serve` process; killed (SIGKILL) when dropped.
pub struct Daemon {
    child: Option<Child>,
    data_dir: PathBuf,
    addr: SocketAddr,
    log_path: PathBuf,
    extra_args: Vec<String>,
    /// A command the daemon is started under (e.g. `prlimit --nofile=256:4096`); empty: none.
    launcher: Vec<String>,
    /// The client that checks health: over TLS, one that trusts the daemon's CA.
    health: Health,
}

/// How [`Daemon`] reaches `/healthz`: over TLS, trusting `ca` and presenting `identity`
/// (certificate and key files) when set.
#[derive(Clone)]
struct Health {
    scheme: &'static str,
    ca: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
}

impl Health {
    fn plain() -> Health {
        Health {
            scheme: "http",
            ca: None,
            identity: None,
        }
    }

    /// A client made for one wait and dropped after it, so no connection of it stays open
    /// (tests count the connections the daemon closes).
    fn client(&self) -> reqwest::blocking::Client {
        tls_client(
            self.ca.as_deref(),
            self.identity
                .as_ref()
                .map(|(c, k)| (c.as_path(), k.as_path())),
        )
    }
}

/// A blocking client with the test timeouts, trusting the CA certificate file `ca` when given
/// and presenting `identity` (certificate and key files) when given.
pub fn tls_client(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> reqwest::blocking::Client {
    let mut builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).expect("read the CA file");
        builder = builder.add_root_certificate(
            reqwest::Certificate::from_pem(&pem).expect("a PEM CA certificate"),
        );
    }
    if let Some((cert, key)) = identity {
        let mut both = std::fs::read(cert).expect("read the client certificate");
        both.extend(std::fs::read(key).expect("read the client key"));
        builder = builder.identity(reqwest::Identity::from_pem(&both).expect("identity"));
    }
    builder.build().expect("client")
}

impl Daemon {
    /// Starts `narad serve` on `data_dir` and waits until `/healthz` answers.
    pub fn start(data_dir: &Path) -> Daemon {
        Self::start_with(data_dir, &[])
    }

    /// Like [`Daemon::start`], with extra command-line arguments for `narad serve`.
    pub fn start_with(data_dir: &Path, extra_args: &[&str]) -> Daemon {
        Daemon::launch(data_dir, &[], extra_args, Health::plain())
    }

    /// Like [`Daemon::start_with`], with `narad serve` run by `launcher` (a program and its
    /// arguments that execs the command after it, such as `prlimit --nofile=256:4096`).
    pub fn start_under(data_dir: &Path, launcher: &[&str], extra_args: &[&str]) -> Daemon {
        Daemon::launch(data_dir, launcher, extra_args, Health::plain())
    }

    /// Like [`Daemon::start_with`] for a daemon serving TLS (`extra_args` give `--tls-cert`
    /// and `--tls-key`): health is asked over https trusting the CA certificate `ca` (and
    /// presenting `identity`, a certificate and key file, when the daemon asks for one);
    /// [`Daemon::url`] is `https://`.
    pub fn start_tls(
        data_dir: &Path,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        extra_args: &[&str],
    ) -> Daemon {
        let health = Health {
            scheme: "https",
            ca: Some(ca.to_path_buf()),
            identity: identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
        };
        Daemon::launch(data_dir, &[], extra_args, health)
    }

    /// Starts the process and waits until its health is answered.
    fn launch(data_dir: &Path, launcher: &[&str], extra_args: &[&str], health: Health) -> Daemon {
        let mut daemon = Daemon {
            child: None,
            data_dir: data_dir.to_path_buf(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path: data_dir.with_extension("log"),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            launcher: launcher.iter().map(|s| s.to_string()).collect(),
            health,
        };
        daemon.spawn();
        daemon
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The listen address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends SIGTERM and waits up to `within` for the process to exit. Returns its exit status,
    /// or `None` when it was still running at the deadline (it is then left to `Drop`).
    pub fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn spawn(&mut self) {
        self.spawn_on(None);
    }

    /// Starts the process, on `fixed` when given (retrying while the port is still taken),
    /// else on a fresh free port.
    fn spawn_on(&mut self, fixed: Option<SocketAddr>) {
        for _attempt in 0..5 {
            self.addr = fixed.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], free_port())));
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)
                .expect("open daemon log");
            let mut command = match self.launcher.split_first() {
                Some((program, args)) => {
                    let mut c = Command::new(program);
                    c.args(args).arg(narad_binary());
                    c
                }
                None => Command::new(narad_binary()),
            };
            let child = command
                .arg("serve")
                .arg("--data-dir")
                .arg(&self.data_dir)
                .arg("--listen")
                .arg(self.addr.to_string())
                .args(&self.extra_args)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone log handle"))
                .stderr(log)
                .spawn()
                .expect("spawn narad serve");
            self.child = Some(child);
            if self.wait_healthy() {
                return;
            }
            self.kill9();
        }
        panic!("narad serve did not become healthy; log:\n{}", self.log());
    }

    fn wait_healthy(&mut self) -> bool {
        let deadline = Instant::now() + START_TIMEOUT;
        let client = self.health.client();
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_status)) = child.try_wait()
            {
                return false;
            }
            if let Ok(resp) = client.get(format!("{}/healthz", self.url())).send()
                && resp.status().is_success()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Base URL, e.g. `http://127.0.0.1:41234` (`https://` for [`Daemon::start_tls`]).
    pub fn url(&self) -> String {
        format!("{}://{}", self.health.scheme, self.addr)
    }

    /// Kills the process with SIGKILL (no shutdown hook runs) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with SIGSTOP (a hung node: its sockets stay open, nothing runs);
    /// [`Daemon::resume`] lets it run again.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a process stopped by [`Daemon::pause`] run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("a running daemon");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// Starts the daemon again on the same data directory (after [`Daemon::kill9`]).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Like [`Daemon::restart`], on the same address: for a daemon other processes were told
    /// the address of (a remote child's target).
    pub fn restart_same_port(&mut self) {
        self.kill9();
        let addr = self.addr;
        self.spawn_on(Some(addr));
    }

    /// Everything the daemon processes wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log_path) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The peer secret the nodes of `cluster` share, read from the etcd at `endpoint` (plain
/// HTTP) as a node holding the cluster's etcd credentials could.
pub fn peer_secret(endpoint: &str, cluster: &str) -> String {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let mut etcd = narad_host::metastore::etcd::connect_client(&[endpoint.to_owned()])
                .await
                .expect("etcd");
            let got = etcd
                .get(format!("/narad/{cluster}/peer-secret"), None)
                .await
                .expect("read the peer secret");
            String::from_utf8(got.kvs()[0].value().to_vec()).expect("utf-8 secret")
        })
}

/// A blocking HTTP client with timeouts suited to tests.
pub fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Sends `body` as JSON and returns the status and the parsed JSON answer.
pub fn send_json(
    client: &reqwest::blocking::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<&Value>,
) -> reqwest::Result<(u16, Value)> {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send()?;
    let status = response.status().as_u16();
    let text = response.text()?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

/// The daemon's `/metrics` text.
pub fn scrape(base: &str) -> String {
    http_client()
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("scrape /metrics")
}

/// One sample of a scrape by its series name, labels included as the text shows them
/// (`narad_x{a="1"}`); `None` when the series is not there.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.trim().parse().ok())?
    })
}

/// Reads every record of a partition from its log start to its high watermark.
pub fn fetch_all(
    client: &reqwest::blocking::Client,
    base: &str,
    topic: &str,
    partition: u32,
) -> Vec<Value> {
    let mut records = Vec::new();
    let mut offset = 0u64;
    loop {
        let url = format!(
            "{base}/v1/topics/{topic}/partitions/{partition}/records?offset={offset}&max=1000"
        );
        let (status, body) = send_json(client, reqwest::Method::GET, &url, None).expect("fetch");
        assert_eq!(status, 200, "fetch {url}: {body}");
        let batch = body["records"].as_array().cloned().unwrap_or_default();
        let next = body["next_offset"].as_u64().expect("next_offset");
        let high = body["high_watermark"].as_u64().expect("high_watermark");
        records.extend(batch);
        if next >= high {
            return records;
        }
        offset = next;
    }
}

/// Runs the real `narad` command line (`args[0]` its command) against the daemon at `base`;
/// returns its standard output, failing the test with its standard error when it fails.
pub fn narad_cli(base: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(narad_binary())
        .args([args[0], "--url", base])
        .args(&args[1..])
        .output()
        .expect("run narad");
    assert!(
        out.status.success(),
        "narad {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
