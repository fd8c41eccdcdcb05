//! The metastore's rules as pure transitions: a [`Change`] applied to a [`Snapshot`] gives the
//! next snapshot and an [`Outcome`], or the error that refuses it. Nothing here does I/O, so a
//! backend is only "apply the transition atomically": under a lock and one file replace for the
//! embedded file, under a compare-and-swap on its revision for a shared store.
//!
//! The rules, all checked in the one transition that makes the change:
//! - topics: a name is created once; partition counts only grow (the same count is a no-op);
//!   a delete takes the topic's links with it, as parent or as child;
//! - retention: a delay child's parent keeps at least the delay plus an hour;
//! - links: both topics exist, a pair is linked once, plus [`super::link::check_attach`] (no
//!   self link, no cycle, at most 108 children, delay at most a year, the retention floor), and
//!   a router names only recorded plugin versions;
//! - shadows: the link exists, the candidate chain holds 1 to 8 recorded plugin versions;
//! - plugins: the same name and digest twice is a no-op; a plugin a link's router (or its
//!   shadow's candidate) names cannot be removed.
//!
//! Versions: every applied change raises the counter of each domain it changed by one and no
//! other; a refused change or a no-op changes nothing.

use super::link::{
    AcceptedGap, LinkRuleError, OnGap, ShadowSpec, check_attach, check_dead_letter, check_retention,
};
use super::{
    Domain, LinkMeta, MetastoreError, PartitionOwner, PluginRef, PluginVersion, Result, Snapshot,
    TopicMeta, UserMeta, check_credentials, check_user_name,
};
use crate::acl::AclRule;
use crate::scram::ScramCredential;

/// What a [`Change::SetLinkPolicy`] changes of a link; what is `None` (or empty) stays.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyChange {
    /// What its cursors do on a gap.
    pub on_gap: Option<OnGap>,
    /// Gaps accepted now, each replacing the one accepted before on its parent partition.
    pub accept: Vec<AcceptedGap>,
    /// Its dead-letter topic: `Some(None)` clears it.
    pub dead_letter: Option<Option<String>>,
}

/// One change to the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// Create a topic.
    CreateTopic(TopicMeta),
    /// Delete a topic, and its links when `remove_links` says so.
    DeleteTopic {
        /// Topic name.
        name: String,
        /// Whether the topic's links go with it. When false, a topic that is a parent or a
        /// (local) child of any link is refused with [`MetastoreError::TopicHasLinks`] and
        /// nothing changes: the check and the delete are one step, so a link attached just
        /// before is never removed unseen.
        remove_links: bool,
    },
    /// Raise a topic's partition count.
    GrowPartitions {
        /// Topic name.
        name: String,
        /// The new count.
        count: u32,
        /// In cluster mode, the owners of the new partitions, in order; empty on one node.
        owners: Vec<PartitionOwner>,
    },
    /// Change a topic's retention (`None`: no limit).
    SetRetention {
        /// Topic name.
        name: String,
        /// Age limit in ms.
        retention_ms: Option<u64>,
        /// Size limit per partition in bytes.
        retention_bytes: Option<u64>,
    },
    /// Let producers write to a topic while it is a fan-out child, or not.
    SetWritableAsChild {
        /// Topic name.
        name: String,
        /// Whether they may.
        writable: bool,
    },
    /// Record a link between existing topics.
    AttachLink(LinkMeta),
    /// Record a new child topic and its link together.
    AttachLinkWithNewChild {
        /// The child topic to create.
        child: TopicMeta,
        /// The link.
        link: LinkMeta,
    },
    /// Remove a link.
    DetachLink {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
    },
    /// Replace a link's router chain (and its config, when given).
    SetLinkRouter {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
        /// The new chain.
        router: Vec<PluginRef>,
        /// The new config, or `None` to keep the current one.
        config: Option<String>,
    },
    /// Replace one partition's owner record, if it is still the one the caller read: the
    /// steps of a planned move (mark moving, hand over at generation + 1, cancel).
    SetOwner {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: u32,
        /// The record the caller read.
        expected: PartitionOwner,
        /// The record to write.
        owner: PartitionOwner,
    },
    /// Pause or resume the cursors of some parent partitions of a link (`None`: all of them).
    SetPaused {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
        /// The parent partitions; `None` for every one.
        partitions: Option<Vec<u32>>,
        /// Pause (`true`) or resume.
        paused: bool,
    },
    /// Set (`Some`) or clear (`None`) a link's shadow: a candidate chain its slabs are also
    /// routed by, for comparison only. Only the link's `shadow` changes: its own chain,
    /// config, epoch and paused set stay as they are.
    SetShadow {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
        /// The shadow, or `None` to clear it.
        shadow: Option<ShadowSpec>,
    },
    /// Change what a link's cursors do on a gap or on a record they cannot route, and
    /// record gaps an operator accepted (see [`PolicyChange`]).
    SetLinkPolicy {
        /// Parent.
        parent: String,
        /// Child.
        child: String,
        /// What changes.
        change: PolicyChange,
    },
    /// Record an uploaded plugin version.
    AddPlugin(PluginVersion),
    /// Remove every version of a plugin.
    RemovePlugin {
        /// Plugin name.
        name: String,
    },
    /// Record a new user.
    CreateUser(UserMeta),
    /// Replace a user's credentials.
    SetUserCredentials {
        /// User name.
        name: String,
        /// The new credentials.
        credentials: Vec<ScramCredential>,
        /// When, in milliseconds since the Unix epoch.
        updated_at_ms: i64,
    },
    /// Remove a user.
    DeleteUser {
        /// User name.
        name: String,
    },
    /// Add an ACL rule.
    AddAcl(AclRule),
    /// Remove an ACL rule.
    RemoveAcl(AclRule),
}

/// What an applied change answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
// One outcome per metadata change, moved straight to its caller: boxing the link would buy
// nothing measurable.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// The topic as recorded now (or as it was, for a delete).
    Topic(TopicMeta),
    /// The link as recorded now (or as it was, for a detach).
    Link(LinkMeta),
    /// The plugin version as recorded.
    Plugin(PluginVersion),
    /// The plugin versions removed.
    Plugins(Vec<PluginVersion>),
    /// The user as recorded now (or as it was, for a delete).
    User(UserMeta),
    /// The ACL rule added or removed.
    Acl(AclRule),
}

impl Outcome {
    /// The topic of a topic change.
    pub(crate) fn into_topic(self) -> Result<TopicMeta> {
        match self {
            Outcome::Topic(t) => Ok(t),
            other => Err(mismatch("a topic", other)),
        }
    }

    /// The user of a user change.
    pub(crate) fn into_user(self) -> Result<UserMeta> {
        match self {
            Outcome::User(u) => Ok(u),
            other => Err(mismatch("a user", other)),
        }
    }

    /// The rule of an ACL change.
    pub(crate) fn into_acl(self) -> Result<AclRule> {
        match self {
            Outcome::Acl(rule) => Ok(rule),
            other => Err(mismatch("an ACL rule", other)),
        }
    }

    /// The link of a link change.
    pub(crate) fn into_link(self) -> Result<LinkMeta> {
        match self {
            Outcome::Link(l) => Ok(l),
            other => Err(mismatch("a link", other)),
        }
    }

    /// The version of a plugin upload.
    pub(crate) fn into_plugin(self) -> Result<PluginVersion> {
        match self {
            Outcome::Plugin(p) => Ok(p),
            other => Err(mismatch("a plugin version", other)),
        }
    }

    /// The versions of a plugin removal.
    pub(crate) fn into_plugins(self) -> Result<Vec<PluginVersion>> {
        match self {
            Outcome::Plugins(p) => Ok(p),
            other => Err(mismatch("plugin versions", other)),
        }
    }
}

fn mismatch(wanted: &'static str, got: Outcome) -> MetastoreError {
    MetastoreError::OutcomeMismatch {
        wanted,
        got: Box::new(got),
    }
}

/// Applies `change` to `state`. On success `state` holds the next metadata (versions raised
/// for each changed domain) and the answer comes back with whether anything changed (a no-op
/// need not be written); on error `state` is exactly as it was.
pub(crate) fn apply(state: &mut Snapshot, change: Change) -> Result<(Outcome, bool)> {
    let mut next = state.clone();
    let (outcome, changed) = step(&mut next, change)?;
    for domain in &changed {
        next.versions.bump(*domain);
    }
    let any = !changed.is_empty();
    if any {
        *state = next;
    }
    Ok((outcome, any))
}

/// [`apply`] without the copy: `state` is changed where it stands, so the cost follows the
/// change, not the size of the metadata. On error `state` may be partly changed and must be
/// replaced by a good copy before it is used again (the file metastore's scratch state).
pub(crate) fn apply_in_place(state: &mut Snapshot, change: Change) -> Result<(Outcome, bool)> {
    let (outcome, changed) = step(state, change)?;
    for domain in &changed {
        state.versions.bump(*domain);
    }
    Ok((outcome, !changed.is_empty()))
}

/// The change itself, on a copy; returns the answer and the domains it changed.
fn step(s: &mut Snapshot, change: Change) -> Result<(Outcome, Vec<Domain>)> {
    match change {
        Change::CreateTopic(topic) => {
            if s.topics.contains_key(&topic.name) {
                return Err(MetastoreError::TopicExists { name: topic.name });
            }
            check_not_remote_child(s, &topic.name)?;
            check_owners(&topic)?;
            s.topics.insert(topic.name.clone(), topic.clone());
            Ok((Outcome::Topic(topic), vec![Domain::Topics]))
        }
        Change::DeleteTopic { name, remove_links } => {
            if !s.topics.contains_key(&name) {
                return Err(MetastoreError::UnknownTopic { name });
            }
            let letters_here = |l: &LinkMeta| l.dead_letter.as_deref() == Some(name.as_str());
            if !remove_links {
                let links: Vec<(String, String)> = s
                    .links
                    .iter()
                    .filter(|(ends, l)| link_names_topic(ends, l, &name) || letters_here(l))
                    .map(|(ends, _)| ends.clone())
                    .collect();
                if !links.is_empty() {
                    return Err(MetastoreError::TopicHasLinks { name, links });
                }
            }
            let Some(topic) = s.topics.remove(&name) else {
                return Err(MetastoreError::UnknownTopic { name });
            };
            let before = s.links.len();
            let gone: Vec<(String, String)> = s
                .links
                .iter()
                .filter(|(ends, l)| link_names_topic(ends, l, &name))
                .map(|(ends, _)| ends.clone())
                .collect();
            for ends in &gone {
                s.links.remove(ends);
            }
            // A link that only sends its dead letters here stays, without a dead-letter topic.
            let lettered: Vec<(String, String)> = s
                .links
                .iter()
                .filter(|(_, l)| letters_here(l))
                .map(|(ends, _)| ends.clone())
                .collect();
            let letters_cleared = !lettered.is_empty();
            for ends in &lettered {
                if let Some(link) = s.links.get_mut(ends) {
                    link.dead_letter = None;
                }
            }
            let mut domains = vec![Domain::Topics];
            if s.links.len() != before || letters_cleared {
                domains.push(Domain::Links);
            }
            Ok((Outcome::Topic(topic), domains))
        }
        Change::GrowPartitions {
            name,
            count,
            owners,
        } => {
            let Some(topic) = s.topics.get_mut(&name) else {
                return Err(MetastoreError::UnknownTopic { name });
            };
            if count < topic.partitions {
                return Err(MetastoreError::CannotShrink {
                    current: topic.partitions,
                    requested: count,
                    name,
                });
            }
            let changed = count != topic.partitions;
            // The new partitions' owners follow the old ones; anything else (owners for a
            // single-node topic, or for no new partition) leaves the two out of step and is
            // refused.
            let mut grown = topic.clone();
            grown.partitions = count;
            grown.owners.extend(owners);
            check_owners(&grown)?;
            *topic = grown;
            Ok((
                Outcome::Topic(topic.clone()),
                domains_if(changed, Domain::Topics),
            ))
        }
        Change::SetRetention {
            name,
            retention_ms,
            retention_bytes,
        } => {
            for link in s.links.values().filter(|l| l.parent == name) {
                check_retention(&name, retention_ms, link.delay_ms)?;
            }
            let Some(topic) = s.topics.get_mut(&name) else {
                return Err(MetastoreError::UnknownTopic { name });
            };
            let changed =
                topic.retention_ms != retention_ms || topic.retention_bytes != retention_bytes;
            topic.retention_ms = retention_ms;
            topic.retention_bytes = retention_bytes;
            Ok((
                Outcome::Topic(topic.clone()),
                domains_if(changed, Domain::Topics),
            ))
        }
        Change::SetWritableAsChild { name, writable } => {
            let Some(topic) = s.topics.get_mut(&name) else {
                return Err(MetastoreError::UnknownTopic { name });
            };
            let changed = topic.writable_as_child != writable;
            topic.writable_as_child = writable;
            Ok((
                Outcome::Topic(topic.clone()),
                domains_if(changed, Domain::Topics),
            ))
        }
        Change::AttachLink(link) => {
            attach(s, link.clone())?;
            Ok((Outcome::Link(link), vec![Domain::Links]))
        }
        Change::AttachLinkWithNewChild { child, link } => {
            if s.topics.contains_key(&child.name) {
                return Err(MetastoreError::TopicExists { name: child.name });
            }
            check_not_remote_child(s, &child.name)?;
            check_owners(&child)?;
            s.topics.insert(child.name.clone(), child);
            attach(s, link.clone())?;
            Ok((Outcome::Link(link), vec![Domain::Topics, Domain::Links]))
        }
        Change::DetachLink { parent, child } => {
            match s.links.remove(&(parent.clone(), child.clone())) {
                Some(link) => Ok((Outcome::Link(link), vec![Domain::Links])),
                None => Err(MetastoreError::UnknownLink { parent, child }),
            }
        }
        Change::SetLinkRouter {
            parent,
            child,
            router,
            config,
        } => {
            check_plugins_exist(s, &router)?;
            let Some(link) = s.links.get_mut(&(parent.clone(), child.clone())) else {
                return Err(MetastoreError::UnknownLink { parent, child });
            };
            let config = config.unwrap_or_else(|| link.config.clone());
            let changed = link.router != router || link.config != config;
            link.router = router;
            link.config = config;
            Ok((
                Outcome::Link(link.clone()),
                domains_if(changed, Domain::Links),
            ))
        }
        Change::SetPaused {
            parent,
            child,
            partitions,
            paused,
        } => {
            let count = match s.topics.get(&parent) {
                Some(topic) => topic.partitions,
                None => return Err(MetastoreError::UnknownTopic { name: parent }),
            };
            let Some(link) = s.links.get_mut(&(parent.clone(), child.clone())) else {
                return Err(MetastoreError::UnknownLink { parent, child });
            };
            let chosen = partitions.unwrap_or_else(|| (0..count).collect());
            if let Some(&bad) = chosen.iter().find(|&&p| p >= count) {
                return Err(MetastoreError::NoSuchPartition {
                    topic: parent,
                    partition: bad,
                    partitions: count,
                });
            }
            let mut now: std::collections::BTreeSet<u32> = link.paused.iter().copied().collect();
            for p in chosen {
                if paused {
                    now.insert(p);
                } else {
                    now.remove(&p);
                }
            }
            let now: Vec<u32> = now.into_iter().collect();
            let changed = now != link.paused;
            link.paused = now;
            Ok((
                Outcome::Link(link.clone()),
                domains_if(changed, Domain::Links),
            ))
        }
        Change::SetOwner {
            topic,
            partition,
            expected,
            owner,
        } => {
            let Some(meta) = s.topics.get_mut(&topic) else {
                return Err(MetastoreError::UnknownTopic { name: topic });
            };
            let index = usize::try_from(partition).unwrap_or(usize::MAX);
            let Some(current) = meta.owners.get_mut(index) else {
                return Err(MetastoreError::OwnerChanged {
                    topic,
                    partition,
                    expected: expected.to_string(),
                    found: "no owner (the partition does not exist, or the topic is not \
                            placed on cluster nodes)"
                        .to_owned(),
                });
            };
            if *current != expected {
                return Err(MetastoreError::OwnerChanged {
                    topic,
                    partition,
                    expected: expected.to_string(),
                    found: current.to_string(),
                });
            }
            let changed = *current != owner;
            *current = owner;
            Ok((
                Outcome::Topic(meta.clone()),
                domains_if(changed, Domain::Topics),
            ))
        }
        Change::SetShadow {
            parent,
            child,
            shadow,
        } => {
            if let Some(shadow) = &shadow {
                check_chain_length(&shadow.router)?;
                check_plugins_exist(s, &shadow.router)?;
            }
            let Some(link) = s.links.get_mut(&(parent.clone(), child.clone())) else {
                return Err(MetastoreError::UnknownLink { parent, child });
            };
            let changed = link.shadow != shadow;
            link.shadow = shadow;
            Ok((
                Outcome::Link(link.clone()),
                domains_if(changed, Domain::Links),
            ))
        }
        Change::SetLinkPolicy {
            parent,
            child,
            change:
                PolicyChange {
                    on_gap,
                    accept,
                    dead_letter,
                },
        } => {
            let count = match s.topics.get(&parent) {
                Some(topic) => topic.partitions,
                None => return Err(MetastoreError::UnknownTopic { name: parent }),
            };
            if let Some(bad) = accept.iter().find(|a| a.partition >= count) {
                return Err(MetastoreError::NoSuchPartition {
                    topic: parent,
                    partition: bad.partition,
                    partitions: count,
                });
            }
            let Some(link) = s.links.get_mut(&(parent.clone(), child.clone())) else {
                return Err(MetastoreError::UnknownLink { parent, child });
            };
            let before = link.clone();
            if let Some(on_gap) = on_gap {
                link.on_gap = on_gap;
            }
            if let Some(dead_letter) = dead_letter {
                let mut changed = link.clone();
                changed.dead_letter = dead_letter;
                check_dead_letter(&s.topics, &changed)?;
                link.dead_letter = changed.dead_letter;
            }
            // One accepted gap per partition: the newest acceptance replaces an older one,
            // which its cursor has passed (or never reached) by now.
            let mut accepted: std::collections::BTreeMap<u32, u64> = link
                .accepted_gaps
                .iter()
                .map(|a| (a.partition, a.from))
                .collect();
            accepted.extend(accept.iter().map(|a| (a.partition, a.from)));
            link.accepted_gaps = accepted
                .into_iter()
                .map(|(partition, from)| AcceptedGap { partition, from })
                .collect();
            let changed = before != *link;
            Ok((
                Outcome::Link(link.clone()),
                domains_if(changed, Domain::Links),
            ))
        }
        Change::AddPlugin(plugin) => {
            if let Some(existing) = s
                .plugins
                .iter()
                .find(|p| p.name == plugin.name && p.digest == plugin.digest)
            {
                return Ok((Outcome::Plugin(existing.clone()), Vec::new()));
            }
            s.plugins.push(plugin.clone());
            Ok((Outcome::Plugin(plugin), vec![Domain::Plugins]))
        }
        Change::RemovePlugin { name } => {
            let mut users: Vec<String> = s
                .links
                .values()
                .filter(|l| l.router.iter().any(|p| p.name == name))
                .map(|l| format!("{} -> {}", l.parent, l.child))
                .collect();
            // A shadow names recorded versions too: removing one under it would leave a
            // candidate that can never be built again.
            users.extend(
                s.links
                    .values()
                    .filter(|l| {
                        l.shadow
                            .as_ref()
                            .is_some_and(|sh| sh.router.iter().any(|p| p.name == name))
                    })
                    .map(|l| format!("the shadow of {} -> {}", l.parent, l.child)),
            );
            if !users.is_empty() {
                return Err(MetastoreError::PluginInUse { name, links: users });
            }
            let (removed, kept): (Vec<_>, Vec<_>) =
                s.plugins.drain(..).partition(|p| p.name == name);
            s.plugins = kept;
            if removed.is_empty() {
                return Err(MetastoreError::UnknownPlugin { name });
            }
            Ok((Outcome::Plugins(removed), vec![Domain::Plugins]))
        }
        Change::CreateUser(user) => {
            check_user_name(&user.name).map_err(MetastoreError::BadUser)?;
            check_credentials(&user.credentials).map_err(MetastoreError::BadUser)?;
            if s.users.contains_key(&user.name) {
                return Err(MetastoreError::UserExists { name: user.name });
            }
            s.users.insert(user.name.clone(), user.clone());
            Ok((Outcome::User(user), vec![Domain::Users]))
        }
        Change::SetUserCredentials {
            name,
            credentials,
            updated_at_ms,
        } => {
            check_credentials(&credentials).map_err(MetastoreError::BadUser)?;
            let Some(user) = s.users.get_mut(&name) else {
                return Err(MetastoreError::UnknownUser { name });
            };
            user.credentials = credentials;
            user.updated_at_ms = updated_at_ms;
            Ok((Outcome::User(user.clone()), vec![Domain::Users]))
        }
        Change::DeleteUser { name } => match s.users.remove(&name) {
            Some(user) => Ok((Outcome::User(user), vec![Domain::Users])),
            None => Err(MetastoreError::UnknownUser { name }),
        },
        Change::AddAcl(rule) => {
            rule.check().map_err(MetastoreError::BadAcl)?;
            match s.acls.binary_search(&rule) {
                Ok(_) => Ok((Outcome::Acl(rule), Vec::new())),
                Err(at) => {
                    s.acls.insert(at, rule.clone());
                    Ok((Outcome::Acl(rule), vec![Domain::Acls]))
                }
            }
        }
        Change::RemoveAcl(rule) => match s.acls.binary_search(&rule) {
            Ok(at) => {
                s.acls.remove(at);
                Ok((Outcome::Acl(rule), vec![Domain::Acls]))
            }
            Err(_) => Err(MetastoreError::UnknownAcl {
                rule: Box::new(rule),
            }),
        },
    }
}

/// A topic has one owner per partition (cluster mode) or none (one node).
fn check_owners(topic: &TopicMeta) -> Result<()> {
    let partitions = usize::try_from(topic.partitions).unwrap_or(usize::MAX);
    if topic.owners.is_empty() || topic.owners.len() == partitions {
        return Ok(());
    }
    Err(MetastoreError::Placement {
        topic: topic.name.clone(),
        partitions: topic.partitions,
        owners: topic.owners.len(),
    })
}

fn domains_if(changed: bool, domain: Domain) -> Vec<Domain> {
    if changed { vec![domain] } else { Vec::new() }
}

/// Adds `link` after checking that both topics exist, the pair is not linked yet, the link
/// rules hold and every plugin of its router is recorded.
/// Whether the link `(parent, child)` goes when `topic` is deleted: it is the link's parent or
/// its local child (a remote child of the same name is another thing, and its link stays).
pub(crate) fn link_names_topic(
    (parent, child): &(String, String),
    link: &LinkMeta,
    topic: &str,
) -> bool {
    parent == topic || (child == topic && link.remote.is_none())
}

fn attach(s: &mut Snapshot, link: LinkMeta) -> Result<()> {
    // A remote child names no local topic, and must not shadow one: the name would stand for
    // two different things in the link list.
    let local_ends: &[&String] = if link.remote.is_some() {
        if s.topics.contains_key(&link.child) {
            return Err(LinkRuleError::RemoteChildIsATopic(link.child.clone()).into());
        }
        &[&link.parent]
    } else {
        &[&link.parent, &link.child]
    };
    for topic in local_ends {
        if !s.topics.contains_key(*topic) {
            return Err(MetastoreError::UnknownTopic {
                name: (*topic).clone(),
            });
        }
    }
    let key = (link.parent.clone(), link.child.clone());
    if s.links.contains_key(&key) {
        return Err(MetastoreError::LinkExists {
            parent: link.parent,
            child: link.child,
        });
    }
    let links: Vec<LinkMeta> = s.links.values().cloned().collect();
    check_attach(&s.topics, &links, &link)?;
    check_plugins_exist(s, &link.router)?;
    s.links.insert(key, link);
    Ok(())
}

/// Refuses a new topic named like a remote child (see [`attach`]).
fn check_not_remote_child(s: &Snapshot, name: &str) -> Result<()> {
    if s.links
        .values()
        .any(|l| l.child == name && l.remote.is_some())
    {
        return Err(LinkRuleError::RemoteChildIsATopic(name.to_owned()).into());
    }
    Ok(())
}

/// A candidate chain holds 1 to [`narad_runtime::MAX_CHAIN_LEN`] plugins, as a link's does (a
/// link's own chain is checked by the API before it gets here).
fn check_chain_length(router: &[PluginRef]) -> Result<()> {
    let max = narad_runtime::MAX_CHAIN_LEN;
    if router.is_empty() || router.len() > max {
        return Err(LinkRuleError::ChainLength {
            len: router.len(),
            max,
        }
        .into());
    }
    Ok(())
}

/// A chain may only name recorded plugin versions: checked in the same transition as the link
/// change, so a plugin removed after the router was resolved cannot slip into a link.
fn check_plugins_exist(s: &Snapshot, router: &[PluginRef]) -> Result<()> {
    for plugin in router {
        if !s
            .plugins
            .iter()
            .any(|p| p.name == plugin.name && p.digest == plugin.digest)
        {
            return Err(MetastoreError::UnknownPlugin {
                name: format!("{}@{}", plugin.name, plugin.digest),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::metastore::test_topic as topic;

    #[test]
    fn an_outcome_of_another_kind_than_the_call_expects_is_an_outcome_mismatch() {
        let err = Outcome::Plugins(Vec::new()).into_topic().unwrap_err();
        assert!(
            matches!(
                &err,
                MetastoreError::OutcomeMismatch { wanted: "a topic", got }
                    if **got == Outcome::Plugins(Vec::new())
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "a metastore change answered Plugins([]), not a topic"
        );
    }

    #[test]
    fn a_remote_child_names_no_local_topic_and_no_topic_may_take_its_name() {
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(topic("orders", 2))).unwrap();
        apply(&mut state, Change::CreateTopic(topic("local", 1))).unwrap();
        let remote = |child: &str| LinkMeta {
            parent: "orders".into(),
            child: child.into(),
            attach_epoch: "00112233445566aa".into(),
            attach_offsets: Some(vec![0; 2]),
            delay_ms: 0,
            router: Vec::new(),
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: Some(crate::metastore::RemoteTarget {
                url: "http://127.0.0.1:7070".into(),
                topic: "copy".into(),
                partitions: 3,
                token_file: None,
                ca_file: None,
                source: "node:n1".into(),
            }),
        };
        // No local topic is needed for it, and none may share its name.
        apply(&mut state, Change::AttachLink(remote("away"))).unwrap();
        let err = apply(&mut state, Change::AttachLink(remote("local"))).unwrap_err();
        assert!(err.to_string().contains("remote child"), "{err}");
        let err = apply(&mut state, Change::CreateTopic(topic("away", 1))).unwrap_err();
        assert!(err.to_string().contains("remote child"), "{err}");
        // The view a cursor reads gives it the target's partition count.
        let view = crate::metastore::LinkTopics::find_in(&state, "orders", "away").unwrap();
        assert_eq!(view.child.partitions, 3);
        // Deleting the parent without its links is refused, naming them, and changes nothing.
        let before = state.clone();
        let err = apply(
            &mut state,
            Change::DeleteTopic {
                name: "orders".into(),
                remove_links: false,
            },
        )
        .unwrap_err();
        assert!(
            matches!(&err, MetastoreError::TopicHasLinks { links, .. }
                if links == &[("orders".to_owned(), "away".to_owned())]),
            "{err}"
        );
        assert_eq!(state, before);
        // Deleting the parent takes the link with it.
        apply(
            &mut state,
            Change::DeleteTopic {
                name: "orders".into(),
                remove_links: true,
            },
        )
        .unwrap();
        assert!(state.links.is_empty());
    }

    #[test]
    fn a_refused_change_leaves_the_state_exactly_as_it_was_and_a_no_op_reports_no_change() {
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(topic("orders", 2))).unwrap();
        let before = state.clone();
        let refused = [
            Change::CreateTopic(topic("orders", 1)),
            Change::GrowPartitions {
                name: "orders".into(),
                count: 1,
                owners: Vec::new(),
            },
            Change::DeleteTopic {
                name: "nope".into(),
                remove_links: true,
            },
            Change::RemovePlugin {
                name: "nope".into(),
            },
            Change::DetachLink {
                parent: "orders".into(),
                child: "nope".into(),
            },
        ];
        for change in refused {
            assert!(apply(&mut state, change.clone()).is_err(), "{change:?}");
            assert_eq!(state, before, "{change:?} changed the state");
        }
        let (outcome, changed) = apply(
            &mut state,
            Change::GrowPartitions {
                name: "orders".into(),
                count: 2,
                owners: Vec::new(),
            },
        )
        .unwrap();
        assert!(!changed);
        assert_eq!(outcome, Outcome::Topic(topic("orders", 2)));
        assert_eq!(state, before);
    }

    fn owned(name: &str, nodes: &[&str]) -> TopicMeta {
        TopicMeta {
            owners: nodes.iter().map(|n| PartitionOwner::first(*n)).collect(),
            ..topic(name, u32::try_from(nodes.len()).unwrap())
        }
    }

    fn grow(name: &str, count: u32, nodes: &[&str]) -> Change {
        Change::GrowPartitions {
            name: name.into(),
            count,
            owners: nodes.iter().map(|n| PartitionOwner::first(*n)).collect(),
        }
    }

    #[test]
    fn partitions_and_owners_stay_in_step_through_every_topic_change() {
        // (state before, change, accepted?)
        let cases: Vec<(Vec<TopicMeta>, Change, bool)> = vec![
            (vec![], Change::CreateTopic(owned("t", &["a", "b"])), true),
            (vec![], Change::CreateTopic(topic("t", 2)), true),
            (
                vec![],
                Change::CreateTopic(TopicMeta {
                    owners: vec![PartitionOwner::first("a")],
                    ..topic("t", 2)
                }),
                false,
            ),
            (vec![owned("t", &["a", "b"])], grow("t", 3, &["c"]), true),
            (vec![owned("t", &["a", "b"])], grow("t", 3, &[]), false),
            (
                vec![owned("t", &["a", "b"])],
                grow("t", 3, &["c", "a"]),
                false,
            ),
            (vec![owned("t", &["a", "b"])], grow("t", 2, &[]), true),
            (vec![owned("t", &["a", "b"])], grow("t", 2, &["c"]), false),
            (vec![topic("t", 2)], grow("t", 3, &[]), true),
            (vec![topic("t", 2)], grow("t", 3, &["c"]), false),
            (
                vec![topic("p", 1)],
                Change::AttachLinkWithNewChild {
                    child: TopicMeta {
                        owners: vec![PartitionOwner::first("a"); 3],
                        ..topic("c", 2)
                    },
                    link: LinkMeta {
                        parent: "p".into(),
                        child: "c".into(),
                        attach_epoch: "00".repeat(8),
                        attach_offsets: Some(vec![0]),
                        delay_ms: 0,
                        router: Vec::new(),
                        config: String::new(),
                        attached_at_ms: 0,
                        paused: Vec::new(),
                        shadow: None,
                        on_gap: Default::default(),
                        accepted_gaps: Vec::new(),
                        dead_letter: None,
                        remote: None,
                    },
                },
                false,
            ),
        ];
        for (topics, change, accepted) in cases {
            let mut state = Snapshot::default();
            for t in topics {
                state.topics.insert(t.name.clone(), t);
            }
            let before = state.clone();
            match apply(&mut state, change.clone()) {
                Ok(_) => {
                    assert!(accepted, "{change:?} was accepted");
                    for t in state.topics.values() {
                        assert!(
                            t.owners.is_empty() || t.owners.len() == t.partitions as usize,
                            "{change:?} left {t:?}"
                        );
                    }
                }
                Err(e) => {
                    assert!(!accepted, "{change:?} was refused: {e}");
                    assert!(matches!(e, MetastoreError::Placement { .. }), "{e}");
                    assert_eq!(state, before);
                }
            }
        }
    }

    #[test]
    fn an_owner_record_changes_only_from_the_record_the_caller_read() {
        let moving = |generation: u64| PartitionOwner {
            moving_to: Some("b".into()),
            ..PartitionOwner {
                generation,
                ..PartitionOwner::first("a")
            }
        };
        let at = |node: &str, generation: u64| PartitionOwner {
            generation,
            ..PartitionOwner::first(node)
        };
        let set =
            |partition: u32, expected: PartitionOwner, owner: PartitionOwner| Change::SetOwner {
                topic: "t".into(),
                partition,
                expected,
                owner,
            };
        // (change, accepted?)
        let cases = [
            // Mark moving, hand over at generation + 1, cancel.
            (set(0, at("a", 1), moving(1)), true),
            (set(0, moving(1), at("b", 2)), false),
            (set(1, at("b", 1), at("c", 2)), true),
            // A stale read (another move got there first), a wrong generation, no partition.
            (set(0, at("a", 2), moving(2)), false),
            (set(0, at("c", 1), moving(1)), false),
            (set(2, at("a", 1), moving(1)), false),
        ];
        for (change, accepted) in cases {
            let mut state = Snapshot::default();
            apply(&mut state, Change::CreateTopic(owned("t", &["a", "b"]))).unwrap();
            let before = state.clone();
            let result = apply(&mut state, change.clone());
            assert_eq!(result.is_ok(), accepted, "{change:?}: {result:?}");
            if accepted {
                let Change::SetOwner {
                    partition, owner, ..
                } = &change
                else {
                    unreachable!()
                };
                assert_eq!(&state.topics["t"].owners[*partition as usize], owner);
                assert_eq!(state.versions.topics, before.versions.topics + 1);
            } else {
                assert!(
                    matches!(result, Err(MetastoreError::OwnerChanged { .. })),
                    "{result:?}"
                );
                assert_eq!(state, before, "{change:?} changed the state");
            }
        }
        // A whole move, step by step from what each step read.
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(owned("t", &["a"]))).unwrap();
        apply(&mut state, set(0, at("a", 1), moving(1))).unwrap();
        apply(&mut state, set(0, moving(1), at("b", 2))).unwrap();
        assert_eq!(state.topics["t"].owners, vec![at("b", 2)]);
    }

    #[test]
    fn pausing_and_resuming_partitions_of_a_link_keeps_a_sorted_set_and_refuses_unknown_ones() {
        let link = LinkMeta {
            parent: "p".into(),
            child: "c".into(),
            attach_epoch: "00112233445566aa".into(),
            attach_offsets: Some(vec![0; 4]),
            delay_ms: 0,
            router: Vec::new(),
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        };
        let set = |partitions: Option<Vec<u32>>, paused: bool| Change::SetPaused {
            parent: "p".into(),
            child: "c".into(),
            partitions,
            paused,
        };
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(topic("p", 4))).unwrap();
        apply(&mut state, Change::CreateTopic(topic("c", 4))).unwrap();
        apply(&mut state, Change::AttachLink(link)).unwrap();
        let paused = |s: &Snapshot| s.links[&("p".to_owned(), "c".to_owned())].paused.clone();
        // (change, paused after it, versions moved?)
        let steps: Vec<(Change, Vec<u32>, bool)> = vec![
            (set(Some(vec![2, 0]), true), vec![0, 2], true),
            (set(Some(vec![2]), true), vec![0, 2], false),
            (set(Some(vec![0]), false), vec![2], true),
            (set(None, true), vec![0, 1, 2, 3], true),
            (set(None, false), vec![], true),
        ];
        for (change, want, moved) in steps {
            let before = state.versions.links;
            let (_, changed) = apply(&mut state, change.clone()).unwrap();
            assert_eq!(paused(&state), want, "{change:?}");
            assert_eq!(changed, moved, "{change:?}");
            assert_eq!(state.versions.links == before, !moved, "{change:?}");
        }
        let before = state.clone();
        for bad in [
            set(Some(vec![4]), true),
            Change::SetPaused {
                parent: "p".into(),
                child: "nope".into(),
                partitions: None,
                paused: true,
            },
        ] {
            assert!(apply(&mut state, bad.clone()).is_err(), "{bad:?}");
            assert_eq!(state, before);
        }
    }

    #[test]
    fn a_link_policy_change_keeps_one_accepted_gap_per_partition_and_names_only_a_real_dead_letter_topic()
     {
        let link = LinkMeta {
            parent: "p".into(),
            child: "c".into(),
            attach_epoch: "00112233445566aa".into(),
            attach_offsets: Some(vec![0; 4]),
            delay_ms: 0,
            router: Vec::new(),
            config: String::new(),
            attached_at_ms: 0,
            paused: Vec::new(),
            shadow: None,
            on_gap: OnGap::Halt,
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        };
        let accept = |gaps: &[(u32, u64)]| Change::SetLinkPolicy {
            parent: "p".into(),
            child: "c".into(),
            change: PolicyChange {
                accept: gaps
                    .iter()
                    .map(|&(partition, from)| AcceptedGap { partition, from })
                    .collect(),
                ..PolicyChange::default()
            },
        };
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(topic("p", 4))).unwrap();
        apply(&mut state, Change::CreateTopic(topic("c", 4))).unwrap();
        apply(&mut state, Change::AttachLink(link)).unwrap();
        let now = |s: &Snapshot| {
            let link = &s.links[&("p".to_owned(), "c".to_owned())];
            let gaps: Vec<(u32, u64)> = link
                .accepted_gaps
                .iter()
                .map(|a| (a.partition, a.from))
                .collect();
            (link.on_gap, gaps)
        };
        let (_, changed) = apply(&mut state, accept(&[(2, 10), (0, 5)])).unwrap();
        assert!(changed);
        assert_eq!(now(&state), (OnGap::Halt, vec![(0, 5), (2, 10)]));
        // A newer acceptance on a partition replaces the older one there.
        apply(&mut state, accept(&[(2, 40)])).unwrap();
        assert_eq!(now(&state), (OnGap::Halt, vec![(0, 5), (2, 40)]));
        let (_, changed) = apply(&mut state, accept(&[(2, 40)])).unwrap();
        assert!(!changed, "the same acceptance again changes nothing");
        let skip = Change::SetLinkPolicy {
            parent: "p".into(),
            child: "c".into(),
            change: PolicyChange {
                on_gap: Some(OnGap::Skip),
                ..PolicyChange::default()
            },
        };
        apply(&mut state, skip).unwrap();
        assert_eq!(now(&state), (OnGap::Skip, vec![(0, 5), (2, 40)]));
        // The stored record leaves the default policy out.
        let stored = serde_json::to_value(&state.links[&("p".to_owned(), "c".to_owned())]).unwrap();
        assert!(stored.get("on_gap").is_none(), "{stored}");

        // A dead-letter topic: an existing topic, neither end of the link; `Some(None)` clears.
        let dead_letter = |topic: Option<&str>| Change::SetLinkPolicy {
            parent: "p".into(),
            child: "c".into(),
            change: PolicyChange {
                dead_letter: Some(topic.map(str::to_owned)),
                ..PolicyChange::default()
            },
        };
        apply(&mut state, Change::CreateTopic(topic("dlq", 1))).unwrap();
        apply(&mut state, dead_letter(Some("dlq"))).unwrap();
        let named = |s: &Snapshot| {
            s.links[&("p".to_owned(), "c".to_owned())]
                .dead_letter
                .clone()
        };
        assert_eq!(named(&state).as_deref(), Some("dlq"));
        apply(&mut state, dead_letter(None)).unwrap();
        assert_eq!(named(&state), None);
        // A dead-letter topic in use is not deleted unseen: refused without force; with force
        // the link stays and loses its dead-letter topic.
        apply(&mut state, dead_letter(Some("dlq"))).unwrap();
        let delete = |remove_links: bool| Change::DeleteTopic {
            name: "dlq".into(),
            remove_links,
        };
        let err = apply(&mut state, delete(false)).unwrap_err();
        assert!(
            matches!(&err, MetastoreError::TopicHasLinks { links, .. }
                if links == &[("p".to_owned(), "c".to_owned())]),
            "{err}"
        );
        apply(&mut state, delete(true)).unwrap();
        assert_eq!(
            named(&state),
            None,
            "the link stays, without a dead-letter topic"
        );
        apply(&mut state, Change::CreateTopic(topic("dlq", 1))).unwrap();

        let before = state.clone();
        for bad in [
            dead_letter(Some("missing")),
            dead_letter(Some("p")),
            dead_letter(Some("c")),
            accept(&[(4, 0)]),
            Change::SetLinkPolicy {
                parent: "p".into(),
                child: "nope".into(),
                change: PolicyChange {
                    on_gap: Some(OnGap::Halt),
                    ..PolicyChange::default()
                },
            },
        ] {
            assert!(apply(&mut state, bad.clone()).is_err(), "{bad:?}");
            assert_eq!(state, before);
        }
    }

    #[test]
    fn a_shadow_names_only_recorded_plugins_in_a_chain_of_one_to_eight_and_leaves_the_link_alone() {
        let recorded = PluginVersion {
            name: "candidate".into(),
            digest: "c".repeat(64),
            size_bytes: 1,
            version: "1".into(),
            description: String::new(),
            uploaded_at_ms: 0,
        };
        let pinned = PluginRef {
            name: "candidate".into(),
            digest: "c".repeat(64),
        };
        let unrecorded = PluginRef {
            name: "candidate".into(),
            digest: "d".repeat(64),
        };
        let spec = |router: Vec<PluginRef>| ShadowSpec {
            router,
            config: "k = v".into(),
            set_at_ms: 7,
        };
        let set = |child: &str, shadow: Option<ShadowSpec>| Change::SetShadow {
            parent: "p".into(),
            child: child.into(),
            shadow,
        };
        let mut state = Snapshot::default();
        apply(&mut state, Change::CreateTopic(topic("p", 2))).unwrap();
        apply(&mut state, Change::CreateTopic(topic("c", 2))).unwrap();
        apply(&mut state, Change::AddPlugin(recorded)).unwrap();
        let link = LinkMeta {
            parent: "p".into(),
            child: "c".into(),
            attach_epoch: "00112233445566aa".into(),
            attach_offsets: Some(vec![0; 2]),
            delay_ms: 0,
            router: vec![pinned.clone()],
            config: "real".into(),
            attached_at_ms: 0,
            paused: vec![1],
            shadow: None,
            on_gap: Default::default(),
            accepted_gaps: Vec::new(),
            dead_letter: None,
            remote: None,
        };
        apply(&mut state, Change::AttachLink(link.clone())).unwrap();

        // (change, accepted?, what the refusal says)
        let cases: Vec<(Change, bool, &str)> = vec![
            (set("c", Some(spec(vec![unrecorded]))), false, "no plugin"),
            (
                set("c", Some(spec(Vec::new()))),
                false,
                "1 to 8 plugins; got 0",
            ),
            (
                set("c", Some(spec(vec![pinned.clone(); 9]))),
                false,
                "1 to 8 plugins; got 9",
            ),
            (
                set("nope", Some(spec(vec![pinned.clone()]))),
                false,
                "not a child",
            ),
            (set("nope", None), false, "not a child"),
            (set("c", Some(spec(vec![pinned.clone(); 8]))), true, ""),
            (set("c", Some(spec(vec![pinned.clone()]))), true, ""),
        ];
        for (change, accepted, says) in cases {
            let before = state.clone();
            match apply(&mut state, change.clone()) {
                Ok((outcome, changed)) => {
                    assert!(accepted, "{change:?} was accepted");
                    assert!(changed);
                    assert_eq!(state.versions.links, before.versions.links + 1);
                    let now = outcome.into_link().unwrap();
                    // Only the shadow moved: chain, config, epoch and pauses are the link's.
                    assert_eq!(
                        LinkMeta {
                            shadow: None,
                            on_gap: Default::default(),
                            accepted_gaps: Vec::new(),
                            dead_letter: None,
                            ..now.clone()
                        },
                        link
                    );
                    let Change::SetShadow { shadow, .. } = change else {
                        unreachable!()
                    };
                    assert_eq!(now.shadow, shadow);
                }
                Err(e) => {
                    assert!(!accepted, "{change:?} was refused: {e}");
                    assert!(e.to_string().contains(says), "{e}");
                    assert_eq!(state, before, "{change:?} changed the state");
                }
            }
        }

        // The same shadow again is a no-op; a plugin it names cannot be removed; clearing it
        // frees the plugin (the link's own chain still holds it here, so that refusal stays).
        let again = apply(&mut state, set("c", Some(spec(vec![pinned.clone()])))).unwrap();
        assert!(!again.1);
        let refused = apply(
            &mut state,
            Change::RemovePlugin {
                name: "candidate".into(),
            },
        )
        .unwrap_err();
        assert!(
            refused.to_string().contains("the shadow of p -> c"),
            "{refused}"
        );
        let (_, changed) = apply(&mut state, set("c", None)).unwrap();
        assert!(changed);
        assert_eq!(state.links[&("p".to_owned(), "c".to_owned())], link);
        let refused = apply(
            &mut state,
            Change::RemovePlugin {
                name: "candidate".into(),
            },
        )
        .unwrap_err();
        assert!(!refused.to_string().contains("shadow"), "{refused}");
    }
}
