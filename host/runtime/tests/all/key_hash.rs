//! The `key_hash` need through the real runtime: a plugin that asks for it is handed Kafka's
//! murmur2 of every key (and no hash for a keyless record) in the layout docs/abi.md gives,
//! read here by plugins written in WAT, as a plugin in any language would; a plugin without
//! the need still gets the ABI v1 buffer; the limits still stop a hostile plugin that asks
//! for hashes; an unknown need is refused at load.

use narad_abi::{murmur2, partition_for_key};
use narad_runtime::testkit::WatRouter;
use std::time::Duration;

use narad_runtime::{
    Chain, FailureKind, FuelBudget, Limits, LoadError, Plugin, RouteContext, Runtime, RuntimeConfig,
};

use crate::common::{Slab, runtime};

/// A plugin that checks the header it is handed is the key-hash layout (fields = the key-hash
/// bit alone, a 36-byte header) and, per record, that the entry's presence bit agrees with
/// the table's `key_len`; then writes the hash's low 31 bits as the decision (Kafka's
/// `toPositive(murmur2)`, the partition among 2^31) and leaves keyless records undecided.
/// It decides nothing on a slab of four records: the deploy check's, whose child has 3
/// partitions.
fn hash_reader() -> WatRouter {
    WatRouter::new("hash-reader").needs(r#"["key_hash"]"#).route(
        "(local $n i32) (local $i i32) (local $hashes i32) (local $table i32) (local $entry i64)
         (local $keyed i32)",
        r#"
        (if (i32.ne (i32.load offset=28 (local.get $in)) (i32.const 8)) (then (return (i32.const -2))))
        (if (i32.ne (i32.load offset=8 (local.get $in)) (i32.const 36)) (then (return (i32.const -2))))
        (local.set $n (i32.load offset=4 (local.get $in)))
        (if (i32.eq (local.get $n) (i32.const 4)) (then (return (i32.const 0))))
        (local.set $table (i32.add (local.get $in) (i32.load offset=16 (local.get $in))))
        (local.set $hashes (i32.add (local.get $in) (i32.load offset=32 (local.get $in))))
        (block $done (loop $next
          (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
          (local.set $entry (i64.load (i32.add (local.get $hashes) (i32.shl (local.get $i) (i32.const 3)))))
          (local.set $keyed (i32.ne (i32.load offset=20 (i32.add (local.get $table) (i32.mul (local.get $i) (i32.const 40))))
                                    (i32.const -1)))
          ;; bit 32 says "has a key", and must agree with key_len; bits 33..63 are zero
          (if (i64.ne (i64.shr_u (local.get $entry) (i64.const 32)) (i64.extend_i32_u (local.get $keyed)))
            (then (return (i32.const -2))))
          (if (local.get $keyed)
            (then (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2)))
                             (i32.and (i32.wrap_i64 (local.get $entry)) (i32.const 0x7fffffff)))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $next)))
        "#,
    )
}

/// Decides every record it is handed to partition 2, after checking it was handed the ABI v1
/// header: fields = keys only, the context at 32.
fn v1_reader() -> WatRouter {
    WatRouter::new("v1-reader").route(
        "(local $n i32) (local $i i32)",
        r#"
        (if (i32.ne (i32.load offset=28 (local.get $in)) (i32.const 1)) (then (return (i32.const -2))))
        (if (i32.ne (i32.load offset=8 (local.get $in)) (i32.const 32)) (then (return (i32.const -2))))
        (local.set $n (i32.load offset=4 (local.get $in)))
        (block $done (loop $next
          (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
          (i32.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 2))) (i32.const 2))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br $next)))
        "#,
    )
}

fn ctx(child_count: u32) -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition: 0,
        parent_partition_count: 4,
        child_topic: "analytics".into(),
        child_partition_count: child_count,
        attempt: 0,
        config: Vec::new(),
    }
}

fn load(runtime: &Runtime, plugin: &WatRouter) -> Plugin {
    Plugin::load(runtime, &plugin.wasm()).unwrap()
}

fn mixed_keys() -> Vec<Option<Vec<u8>>> {
    let mut keys: Vec<Option<Vec<u8>>> = (0..300u32)
        .map(|i| (i % 5 != 0).then(|| format!("user-{i}").into_bytes()))
        .collect();
    keys.push(Some(Vec::new()));
    keys.push(Some(vec![b'k'; 300]));
    keys.push(Some(b"foobar".to_vec()));
    keys
}

#[test]
fn a_plugin_asking_for_key_hashes_is_handed_each_keys_murmur2_and_none_for_keyless_records() {
    let runtime = runtime();
    let plugin = load(&runtime, &hash_reader());
    assert_eq!(plugin.needs(), narad_abi::Needs::KEY_HASH);
    let mut chain = Chain::new([plugin, load(&runtime, &v1_reader())]).unwrap();
    let keys = mixed_keys();
    let refs: Vec<Option<&[u8]>> = keys.iter().map(|k| k.as_deref()).collect();
    let slab = Slab::new(0, &refs);
    let decisions = chain.route(&ctx(1 << 31), &slab.records()).unwrap();
    for (key, d) in keys.iter().zip(&decisions) {
        match key {
            Some(k) => {
                assert_eq!(*d, murmur2(k) as u32 & 0x7fff_ffff, "{k:?}");
                assert_eq!(Some(*d), partition_for_key(k, 1 << 31));
            }
            // Left undecided by the hash reader (no presence bit), decided by the next plugin.
            None => assert_eq!(*d, 2),
        }
    }
    let stats = chain.stats();
    assert_eq!(stats[0].records_decided, 243);
    assert_eq!(stats[1].records_in, 60);
}

#[test]
fn a_plugin_without_the_need_is_handed_the_abi_v1_buffer_unchanged() {
    let runtime = runtime();
    // After a plugin that asked for hashes, and first in a chain: both see the v1 layout.
    let mut chain =
        Chain::new([load(&runtime, &v1_reader()), load(&runtime, &hash_reader())]).unwrap();
    let keys = mixed_keys();
    let refs: Vec<Option<&[u8]>> = keys.iter().map(|k| k.as_deref()).collect();
    let slab = Slab::new(0, &refs);
    let decisions = chain.route(&ctx(16), &slab.records()).unwrap();
    assert!(decisions.iter().all(|&d| d == 2));
    let mut chain =
        Chain::new([load(&runtime, &hash_reader()), load(&runtime, &v1_reader())]).unwrap();
    let decisions = chain.route(&ctx(1 << 31), &slab.records()).unwrap();
    assert_eq!(decisions.iter().filter(|&&d| d == 2).count(), 60);
}

/// A plugin that asks for key hashes and loops forever on a slab of exactly two records (the
/// deploy check's four route), else decides nothing.
fn spins_on_two() -> WatRouter {
    WatRouter::new("spin-on-two")
        .needs(r#"["key_hash"]"#)
        .route(
            "",
            "(if (i32.eq (i32.load offset=4 (local.get $in)) (i32.const 2))
           (then (loop $spin (br $spin))))",
        )
}

#[test]
fn fuel_and_the_deadline_still_stop_an_endless_loop_in_a_plugin_that_asks_for_key_hashes() {
    let keys = [Some(&b"k"[..]), None];
    let two = Slab::new(0, &keys);
    let three = Slab::new(2, &[Some(&b"a"[..]), Some(&b"b"[..]), None]);
    let metered = runtime();
    let deadline_only = Runtime::new(RuntimeConfig::default().limits(Limits {
        deadline: Duration::from_millis(30),
        fuel: FuelBudget {
            base: u64::MAX / 2,
            ..FuelBudget::DEFAULT
        },
        ..Limits::default()
    }))
    .unwrap();
    for (runtime, kind) in [
        (&metered, FailureKind::Fuel),
        (&deadline_only, FailureKind::Deadline),
    ] {
        let mut chain =
            Chain::new([load(runtime, &spins_on_two()), load(runtime, &v1_reader())]).unwrap();
        let err = chain.route(&ctx(16), &two.records()).unwrap_err();
        assert_eq!(err.failure.kind(), kind, "{err}");
        assert_eq!(err.name, "spin-on-two");
        // The instance is rebuilt and the next slab routes.
        assert_eq!(chain.route(&ctx(16), &three.records()).unwrap(), [2, 2, 2]);
    }
}

#[test]
fn an_unknown_need_is_refused_at_load_naming_the_needs_this_host_knows() {
    let runtime = runtime();
    let err = Plugin::load(
        &runtime,
        &WatRouter::new("odd").needs(r#"["payload"]"#).wasm(),
    )
    .unwrap_err();
    assert!(matches!(err, LoadError::ManifestInvalid { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("unknown variant `payload`"), "{message}");
    assert!(message.contains("`key_hash`"), "{message}");
}
