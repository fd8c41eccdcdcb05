//! The Narad fan-out host: the daemon library behind the `narad` binary (whose command line
//! is the `narad` crate in `host/cli`; nothing here depends on it).
//!
//! Layout:
//! - [`config`]: `narad serve` flags, environment and TOML config file, merged into [`Config`];
//!   [`auth`]: the API bearer token it loads and the API checks; [`scram`]: users' salted
//!   credentials and the server side of a SCRAM exchange; [`acl`]: allow rules and the one
//!   decision every listener asks.
//! - [`shutdown`]: the shutdown trigger/signal every loop and the HTTP server select on.
//! - [`metastore`]: the [`metastore::Metastore`] trait (topics, a version per domain, a
//!   linearizable `confirm`) and its embedded file implementation.
//! - [`ownership`]: which node owns a partition (on one node: this one, always).
//! - [`produce`]: placement (explicit, Kafka key hash, round-robin) and the one commit path to a
//!   partition log, shared by produce and (later) child commits.
//! - [`topics`]: topic administration keeping metastore and partition directories in step:
//!   intent records, start-up accounting of `topics/`, the set-aside area, the metastore
//!   rebuild; `durable`: the file system their bookkeeping files are written through (real in
//!   production, a fault-injecting one in crash tests).
//! - [`blocking`]: the one way async code runs blocking work, and its error.
//! - [`fanout`]: the cursors that copy a parent partition into a child, one file per step
//!   (position, read, route, bucket, commit, advance), with the delay gate, drop-behind and lag
//!   reporting.
//! - [`reconciler`]: starts and stops cursors to match the links and owned partitions.
//! - [`operations`]: planned moves, re-creation of a dead node's partitions and of a lost one.
//! - [`plugins`]: the plugin registry (content-addressed modules, versions, resolve, load).
//! - [`api`]: the HTTP API (axum), one module per resource, and its JSON types.
//! - [`kafka`]: the Kafka protocol listener (`--kafka-listen`), beside the HTTP API over the
//!   same produce and read paths.
//! - [`protocol`]: the API's bodies as types, below everything, so the API, the transports and
//!   the CLI share them; [`peer`]: the one client for calls between nodes, the one for other
//!   clusters, and the produce to another narad both use.
//! - [`server`]: start-up, background loops (retention, idle close), graceful shutdown.
//! - [`http_server`]: the HTTP accept loop: connection cap, header and idle timeouts, a
//!   shutdown bounded in time; [`fdlimit`]: the descriptor limit raised at start; [`tls`]:
//!   the listeners' TLS, reloaded when its files change.
//!
//! Data flows one way: API -> topics/produce -> `narad_storage::Store`; the metastore is the
//! source of truth for which topics and partitions exist.
//!
//! Modules are layered, lowest first, and a module imports only from layers below its own
//! (`layering`, a test, checks every `crate::` path in `src/` against its `LAYERS`, and this
//! list and `docs/architecture.md`'s against `LAYERS`):
//! 1. `protocol`: the bodies narad processes and clients exchange, as types; then
//!    `shutdown`, `durable`, `ownership`, `fdlimit`, `auth`, `scram`, `acl`, then `blocking`,
//!    then `tls`: small leaves; then `peer`: the one transport between narad processes;
//! 2. `config`: settings, read by anything above;
//! 3. `metastore`: pure data and the link rules (with the link limits), on a file or etcd;
//! 4. `cluster`: membership, placement, ownership from the metadata, the commit receiver;
//! 5. `produce`, then `topics`, then `plugins` and `groups`: the write path, topic
//!    administration, the plugin registry, the consumer-group coordinator;
//! 6. `fanout`: one cursor, its vocabulary (`CursorKey`, `RouterFactory`) and its status
//!    (`FanoutView`);
//! 7. `reconciler`: starts and stops cursors and fills the `FanoutView`; then `operations`:
//!    the operator's actions that move or re-create a partition's data;
//! 8. `api` and `kafka` (side by side, neither imports the other), then `http_server`, then
//!    `server`.

// Tests may unwrap: a panic there is a test failure with its location.
#![cfg_attr(test, allow(clippy::unwrap_used))]
// `pub` only where another crate can reach the item: everything else is `pub(crate)`, so the
// public surface is what the command line and the tests use, and says so.
#![warn(unreachable_pub)]

pub mod acl;
pub mod api;
pub mod auth;
pub mod blocking;
pub mod cluster;
pub mod config;
mod durable;
pub mod fanout;
pub mod fdlimit;
pub mod groups;
pub(crate) mod http_server;
pub(crate) mod kafka;
#[cfg(test)]
mod layering;
pub mod metastore;
pub mod operations;
pub mod ownership;
pub mod peer;
pub mod plugins;
pub mod produce;
pub mod protocol;
pub mod reconciler;
pub mod scram;
pub mod server;
pub mod shutdown;
pub mod tls;
pub mod topics;

pub use config::Config;
pub use server::{RunningServer, ServerError, run_server};
