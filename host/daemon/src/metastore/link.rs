//! Links (fan-out children) and plugin versions as the metastore records them, and the rules
//! an attach must satisfy (checked inside the metastore write, so two concurrent attaches
//! cannot together break them).
//!
//! The link limits ([`MAX_CHILDREN_PER_PARENT`], [`MAX_DELAY_MS`],
//! [`DELAY_RETENTION_MARGIN_MS`]) live here, next to the rules that enforce them; anything
//! above the metastore that needs them (the bench, the fan-out) imports them from here.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::TopicMeta;

/// Most children one parent may have (engine reference: 108).
pub const MAX_CHILDREN_PER_PARENT: usize = 108;

/// Longest delay a delay child may have: one year of 365 days (engine reference: 1 year).
pub(crate) const MAX_DELAY_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// How much longer than its delay a delay child's parent must retain records (engine
/// reference: topic.MinRetentionMs = delay + 1 h), so a healthy delay child never drops behind.
pub(crate) const DELAY_RETENTION_MARGIN_MS: u64 = 60 * 60 * 1000;

/// A plugin of a link's router chain, resolved to the exact module bytes it runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginRef {
    /// The plugin's name.
    pub name: String,
    /// sha256 of the module, hex; fixed when the link is attached or its chain changed, so a
    /// new upload under the same name never changes a running link by surprise.
    pub digest: String,
}

impl std::fmt::Display for PluginRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.name, self.digest)
    }
}

/// One attached child.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkMeta {
    /// Parent topic.
    pub parent: String,
    /// Child topic.
    pub child: String,
    /// Fresh for every attach: 8 random bytes as 16 lowercase hex digits. A cursor resumes an
    /// offset file only when it carries this epoch.
    pub attach_epoch: String,
    /// The parent's committed high watermark per partition (index = partition) read while the
    /// attach was processed; `None` for links attached before attach points existed.
    pub attach_offsets: Option<Vec<u64>>,
    /// 0 for a plain child; otherwise records are copied only once they are this old.
    pub delay_ms: u64,
    /// The router chain, 1..=8 plugins, applied in order.
    pub router: Vec<PluginRef>,
    /// Bytes handed to every plugin of the chain as its configuration.
    #[serde(default)]
    pub config: String,
    /// When the link was attached, ms since the Unix epoch.
    pub attached_at_ms: i64,
    /// Parent partitions whose cursors are paused (`POST .../pause`), sorted: each finishes
    /// the slab it is committing, writes its position and copies nothing more until resumed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paused: Vec<u32>,
    /// A candidate chain run beside the real one (`PUT .../shadow`): it routes a copy of every
    /// slab it keeps up with, its decisions are compared and never committed. Absent in
    /// records written before shadows existed, and when none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSpec>,
    /// Set for a remote child: the child is a topic of another narad (cluster or node), not a
    /// local topic, and the cursors send their slabs through its batch produce. Absent for a
    /// local child and in records written before remote children existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteTarget>,
    /// What a cursor does when records it has not copied aged out of the parent: skip them
    /// onto the gap ledger (the default), or halt before them until an operator accepts.
    #[serde(default, skip_serializing_if = "OnGap::is_skip")]
    pub on_gap: OnGap,
    /// Gaps an operator accepted (`resume --accept-gap`), at most one per parent partition:
    /// a halted cursor of that partition at that position skips and goes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_gaps: Vec<AcceptedGap>,
    /// A local topic that takes, whole, each record the router chain cannot route (found
    /// by the poison search, failing on its own), so the rest of its slab goes on; `None`:
    /// such a record stalls the cursor until the chain is fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
}

impl LinkMeta {
    /// Whether the cursor of `partition`, at parent offset `from` and about to lose records
    /// that aged out, may skip them: the link skips on a gap, or an operator accepted this
    /// one.
    pub fn may_skip_gap(&self, partition: u32, from: u64) -> bool {
        self.on_gap == OnGap::Skip
            || self
                .accepted_gaps
                .iter()
                .any(|a| a.partition == partition && a.from == from)
    }
}

/// What a link's cursor does when the parent no longer holds records it has not copied
/// (retention removed them first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnGap {
    /// Skip to the parent's oldest record, writing the range onto the gap ledger.
    #[default]
    Skip,
    /// Stop before the range (state `halted`, naming it) until an operator accepts the loss
    /// or moves the cursor.
    Halt,
}

impl OnGap {
    /// True for [`OnGap::Skip`] (the default, left out of the stored record).
    pub fn is_skip(&self) -> bool {
        *self == OnGap::Skip
    }
}

/// A loss an operator accepted: the halted cursor of parent partition `partition`, at
/// position `from`, may skip what aged out from there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcceptedGap {
    /// The parent partition.
    pub partition: u32,
    /// The position the cursor halted at.
    pub from: u64,
}

/// Where a remote child's records go: a topic of another narad, reached over its public API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteTarget {
    /// The target's base URL (`http://host:port`).
    pub url: String,
    /// The topic there.
    pub topic: String,
    /// Its partition count when the link was attached: the router places records among
    /// these, and each lane goes to one of them.
    pub partitions: u32,
    /// A file holding the bearer token for the target, read when the sender starts and again
    /// after a 401 or 403. The token itself is never stored here nor shown by the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// A file of PEM CA certificates the target's TLS certificate is checked against, beside
    /// the system's (an `https://` target whose certificate a private CA signed); read when
    /// the sender starts. Written only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Names this side in each copy's origin header (the cluster name, or `node:{id}` on one
    /// node), recorded at the attach.
    #[serde(default)]
    pub source: String,
}

/// A link's shadow: the candidate chain and config the link's slabs are also routed by, for
/// comparison only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSpec {
    /// The candidate chain, 1..=8 recorded plugin versions, applied in order.
    pub router: Vec<PluginRef>,
    /// Bytes handed to every plugin of the candidate chain as its configuration.
    #[serde(default)]
    pub config: String,
    /// When the shadow was set, ms since the Unix epoch: setting it again (even the same
    /// chain) is a new shadow with a fresh report.
    pub set_at_ms: i64,
}

/// One uploaded version of a plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginVersion {
    /// The name it was uploaded under.
    pub name: String,
    /// sha256 of the module bytes, hex.
    pub digest: String,
    /// Module size in bytes.
    pub size_bytes: u64,
    /// The version string from the plugin's manifest.
    pub version: String,
    /// The one-line description from the plugin's manifest.
    pub description: String,
    /// When it was uploaded, ms since the Unix epoch (0 for built-ins).
    pub uploaded_at_ms: i64,
}

/// Why an attach (or a retention change) breaks the link rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkRuleError {
    /// The child is the parent.
    #[error("topic {0:?} cannot be its own child")]
    SelfLink(String),
    /// The link would close a cycle of links.
    #[error("attaching {child:?} to {parent:?} would create a cycle: {}", path.join(" -> "))]
    Cycle {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
        /// The cycle, parent first.
        path: Vec<String>,
    },
    /// The parent already has the maximum number of children.
    #[error("topic {parent:?} already has {max} children, the most a parent may have")]
    TooManyChildren {
        /// Parent.
        parent: String,
        /// The limit.
        max: usize,
    },
    /// The delay is over the maximum.
    #[error("delay_ms {delay_ms} is over the maximum of {max} (one year)")]
    DelayTooLong {
        /// Asked for.
        delay_ms: u64,
        /// The limit.
        max: u64,
    },
    /// A delay child's parent keeps records for less than the delay plus one hour.
    #[error(
        "topic {parent:?} keeps records for {retention} but a child delayed by {delay_ms} ms needs at least {needed_ms} ms (delay + 1 h); raise the parent's retention_ms first"
    )]
    RetentionTooShort {
        /// Parent.
        parent: String,
        /// The parent's retention, as text.
        retention: String,
        /// The child's delay.
        delay_ms: u64,
        /// The least retention the parent needs.
        needed_ms: u64,
    },
    /// A remote child's name is the name of a local topic (or a topic is to be created under
    /// the name of a remote child).
    #[error(
        "{0:?} is both a local topic and a remote child's name; give the remote child another name"
    )]
    RemoteChildIsATopic(String),
    /// A link's dead-letter topic is not a topic of this narad.
    #[error("the dead-letter topic {0:?} does not exist; create it first")]
    DeadLetterUnknown(String),
    /// A link's dead-letter topic is its own parent or child.
    #[error(
        "the dead-letter topic of {parent:?} -> {child:?} cannot be the parent or the child itself"
    )]
    DeadLetterIsLinked {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
    },
    /// A remote child was given a dead-letter topic.
    #[error("a dead-letter topic is for local children; {0:?} is a remote child")]
    DeadLetterOnRemote(String),
    /// A chain (a shadow's candidate) has no plugin, or more than a chain may hold.
    #[error("a router is a chain of 1 to {max} plugins; got {len}")]
    ChainLength {
        /// Plugins asked for.
        len: usize,
        /// The limit ([`narad_runtime::MAX_CHAIN_LEN`]).
        max: usize,
    },
}

/// Checks `link`'s dead-letter topic, if it names one: a local topic that exists, neither
/// its parent nor its child, and the link not a remote child.
pub(crate) fn check_dead_letter(
    topics: &crate::metastore::Items<String, TopicMeta>,
    link: &LinkMeta,
) -> Result<(), LinkRuleError> {
    let Some(topic) = &link.dead_letter else {
        return Ok(());
    };
    if link.remote.is_some() {
        return Err(LinkRuleError::DeadLetterOnRemote(link.child.clone()));
    }
    if *topic == link.parent || *topic == link.child {
        return Err(LinkRuleError::DeadLetterIsLinked {
            parent: link.parent.clone(),
            child: link.child.clone(),
        });
    }
    match topics.contains_key(topic) {
        true => Ok(()),
        false => Err(LinkRuleError::DeadLetterUnknown(topic.clone())),
    }
}

/// Checks the rules for attaching `link`, given the topics and the links that exist.
pub(crate) fn check_attach(
    topics: &crate::metastore::Items<String, TopicMeta>,
    links: &[LinkMeta],
    link: &LinkMeta,
) -> Result<(), LinkRuleError> {
    if link.parent == link.child {
        return Err(LinkRuleError::SelfLink(link.parent.clone()));
    }
    check_dead_letter(topics, link)?;
    if link.delay_ms > MAX_DELAY_MS {
        return Err(LinkRuleError::DelayTooLong {
            delay_ms: link.delay_ms,
            max: MAX_DELAY_MS,
        });
    }
    let children = links.iter().filter(|l| l.parent == link.parent).count();
    if children >= MAX_CHILDREN_PER_PARENT {
        return Err(LinkRuleError::TooManyChildren {
            parent: link.parent.clone(),
            max: MAX_CHILDREN_PER_PARENT,
        });
    }
    if let Some(parent) = topics.get(&link.parent) {
        check_retention(&link.parent, parent.retention_ms, link.delay_ms)?;
    }
    // A cycle exists if the parent is reachable from the child through existing links.
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for existing in links {
        edges
            .entry(existing.parent.as_str())
            .or_default()
            .push(existing.child.as_str());
    }
    let mut stack = vec![vec![link.child.as_str()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let Some(&node) = path.last() else { continue };
        if node == link.parent {
            let mut cycle = vec![link.parent.clone()];
            cycle.extend(path.iter().map(|s| s.to_string()));
            return Err(LinkRuleError::Cycle {
                parent: link.parent.clone(),
                child: link.child.clone(),
                path: cycle,
            });
        }
        if !seen.insert(node) {
            continue;
        }
        for next in edges.get(node).into_iter().flatten() {
            let mut longer = path.clone();
            longer.push(next);
            stack.push(longer);
        }
    }
    Ok(())
}

/// Checks that a parent keeping records for `retention_ms` (`None` = forever) can feed a
/// child delayed by `delay_ms`: it must keep them for at least the delay plus one hour.
pub(crate) fn check_retention(
    parent: &str,
    retention_ms: Option<u64>,
    delay_ms: u64,
) -> Result<(), LinkRuleError> {
    if delay_ms == 0 {
        return Ok(());
    }
    let needed_ms = delay_ms.saturating_add(DELAY_RETENTION_MARGIN_MS);
    match retention_ms {
        Some(retention) if retention < needed_ms => Err(LinkRuleError::RetentionTooShort {
            parent: parent.to_string(),
            retention: format!("{retention} ms"),
            delay_ms,
            needed_ms,
        }),
        _ => Ok(()),
    }
}

/// Why an attach epoch is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("attach epoch {0:?} is not 16 lowercase hex digits")]
pub struct BadEpoch(pub String);

/// A new attach epoch: 8 random bytes, as 16 lowercase hex digits.
pub fn new_epoch() -> String {
    let bytes: [u8; 8] = rand::random();
    hex::encode(bytes)
}

/// The 8 bytes of an epoch, as provenance stores them.
pub(crate) fn epoch_bytes(epoch: &str) -> Result<[u8; 8], BadEpoch> {
    let mut out = [0u8; 8];
    if epoch.len() != 16
        || !epoch
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(BadEpoch(epoch.to_string()));
    }
    hex::decode_to_slice(epoch, &mut out).map_err(|_| BadEpoch(epoch.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str, retention_ms: Option<u64>) -> TopicMeta {
        TopicMeta {
            writable_as_child: false,
            name: name.into(),
            partitions: 1,
            retention_ms,
            retention_bytes: None,
            created_at_ms: 0,
            owners: Vec::new(),
        }
    }

    fn link(parent: &str, child: &str, delay_ms: u64) -> LinkMeta {
        LinkMeta {
            parent: parent.into(),
            child: child.into(),
            attach_epoch: "0011223344556677".into(),
            attach_offsets: Some(vec![0]),
            delay_ms,
            router: Vec::new(),
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        }
    }

    fn topics(names: &[&str]) -> crate::metastore::Items<String, TopicMeta> {
        names
            .iter()
            .map(|n| (n.to_string(), topic(n, None)))
            .collect()
    }

    #[test]
    fn a_topic_cannot_be_its_own_child() {
        let err = check_attach(&topics(&["a"]), &[], &link("a", "a", 0)).unwrap_err();
        assert_eq!(err, LinkRuleError::SelfLink("a".into()));
    }

    #[test]
    fn a_link_that_closes_a_cycle_is_refused() {
        let existing = [link("a", "b", 0), link("b", "c", 0)];
        let err =
            check_attach(&topics(&["a", "b", "c"]), &existing, &link("c", "a", 0)).unwrap_err();
        assert!(
            matches!(err, LinkRuleError::Cycle { ref path, .. } if path == &["c", "a", "b", "c"])
        );
        // A diamond is not a cycle.
        assert!(check_attach(&topics(&["a", "b", "c"]), &existing, &link("a", "c", 0)).is_ok());
    }

    #[test]
    fn a_parent_takes_at_most_108_children() {
        let existing: Vec<LinkMeta> = (0..MAX_CHILDREN_PER_PARENT)
            .map(|i| link("p", &format!("c{i}"), 0))
            .collect();
        let err = check_attach(&topics(&["p"]), &existing, &link("p", "one-more", 0)).unwrap_err();
        assert!(matches!(
            err,
            LinkRuleError::TooManyChildren { max: 108, .. }
        ));
        assert!(check_attach(&topics(&["p"]), &existing[1..], &link("p", "one-more", 0)).is_ok());
    }

    #[test]
    fn a_delay_is_at_most_one_year() {
        assert!(check_attach(&topics(&["p"]), &[], &link("p", "c", MAX_DELAY_MS)).is_ok());
        assert!(matches!(
            check_attach(&topics(&["p"]), &[], &link("p", "c", MAX_DELAY_MS + 1)),
            Err(LinkRuleError::DelayTooLong { .. })
        ));
    }

    #[test]
    fn a_delay_child_needs_parent_retention_of_delay_plus_an_hour() {
        let hour = DELAY_RETENTION_MARGIN_MS;
        let mut short = topics(&["p"]);
        short.insert("p".into(), topic("p", Some(2 * hour - 1)));
        assert!(matches!(
            check_attach(&short, &[], &link("p", "c", hour)),
            Err(LinkRuleError::RetentionTooShort { needed_ms, .. }) if needed_ms == 2 * hour
        ));
        let mut enough = topics(&["p"]);
        enough.insert("p".into(), topic("p", Some(2 * hour)));
        assert!(check_attach(&enough, &[], &link("p", "c", hour)).is_ok());
        // Forever is long enough; a plain child needs nothing.
        assert!(check_attach(&topics(&["p"]), &[], &link("p", "c", hour)).is_ok());
        assert!(check_retention("p", Some(1), 0).is_ok());
    }

    #[test]
    fn new_epochs_are_sixteen_hex_digits_and_differ() {
        let a = new_epoch();
        let b = new_epoch();
        assert_eq!(a.len(), 16);
        assert!(epoch_bytes(&a).is_ok());
        assert_ne!(a, b);
    }

    #[test]
    fn epoch_bytes_round_trip_and_reject_garbage() {
        assert_eq!(
            epoch_bytes("67953471cc57a32a").unwrap(),
            [0x67, 0x95, 0x34, 0x71, 0xcc, 0x57, 0xa3, 0x2a]
        );
        assert!(epoch_bytes("67953471CC57A32A").is_err());
        assert!(epoch_bytes("short").is_err());
    }
}
