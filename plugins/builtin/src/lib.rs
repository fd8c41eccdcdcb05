//! The built-in routing plugins, compiled to Wasm by `build.rs` and embedded here, so the
//! daemon always has them (they cannot be deleted) and `narad plugin test` can run them.
//!
//! Layout: `build.rs` runs a nested `cargo build --release --target wasm32-unknown-unknown`
//! of `plugins/{key-hash,keyless-index,round-robin,header-route}`; this file exposes the
//! module bytes. `tests/` checks each module (valid Wasm, manifest, imports, exports) and that
//! the default chain reproduces the reference routing rules.
#![no_std]

/// `key-hash`: Kafka's default partitioner for every keyed record.
pub const KEY_HASH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/key-hash.wasm"));

/// `keyless-index`: a keyless record keeps its parent partition index when the parent and
/// child partition counts match.
pub const KEYLESS_INDEX: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/keyless-index.wasm"));

/// `round-robin`: every record still undecided, round-robin per link (so per child topic).
pub const ROUND_ROBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/round-robin.wasm"));

/// `header-route`: routes by a header's value through a map in the link's config.
pub const HEADER_ROUTE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/header-route.wasm"));

/// The chain a link gets when it names no router: it reproduces the reference engine's
/// routing (keys hashed like Kafka; keyless records keep their partition when the counts
/// match, else round-robin).
pub const DEFAULT_CHAIN: [&str; 3] = ["key-hash", "keyless-index", "round-robin"];

static ALL: [(&str, &[u8]); 4] = [
    ("key-hash", KEY_HASH),
    ("keyless-index", KEYLESS_INDEX),
    ("round-robin", ROUND_ROBIN),
    ("header-route", HEADER_ROUTE),
];

/// Every built-in plugin as `(name, module bytes)`; the name equals the manifest's.
pub fn all() -> &'static [(&'static str, &'static [u8])] {
    &ALL
}

/// The module bytes of the built-in plugin called `name`.
pub fn get(name: &str) -> Option<&'static [u8]> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}
