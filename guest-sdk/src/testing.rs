//! Native test harness: build slabs, run a router (or a chain) with plain `cargo test`, no
//! daemon and no Wasm.
//!
//! The harness encodes each slab with the host's own encoder and hands the router only the
//! fields its manifest asks for, exactly as the host does; a chain hands each plugin only the
//! records still undecided. So what passes here routes the same way in the daemon.
//!
//! ```
//! use narad_guest::testing::{SlabBuilder, TestRecord};
//! let slab = SlabBuilder::new()
//!     .child("analytics", 4)
//!     .keyed("user-1")
//!     .record(TestRecord::keyless().header("region", "eu"));
//! assert_eq!(slab.len(), 2);
//! ```

extern crate std;

use std::string::String;
use std::vec::Vec;
use std::{format, vec};

use narad_abi::{LogLevel, Needs, RecordInput, RouteContext, SlabEncoder, SlabView, UNDECIDED};

use crate::error::RouteError;
use crate::plugin::Plugin;

/// One record for a test slab.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestRecord {
    /// Parent offset; `None` takes the next one in slab order.
    pub parent_offset: Option<u64>,
    /// Commit time in ms since the Unix epoch.
    pub committed_at_ms: i64,
    /// The key (`None` = keyless).
    pub key: Option<Vec<u8>>,
    /// `(name, value)` headers.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The value.
    pub value: Vec<u8>,
}

impl TestRecord {
    /// A record with `key`.
    pub fn keyed(key: impl AsRef<[u8]>) -> Self {
        Self {
            key: Some(key.as_ref().to_vec()),
            ..Self::default()
        }
    }

    /// A record without a key.
    pub fn keyless() -> Self {
        Self::default()
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// Sets the value.
    pub fn value(mut self, value: impl AsRef<[u8]>) -> Self {
        self.value = value.as_ref().to_vec();
        self
    }

    /// Sets the parent offset.
    pub fn offset(mut self, offset: u64) -> Self {
        self.parent_offset = Some(offset);
        self
    }

    /// Sets the commit time.
    pub fn committed_at_ms(mut self, ms: i64) -> Self {
        self.committed_at_ms = ms;
        self
    }
}

/// Builds a slab and its route context. Defaults: parent `parent` partition 0 of 1, child
/// `child` with 1 partition, attempt 0, empty config.
#[derive(Clone, Debug)]
pub struct SlabBuilder {
    context: RouteContext,
    records: Vec<TestRecord>,
}

impl Default for SlabBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SlabBuilder {
    /// An empty slab with the default context.
    pub fn new() -> Self {
        Self {
            context: RouteContext {
                parent_topic: "parent".into(),
                parent_partition: 0,
                parent_partition_count: 1,
                child_topic: "child".into(),
                child_partition_count: 1,
                attempt: 0,
                config: Vec::new(),
            },
            records: Vec::new(),
        }
    }

    /// Sets the parent topic, the slab's parent partition and the parent's partition count.
    pub fn parent(mut self, topic: &str, partition: u32, partition_count: u32) -> Self {
        self.context.parent_topic = topic.into();
        self.context.parent_partition = partition;
        self.context.parent_partition_count = partition_count;
        self
    }

    /// Sets the child topic and its partition count.
    pub fn child(mut self, topic: &str, partition_count: u32) -> Self {
        self.context.child_topic = topic.into();
        self.context.child_partition_count = partition_count;
        self
    }

    /// Sets the attempt number (0 = first try).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.context.attempt = attempt;
        self
    }

    /// Sets the link's plugin config bytes.
    pub fn config(mut self, config: impl AsRef<[u8]>) -> Self {
        self.context.config = config.as_ref().to_vec();
        self
    }

    /// Appends a record.
    pub fn record(mut self, record: TestRecord) -> Self {
        self.records.push(record);
        self
    }

    /// Appends a record with `key`.
    pub fn keyed(self, key: impl AsRef<[u8]>) -> Self {
        self.record(TestRecord::keyed(key))
    }

    /// Appends a keyless record.
    pub fn keyless(self) -> Self {
        self.record(TestRecord::keyless())
    }

    /// The records.
    pub fn records(&self) -> &[TestRecord] {
        &self.records
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the slab has no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The route context.
    pub fn context(&self) -> &RouteContext {
        &self.context
    }

    /// The input buffer the host would write for the records at `indices` (in that order),
    /// with the fields `needs` asks for.
    pub fn encode(&self, needs: Needs, indices: &[usize]) -> Result<Vec<u8>, RouteError> {
        let mut headers: Vec<Vec<(&[u8], &[u8])>> = Vec::with_capacity(indices.len());
        for &i in indices {
            let r = self.get(i)?;
            headers.push(
                r.headers
                    .iter()
                    .map(|(n, v)| (n.as_bytes(), v.as_slice()))
                    .collect(),
            );
        }
        let mut inputs = Vec::with_capacity(indices.len());
        for (&i, h) in indices.iter().zip(&headers) {
            let r = self.get(i)?;
            inputs.push(RecordInput {
                parent_offset: r.parent_offset.unwrap_or(i as u64),
                committed_at_ms: r.committed_at_ms,
                key: r.key.as_deref(),
                headers: h,
                value: &r.value,
            });
        }
        let encoder = SlabEncoder::new(self.context.as_ref(), needs)
            .map_err(|e| RouteError::plugin(format!("test slab: {e}")))?;
        encoder
            .encode_to_vec(&inputs)
            .map_err(|e| RouteError::plugin(format!("test slab: {e}")))
    }

    fn get(&self, i: usize) -> Result<&TestRecord, RouteError> {
        self.records
            .get(i)
            .ok_or_else(|| RouteError::plugin(format!("no record {i} in the test slab")))
    }

    /// Routes the whole slab through `plugin` with a fresh instance.
    pub fn route<S: Default>(&self, plugin: &'static Plugin<S>) -> Result<Vec<u32>, RouteError> {
        Instance::new(plugin).route(self)
    }
}

/// One plugin instance with its own state, like the one the host keeps per link: route
/// several slabs through it to test state carried across slabs.
pub struct Instance<S: 'static> {
    plugin: &'static Plugin<S>,
    state: S,
}

impl<S: Default> Instance<S> {
    /// A fresh instance of `plugin`.
    pub fn new(plugin: &'static Plugin<S>) -> Self {
        Self {
            plugin,
            state: S::default(),
        }
    }

    /// Routes every record of `slab`; returns one slot per record ([`UNDECIDED`] for those
    /// left to the next plugin).
    pub fn route(&mut self, slab: &SlabBuilder) -> Result<Vec<u32>, RouteError> {
        let all: Vec<usize> = (0..slab.len()).collect();
        self.route_records(slab, &all)
    }

    /// Routes the records of `slab` at `indices`, as the host hands a plugin only the records
    /// still undecided; slot `j` of the result belongs to record `indices[j]`.
    pub fn route_records(
        &mut self,
        slab: &SlabBuilder,
        indices: &[usize],
    ) -> Result<Vec<u32>, RouteError> {
        let input = slab.encode(self.plugin.needs, indices)?;
        let view = SlabView::parse(&input)?;
        let mut out = vec![UNDECIDED; indices.len()];
        self.plugin.route_slab(&mut self.state, &view, &mut out)?;
        Ok(out)
    }

    /// The instance's state.
    pub fn state(&self) -> &S {
        &self.state
    }
}

/// A plugin instance in a chain, whatever its state type.
pub trait ChainLink {
    /// The plugin name.
    fn name(&self) -> &'static str;
    /// See [`Instance::route_records`].
    fn route_records(
        &mut self,
        slab: &SlabBuilder,
        indices: &[usize],
    ) -> Result<Vec<u32>, RouteError>;
}

impl<S: Default> ChainLink for Instance<S> {
    fn name(&self) -> &'static str {
        self.plugin.name
    }

    fn route_records(
        &mut self,
        slab: &SlabBuilder,
        indices: &[usize],
    ) -> Result<Vec<u32>, RouteError> {
        Instance::route_records(self, slab, indices)
    }
}

/// Why a chain could not route a slab (the host reports the same cases as plugin errors).
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainError {
    /// A plugin returned an error.
    Plugin {
        /// The plugin's name.
        plugin: &'static str,
        /// Its error.
        error: RouteError,
    },
    /// A plugin chose a partition at or past the child's partition count.
    OutOfRange {
        /// The plugin's name.
        plugin: &'static str,
        /// The record's index in the slab.
        record: usize,
        /// The partition chosen.
        partition: u32,
    },
    /// The record was still undecided after the last plugin.
    Undecided {
        /// The record's index in the slab.
        record: usize,
    },
}

/// Runs `slab` through `chain` like the host: each plugin sees only the records still
/// undecided; after the chain every record must be decided below the child partition count.
pub fn run_chain(
    chain: &mut [&mut dyn ChainLink],
    slab: &SlabBuilder,
) -> Result<Vec<u32>, ChainError> {
    let count = slab.context().child_partition_count;
    let mut decisions = vec![UNDECIDED; slab.len()];
    for link in chain.iter_mut() {
        let pending: Vec<usize> = (0..slab.len())
            .filter(|&i| decisions[i] == UNDECIDED)
            .collect();
        if pending.is_empty() {
            break;
        }
        let out = link
            .route_records(slab, &pending)
            .map_err(|error| ChainError::Plugin {
                plugin: link.name(),
                error,
            })?;
        for (&record, &partition) in pending.iter().zip(&out) {
            if partition == UNDECIDED {
                continue;
            }
            if partition >= count {
                return Err(ChainError::OutOfRange {
                    plugin: link.name(),
                    record,
                    partition,
                });
            }
            decisions[record] = partition;
        }
    }
    match decisions.iter().position(|&p| p == UNDECIDED) {
        Some(record) => Err(ChainError::Undecided { record }),
        None => Ok(decisions),
    }
}

/// Takes the lines this thread's router logged with `log!` so far.
pub fn take_logs() -> Vec<(LogLevel, String)> {
    crate::stub::take_logs()
}
