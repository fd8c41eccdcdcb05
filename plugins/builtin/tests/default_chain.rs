//! The default chain (key-hash, keyless-index, round-robin) run natively through the SDK
//! harness, exactly as the host chains plugins, against an independent model of the
//! reference engine's routing rules:
//! - a keyed record (an empty key is a key) goes to `(murmur2(key) & 0x7fffffff) % child`;
//! - a keyless record keeps its parent partition when parent and child counts match;
//! - otherwise keyless records go round-robin per child topic, continuing across slabs and
//!   placed afresh (the cycle continues) on a retry.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use narad_guest::testing::{ChainError, ChainLink, Instance, SlabBuilder, run_chain};
use narad_guest::{RouteError, partition_for_key};
use proptest::prelude::*;

/// One link's instances of the default chain (the host keeps one set per link).
struct DefaultChain {
    key_hash: Instance<()>,
    keyless_index: Instance<()>,
    round_robin: Instance<narad_plugin_round_robin::Cycle>,
}

impl DefaultChain {
    fn new() -> Self {
        Self {
            key_hash: Instance::new(&narad_plugin_key_hash::PLUGIN),
            keyless_index: Instance::new(&narad_plugin_keyless_index::PLUGIN),
            round_robin: Instance::new(&narad_plugin_round_robin::PLUGIN),
        }
    }

    fn route(&mut self, slab: &SlabBuilder) -> Result<Vec<u32>, ChainError> {
        let chain: &mut [&mut dyn ChainLink] = &mut [
            &mut self.key_hash,
            &mut self.keyless_index,
            &mut self.round_robin,
        ];
        run_chain(chain, slab)
    }
}

/// The reference rules, written independently of the plugins.
#[derive(Default)]
struct Model {
    round_robin: u64,
}

impl Model {
    fn route(
        &mut self,
        keys: &[Option<Vec<u8>>],
        parent: u32,
        parents: u32,
        children: u32,
    ) -> Vec<u32> {
        keys.iter()
            .map(|key| match key {
                Some(k) => partition_for_key(k, children).unwrap(),
                None if parents == children => parent,
                None => {
                    let p = (self.round_robin % u64::from(children)) as u32;
                    self.round_robin += 1;
                    p
                }
            })
            .collect()
    }
}

fn slab(keys: &[Option<Vec<u8>>], parent: u32, parents: u32, children: u32) -> SlabBuilder {
    keys.iter().fold(
        SlabBuilder::new()
            .parent("orders", parent, parents)
            .child("analytics", children),
        |s, k| match k {
            Some(k) => s.keyed(k),
            None => s.keyless(),
        },
    )
}

#[test]
fn keyed_keyless_and_empty_keys_follow_the_reference_rules_with_equal_counts() {
    let keys = vec![Some(b"user-1".to_vec()), None, Some(Vec::new()), None];
    let out = DefaultChain::new().route(&slab(&keys, 2, 4, 4)).unwrap();
    assert_eq!(
        out,
        [
            partition_for_key(b"user-1", 4).unwrap(),
            2,
            partition_for_key(b"", 4).unwrap(),
            2
        ]
    );
}

#[test]
fn keyless_records_go_round_robin_when_counts_differ() {
    let keys = vec![None, Some(b"k".to_vec()), None, None];
    let out = DefaultChain::new().route(&slab(&keys, 2, 4, 3)).unwrap();
    assert_eq!(out, [0, partition_for_key(b"k", 3).unwrap(), 1, 2]);
}

#[test]
fn round_robin_continues_across_slabs_and_is_independent_per_child_topic() {
    let keys = vec![None, None];
    let mut analytics = DefaultChain::new();
    let mut audit = DefaultChain::new();
    assert_eq!(analytics.route(&slab(&keys, 0, 1, 3)).unwrap(), [0, 1]);
    assert_eq!(audit.route(&slab(&keys[..1], 0, 1, 3)).unwrap(), [0]);
    assert_eq!(analytics.route(&slab(&keys, 0, 1, 3)).unwrap(), [2, 0]);
    // A retry of the same slab is placed afresh: the cycle moves on.
    assert_eq!(
        analytics.route(&slab(&keys, 0, 1, 3).attempt(1)).unwrap(),
        [1, 2]
    );
}

#[test]
fn a_child_without_partitions_fails_as_a_plugin_error_of_key_hash() {
    let keys = vec![Some(b"k".to_vec())];
    let err = DefaultChain::new()
        .route(&slab(&keys, 0, 1, 0))
        .unwrap_err();
    assert!(matches!(
        err,
        ChainError::Plugin {
            plugin: "key-hash",
            error: RouteError::Plugin(_)
        }
    ));
}

fn arb_keys() -> impl Strategy<Value = Vec<Option<Vec<u8>>>> {
    proptest::collection::vec(
        proptest::option::weighted(0.7, proptest::collection::vec(any::<u8>(), 0..20)),
        0..40,
    )
}

proptest! {
    #[test]
    fn the_default_chain_matches_the_reference_rules(
        slabs in proptest::collection::vec(arb_keys(), 1..5),
        parents in 1u32..6,
        children in 1u32..6,
        parent_seed in any::<u32>(),
    ) {
        let parent = parent_seed % parents;
        let mut chain = DefaultChain::new();
        let mut model = Model::default();
        for keys in &slabs {
            let got = chain.route(&slab(keys, parent, parents, children)).unwrap();
            prop_assert_eq!(got, model.route(keys, parent, parents, children));
        }
    }
}
