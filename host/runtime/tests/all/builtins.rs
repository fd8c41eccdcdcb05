//! The real built-in plugins through the runtime: the default chain reproduces the seed's
//! routing rules exactly, round-robin state belongs to one chain (one child topic), and
//! custom plugins compose with the built-ins.
#![allow(clippy::unwrap_used, missing_docs)]

use crate::common::{Poison, Slab, Spec, context, runtime};
use narad_abi::partition_for_key;
use narad_runtime::limits::FUEL_PER_RECORD;
use narad_runtime::{
    Chain, Failure, FailureKind, Plugin, RecordInput, RouteContext, Runtime, run_trial,
};

fn builtin(runtime: &Runtime, wasm: &[u8]) -> Plugin {
    Plugin::load(runtime, wasm).unwrap()
}

fn default_chain(runtime: &Runtime) -> Chain {
    Chain::new([
        builtin(runtime, narad_builtin_plugins::KEY_HASH),
        builtin(runtime, narad_builtin_plugins::KEYLESS_INDEX),
        builtin(runtime, narad_builtin_plugins::ROUND_ROBIN),
    ])
    .unwrap()
}

fn ctx(parent_partition: u32, parent_count: u32, child: &str, child_count: u32) -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition,
        parent_partition_count: parent_count,
        child_topic: child.into(),
        child_partition_count: child_count,
        attempt: 0,
        config: Vec::new(),
    }
}

#[test]
fn every_builtin_passes_the_deploy_checks_with_its_manifest_name() {
    let runtime = runtime();
    for (wasm, name) in [
        (narad_builtin_plugins::KEY_HASH, "key-hash"),
        (narad_builtin_plugins::KEYLESS_INDEX, "keyless-index"),
        (narad_builtin_plugins::ROUND_ROBIN, "round-robin"),
        (narad_builtin_plugins::HEADER_ROUTE, "header-route"),
    ] {
        assert_eq!(builtin(&runtime, wasm).name(), name);
    }
}

#[test]
fn keyed_records_land_on_kafkas_partition() {
    let mut chain = default_chain(&runtime());
    let keys: Vec<Vec<u8>> = (0..500u32)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let refs: Vec<Option<&[u8]>> = keys.iter().map(|k| Some(k.as_slice())).collect();
    let slab = Slab::new(0, &refs);
    let decisions = chain.route(&ctx(0, 4, "a", 12), &slab.records()).unwrap();
    for (key, d) in keys.iter().zip(&decisions) {
        assert_eq!(Some(*d), partition_for_key(key, 12));
    }
    // One of Kafka's own vectors: murmur2("foobar") = -790332482, masked = 1357151166.
    let slab = Slab::new(0, &[Some(b"foobar")]);
    let decisions = chain.route(&ctx(0, 4, "a", 7), &slab.records()).unwrap();
    assert_eq!(decisions, vec![1_357_151_166 % 7]);
}

#[test]
fn an_empty_key_is_a_key_and_is_hashed() {
    let mut chain = default_chain(&runtime());
    // Counts match, so a keyless record would keep index 2; the empty key is hashed instead:
    // murmur2("") = 275646681.
    let slab = Slab::new(0, &[Some(b""), None]);
    let decisions = chain.route(&ctx(2, 5, "a", 5), &slab.records()).unwrap();
    assert_eq!(decisions, vec![275_646_681 % 5, 2]);
}

#[test]
fn keyless_records_keep_the_parent_index_when_counts_match() {
    let mut chain = default_chain(&runtime());
    let slab = Slab::new(0, &[None, Some(b"k"), None, None]);
    let decisions = chain.route(&ctx(3, 8, "a", 8), &slab.records()).unwrap();
    assert_eq!(decisions[0], 3);
    assert_eq!(decisions[2], 3);
    assert_eq!(decisions[3], 3);
    assert_eq!(Some(decisions[1]), partition_for_key(b"k", 8));
}

#[test]
fn keyless_records_go_round_robin_across_slabs_when_counts_differ() {
    let mut chain = default_chain(&runtime());
    let c = ctx(3, 8, "a", 3);
    let first = Slab::new(0, &[None, Some(b"k"), None]);
    let second = Slab::new(3, &[None, None, None]);
    let d1 = chain.route(&c, &first.records()).unwrap();
    let d2 = chain.route(&c, &second.records()).unwrap();
    assert_eq!((d1[0], d1[2]), (0, 1));
    assert_eq!(d2, vec![2, 0, 1]);
}

/// The default chain's rules written natively (as the route bench's native side): Kafka's
/// partitioner for keys, the parent partition for keyless records when the counts match,
/// else one round-robin cycle per chain continuing across slabs.
struct NativeDefaultChain {
    next: u32,
}

impl NativeDefaultChain {
    fn route(&mut self, ctx: &RouteContext, keys: &[Option<Vec<u8>>]) -> Vec<u32> {
        let n = ctx.child_partition_count;
        keys.iter()
            .map(|key| match key {
                Some(k) => partition_for_key(k, n).unwrap(),
                None if ctx.parent_partition_count == n => ctx.parent_partition,
                None => {
                    let p = self.next % n;
                    self.next += 1;
                    p
                }
            })
            .collect()
    }
}

#[test]
fn the_default_chain_routes_mixed_slabs_exactly_as_the_native_rules_do() {
    let runtime = runtime();
    // Keys of many lengths (the hash's block, word and tail paths), empty keys, runs of
    // keyless records and slabs of every mix, across mask boundaries of the chain's pending
    // list (64 records).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (parents, children) in [(4, 4), (4, 12), (1, 7)] {
        let mut chain = default_chain(&runtime);
        let mut native = NativeDefaultChain { next: 0 };
        for (slab_no, keyless_per_16) in [0u64, 1, 2, 8, 15, 16].into_iter().enumerate() {
            let len = 1 + (next() % 300) as usize;
            let keys: Vec<Option<Vec<u8>>> = (0..len)
                .map(|_| {
                    let v = next();
                    (v % 16 >= keyless_per_16).then(|| {
                        let key_len = ((v >> 8) % 40) as usize;
                        (0..key_len)
                            .map(|i| (v >> (i % 7 * 8)) as u8 ^ i as u8)
                            .collect()
                    })
                })
                .collect();
            let refs: Vec<Option<&[u8]>> = keys.iter().map(|k| k.as_deref()).collect();
            let slab = Slab::new(slab_no as u64 * 1000, &refs);
            let c = ctx(slab_no as u32 % parents, parents, "a", children);
            let wasm = chain.route(&c, &slab.records()).unwrap();
            assert_eq!(
                wasm,
                native.route(&c, &keys),
                "{parents}->{children}, slab {slab_no}"
            );
        }
    }
}

#[test]
fn round_robin_is_independent_per_chain_and_child_topic() {
    let runtime = runtime();
    let mut analytics = default_chain(&runtime);
    let mut retry = default_chain(&runtime);
    let slab = Slab::new(0, &[None, None]);
    let a1 = analytics
        .route(&ctx(0, 8, "analytics", 4), &slab.records())
        .unwrap();
    let r1 = retry
        .route(&ctx(0, 8, "retry", 4), &slab.records())
        .unwrap();
    let a2 = analytics
        .route(&ctx(0, 8, "analytics", 4), &slab.records())
        .unwrap();
    assert_eq!(a1, vec![0, 1]);
    assert_eq!(r1, vec![0, 1], "the retry child has its own cycle");
    assert_eq!(a2, vec![2, 3]);
}

#[test]
fn a_full_slab_of_4096_records_routes_within_its_fuel_budget() {
    let mut chain = default_chain(&runtime());
    let keys: Vec<Vec<u8>> = (0..4096u32).map(|i| i.to_le_bytes().repeat(4)).collect();
    let refs: Vec<Option<&[u8]>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (i % 10 != 0).then_some(k.as_slice()))
        .collect();
    let decisions = chain
        .route(&ctx(1, 8, "a", 16), &Slab::new(0, &refs).records())
        .unwrap();
    assert!(decisions.iter().all(|&d| d < 16));
    // The fuel constants promise headroom: the built-ins spend under a fifth of
    // FUEL_PER_RECORD per record (fuel is deterministic, so this is no timing assertion).
    for stats in chain.stats() {
        assert!(
            stats.fuel_consumed < stats.records_in * FUEL_PER_RECORD / 5,
            "{} spent {} fuel on {} records",
            stats.name,
            stats.fuel_consumed,
            stats.records_in
        );
    }
}

#[test]
fn the_peak_fuel_use_is_the_call_closest_to_its_budget() {
    let runtime = runtime();
    let mut chain = Chain::new([builtin(&runtime, narad_builtin_plugins::KEY_HASH)]).unwrap();
    assert_eq!(chain.stats()[0].peak_fuel_use, (0, 0));
    let keys: Vec<Vec<u8>> = (0..4096u32).map(|i| i.to_le_bytes().repeat(4)).collect();
    let refs: Vec<Option<&[u8]>> = keys.iter().map(|k| Some(k.as_slice())).collect();
    let one = Slab::new(0, &refs[..1]);
    let full = Slab::new(0, &refs);
    chain.route(&ctx(0, 1, "a", 8), &one.records()).unwrap();
    let after_one = chain.stats()[0].clone();
    assert_eq!(after_one.peak_fuel_use.0, after_one.fuel_consumed);
    // A full slab spends a larger share of its (larger) budget than one record of its own:
    // the per-call fixed work is small next to the fixed budget.
    chain.route(&ctx(0, 1, "a", 8), &full.records()).unwrap();
    let after_full = chain.stats()[0].clone();
    let (spent, budget) = after_full.peak_fuel_use;
    assert_eq!(spent, after_full.fuel_consumed - after_one.fuel_consumed);
    assert!(budget > 5_000_000 + 4096 * FUEL_PER_RECORD, "{budget}");
    // Another small call does not replace the peak.
    chain.route(&ctx(0, 1, "a", 8), &one.records()).unwrap();
    assert_eq!(chain.stats()[0].peak_fuel_use, (spent, budget));
}

#[test]
fn a_custom_plugin_chains_with_the_builtins() {
    let runtime = runtime();
    let pin = Spec::new("pin-x")
        .poison(Poison::PinZero)
        .undecided_by_default();
    let mut chain = Chain::new([
        Plugin::load(&runtime, &pin.wasm()).unwrap(),
        builtin(&runtime, narad_builtin_plugins::KEY_HASH),
        builtin(&runtime, narad_builtin_plugins::KEYLESS_INDEX),
        builtin(&runtime, narad_builtin_plugins::ROUND_ROBIN),
    ])
    .unwrap();
    let slab = Slab::new(0, &[Some(b"X1"), Some(b"plain"), None, Some(b"X2")]);
    let decisions = chain.route(&ctx(0, 2, "a", 6), &slab.records()).unwrap();
    assert_eq!(decisions[0], 0);
    assert_eq!(Some(decisions[1]), partition_for_key(b"plain", 6));
    assert_eq!(
        decisions[2], 0,
        "first keyless record of the round-robin cycle"
    );
    assert_eq!(decisions[3], 0);
    let stats = chain.stats();
    assert_eq!(stats[0].records_decided, 2);
    assert_eq!(stats[1].records_in, 2, "key-hash sees only what pin-x left");
}

#[test]
fn header_route_routes_by_header_through_its_config_and_falls_through() {
    let runtime = runtime();
    let mut chain = Chain::new([
        builtin(&runtime, narad_builtin_plugins::HEADER_ROUTE),
        builtin(&runtime, narad_builtin_plugins::KEY_HASH),
        builtin(&runtime, narad_builtin_plugins::ROUND_ROBIN),
    ])
    .unwrap();
    let mut c = ctx(0, 4, "regional", 4);
    c.config = b"header = region\nus = 0\neu = 1\n".to_vec();
    let us: &[(&[u8], &[u8])] = &[(b"region", b"us")];
    let eu: &[(&[u8], &[u8])] = &[(b"trace", b"x"), (b"region", b"eu")];
    let record = |offset, key, headers| RecordInput {
        parent_offset: offset,
        committed_at_ms: 0,
        key,
        headers,
        value: b"",
    };
    let records = [
        record(0, Some(b"k1".as_slice()), us),
        record(1, Some(b"k2".as_slice()), eu),
        record(2, Some(b"k3".as_slice()), &[]),
        record(3, None, &[]),
    ];
    let decisions = chain.route(&c, &records).unwrap();
    assert_eq!(decisions[0], 0);
    assert_eq!(decisions[1], 1);
    assert_eq!(Some(decisions[2]), partition_for_key(b"k3", 4));
    assert_eq!(decisions[3], 0, "keyless, no header: round-robin");
}

#[test]
fn header_route_without_a_config_fails_with_its_message() {
    let runtime = runtime();
    let mut chain = Chain::new([builtin(&runtime, narad_builtin_plugins::HEADER_ROUTE)]).unwrap();
    let err = chain
        .route(&context(4), &Slab::new(0, &[Some(b"k")]).records())
        .unwrap_err();
    assert_eq!(err.name, "header-route");
    match *err.failure {
        Failure::ErrorReturn { message, .. } => assert!(message.is_some()),
        other => panic!("{other:?}"),
    }
}

/// Keyless records at parent offsets from 1,000 on (the deploy test slab's are below).
const LATE_KEYLESS: &str = "(i32.and (i32.eq (local.get $b) (i32.const -1)) (i64.ge_u (i64.load (local.get $e)) (i64.const 1000)))";

#[test]
fn bisect_names_the_record_the_builtins_leave_to_a_failing_plugin() {
    let runtime = runtime();
    // Everything keyed is decided by key-hash, keyless-index passes (counts differ), and the
    // keyless record reaches the trapper.
    let trapper = Spec::new("trapper").poison(Poison::Trap).when(LATE_KEYLESS);
    let mut chain = Chain::new([
        builtin(&runtime, narad_builtin_plugins::KEY_HASH),
        builtin(&runtime, narad_builtin_plugins::KEYLESS_INDEX),
        Plugin::load(&runtime, &trapper.wasm()).unwrap(),
    ])
    .unwrap();
    let mut keys: Vec<Option<&[u8]>> = vec![Some(b"key"); 64];
    keys[42] = None;
    let slab = Slab::new(9000, &keys);
    let poison = chain.bisect(&ctx(0, 4, "a", 3), &slab.records()).unwrap();
    assert_eq!((poison.index, poison.parent_offset), (42, 9042));
    assert_eq!(poison.error.name, "trapper");
    assert_eq!(poison.error.kind(), FailureKind::Trap);
    // The trial run (what `narad plugin test` shows) names it too.
    let err = run_trial(&mut chain, &ctx(0, 4, "a", 3), &slab.records()).unwrap_err();
    assert_eq!(err.poison.unwrap().parent_offset, 9042);
}
