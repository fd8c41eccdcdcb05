//! How the metadata is laid out in etcd: one key per item (a topic with its partition owners, a
//! link, a plugin version) under `{prefix}meta/`, beside `meta/versions`, which every write
//! rewrites and compares (see [`super::etcd`]).
//!
//! | key (under `{prefix}meta/`)  | value (JSON)                          |
//! |------------------------------|---------------------------------------|
//! | `versions`                   | [`Versions`]                          |
//! | `topic/{name}`               | one [`TopicMeta`]                     |
//! | `link/{parent}/{child}`      | one [`LinkMeta`]                      |
//! | `plugin/{seq}`               | one [`PluginVersion`]; `seq` (ten digits) keeps upload order |
//! | `user/{name}`                | one [`UserMeta`] (salted credentials, never a password) |
//! | `acl/{principal}/{resource}/{pattern}/{name}/{operation}` | one [`AclRule`] |
//! | `topics`, `links`, `plugins` | [`LAYOUT_MARKER`]                     |
//!
//! Names in keys are escaped (`%` and `/`), so two items never share a key. The values are
//! read back from their JSON, never from the key.
//!
//! Builds before this layout kept each domain in one value (`topics`, `links`, `plugins`: JSON
//! arrays), which capped a cluster at about a thousand topics of twelve partitions. A node of
//! this build converts such metadata once, at start ([`convert`]); the old keys then hold
//! [`LAYOUT_MARKER`], a JSON object an older build cannot read as its array, so an older node
//! started by mistake refuses to work rather than see an empty cluster.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use imbl::ordmap::DiffItem;
use serde::de::DeserializeOwned;

use super::{
    LinkMeta, MetastoreError, PluginVersion, Result, Snapshot, TopicMeta, UserMeta, Versions,
};
use crate::acl::{AclRule, PatternKind};

/// The metadata keys live under `{prefix}meta/`.
pub(crate) const META: &str = "meta/";
/// The versions key, rewritten by every write and compared by the next.
pub(crate) const VERSIONS: &str = "versions";
const TOPIC: &str = "topic/";
const LINK: &str = "link/";
const PLUGIN: &str = "plugin/";
const USER: &str = "user/";
const ACL: &str = "acl/";
/// The keys of the one-value-per-domain layout of older builds.
pub(crate) const OLD_DOMAINS: [&str; 3] = ["topics", "links", "plugins"];

/// What the old domain keys hold once converted: valid JSON that is not the array an older
/// build expects.
pub(crate) const LAYOUT_MARKER: &str = r#"{"layout":2,"note":"narad keeps one etcd key per item under meta/topic/, meta/link/ and meta/plugin/; this build is too old for it"}"#;

/// Most operations one write puts in a transaction: etcd's default `--max-txn-ops` is 128.
pub(crate) const MAX_TXN_OPS: usize = 128;

/// Most bytes of values one transaction carries: etcd refuses requests over 1.5 MiB by
/// default (`--max-request-bytes`); keys and framing take the rest.
pub(crate) const MAX_TXN_BYTES: usize = 1400 * 1024;

/// Escapes a name for use inside a key: `%` and `/` become `%25` and `%2F`.
fn escape(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The key name (without the prefix) of a topic.
pub(crate) fn topic_key(name: &str) -> String {
    format!("{TOPIC}{}", escape(name))
}

/// The key name of a link.
pub(crate) fn link_key(parent: &str, child: &str) -> String {
    format!("{LINK}{}/{}", escape(parent), escape(child))
}

/// The key name of a user.
pub(crate) fn user_key(name: &str) -> String {
    format!("{USER}{}", escape(name))
}

/// The key name of an ACL rule: every field of the rule, so two rules never share a key.
pub(crate) fn acl_key(rule: &AclRule) -> String {
    let pattern = match rule.pattern {
        PatternKind::Literal => "literal",
        PatternKind::Prefixed => "prefixed",
    };
    format!(
        "{ACL}{}/{}/{pattern}/{}/{}",
        escape(&rule.principal),
        rule.resource.name(),
        escape(&rule.name),
        rule.operation.name()
    )
}

/// Undoes [`escape`].
fn unescape(part: &str) -> String {
    part.replace("%2F", "/").replace("%25", "%")
}

/// The key name of the plugin version with upload sequence number `seq`.
pub(crate) fn plugin_key(seq: u64) -> String {
    format!("{PLUGIN}{seq:010}")
}

/// The sequence number of a plugin key name, if it is one.
fn plugin_seq(name: &str) -> Option<u64> {
    name.strip_prefix(PLUGIN)?.parse().ok()
}

/// The entries of a range read under `meta`, each with its name (the key without `meta`);
/// keys that are not UTF-8 are not narad's and are skipped.
pub(crate) fn named<'a>(
    kvs: &'a [etcd_client::KeyValue],
    meta: &'a str,
) -> impl Iterator<Item = (&'a str, &'a etcd_client::KeyValue)> + 'a {
    kvs.iter().filter_map(move |entry| {
        let name = entry
            .key()
            .strip_prefix(meta.as_bytes())
            .and_then(|k| std::str::from_utf8(k).ok())?;
        Some((name, entry))
    })
}

/// The metadata decoded from the keys of one read, with what a write needs to change it key by
/// key.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    /// The metadata.
    pub(crate) snapshot: Snapshot,
    /// The key of each of `snapshot.plugins`, in the same order.
    pub(crate) plugin_keys: Vec<String>,
    /// Whether an old domain key holds an array: metadata of the old layout, to convert.
    pub(crate) old_layout: bool,
}

/// Decodes the keys under `meta/` (named without the prefix; `full_key` names them in
/// errors), in key order as etcd returns them.
pub(crate) fn decode<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    full_key: impl Fn(&str) -> String,
) -> Result<Decoded> {
    let mut decoded = Decoded::default();
    let parse = |name: &str, value: &[u8]| -> Result<serde_json::Value> {
        serde_json::from_slice(value).map_err(|e| MetastoreError::BadRecord {
            key: full_key(name),
            reason: e.to_string(),
        })
    };
    for (name, value) in entries {
        if name == VERSIONS {
            decoded.snapshot.versions = typed(name, value, &full_key)?;
        } else if name.starts_with(TOPIC) {
            let topic: TopicMeta = typed(name, value, &full_key)?;
            decoded.snapshot.topics.insert(topic.name.clone(), topic);
        } else if name.starts_with(LINK) {
            let link: LinkMeta = typed(name, value, &full_key)?;
            decoded
                .snapshot
                .links
                .insert((link.parent.clone(), link.child.clone()), link);
        } else if name.starts_with(USER) {
            let user: UserMeta = typed(name, value, &full_key)?;
            decoded.snapshot.users.insert(user.name.clone(), user);
        } else if name.starts_with(ACL) {
            let rule: AclRule = typed(name, value, &full_key)?;
            insert_acl(&mut decoded.snapshot.acls, rule);
        } else if plugin_seq(name).is_some() {
            decoded
                .snapshot
                .plugins
                .push(typed(name, value, &full_key)?);
            decoded.plugin_keys.push(name.to_owned());
        } else if OLD_DOMAINS.contains(&name) {
            // The marker, or an array of the old layout (converted at start).
            if parse(name, value)?.is_array() {
                decoded.old_layout = true;
            }
        }
        // Other keys a newer narad may add under meta/ are not ours to judge.
    }
    Ok(decoded)
}

/// Applies one key's change (`Some(value)` put, `None` deleted) to `snapshot` and its
/// `plugin_keys` (kept in key order beside `snapshot.plugins`), as [`decode`] would read the
/// key. `false` for a key it cannot apply alone (an old domain key: the caller decodes
/// everything, which judges the layout).
pub(crate) fn apply_change(
    snapshot: &mut Snapshot,
    plugin_keys: &mut Vec<String>,
    name: &str,
    value: Option<&[u8]>,
    full_key: impl Fn(&str) -> String,
) -> Result<bool> {
    if name == VERSIONS {
        snapshot.versions = match value {
            Some(value) => typed(name, value, &full_key)?,
            None => Versions::default(),
        };
    } else if let Some(escaped) = name.strip_prefix(TOPIC) {
        match value {
            Some(value) => {
                let topic: TopicMeta = typed(name, value, &full_key)?;
                snapshot.topics.insert(topic.name.clone(), topic);
            }
            None => {
                snapshot.topics.remove(&unescape(escaped));
            }
        }
    } else if let Some(pair) = name.strip_prefix(LINK) {
        match value {
            Some(value) => {
                let link: LinkMeta = typed(name, value, &full_key)?;
                snapshot
                    .links
                    .insert((link.parent.clone(), link.child.clone()), link);
            }
            None => {
                if let Some((parent, child)) = pair.split_once('/') {
                    snapshot.links.remove(&(unescape(parent), unescape(child)));
                }
            }
        }
    } else if name.starts_with(ACL) {
        match value {
            Some(value) => {
                let rule: AclRule = typed(name, value, &full_key)?;
                insert_acl(&mut snapshot.acls, rule);
            }
            // The rule is the one whose key this is.
            None => snapshot.acls.retain(|rule| acl_key(rule) != name),
        }
    } else if let Some(escaped) = name.strip_prefix(USER) {
        match value {
            Some(value) => {
                let user: UserMeta = typed(name, value, &full_key)?;
                snapshot.users.insert(user.name.clone(), user);
            }
            None => {
                snapshot.users.remove(&unescape(escaped));
            }
        }
    } else if plugin_seq(name).is_some() {
        let at = plugin_keys.binary_search_by(|k| k.as_str().cmp(name));
        match (value, at) {
            (Some(value), Ok(i)) => snapshot.plugins[i] = typed(name, value, &full_key)?,
            (Some(value), Err(i)) => {
                snapshot.plugins.insert(i, typed(name, value, &full_key)?);
                plugin_keys.insert(i, name.to_owned());
            }
            (None, Ok(i)) => {
                snapshot.plugins.remove(i);
                plugin_keys.remove(i);
            }
            (None, Err(_)) => {}
        }
    } else if OLD_DOMAINS.contains(&name) {
        return Ok(false);
    }
    Ok(true)
}

/// Puts `rule` in its place in the sorted `acls`, once.
fn insert_acl(acls: &mut Vec<AclRule>, rule: AclRule) {
    if let Err(at) = acls.binary_search(&rule) {
        acls.insert(at, rule);
    }
}

fn typed<T: DeserializeOwned>(
    name: &str,
    value: &[u8],
    full_key: impl Fn(&str) -> String,
) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| MetastoreError::BadRecord {
        key: full_key(name),
        reason: e.to_string(),
    })
}

/// One key's change in a write: `Some(value)` puts, `None` deletes.
pub(crate) type KeyChange = (String, Option<Vec<u8>>);

/// The key changes that turn `before` (with the key of each of its plugin versions) into
/// `after`, versions included when anything changed. Items are compared whole; unchanged ones
/// are not written.
pub(crate) fn diff(
    before: &Snapshot,
    plugin_keys: &[String],
    after: &Snapshot,
) -> Result<Vec<KeyChange>> {
    let mut changes = Vec::new();
    // `after` is `before` changed by a transition, so the maps share every item the change did
    // not touch and `diff` skips them: the cost is the change's, not the metadata's.
    changed_items(
        &before.topics,
        &after.topics,
        |name| topic_key(name),
        &mut changes,
    )?;
    changed_items(
        &before.links,
        &after.links,
        |(parent, child)| link_key(parent, child),
        &mut changes,
    )?;
    changed_items(
        &before.users,
        &after.users,
        |name| user_key(name),
        &mut changes,
    )?;
    for rule in &after.acls {
        if before.acls.binary_search(rule).is_err() {
            changes.push((acl_key(rule), Some(encode(&acl_key(rule), rule)?)));
        }
    }
    for rule in &before.acls {
        if after.acls.binary_search(rule).is_err() {
            changes.push((acl_key(rule), None));
        }
    }
    plugin_changes(&before.plugins, plugin_keys, &after.plugins, &mut changes)?;
    if !changes.is_empty() || before.versions != after.versions {
        changes.push((
            VERSIONS.to_owned(),
            Some(encode(VERSIONS, &after.versions)?),
        ));
    }
    Ok(changes)
}

/// The keys of the items that differ between `before` and `after` (`after` being `before`
/// changed by a transition, so that `diff` skips every part they share), with each new value
/// encoded or `None` for a removed item.
fn changed_items<K: Ord + Clone, V: serde::Serialize + PartialEq + Clone>(
    before: &super::Items<K, V>,
    after: &super::Items<K, V>,
    key_of: impl Fn(&K) -> String,
    changes: &mut Vec<KeyChange>,
) -> Result<()> {
    for item in before.diff(after) {
        let (id, value) = match item {
            DiffItem::Add(id, value)
            | DiffItem::Update {
                new: (id, value), ..
            } => (id, Some(value)),
            DiffItem::Remove(id, _) => (id, None),
        };
        let key = key_of(id);
        let value = value.map(|value| encode(&key, value)).transpose()?;
        changes.push((key, value));
    }
    Ok(())
}

/// The plugin keys' changes. The list keeps upload order; a write appends or removes
/// versions, and the ones kept keep their keys. A reordering (no transition makes one today)
/// rewrites every plugin key in the new order.
fn plugin_changes(
    before: &[PluginVersion],
    plugin_keys: &[String],
    after: &[PluginVersion],
    changes: &mut Vec<KeyChange>,
) -> Result<()> {
    let same_version =
        |a: &PluginVersion, b: &PluginVersion| a.name == b.name && a.digest == b.digest;
    let mut taken = vec![false; before.len()];
    // For each version after the write: the index of the same version before it, if any.
    let mut matched: Vec<Option<usize>> = Vec::with_capacity(after.len());
    for version in after {
        let found = (0..before.len()).find(|&i| !taken[i] && same_version(&before[i], version));
        if let Some(i) = found {
            taken[i] = true;
        }
        matched.push(found);
    }
    let kept: Vec<usize> = matched.iter().flatten().copied().collect();
    let in_order = kept.windows(2).all(|w| w[0] < w[1])
        // New versions come after every kept one.
        && matched
            .iter()
            .skip_while(|m| m.is_some())
            .all(Option::is_none);
    let mut next_seq = plugin_keys
        .iter()
        .filter_map(|k| plugin_seq(k))
        .max()
        .map_or(1, |s| s + 1);
    if !in_order {
        for key in plugin_keys {
            changes.push((key.clone(), None));
        }
        for version in after {
            let key = plugin_key(next_seq);
            next_seq += 1;
            changes.push((key.clone(), Some(encode(&key, version)?)));
        }
        return Ok(());
    }
    for (version, found) in after.iter().zip(&matched) {
        match found {
            Some(i) if before[*i] == *version => {}
            Some(i) => {
                let key = plugin_keys[*i].clone();
                changes.push((key.clone(), Some(encode(&key, version)?)));
            }
            None => {
                let key = plugin_key(next_seq);
                next_seq += 1;
                changes.push((key.clone(), Some(encode(&key, version)?)));
            }
        }
    }
    for (i, key) in plugin_keys.iter().enumerate() {
        if !taken[i] {
            changes.push((key.clone(), None));
        }
    }
    Ok(())
}

/// Encodes one item, refusing one larger than a transaction may carry.
fn encode<T: serde::Serialize + ?Sized>(key: &str, value: &T) -> Result<Vec<u8>> {
    let bytes = serde_json::to_vec(value).map_err(|e| MetastoreError::Task(e.to_string()))?;
    if bytes.len() > MAX_TXN_BYTES {
        return Err(MetastoreError::ItemTooLarge {
            key: key.to_owned(),
            bytes: bytes.len(),
            limit: MAX_TXN_BYTES,
        });
    }
    Ok(bytes)
}

/// Refuses a write etcd would refuse: more operations or bytes than one transaction takes.
/// `extra_ops` counts the compares and reads that go with the changes.
pub(crate) fn check_size(changes: &[KeyChange]) -> Result<()> {
    let operations = changes.len();
    let bytes: usize = changes
        .iter()
        .map(|(key, value)| key.len() + value.as_ref().map_or(0, Vec::len))
        .sum();
    if operations > MAX_TXN_OPS || bytes > MAX_TXN_BYTES {
        return Err(MetastoreError::WriteTooLarge {
            operations,
            bytes,
            max_operations: MAX_TXN_OPS,
            max_bytes: MAX_TXN_BYTES,
        });
    }
    Ok(())
}

/// Most keys one conversion transaction writes (well under [`MAX_TXN_OPS`], which also counts
/// the compare).
const CONVERT_BATCH_KEYS: usize = 100;

/// Converts metadata of the old layout under `prefix` to one key per item, once; returns
/// whether it converted anything. Safe against several nodes starting together and against a
/// node of an older build writing meanwhile: every transaction compares `meta/versions` with
/// the read it was planned from and starts over when another write landed; the last one also
/// compares the old keys and replaces them with [`LAYOUT_MARKER`]. Items left over from an
/// attempt that started over are put again or deleted by the next one. Refused while a node is
/// alive under `{prefix}nodes/` (an older build would keep writing the old keys): stop every
/// node, then start the upgraded ones.
pub(crate) async fn convert(client: &Client, prefix: &str) -> Result<bool> {
    let meta = format!("{prefix}{META}");
    let full_key = |name: &str| format!("{meta}{name}");
    let mut converted = false;
    for _ in 0..super::etcd::MAX_WRITE_ROUNDS {
        let response = super::etcd_range::read_prefix(client, &meta, false, false)
            .await
            .map_err(|source| MetastoreError::Unavailable {
                context: format!("reading {meta} from etcd"),
                source: Box::new(source),
            })?;
        let mut versions_revision = 0;
        let mut old: Vec<(String, i64, Vec<u8>)> = Vec::new();
        let mut items: Vec<(String, Vec<u8>)> = Vec::new();
        let mut versions: Option<Vec<u8>> = None;
        for (name, entry) in named(&response.kvs, &meta) {
            if name == VERSIONS {
                versions_revision = entry.mod_revision();
                versions = Some(entry.value().to_vec());
            } else if OLD_DOMAINS.contains(&name) {
                old.push((
                    name.to_owned(),
                    entry.mod_revision(),
                    entry.value().to_vec(),
                ));
            } else {
                items.push((name.to_owned(), entry.value().to_vec()));
            }
        }
        let arrays = old
            .iter()
            .filter(|(_, _, value)| value.first() == Some(&b'['))
            .count();
        if arrays == 0 {
            return Ok(converted);
        }
        let alive = live_nodes(client, prefix).await?;
        if !alive.is_empty() {
            return Err(MetastoreError::Task(format!(
                "the cluster's metadata under {meta} is in the layout of an older narad (one etcd \
                 value per domain); this build converts it once, with every node stopped, but \
                 node(s) {} are alive: stop every node (or wait for the lease of one just \
                 stopped to expire), then start the upgraded ones",
                alive.join(", ")
            )));
        }
        // The old values, decoded as the old build wrote them.
        let mut snapshot = Snapshot::default();
        if let Some(value) = &versions {
            snapshot.versions = typed::<Versions>(VERSIONS, value, full_key)?;
        }
        for (name, _, value) in &old {
            if value.first() != Some(&b'[') {
                continue;
            }
            match name.as_str() {
                "topics" => {
                    let topics: Vec<TopicMeta> = typed(name, value, full_key)?;
                    snapshot.topics = topics.into_iter().map(|t| (t.name.clone(), t)).collect();
                }
                "links" => {
                    let links: Vec<LinkMeta> = typed(name, value, full_key)?;
                    snapshot.links = links
                        .into_iter()
                        .map(|l| ((l.parent.clone(), l.child.clone()), l))
                        .collect();
                }
                _ => snapshot.plugins = typed(name, value, full_key)?,
            }
        }
        let mut wanted: Vec<(String, Vec<u8>)> = Vec::new();
        for (name, topic) in &snapshot.topics {
            wanted.push((topic_key(name), encode(&topic_key(name), topic)?));
        }
        for ((parent, child), link) in &snapshot.links {
            let key = link_key(parent, child);
            wanted.push((key.clone(), encode(&key, link)?));
        }
        for (i, version) in snapshot.plugins.iter().enumerate() {
            let key = plugin_key(i as u64 + 1);
            wanted.push((key.clone(), encode(&key, version)?));
        }
        let mut ops: Vec<TxnOp> = Vec::new();
        for (key, value) in &wanted {
            if !items.iter().any(|(k, v)| k == key && v == value) {
                ops.push(TxnOp::put(full_key(key), value.clone(), None));
            }
        }
        for (key, _) in &items {
            let is_item =
                key.starts_with(TOPIC) || key.starts_with(LINK) || key.starts_with(PLUGIN);
            if is_item && !wanted.iter().any(|(k, _)| k == key) {
                ops.push(TxnOp::delete(full_key(key), None));
            }
        }
        let guard = Compare::mod_revision(full_key(VERSIONS), CompareOp::Equal, versions_revision);
        let mut lost = false;
        while ops.len() > CONVERT_BATCH_KEYS {
            let rest = ops.split_off(CONVERT_BATCH_KEYS);
            let batch = std::mem::replace(&mut ops, rest);
            if !commit(
                client,
                &meta,
                Txn::new().when([guard.clone()]).and_then(batch),
            )
            .await?
            {
                lost = true;
                break;
            }
        }
        if lost {
            continue;
        }
        // The last batch: compare the old keys too, and replace them with the marker.
        let mut compares = vec![guard];
        for (name, revision, _) in &old {
            compares.push(Compare::mod_revision(
                full_key(name),
                CompareOp::Equal,
                *revision,
            ));
        }
        for name in OLD_DOMAINS {
            ops.push(TxnOp::put(full_key(name), LAYOUT_MARKER, None));
        }
        // Rewriting versions makes every other converter's next transaction start over.
        let versions_value = serde_json::to_vec(&snapshot.versions)
            .map_err(|e| MetastoreError::Task(e.to_string()))?;
        ops.push(TxnOp::put(full_key(VERSIONS), versions_value, None));
        if commit(client, &meta, Txn::new().when(compares).and_then(ops)).await? {
            tracing::info!(
                topics = snapshot.topics.len(),
                links = snapshot.links.len(),
                plugins = snapshot.plugins.len(),
                "converted the cluster's metadata to one etcd key per item"
            );
            converted = true;
        }
    }
    Err(MetastoreError::Contended {
        rounds: super::etcd::MAX_WRITE_ROUNDS,
    })
}

/// Commits `txn`; whether its compares held.
async fn commit(client: &Client, meta: &str, txn: Txn) -> Result<bool> {
    let mut kv = client.kv_client();
    let response = kv
        .txn(txn)
        .await
        .map_err(|source| MetastoreError::Unavailable {
            context: format!("converting {meta} in etcd"),
            source: Box::new(source),
        })?;
    Ok(response.succeeded())
}

/// The ids of the nodes with a key under `{prefix}nodes/` (alive: the key lives on a lease).
async fn live_nodes(client: &Client, prefix: &str) -> Result<Vec<String>> {
    let nodes = format!("{prefix}nodes/");
    let mut kv = client.kv_client();
    let response = kv
        .get(
            nodes.clone(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(|source| MetastoreError::Unavailable {
            context: format!("reading {nodes} from etcd"),
            source: Box::new(source),
        })?;
    Ok(response
        .kvs()
        .iter()
        .filter_map(|kv| {
            let key = std::str::from_utf8(kv.key()).ok()?;
            Some(key.strip_prefix(&nodes)?.to_owned())
        })
        .collect())
}
