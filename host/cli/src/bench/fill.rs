//! Writes a bench parent: `records` records spread over its partitions the way produce places
//! them (Kafka's key hash; keyless records round-robin), appended through `Store::append` in
//! large batches.

use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_storage::{AppendBatch, NewRecord, PartitionId, Store};

use super::BenchError;
use super::progress::Progress;

/// Records per pre-fill append: large batches keep the fill's `fdatasync`s few (about 2 MB
/// per batch with the default record size), small enough not to weigh on memory.
const FILL_BATCH_RECORDS: usize = 16_384;

/// What to write.
#[derive(Clone, Debug)]
pub struct FillSpec {
    /// The parent topic (its partitions must exist in the store).
    pub topic: String,
    /// Its partition count.
    pub partitions: u32,
    /// Records in all.
    pub records: u64,
    /// Key bytes per record; 0 writes keyless records.
    pub key_bytes: usize,
    /// Value bytes per record.
    pub value_bytes: usize,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Filled {
    /// Records per partition.
    pub per_partition: Vec<u64>,
    /// Key plus value bytes in all.
    pub payload_bytes: u64,
    /// How long the fill took.
    pub elapsed: Duration,
}

/// splitmix64: a cheap, well-spread 64-bit hash of a counter.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The key of record `i`: `key_bytes` bytes, distinct for distinct `i` once `key_bytes >= 8`.
pub fn key_of(i: u64, key_bytes: usize) -> Bytes {
    let mut key = Vec::with_capacity(key_bytes + 8);
    let mut word = 0u64;
    while key.len() < key_bytes {
        key.extend_from_slice(&mix(i ^ word.rotate_left(32)).to_le_bytes());
        word += 1;
    }
    key.truncate(key_bytes);
    // The first 8 bytes carry `i` itself (mixed, which is a bijection), so keys never collide.
    if key_bytes >= 8 {
        key[..8].copy_from_slice(&mix(i).to_le_bytes());
    }
    Bytes::from(key)
}

/// Writes the records of `spec` into `store`.
pub fn fill_parent(
    store: &Store,
    spec: &FillSpec,
    progress: &mut Progress,
) -> Result<Filled, BenchError> {
    if spec.partitions == 0 {
        return Err(BenchError::Options("the parent needs a partition".into()));
    }
    let start = Instant::now();
    // Values are slices of one pool of pseudo-random bytes: no allocation per record.
    let pool = Bytes::from(
        (0..spec.value_bytes as u64 + 4096)
            .map(|i| mix(i) as u8)
            .collect::<Vec<u8>>(),
    );
    let partitions = spec.partitions as usize;
    let mut pending: Vec<Vec<NewRecord>> = vec![Vec::new(); partitions];
    let mut per_partition = vec![0u64; partitions];
    let mut payload_bytes = 0u64;
    let flush = |partition: usize, records: Vec<NewRecord>| -> Result<(), BenchError> {
        let id = PartitionId::new(spec.topic.clone(), partition as u32);
        store
            .append(
                &id,
                AppendBatch {
                    records,
                    origin: None,
                },
            )
            .map(|_| ())
            .map_err(BenchError::storage(format!("filling {id}")))
    };
    for i in 0..spec.records {
        let (key, partition) = if spec.key_bytes == 0 {
            (None, (i % u64::from(spec.partitions)) as usize)
        } else {
            let key = key_of(i, spec.key_bytes);
            let partition =
                narad_abi::partition_for_key(&key, spec.partitions).unwrap_or(0) as usize;
            (Some(key), partition)
        };
        let at = (mix(i) % 4096) as usize;
        let record = NewRecord {
            key,
            headers: Vec::new(),
            value: Some(pool.slice(at..at + spec.value_bytes)),
        };
        payload_bytes += (spec.key_bytes + spec.value_bytes) as u64;
        per_partition[partition] += 1;
        pending[partition].push(record);
        if pending[partition].len() >= FILL_BATCH_RECORDS {
            flush(partition, std::mem::take(&mut pending[partition]))?;
            progress.update(|| format!("filling the parent: {}/{} records", i + 1, spec.records));
        }
    }
    for (partition, records) in pending.into_iter().enumerate() {
        if !records.is_empty() {
            flush(partition, records)?;
        }
    }
    progress.finish();
    Ok(Filled {
        per_partition,
        payload_bytes,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_asked_length_and_do_not_collide() {
        let keys: std::collections::HashSet<Bytes> = (0..10_000).map(|i| key_of(i, 16)).collect();
        assert_eq!(keys.len(), 10_000);
        assert!(keys.iter().all(|k| k.len() == 16));
        assert_eq!(key_of(7, 3).len(), 3);
        assert_eq!(key_of(7, 20).len(), 20);
    }
}
