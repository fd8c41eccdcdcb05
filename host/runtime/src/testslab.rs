//! The built-in test slab every plugin must route at deploy, under production limits, and the
//! probe an attach runs with the link's real context.
//!
//! What the deploy check feeds a plugin, exactly (the plugin guide and `docs/abi.md` repeat it):
//! one call of `narad_route` with the 4 records of [`records`] (offsets 0 to 3: a keyed record
//! with 2 headers and a value, a keyless record, an empty key with an empty value, a 300-byte
//! key with 1 header and a 64-byte value; headers and values only if the manifest asks for
//! them) under [`context`]: parent `narad.deploy-check.parent` partition 1 of 4, child
//! `narad.deploy-check.child` with [`TEST_CHILD_PARTITIONS`] (3) partitions, attempt 0, and
//! the manifest's `probe_config` as config, or empty config bytes when it declares none.
//!
//! A plugin passes if it returns without trapping, overrunning, breaking the protocol or
//! answering out of range; leaving records undecided is fine (a plugin may be meant for the
//! middle of a chain). Every error return (`-1`, `-2`, `-3`) fails the deploy, with one
//! exception, and the deploy answer says when it applied ([`DeployProbe::NeedsConfig`]): a
//! plugin with no `probe_config` that answers `ROUTE_ERR_BAD_CONFIG` to the empty config is
//! accepted, because a plugin that needs a config cannot be blamed for refusing none; its
//! routing was then not checked at deploy, and [`probe_link`] checks it at attach.

use narad_abi::{RecordInput, RouteContext, SlabEncoder, UNDECIDED};

use crate::chain::Chain;
use crate::error::{ErrorCode, Failure, PluginError};
use crate::instance::Instance;

/// Child partition count of the test context (differs from the parent's 4, so keyless
/// records are not trivially kept in place).
pub const TEST_CHILD_PARTITIONS: u32 = 3;

/// The route context of the test slab.
pub fn context() -> RouteContext {
    RouteContext {
        parent_topic: "narad.deploy-check.parent".into(),
        parent_partition: 1,
        parent_partition_count: 4,
        child_topic: "narad.deploy-check.child".into(),
        child_partition_count: TEST_CHILD_PARTITIONS,
        attempt: 0,
        config: Vec::new(),
    }
}

const LONG_KEY: [u8; 300] = [b'k'; 300];
const HEADERS: [(&[u8], &[u8]); 2] = [(b"narad-test", b"1"), (b"content-type", b"text/plain")];

/// The records of the test slab.
pub fn records() -> [RecordInput<'static>; 4] {
    [
        RecordInput {
            parent_offset: 0,
            committed_at_ms: 1_700_000_000_000,
            key: Some(b"narad-test-key"),
            headers: &HEADERS,
            value: b"test value",
        },
        RecordInput {
            parent_offset: 1,
            committed_at_ms: 1_700_000_000_001,
            key: None,
            headers: &[],
            value: b"keyless",
        },
        RecordInput {
            parent_offset: 2,
            committed_at_ms: 1_700_000_000_002,
            key: Some(b""),
            headers: &[],
            value: b"",
        },
        RecordInput {
            parent_offset: 3,
            committed_at_ms: 1_700_000_000_003,
            key: Some(&LONG_KEY),
            headers: &HEADERS[..1],
            value: &[0u8; 64],
        },
    ]
}

/// What the deploy check learnt of a plugin that passed it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeployProbe {
    /// It routed the test slab (with its `probe_config`, or the empty config).
    Routed,
    /// It has no `probe_config` and answered `ROUTE_ERR_BAD_CONFIG` to the empty config: it
    /// was accepted, but its routing was not checked; an attach checks it with the link's
    /// config ([`probe_link`]).
    NeedsConfig {
        /// The plugin's message, escaped and cut like every plugin text.
        message: Option<String>,
    },
}

/// Routes the test slab through `instance` and checks the answer (see the module doc).
pub(crate) fn run(instance: &mut Instance) -> Result<DeployProbe, Failure> {
    let declared = instance.plugin().manifest().probe_config.clone();
    let mut ctx = context();
    if let Some(config) = &declared {
        ctx.config = config.as_bytes().to_vec();
    }
    let records = records();
    let encoder =
        SlabEncoder::new(ctx.as_ref(), instance.plugin().needs()).map_err(|e| Failure::Host {
            message: e.to_string(),
        })?;
    let input = encoder
        .encode_to_vec(records.iter())
        .map_err(|e| Failure::Host {
            message: e.to_string(),
        })?;
    let mut out = vec![UNDECIDED; records.len()];
    match instance.route(&input, &mut out) {
        Ok(()) => {}
        // Only the empty config may be refused: a declared probe config is one the plugin
        // said it accepts, so refusing it is a failure like -1 and -2.
        Err(Failure::ErrorReturn {
            code: ErrorCode::BadConfig,
            message,
        }) if declared.is_none() => return Ok(DeployProbe::NeedsConfig { message }),
        Err(other) => return Err(other),
    }
    for (record, &value) in records.iter().zip(&out) {
        if value != UNDECIDED && value >= TEST_CHILD_PARTITIONS {
            return Err(Failure::OutOfRange {
                value,
                record_offset: record.parent_offset,
                partition_count: TEST_CHILD_PARTITIONS,
            });
        }
    }
    Ok(DeployProbe::Routed)
}

/// The attach check: routes the [`records`] of the test slab through `chain` under `ctx`, the
/// link's real context (its parent and child topics and partition counts, its config), and
/// returns the error when a plugin answers `ROUTE_ERR_BAD_CONFIG`: a config the plugin can
/// never accept, whatever the records. Any other outcome is `Ok`: a record the chain leaves
/// undecided, or another failure on these made-up records, says nothing certain about the
/// link's real records, which production routing reports as usual.
///
/// Use a fresh chain: the probe moves plugin state (a round-robin position) like any call.
pub fn probe_link(chain: &mut Chain, ctx: &RouteContext) -> Result<(), Box<PluginError>> {
    match chain.route(ctx, &records()) {
        Err(error) if error.failure.is_bad_config() => Err(Box::new(error)),
        _ => Ok(()),
    }
}
