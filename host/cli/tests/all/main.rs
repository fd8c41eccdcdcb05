//! The integration tests of the daemon and its command line, one binary:
//!
//! - [`bench_smoke`]: `narad bench` at tiny sizes (it runs, it reports, nothing is lost);
//! - [`api`]: the daemon in this process on 127.0.0.1:0, driven over real HTTP and the CLI;
//! - [`e2e`]: real `narad serve` processes (the binary cargo built for these tests), killed
//!   with SIGKILL where the promise is about a crash, with a real etcd and real Kafka clients;
//! - [`plugins_api`]: the plugin registry, its HTTP API and CLI.
//!
//! Run a part with a filter: `cargo test -p narad --test all e2e::cluster::`.

// Tests may unwrap: a panic is how they fail.
#![allow(clippy::unwrap_used, missing_docs)]

mod api;
mod bench_smoke;
mod e2e;
// The full-device harness lives with the storage tests, which use it too.
#[path = "../../../storage/tests/all/common/full_device.rs"]
mod full_device;
mod metastore_files;
mod plugins_api;
