//! `key-hash`: decides every keyed record with Kafka's default partitioner,
//! `(murmur2(key) & 0x7fffffff) % child_partition_count`, so a key lands in the child
//! partition a Kafka producer would choose. An empty key is a key (it hashes); a keyless
//! record is left to the next plugin of the chain.
//!
//! Layout: this file only (the router and its tests).
#![cfg_attr(not(test), no_std)]

use narad_guest::{Decisions, RouteContext, RouteError, Slab, partition_for_key};

#[narad_guest::router(
    name = "key-hash",
    description = "Kafka's default partitioner for every keyed record",
    needs = [keys]
)]
fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
    let partitions = ctx.child_partition_count;
    if partitions == 0 {
        return Err(RouteError::plugin("child topic has no partitions"));
    }
    // One lean loop per slab: slots zipped with records (no per-record index check), and
    // the hash inlined, where `partitions != 0` (checked above) removes its `None` case.
    for (record, slot) in slab.records().zip(out.slots_mut()) {
        if let Some(key) = record.key()?
            && let Some(p) = partition_for_key(key, partitions)
        {
            *slot = p;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use narad_guest::testing::SlabBuilder;
    use narad_guest::{RouteError, UNDECIDED};

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
    fn the_manifest_asks_for_keys_only() {
        assert_eq!(PLUGIN.name, "key-hash");
        assert!(!PLUGIN.needs.headers() && !PLUGIN.needs.values());
        assert!(PLUGIN.manifest_json.contains(r#""needs":["keys"]"#));
    }
}
