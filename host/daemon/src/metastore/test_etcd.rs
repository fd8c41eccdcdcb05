//! A real etcd server for tests: started from `PATH` on free loopback ports with its data on a
//! RAM disk (etcd 3.4 cannot skip fsync; `/dev/shm` makes it cheap), stopped and removed when
//! the guard drops, also when the test fails. `scripts/test-all` installs `etcd-server`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long etcd may take to answer its first request after starting.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// One running etcd; killed (SIGKILL) and its data dir removed on drop.
pub struct TestEtcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    /// Serve clients over TLS with this certificate, key and client CA (`--client-cert-auth`).
    tls: Option<EtcdTlsFiles>,
}

/// The files of an etcd that serves its clients over TLS and asks them for certificates.
#[derive(Debug, Clone)]
pub struct EtcdTlsFiles {
    /// The server's certificate (PEM), for 127.0.0.1.
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
    /// The CA client certificates must be signed by (PEM).
    pub client_ca: PathBuf,
}

/// Fresh starts tried, each on new ports, before a test fails: a port found free can be taken
/// by another test's server before etcd binds it, and etcd then exits at once.
const START_ATTEMPTS: usize = 5;

/// Two distinct loopback ports that were free a moment ago (both held until both are known, so
/// they differ).
fn two_free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let b = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    (
        a.local_addr().expect("local addr").port(),
        b.local_addr().expect("local addr").port(),
    )
}

impl TestEtcd {
    /// Starts etcd and waits until it serves; panics (failing the test) with the reason when
    /// the binary is missing or the server does not come up.
    pub fn start() -> TestEtcd {
        TestEtcd::start_with(None)
    }

    /// [`TestEtcd::start`] serving clients over TLS (`https://`) and asking each for a
    /// certificate `tls.client_ca` signed.
    pub fn start_tls(tls: EtcdTlsFiles) -> TestEtcd {
        TestEtcd::start_with(Some(tls))
    }

    fn start_with(tls: Option<EtcdTlsFiles>) -> TestEtcd {
        let shm = PathBuf::from("/dev/shm");
        let base = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        let data_dir = tempfile::Builder::new()
            .prefix("narad-test-etcd-")
            .tempdir_in(base)
            .expect("create the etcd data dir")
            .keep();
        let (client_port, peer_port) = two_free_ports();
        let mut etcd = TestEtcd {
            child: None,
            client_port,
            peer_port,
            data_dir,
            tls,
        };
        let mut failures = Vec::new();
        while failures.len() < START_ATTEMPTS {
            match etcd.spawn_and_wait() {
                Ok(()) => return etcd,
                Err(why) => {
                    failures.push(why);
                    etcd.stop();
                    // Nothing of a server that never served is worth keeping.
                    let _ = std::fs::remove_dir_all(&etcd.data_dir);
                    (etcd.client_port, etcd.peer_port) = two_free_ports();
                }
            }
        }
        panic!(
            "etcd did not start in {START_ATTEMPTS} tries on fresh ports: {}",
            failures.join("; ")
        );
    }

    /// Starts the stopped server again on the same ports and data (its history kept).
    pub fn start_again(&mut self) {
        if let Err(why) = self.spawn_and_wait() {
            panic!("{why}");
        }
    }

    /// Spawns etcd on this guard's ports and data and waits until it serves.
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "etcd is already running");
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()))
                .arg(format!("--trusted-ca-file={}", tls.client_ca.display()))
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name=narad-test")
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=narad-test={peer}"))
            .arg("--log-level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `etcd` from PATH ({e}); the cluster tests need etcd 3.4: \
                     run scripts/test-all, which installs Debian's etcd-server"
                )
            });
        self.child = Some(child);
        self.wait_until_serving()
    }

    /// Kills the server (SIGKILL), keeping its data for [`TestEtcd::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and starts the server again: every client connection and watch is cut.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// The client URL, e.g. `http://127.0.0.1:40123` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn wait_until_serving(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().expect("poll etcd")
            {
                self.child = None;
                return Err(format!(
                    "etcd exited during start-up with {status} (ports {} and {})",
                    self.client_port, self.peer_port
                ));
            }
            // A one-member cluster elects itself as soon as it listens; the client's request
            // timeout covers the rest.
            if std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_ok() {
                // Still running: the listener that answered is this etcd's, not another
                // server's that took the port before etcd could bind it.
                if let Some(child) = self.child.as_mut()
                    && child.try_wait().expect("poll etcd").is_none()
                {
                    return Ok(());
                }
                continue;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "etcd did not listen on {} within {STARTUP_TIMEOUT:?}",
                    self.endpoint()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A TCP relay to etcd that can be frozen: while frozen it moves no bytes either way but keeps
/// every connection open, as a half-open connection or a stuck middlebox would, so a watch
/// through it goes silent without ending. Its threads stop when it drops.
pub struct FreezingProxy {
    port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FreezingProxy {
    /// Relays a free loopback port to `127.0.0.1:upstream_port`.
    pub fn start(upstream_port: u16) -> FreezingProxy {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("nonblocking proxy listener");
        let port = listener.local_addr().expect("proxy addr").port();
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (frozen_t, stop_t) = (Arc::clone(&frozen), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop_t.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((downstream, _)) => {
                        let Ok(upstream) =
                            std::net::TcpStream::connect(("127.0.0.1", upstream_port))
                        else {
                            continue;
                        };
                        for (from, to) in [
                            (downstream.try_clone(), upstream.try_clone()),
                            (upstream.try_clone(), downstream.try_clone()),
                        ] {
                            let (Ok(from), Ok(to)) = (from, to) else {
                                continue;
                            };
                            let (frozen, stop) = (Arc::clone(&frozen_t), Arc::clone(&stop_t));
                            std::thread::spawn(move || pump(from, to, &frozen, &stop));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        FreezingProxy { port, frozen, stop }
    }

    /// The relay's client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops (`true`) or resumes (`false`) moving bytes. A freeze returns once no relay
    /// thread can still be forwarding bytes it read before the flag flipped (each reads for at
    /// most 20 ms between looks at the flag).
    pub fn freeze(&self, frozen: bool) {
        self.frozen
            .store(frozen, std::sync::atomic::Ordering::Relaxed);
        if frozen {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    frozen: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read as _, Write as _};
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        if frozen.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl TestEtcd {
    /// The client port (for a relay in front of it).
    pub fn client_port(&self) -> u16 {
        self.client_port
    }
}
