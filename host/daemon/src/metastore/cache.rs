//! A watched copy of every key under one etcd prefix: one range read, then a watch from the
//! next revision, so each node reads the cluster's metadata from memory and hears of a change
//! within a round trip.
//!
//! The Rust client does not re-create a watch that ends, so this loop does, and keeps these
//! promises:
//! - **Resume, do not skip.** A watch that ends or errors (etcd restarted, connection lost) is
//!   re-created from the revision after the last one applied: no event is missed or applied
//!   twice.
//! - **Re-read on compaction.** When the revision to resume from has been compacted away, the
//!   events are gone: the copy is rebuilt from a fresh range read (which also drops keys
//!   deleted meanwhile) and the watch starts after it.
//! - **Silence is a stall.** A watch can stop delivering without ending (a half-open
//!   connection, a stuck proxy). The loop asks etcd for a progress report every
//!   [`CacheTiming::progress_every`]; etcd answers even when nothing changed, so no answer at
//!   all for [`CacheTiming::stall_after`] means the watch is dead: it is dropped, counted, and
//!   re-created from the last revision.
//!
//! The copy is published as a [`CacheView`] (revision + entries) through a `watch` channel;
//! readers never block the loop. It is never more than "behind": a reader that must not act
//! on stale data (an anchor, a cursor-file deletion) uses a linearizable read instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, EventType, WatchOptions};
use tokio::sync::watch;

use crate::shutdown::ShutdownSignal;

/// How often the cache asks for progress, when it declares a stall, and how long it pauses
/// before retrying a failed read or watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTiming {
    /// Interval between progress requests on a quiet watch.
    pub(crate) progress_every: Duration,
    /// No message (event or progress) for this long: the watch is declared stalled.
    pub(crate) stall_after: Duration,
    /// Pause before retrying a failed range read or watch creation.
    pub(crate) retry_pause: Duration,
}

impl Default for CacheTiming {
    /// 2 s progress requests, a stall after 6 s (three unanswered requests), 500 ms retries:
    /// a dead watch is replaced well inside the 10 s node lease.
    fn default() -> CacheTiming {
        CacheTiming {
            progress_every: Duration::from_secs(2),
            stall_after: Duration::from_secs(6),
            retry_pause: Duration::from_millis(500),
        }
    }
}

/// The copy at one revision.
#[derive(Debug, Clone, Default)]
pub(crate) struct CacheView {
    /// The etcd revision the copy reflects (every event up to it is applied); 0 before the
    /// first read. After a full read this is etcd's revision at the read, which counts writes
    /// under other prefixes too: a peer's copy, moved only by this prefix's events, may never
    /// reach it. Send [`CacheView::data_revision`] to others instead.
    pub(crate) revision: i64,
    /// The newest modification revision among the keys the copy holds or saw deleted: the
    /// revision of the metadata itself. A peer whose copy reflects it holds everything this
    /// copy does (every metadata write bumps a key the copy keeps).
    pub(crate) data_revision: i64,
    /// Every key under the prefix (the prefix stripped), with its value. The map of each
    /// revision is the previous one's changed by its events, sharing every key they did not
    /// touch: cloning it is a reference count, and `diff` with an older one visits only the
    /// keys changed since.
    pub entries: super::Items<String, Bytes>,
}

/// Counters of the loop, for metrics and tests.
#[derive(Debug, Default)]
pub(crate) struct CacheHealth {
    /// Full range reads (the first one, and one per compaction or failed resume).
    pub(crate) full_reads: AtomicU64,
    /// Watches re-created after they ended or failed.
    pub resumes: AtomicU64,
    /// Watches dropped because they went silent.
    pub(crate) stalls: AtomicU64,
    /// Watches that found their revision compacted.
    pub(crate) compactions: AtomicU64,
}

/// A watched copy of one prefix.
pub(crate) struct PrefixCache {
    view: watch::Receiver<CacheView>,
    health: Arc<CacheHealth>,
}

/// Why the watch loop went back to a full read.
enum Restart {
    /// Resume the watch from the last revision.
    Resume,
    /// The revision is compacted: read everything again.
    Reread,
}

impl PrefixCache {
    /// Reads the prefix once (failing if etcd cannot answer: the daemon should not start on an
    /// empty copy), then keeps the copy current in a background task until `shutdown`.
    pub(crate) async fn start(
        client: Client,
        prefix: String,
        timing: CacheTiming,
        shutdown: ShutdownSignal,
    ) -> Result<PrefixCache, etcd_client::Error> {
        let first = full_read(&client, &prefix).await?;
        let health = Arc::new(CacheHealth::default());
        health.full_reads.fetch_add(1, Ordering::Relaxed);
        let (sender, view) = watch::channel(first);
        let task = WatchLoop {
            client,
            prefix,
            timing,
            sender,
            health: Arc::clone(&health),
        };
        tokio::spawn(task.run(shutdown));
        Ok(PrefixCache { view, health })
    }

    /// The copy as of now.
    pub(crate) fn view(&self) -> CacheView {
        self.view.borrow().clone()
    }

    /// The loop's counters.
    pub(crate) fn health(&self) -> &CacheHealth {
        &self.health
    }

    /// Waits until the copy reflects `revision` (say, a write this node just made), for at
    /// most `limit`; returns whether it got there.
    pub(crate) async fn wait_for(&self, revision: i64, limit: Duration) -> bool {
        let mut view = self.view.clone();
        let reached = tokio::time::timeout(limit, view.wait_for(|v| v.revision >= revision)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

async fn full_read(client: &Client, prefix: &str) -> Result<CacheView, etcd_client::Error> {
    let response = super::etcd_range::read_prefix(client, prefix, false, false).await?;
    let revision = response.revision;
    let data_revision = response
        .kvs
        .iter()
        .map(etcd_client::KeyValue::mod_revision)
        .max()
        .unwrap_or(0);
    let entries = response
        .kvs
        .iter()
        .filter_map(|entry| {
            let key = entry.key().strip_prefix(prefix.as_bytes())?;
            let key = String::from_utf8(key.to_vec()).ok()?;
            Some((key, Bytes::copy_from_slice(entry.value())))
        })
        .collect();
    Ok(CacheView {
        revision,
        data_revision,
        entries,
    })
}

struct WatchLoop {
    client: Client,
    prefix: String,
    timing: CacheTiming,
    sender: watch::Sender<CacheView>,
    health: Arc<CacheHealth>,
}

impl WatchLoop {
    async fn run(self, shutdown: ShutdownSignal) {
        loop {
            let restart = tokio::select! {
                _ = shutdown.wait() => return,
                restart = self.watch_from_current() => restart,
            };
            if let Restart::Reread = restart {
                loop {
                    let read = tokio::select! {
                        _ = shutdown.wait() => return,
                        read = full_read(&self.client, &self.prefix) => read,
                    };
                    match read {
                        Ok(view) => {
                            self.health.full_reads.fetch_add(1, Ordering::Relaxed);
                            self.sender.send_replace(view);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, prefix = %self.prefix, "metadata re-read failed; retrying");
                            tokio::time::sleep(self.timing.retry_pause).await;
                        }
                    }
                }
            }
        }
    }

    /// Watches from the revision after the copy's, applying events, until the watch ends,
    /// stalls or finds its revision compacted.
    async fn watch_from_current(&self) -> Restart {
        let start = self.sender.borrow().revision + 1;
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(start)
            .with_progress_notify();
        // One answer can carry many writes' events (catching up after a pause).
        let mut watcher = self
            .client
            .watch_client()
            .max_decoding_message_size(super::etcd_range::MAX_ANSWER_BYTES);
        let mut stream = match watcher.watch(self.prefix.clone(), Some(options)).await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metadata watch could not start; retrying");
                tokio::time::sleep(self.timing.retry_pause).await;
                self.health.resumes.fetch_add(1, Ordering::Relaxed);
                return Restart::Resume;
            }
        };
        let mut progress = tokio::time::interval(self.timing.progress_every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut silent_since = tokio::time::Instant::now();
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                _ = progress.tick() => {
                    if silent_since.elapsed() >= self.timing.stall_after {
                        self.health.stalls.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            silent_for = ?silent_since.elapsed(),
                            "metadata watch went silent; re-creating it from the last revision"
                        );
                        return Restart::Resume;
                    }
                    // A failed request shows up as silence, and silence is handled above.
                    let _ = stream.request_progress().await;
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) | Err(_) => {
                    self.health.resumes.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("metadata watch ended; resuming from the last revision");
                    tokio::time::sleep(self.timing.retry_pause).await;
                    return Restart::Resume;
                }
            };
            silent_since = tokio::time::Instant::now();
            if response.compact_revision() > 0 {
                self.health.compactions.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    compacted_to = response.compact_revision(),
                    "metadata watch revision was compacted; reading everything again"
                );
                return Restart::Reread;
            }
            if response.canceled() {
                self.health.resumes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    reason = response.cancel_reason(),
                    "metadata watch cancelled by etcd; resuming"
                );
                return Restart::Resume;
            }
            self.apply(&response);
        }
    }

    fn apply(&self, response: &etcd_client::WatchResponse) {
        self.sender.send_if_modified(|view| {
            let mut entries: Option<super::Items<String, Bytes>> = None;
            let mut revision = view.revision;
            let mut newest_event = view.data_revision;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                revision = revision.max(kv.mod_revision());
                newest_event = newest_event.max(kv.mod_revision());
                let Some(key) = kv
                    .key()
                    .strip_prefix(self.prefix.as_bytes())
                    .and_then(|k| String::from_utf8(k.to_vec()).ok())
                else {
                    continue;
                };
                let map = entries.get_or_insert_with(|| view.entries.clone());
                match event.event_type() {
                    EventType::Put => {
                        map.insert(key, Bytes::copy_from_slice(kv.value()));
                    }
                    EventType::Delete => {
                        map.remove(&key);
                    }
                }
            }
            // The revision moves with applied events only. The header of an event batch or of
            // the creation answer is etcd's current revision, which can be ahead of what this
            // watch has delivered; and before etcd 3.4.25 / 3.5.8 even a progress report could
            // be (etcd issue 15220: progress sent by a watcher not yet synced; Debian ships
            // 3.4.23). Taking either would claim events not yet applied, so a reader waiting
            // for a revision could act on a copy that lacks it. Progress reports still prove
            // the watch alive (the stall check).
            let changed = entries.is_some() || revision != view.revision;
            if let Some(map) = entries {
                view.entries = map;
            }
            view.data_revision = newest_event;
            view.revision = revision;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::etcd::connect_client;
    use crate::metastore::test_etcd::TestEtcd;

    const PREFIX: &str = "/narad-test/cache/";

    /// Short, but with room for a loaded test machine: a stall threshold a busy etcd can miss
    /// would re-create the watch forever.
    fn quick() -> CacheTiming {
        CacheTiming {
            progress_every: Duration::from_millis(200),
            stall_after: Duration::from_secs(2),
            retry_pause: Duration::from_millis(50),
        }
    }

    async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        let reached = tokio::time::timeout(Duration::from_secs(15), async {
            while !check() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(reached.is_ok(), "timed out waiting for: {what}");
    }

    fn value(cache: &PrefixCache, key: &str) -> Option<String> {
        cache
            .view()
            .entries
            .get(key)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// A node started after writes outside the prefix (node keys, leases) must not name
    /// etcd's revision to its peers: their copies, moved only by this prefix's events, would
    /// never reach it, and every call they serve for it would wait its full limit.
    #[tokio::test]
    async fn the_revision_a_copy_names_to_peers_is_its_metadatas_whatever_was_written_elsewhere() {
        let etcd = TestEtcd::start();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let (trigger, signal) = crate::shutdown::channel();
        let running =
            PrefixCache::start(client.clone(), PREFIX.to_owned(), quick(), signal.clone())
                .await
                .unwrap();
        let mut kv = client.kv_client();
        let written = kv.put(format!("{PREFIX}a"), "1", None).await.unwrap();
        let written = written.header().unwrap().revision();
        kv.put("/narad-test/nodes/n9", "elsewhere", None)
            .await
            .unwrap();
        assert!(running.wait_for(written, Duration::from_secs(10)).await);
        let restarted = PrefixCache::start(client.clone(), PREFIX.to_owned(), quick(), signal)
            .await
            .unwrap();
        assert_eq!(restarted.view().data_revision, written);
        assert!(
            restarted.view().revision > written,
            "a full read is at etcd's revision"
        );
        assert_eq!(running.view().data_revision, written);
        // The peer that has every metadata write is seen as caught up at once.
        let named = restarted.view().data_revision;
        assert!(running.wait_for(named, Duration::from_millis(1)).await);
        trigger.trigger();
    }

    #[tokio::test]
    async fn the_copy_starts_with_what_is_there_and_follows_puts_and_deletes() {
        let etcd = TestEtcd::start();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = client.kv_client();
        kv.put(format!("{PREFIX}a"), "1", None).await.unwrap();
        kv.put("/narad-test/other/x", "not ours", None)
            .await
            .unwrap();
        let (trigger, signal) = crate::shutdown::channel();
        let cache = PrefixCache::start(client.clone(), PREFIX.to_owned(), quick(), signal)
            .await
            .unwrap();
        assert_eq!(value(&cache, "a").as_deref(), Some("1"));
        assert_eq!(cache.view().entries.len(), 1);
        kv.put(format!("{PREFIX}b"), "2", None).await.unwrap();
        let deleted = kv.delete(format!("{PREFIX}a"), None).await.unwrap();
        let revision = deleted.header().unwrap().revision();
        assert!(cache.wait_for(revision, Duration::from_secs(10)).await);
        assert_eq!(value(&cache, "a"), None);
        assert_eq!(value(&cache, "b").as_deref(), Some("2"));
        trigger.trigger();
    }

    #[tokio::test]
    async fn a_watch_cut_by_an_etcd_restart_resumes_without_missing_a_write() {
        let mut etcd = TestEtcd::start();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let (trigger, signal) = crate::shutdown::channel();
        let cache = PrefixCache::start(client.clone(), PREFIX.to_owned(), quick(), signal)
            .await
            .unwrap();
        etcd.restart();
        // Written while the cache's watch is down or reconnecting.
        let writer = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = writer.kv_client();
        for i in 0..5 {
            kv.put(format!("{PREFIX}k{i}"), format!("{i}"), None)
                .await
                .unwrap();
        }
        eventually("the five writes in the copy", || {
            (0..5).all(|i| value(&cache, &format!("k{i}")) == Some(format!("{i}")))
        })
        .await;
        assert!(
            cache.health().resumes.load(Ordering::Relaxed)
                + cache.health().stalls.load(Ordering::Relaxed)
                >= 1
        );
        trigger.trigger();
    }

    #[tokio::test]
    async fn a_resume_from_a_compacted_revision_reads_everything_again() {
        let mut etcd = TestEtcd::start();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = client.kv_client();
        kv.put(format!("{PREFIX}gone"), "soon deleted", None)
            .await
            .unwrap();
        let (trigger, signal) = crate::shutdown::channel();
        // A long retry pause: the watch, once cut, stays down while the test rewrites and
        // compacts history behind it.
        let timing = CacheTiming {
            retry_pause: Duration::from_secs(5),
            ..quick()
        };
        let cache = PrefixCache::start(client.clone(), PREFIX.to_owned(), timing, signal)
            .await
            .unwrap();
        etcd.stop();
        etcd.start_again();
        let writer = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = writer.kv_client();
        kv.delete(format!("{PREFIX}gone"), None).await.unwrap();
        let put = kv.put(format!("{PREFIX}new"), "1", None).await.unwrap();
        let revision = put.header().unwrap().revision();
        let mut maintenance = writer.clone();
        maintenance.compact(revision, None).await.unwrap();
        eventually("the copy rebuilt after compaction", || {
            value(&cache, "gone").is_none() && value(&cache, "new").as_deref() == Some("1")
        })
        .await;
        assert!(cache.health().compactions.load(Ordering::Relaxed) >= 1);
        assert!(cache.health().full_reads.load(Ordering::Relaxed) >= 2);
        trigger.trigger();
    }

    #[tokio::test]
    async fn a_watch_that_goes_silent_without_ending_is_caught_and_replaced() {
        let etcd = TestEtcd::start();
        let proxy = crate::metastore::test_etcd::FreezingProxy::start(etcd.client_port());
        let through_proxy = connect_client(&[proxy.endpoint()]).await.unwrap();
        let (trigger, signal) = crate::shutdown::channel();
        let cache = PrefixCache::start(through_proxy, PREFIX.to_owned(), quick(), signal)
            .await
            .unwrap();
        let direct = connect_client(&[etcd.endpoint()]).await.unwrap();
        let mut kv = direct.kv_client();
        // The watch is live once a write reaches the copy through it.
        let put = kv.put(format!("{PREFIX}before"), "1", None).await.unwrap();
        assert!(
            cache
                .wait_for(put.header().unwrap().revision(), Duration::from_secs(10))
                .await
        );
        proxy.freeze(true);
        kv.put(format!("{PREFIX}while-frozen"), "1", None)
            .await
            .unwrap();
        // Nothing ends the watch: only its silence can tell.
        eventually("the silent watch declared stalled", || {
            cache.health().stalls.load(Ordering::Relaxed) >= 1
        })
        .await;
        assert_eq!(value(&cache, "while-frozen"), None);
        proxy.freeze(false);
        eventually("the write made while frozen reaches the copy", || {
            value(&cache, "while-frozen").as_deref() == Some("1")
        })
        .await;
        trigger.trigger();
    }
}
