//! The demo's producer: a steady stream of keyed, keyless and `region`-headed records at a
//! fixed rate, each carrying its sequence number in its value so that every copy can be
//! traced back to its parent record.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::verify::{Acked, REGION_HEADER, VALUE_PREFIX};
use crate::cli::client::Client;
use narad_host::api::types::{HeadersJson, ProduceRecordJson};
use narad_host::shutdown::ShutdownSignal;

/// How often the producer sends a batch; at the default rate of 2,000 records/s a batch holds
/// about 100 records.
pub const PRODUCE_TICK: Duration = Duration::from_millis(50);

/// Most records in one produce request (the daemon's default max-batch-records is 10,000).
pub const MAX_BATCH_RECORDS: u64 = 5_000;

/// Distinct keys of the plain keyed records.
const CUSTOMER_KEYS: u64 = 64;

/// Distinct keys of the keyed records that also carry a region.
const STORE_KEYS: u64 = 16;

/// Region values; `us` and `eu` are mapped by the `by-region` child's config, `apac` falls to
/// its `*` entry.
pub const REGIONS: [&str; 3] = ["us", "eu", "apac"];

/// The record with sequence number `seq`. Four kinds take turns: keyed, keyless, keyed with a
/// region (the region fixed by the key, so a key keeps one route), keyless with a region.
pub fn record(seq: u64) -> ProduceRecordJson {
    let region = |i: u64| {
        let mut headers = std::collections::BTreeMap::new();
        headers.insert(
            REGION_HEADER.to_owned(),
            REGIONS[(i % REGIONS.len() as u64) as usize].to_owned(),
        );
        Some(HeadersJson::Map(headers))
    };
    let (key, headers) = match seq % 4 {
        0 => (
            Some(format!("customer-{}", (seq / 4) % CUSTOMER_KEYS)),
            None,
        ),
        1 => (None, None),
        2 => {
            let store = (seq / 4) % STORE_KEYS;
            (Some(format!("store-{store}")), region(store))
        }
        _ => (None, region(seq / 4)),
    };
    ProduceRecordJson {
        key,
        value: Some(Some(format!("{VALUE_PREFIX}{seq}"))),
        headers,
        ..ProduceRecordJson::default()
    }
}

/// Progress shared with the display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Records acknowledged so far.
    pub produced: AtomicU64,
}

/// Produces `rate` records/s to `topic` until `duration` passes or `stop` fires; returns every
/// acknowledged record. A failed produce ends the demo with the server's message.
pub async fn produce(
    client: &Client,
    topic: &str,
    rate: u64,
    duration: Duration,
    stop: ShutdownSignal,
    progress: Arc<Progress>,
) -> anyhow::Result<Vec<Acked>> {
    let mut acked = Vec::new();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(PRODUCE_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.wait() => break,
        }
        let elapsed = started.elapsed().min(duration);
        // Catch up to the rate: a slow request makes the next batch larger.
        let due = (rate as f64 * elapsed.as_secs_f64()) as u64;
        let count = due.saturating_sub(seq).min(MAX_BATCH_RECORDS);
        if count > 0 {
            let batch: Vec<ProduceRecordJson> = (seq..seq + count).map(record).collect();
            let answer = client
                .produce(topic, batch)
                .await
                .with_context(|| format!("producing to {topic} after {seq} records"))?;
            if answer.offsets.len() as u64 != count {
                bail!(
                    "produce answered {} offsets for {count} records",
                    answer.offsets.len()
                );
            }
            for (i, o) in answer.offsets.iter().enumerate() {
                acked.push(Acked {
                    id: seq + i as u64,
                    partition: o.partition,
                    offset: o.offset,
                });
            }
            seq += count;
            progress.produced.store(seq, Ordering::Relaxed);
        }
        if elapsed >= duration && seq >= due {
            break;
        }
    }
    Ok(acked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_kinds_take_turns_and_values_carry_the_sequence() {
        let r: Vec<ProduceRecordJson> = (0..8).map(record).collect();
        assert!(r[0].key.is_some() && r[0].headers.is_none());
        assert!(r[1].key.is_none() && r[1].headers.is_none());
        assert!(r[2].key.is_some() && r[2].headers.is_some());
        assert!(r[3].key.is_none() && r[3].headers.is_some());
        assert_eq!(r[5].value.clone().flatten().as_deref(), Some("order-5"));
    }

    #[test]
    fn a_store_key_always_carries_the_same_region() {
        let mut region_of = std::collections::HashMap::new();
        for seq in (2..4_000).step_by(4) {
            let r = record(seq);
            let Some(HeadersJson::Map(h)) = r.headers else {
                panic!("no region")
            };
            let region = h[REGION_HEADER].clone();
            let previous = region_of.insert(r.key.unwrap(), region.clone());
            assert!(previous.is_none_or(|p| p == region));
        }
    }
}
