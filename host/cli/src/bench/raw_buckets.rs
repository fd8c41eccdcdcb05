//! The raw loop of `bench fanout` for a child whose partition count differs from the
//! parent's: the bucket work the cursors do, without the engine.
//!
//! One worker per (child, parent partition) reads the parent in slabs of the cursors' size,
//! splits each slab by the default chain's rules ([`default_chain_partition`]: Kafka's hash of
//! the key modulo the child's partition count; a keyless record round-robin, since
//! `keyless-index` decides nothing when the counts differ), encodes each bucket as a child
//! batch with its provenance (the same [`EncodedBatch::encode`] a cursor's bucket uses) and
//! writes it to the plain file of its (child, child partition) with `pwrite` at the file's
//! end, then `fdatasync`. The workers of one child share its files: a file's writes are serialized
//! behind a mutex held across the `pwrite` and the `fdatasync`, as the produce lock serializes
//! a child partition's commits. The buckets of one slab are written by up to
//! [`COMMITS_IN_FLIGHT`] lanes at once, as a cursor commits them; the worker waits for all of
//! them before it reads its next slab. No Wasm, no offset file, no pipelining of the next read
//! with the writes; the read-back from the device after each sync only when asked
//! ([`ReadBack`]).

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use narad_storage::{BatchOrigin, EncodedBatch, PartitionId, ReadOptions, Store, StoredRecord};

use super::BenchError;
use super::raw_append::{RawFile, ReadBack};
use narad_host::fanout::{COMMITS_IN_FLIGHT, SLAB_MAX_BYTES, SLAB_MAX_RECORDS};

/// Most lane threads of one raw run: tokio's default limit of its blocking pool, where the
/// cursors' commit lanes run.
const MAX_LANES: usize = 512;

/// The attach epoch the raw loop's provenance carries (any fixed value: nothing reads it).
const RAW_EPOCH: [u8; 8] = [0x5A; 8];

/// The child partition the default chain (`key-hash`, `keyless-index`, `round-robin`) gives a
/// record, when its rules decide that from the record alone: Kafka's hash of the key modulo
/// `child_partitions` for a keyed record (an empty key is a key); a keyless record keeps
/// `parent_partition` when the counts match. `None` for a keyless record when the counts
/// differ (round-robin places it, by the link's position in its cycle) and when the child has
/// no partition.
pub fn default_chain_partition(
    key: Option<&[u8]>,
    parent_partition: u32,
    parent_partitions: u32,
    child_partitions: u32,
) -> Option<u32> {
    match key {
        Some(key) => narad_abi::partition_for_key(key, child_partitions),
        None if parent_partitions == child_partitions && parent_partition < child_partitions => {
            Some(parent_partition)
        }
        None => None,
    }
}

/// Splits `records` (a slab of parent partition `parent_partition`) into one list of record
/// indices per child partition, each in slab order, by [`default_chain_partition`]; records
/// it leaves to round-robin take the next partition of `cycle`, which continues across slabs
/// as the `round-robin` plugin's position does. Returns `child_partitions` lists (empty ones
/// included); nothing when the child has no partition.
pub fn split_by_default_chain(
    records: &[StoredRecord],
    parent_partition: u32,
    parent_partitions: u32,
    child_partitions: u32,
    cycle: &mut u32,
) -> Vec<Vec<usize>> {
    let mut buckets = vec![Vec::new(); child_partitions as usize];
    if child_partitions == 0 {
        return buckets;
    }
    for (i, record) in records.iter().enumerate() {
        let p = default_chain_partition(
            record.key.as_deref(),
            parent_partition,
            parent_partitions,
            child_partitions,
        )
        .unwrap_or_else(|| {
            let p = *cycle % child_partitions;
            *cycle = (p + 1) % child_partitions;
            p
        });
        if let Some(bucket) = buckets.get_mut(p as usize) {
            bucket.push(i);
        }
    }
    buckets
}

/// What one run of the bucket loop did.
#[derive(Clone, Debug)]
pub struct BucketRun {
    /// Seconds until every worker was done.
    pub seconds: f64,
    /// Per child: seconds until its last worker was done.
    pub child_seconds: Vec<f64>,
    /// Bytes written to the files.
    pub written: u64,
    /// Slabs read.
    pub slabs: u64,
    /// Buckets written (one `pwrite` + `fdatasync` each).
    pub buckets: u64,
}

/// One bucket for a lane: its records (indices into the shared slab), its provenance, its
/// file, and where to say how it went.
struct Job {
    slab: Arc<Vec<StoredRecord>>,
    indices: Vec<usize>,
    origin: BatchOrigin,
    /// The plain file of one (child, child partition), shared by the workers of that child.
    file: Arc<Mutex<RawFile>>,
    done: mpsc::Sender<Result<u64, BenchError>>,
}

/// Encodes one bucket and appends it to its file durably; returns the bytes written.
fn write_bucket(job: &Job) -> Result<u64, BenchError> {
    let records: Vec<&StoredRecord> = job
        .indices
        .iter()
        .filter_map(|&i| job.slab.get(i))
        .collect();
    let batch = EncodedBatch::encode(&records, Some(&job.origin))
        .map_err(BenchError::storage("encoding a bucket"))?;
    let frame = batch.frame();
    // Held across the write, the sync and the read-back, as the produce lock is across a
    // commit.
    job.file
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .append(frame)?;
    Ok(frame.len() as u64)
}

/// A lane: writes the buckets it takes from `jobs` until every sender is gone.
fn lane(jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let next = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = next else {
            return;
        };
        let outcome = write_bucket(&job);
        // The worker is gone only when it already failed; its error is the one reported.
        let _ = job.done.send(outcome);
    }
}

/// Copies parent partition `partition` up to `end` into `files` (the child's, one per child
/// partition) through the lanes; returns the slabs, buckets and bytes written.
fn worker(
    store: &Store,
    partition: u32,
    end: u64,
    parent_partitions: u32,
    files: &[Arc<Mutex<RawFile>>],
    jobs: &mpsc::Sender<Job>,
) -> Result<(u64, u64, u64), BenchError> {
    let id = PartitionId::new("parent", partition);
    let child_partitions = u32::try_from(files.len()).unwrap_or(u32::MAX);
    let (done_tx, done_rx) = mpsc::channel();
    let (mut offset, mut cycle) = (0u64, 0u32);
    let (mut slabs, mut buckets, mut written) = (0u64, 0u64, 0u64);
    let lanes_gone = || BenchError::WorkerPanicked {
        message: "the raw loop's write lanes stopped".to_owned(),
    };
    while offset < end {
        let read = store
            .read(
                &id,
                &ReadOptions {
                    offset,
                    max_records: SLAB_MAX_RECORDS,
                    max_bytes: SLAB_MAX_BYTES,
                    max_committed_at_ms: None,
                },
            )
            .map_err(BenchError::storage(format!("reading {id}")))?;
        if read.records.is_empty() {
            break;
        }
        let next_offset = read.next_offset;
        let split = split_by_default_chain(
            &read.records,
            partition,
            parent_partitions,
            child_partitions,
            &mut cycle,
        );
        let slab = Arc::new(read.records);
        let mut sent = 0u64;
        for (indices, file) in split.into_iter().zip(files) {
            if indices.is_empty() {
                continue;
            }
            let origin = BatchOrigin {
                epoch: RAW_EPOCH,
                parent_partition: partition,
                slab_start: offset,
                parent_offsets: indices
                    .iter()
                    .filter_map(|&i| slab.get(i))
                    .map(|r| r.offset)
                    .collect(),
            };
            jobs.send(Job {
                slab: Arc::clone(&slab),
                indices,
                origin,
                file: Arc::clone(file),
                done: done_tx.clone(),
            })
            .map_err(|_| lanes_gone())?;
            sent += 1;
        }
        for _ in 0..sent {
            written += done_rx.recv().map_err(|_| lanes_gone())??;
        }
        slabs += 1;
        buckets += sent;
        offset = next_offset;
    }
    Ok((slabs, buckets, written))
}

/// Runs the bucket loop: `children` children of `child_partitions` partitions each, from the
/// parent partitions whose ends are `high`, into files under `dir` (created; the caller
/// removes it), each bucket read back from the device when `read_back` says so.
pub fn raw_bucket_copy(
    store: &Store,
    dir: &Path,
    high: &[u64],
    children: u32,
    child_partitions: u32,
    read_back: ReadBack,
) -> Result<BucketRun, BenchError> {
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let parent_partitions = u32::try_from(high.len()).unwrap_or(u32::MAX);
    let mut files: Vec<Vec<Arc<Mutex<RawFile>>>> = Vec::new();
    for c in 0..children {
        let mut child = Vec::new();
        for p in 0..child_partitions {
            let path = dir.join(format!("child-{c:03}-p{p:05}.bin"));
            child.push(Arc::new(Mutex::new(RawFile::create(&path, read_back)?)));
        }
        files.push(child);
    }
    let workers = children as usize * high.len();
    let lanes = (workers * (child_partitions as usize).min(COMMITS_IN_FLIGHT)).clamp(1, MAX_LANES);
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let jobs_rx = Mutex::new(jobs_rx);
    let start = Instant::now();
    type Outcome = Result<(u32, Duration, u64, u64, u64), BenchError>;
    let (outcomes, lane_panics): (Vec<Outcome>, Vec<BenchError>) = std::thread::scope(|s| {
        let lane_threads: Vec<_> = (0..lanes).map(|_| s.spawn(|| lane(&jobs_rx))).collect();
        let worker_threads: Vec<_> = (0..children)
            .flat_map(|c| (0..parent_partitions).map(move |p| (c, p)))
            .map(|(c, p)| {
                let (jobs, files) = (jobs_tx.clone(), &files[c as usize]);
                let end = high[p as usize];
                s.spawn(move || {
                    worker(store, p, end, parent_partitions, files, &jobs).map(
                        |(slabs, buckets, written)| (c, start.elapsed(), slabs, buckets, written),
                    )
                })
            })
            .collect();
        // The workers hold the only senders left: the lanes end once every worker is done.
        drop(jobs_tx);
        let outcomes = worker_threads
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|payload| Err(BenchError::worker_panicked(payload.as_ref())))
            })
            .collect();
        let panics = lane_threads
            .into_iter()
            .filter_map(|l| l.join().err())
            .map(|payload| BenchError::worker_panicked(payload.as_ref()))
            .collect();
        (outcomes, panics)
    });
    let seconds = start.elapsed().as_secs_f64();
    if let Some(panic) = lane_panics.into_iter().next() {
        return Err(panic);
    }
    let mut child_done = vec![Duration::ZERO; children as usize];
    let mut run = BucketRun {
        seconds,
        child_seconds: Vec::new(),
        written: 0,
        slabs: 0,
        buckets: 0,
    };
    for outcome in outcomes {
        let (c, done, slabs, buckets, written) = outcome?;
        child_done[c as usize] = child_done[c as usize].max(done);
        run.slabs += slabs;
        run.buckets += buckets;
        run.written += written;
    }
    run.child_seconds = child_done.iter().map(Duration::as_secs_f64).collect();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use narad_runtime::{Chain, Plugin, Runtime, RuntimeConfig};

    use super::*;
    use crate::bench::fill::key_of;
    use narad_host::api::children::DEFAULT_ROUTER;
    use narad_host::fanout::route::wasm::ChainRouter;
    use narad_host::fanout::route::{RouteInput, SlabRouter as _};

    fn record(offset: u64, key: Option<Bytes>) -> StoredRecord {
        StoredRecord {
            offset,
            committed_at_ms: 0,
            key,
            headers: Vec::new(),
            value: Some(Bytes::from_static(b"v")),
            origin: None,
        }
    }

    /// A slab of keyed records (16-byte keys, as the bench writes) with every seventh keyless.
    fn slab(n: u64) -> Vec<StoredRecord> {
        (0..n)
            .map(|i| record(i, (i % 7 != 3).then(|| key_of(i, 16))))
            .collect()
    }

    /// The real default chain, built from the built-in plugins, routing `records`.
    fn route_with_default_chain(
        records: &[StoredRecord],
        parent_partition: u32,
        parent_partitions: u32,
        child_partitions: u32,
    ) -> Vec<u32> {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let plugins = DEFAULT_ROUTER
            .iter()
            .map(|name| Plugin::load(&runtime, narad_builtin_plugins::get(name).unwrap()).unwrap());
        let mut router = ChainRouter::new(Chain::new(plugins).unwrap());
        let input = RouteInput {
            parent_topic: "parent".into(),
            parent_partition,
            parent_partition_count: parent_partitions,
            child_topic: "child".into(),
            child_partition_count: child_partitions,
            attempt: 0,
            config: Vec::new(),
        };
        router.route(&input, records).unwrap()
    }

    fn placement(split: &[Vec<usize>], records: usize) -> Vec<u32> {
        let mut out = vec![u32::MAX; records];
        for (p, bucket) in split.iter().enumerate() {
            for &i in bucket {
                out[i] = p as u32;
            }
        }
        out
    }

    #[test]
    fn the_raw_split_puts_every_record_where_the_default_chain_routes_it_from_4_to_12_partitions() {
        let records = slab(2_000);
        let routed = route_with_default_chain(&records, 2, 4, 12);
        let split = split_by_default_chain(&records, 2, 4, 12, &mut 0);
        // Both cycles start at the first partition, so even the keyless records agree.
        assert_eq!(placement(&split, records.len()), routed);
        assert!(
            split.iter().all(|b| !b.is_empty()),
            "a bucket per partition"
        );
        assert!(
            split.iter().all(|b| b.windows(2).all(|w| w[0] < w[1])),
            "buckets keep slab order"
        );
    }

    #[test]
    fn the_raw_split_puts_every_record_where_the_default_chain_routes_it_with_equal_counts() {
        let records = slab(2_000);
        let routed = route_with_default_chain(&records, 3, 4, 4);
        let split = split_by_default_chain(&records, 3, 4, 4, &mut 0);
        assert_eq!(placement(&split, records.len()), routed);
        assert!(
            split[3].contains(&3),
            "a keyless record keeps its parent partition"
        );
    }

    #[test]
    fn keyless_records_are_left_to_round_robin_only_when_the_counts_differ() {
        assert_eq!(default_chain_partition(None, 1, 4, 4), Some(1));
        assert_eq!(default_chain_partition(None, 1, 4, 12), None);
        let key = key_of(9, 16);
        assert_eq!(
            default_chain_partition(Some(&key), 1, 4, 12),
            narad_abi::partition_for_key(&key, 12)
        );
    }

    #[test]
    fn the_round_robin_position_continues_across_slabs() {
        let keyless: Vec<StoredRecord> = (0..5).map(|i| record(i, None)).collect();
        let mut cycle = 0;
        let first = split_by_default_chain(&keyless, 0, 1, 3, &mut cycle);
        let second = split_by_default_chain(&keyless, 0, 1, 3, &mut cycle);
        assert_eq!(placement(&first, 5), [0, 1, 2, 0, 1]);
        assert_eq!(placement(&second, 5), [2, 0, 1, 2, 0]);
    }

    #[test]
    fn buckets_written_by_the_raw_loop_land_in_their_child_partition_files() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let store = Store::open(&data, Default::default()).unwrap();
        for p in 0..2 {
            store
                .create_partition(&PartitionId::new("parent", p), Default::default())
                .unwrap();
        }
        let mut high = Vec::new();
        for p in 0..2u32 {
            let records = (0..100u64)
                .map(|i| narad_storage::NewRecord {
                    key: Some(key_of(u64::from(p) * 1000 + i, 16)),
                    headers: Vec::new(),
                    value: Some(Bytes::from_static(b"value")),
                })
                .collect();
            store
                .append(
                    &PartitionId::new("parent", p),
                    narad_storage::AppendBatch {
                        records,
                        origin: None,
                    },
                )
                .unwrap();
            high.push(100);
        }
        for (name, read_back) in [("raw", ReadBack::No), ("read-back", ReadBack::FromDevice)] {
            let out = dir.path().join(name);
            let run = raw_bucket_copy(&store, &out, &high, 2, 6, read_back).unwrap();
            assert_eq!(run.slabs, 4, "one slab per (child, parent partition)");
            assert!(run.buckets > run.slabs, "slabs split into buckets");
            let on_disk: u64 = std::fs::read_dir(&out)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum();
            assert_eq!(on_disk, run.written, "{read_back:?}");
            assert_eq!(std::fs::read_dir(&out).unwrap().count(), 12);
        }
    }
}
