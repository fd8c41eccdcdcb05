//! The built-in test slab every plugin must route at deploy, under production limits.
//!
//! It holds the shapes of record a plugin meets in production (a keyed record with a header
//! and a value, a keyless record, an empty key, a long key) with a context whose child
//! partition count differs from the parent's. A plugin passes if it returns without trapping,
//! overrunning, breaking the protocol or answering out of range; leaving records undecided is
//! fine (a plugin may be meant for the middle of a chain).
//!
//! The link's config is not known at deploy, so the test slab carries none; a plugin that
//! answers `ROUTE_ERR_BAD_CONFIG` to an empty config passes (it needs a config to be useful,
//! which the link will give it); any other error return fails the deploy.

use narad_abi::{RecordInput, RouteContext, SlabEncoder, UNDECIDED};

use crate::error::{ErrorCode, Failure};
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

/// Routes the test slab through `instance` and checks the answer.
pub(crate) fn run(instance: &mut Instance) -> Result<(), Failure> {
    let ctx = context();
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
        Err(Failure::ErrorReturn {
            code: ErrorCode::BadConfig,
            ..
        }) => return Ok(()),
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
    Ok(())
}
