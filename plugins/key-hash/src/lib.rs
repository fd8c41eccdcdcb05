//! `key-hash`: decides every keyed record with Kafka's default partitioner,
//! `(murmur2(key) & 0x7fffffff) % child_partition_count`, so a key lands in the child
//! partition a Kafka producer would choose. An empty key is a key (it hashes); a keyless
//! record is left to the next plugin of the chain.
//!
//! It asks for `key_hash_only`: the host computes murmur2 natively while it writes the slab,
//! and writes nothing else per record (no key bytes, no record table), so the plugin's loop
//! is a load, a mask, a modulo and a store per record (hashing in Wasm cost more than all the
//! rest of routing; see docs/benchmarks.md). Handed a slab without the hashes (a buffer with
//! keys), it hashes the keys itself, with the same answers.
//!
//! Layout: this file only (the router and its tests).
#![cfg_attr(not(test), no_std)]

use core::num::NonZeroU32;

use narad_guest::{Decisions, RouteContext, RouteError, Slab, UNDECIDED, partition_for_hash};

#[narad_guest::router(
    name = "key-hash",
    description = "Kafka's default partitioner for every keyed record",
    needs = [key_hash_only]
)]
fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
    let Some(partitions) = NonZeroU32::new(ctx.child_partition_count) else {
        return Err(RouteError::plugin("child topic has no partitions"));
    };
    let Some(hashes) = slab.key_hashes() else {
        // A buffer without the host's hashes: hash each key here (same answers, slower).
        for (record, slot) in slab.records().zip(out.slots_mut()) {
            if let Some(hash) = record.key_hash()? {
                *slot = partition_for_hash(hash, partitions.get()).unwrap_or(UNDECIDED);
            }
        }
        return Ok(());
    };
    // The hot loop reads the dense hash region alone, one index over the hashes and the
    // slots. `% NonZeroU32` has no zero check: this is `partition_for_hash` (Kafka's
    // `toPositive(murmur2) % partitions`) with its `None` case removed.
    //
    // No branch on whether a record has a key either (it mispredicts on mixed slabs): a
    // keyless record's partition is computed from hash 0 and turned into UNDECIDED by OR-ing
    // all ones, arithmetic the compiler cannot turn back into a branch.
    for (hash, slot) in hashes.zip(out.slots_mut()) {
        let partition = (hash.unwrap_or(0) & 0x7fff_ffff) % partitions;
        *slot = partition | u32::from(hash.is_none()).wrapping_neg();
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use narad_guest::testing::SlabBuilder;
    use narad_guest::{Needs, RouteError, Slab as SlabView, UNDECIDED, partition_for_key};

    use super::PLUGIN;

    /// Kafka's `UtilsTest#testMurmur2` keys with the partition Kafka's default partitioner
    /// gives them among 12 and 100 partitions (from the published hash values, sign bit
    /// masked).
    const KAFKA_VECTORS: &[(&str, u32, u32)] = &[
        ("21", 0, 40),
        ("foobar", 6, 66),
        ("a-little-bit-long-string", 8, 12),
        ("a-little-bit-longer-string", 11, 19),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", 5, 77),
        ("abc", 3, 7),
        ("", 9, 81),
    ];

    #[test]
    fn keyed_records_land_where_kafka_puts_them() {
        for partitions in [12, 100] {
            let mut slab = SlabBuilder::new().child("analytics", partitions);
            for (key, _, _) in KAFKA_VECTORS {
                slab = slab.keyed(key);
            }
            let out = slab.route(&PLUGIN).unwrap();
            let want: Vec<u32> = KAFKA_VECTORS
                .iter()
                .map(|(_, p12, p100)| if partitions == 12 { *p12 } else { *p100 })
                .collect();
            assert_eq!(out, want, "{partitions} partitions");
        }
    }

    #[test]
    fn an_empty_key_is_hashed_but_a_missing_key_is_left_undecided() {
        let out = SlabBuilder::new()
            .child("c", 12)
            .keyed("")
            .keyless()
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [9, UNDECIDED]);
    }

    #[test]
    fn the_parent_partition_does_not_change_a_keys_partition() {
        let a = SlabBuilder::new()
            .parent("p", 0, 3)
            .child("c", 7)
            .keyed("k")
            .route(&PLUGIN);
        let b = SlabBuilder::new()
            .parent("p", 2, 3)
            .child("c", 7)
            .keyed("k")
            .route(&PLUGIN);
        assert_eq!(a.unwrap(), b.unwrap());
    }

    #[test]
    fn a_child_without_partitions_is_a_plugin_error() {
        let err = SlabBuilder::new()
            .child("c", 0)
            .keyed("k")
            .route(&PLUGIN)
            .unwrap_err();
        assert!(matches!(err, RouteError::Plugin(_)));
    }

    #[test]
    fn the_manifest_asks_for_key_hashes_only() {
        assert_eq!(PLUGIN.name, "key-hash");
        assert_eq!(PLUGIN.needs, Needs::KEY_HASH_ONLY);
        assert!(
            PLUGIN
                .manifest_json
                .contains(r#""needs":["key_hash_only"]"#)
        );
    }

    #[test]
    fn every_partition_of_a_mixed_slab_is_kafkas_for_any_partition_count() {
        let keys: Vec<Option<String>> = (0..200)
            .map(|i| (i % 3 != 0).then(|| format!("key-{i}")))
            .collect();
        for partitions in [1, 2, 3, 7, 16, 1000, u32::MAX] {
            let slab =
                keys.iter()
                    .fold(SlabBuilder::new().child("c", partitions), |s, k| match k {
                        Some(k) => s.keyed(k),
                        None => s.keyless(),
                    });
            let want: Vec<u32> = keys
                .iter()
                .map(|k| {
                    k.as_ref().map_or(UNDECIDED, |k| {
                        partition_for_key(k.as_bytes(), partitions).unwrap()
                    })
                })
                .collect();
            assert_eq!(
                slab.route(&PLUGIN).unwrap(),
                want,
                "{partitions} partitions"
            );
        }
    }

    #[test]
    fn a_slab_with_keys_and_no_hashes_routes_the_same_as_one_with_hashes() {
        let mut slab = SlabBuilder::new().child("c", 100);
        for (key, _, _) in KAFKA_VECTORS {
            slab = slab.keyed(key).keyless();
        }
        let all: Vec<usize> = (0..slab.len()).collect();
        let route = |needs: Needs| {
            let input = slab.encode(needs, &all).unwrap();
            let view = SlabView::parse(&input).unwrap();
            let mut out = vec![UNDECIDED; slab.len()];
            PLUGIN.route_slab(&mut (), &view, &mut out).unwrap();
            out
        };
        let with_hashes = route(Needs::KEY_HASH_ONLY);
        assert_eq!(route(Needs::KEY_HASH), with_hashes);
        assert_eq!(route(Needs::KEYS), with_hashes);
        let want: Vec<u32> = KAFKA_VECTORS
            .iter()
            .flat_map(|(_, _, p100)| [*p100, UNDECIDED])
            .collect();
        assert_eq!(with_hashes, want);
    }
}
