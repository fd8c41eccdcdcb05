//! Wire contract shared by the Narad host and its routing plugins.
//!
//! `no_std` and dependency-free so that it builds for `wasm32-unknown-unknown` inside a
//! plugin and natively inside the host, and both sides agree bit for bit.
//!
//! Layout:
//! - [`partitioner`]: Kafka's default partitioner (`murmur2`), used by produce and by the
//!   `key-hash` plugin, so a key lands where a Kafka client would put it.
#![no_std]

pub mod partitioner;

pub use partitioner::{murmur2, partition_for_key};
