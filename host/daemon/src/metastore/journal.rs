//! The file metastore's change journal: `metastore.journal`, one checksummed line per applied
//! change, so that a change costs what it writes and not the size of all the metadata.
//!
//! A line is a [`super::frame`] under the field `entry`:
//!
//! ```text
//! {"crc32c":"xxxxxxxx","entry":{"seq":N,"versions":{..},"topics":[..],"links":[..],"plugins":..}}\n
//! ```
//!
//! An [`Entry`] records what the change made of the keys it touched (each topic and link by
//! name, with its new value or `null` for removed, and the whole plugin list when plugins
//! changed), not the request: replaying it needs none of the metastore's rules, so a later
//! binary with stricter rules replays an older journal exactly. `seq` numbers the changes; the
//! snapshot records the last one it contains (`journal_seq`), and replay applies, in file
//! order, each entry whose `seq` is the next one and skips those the state already holds.
//!
//! What the reader does with bytes that are not a valid line:
//! - after the last valid line, with nothing valid behind them: the tail of an append that a
//!   crash interrupted, which was never acknowledged; the caller sets those bytes aside and
//!   cuts them off;
//! - with a valid line behind them: damage to acknowledged changes, reported as corrupt.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::frame;
use super::transition::Change;
use crate::acl::AclRule;

use super::{
    LinkMeta, MetastoreError, PluginVersion, Result, Snapshot, TopicMeta, UserMeta, Versions,
};

/// File name of the journal of changes since the snapshot.
pub(crate) const FILE_NAME: &str = "metastore.journal";
/// File name of the journal of the changes between the backup snapshot and the snapshot.
pub(crate) const BACKUP_FILE_NAME: &str = "metastore.journal.prev";
/// Prefix of the files a cut journal tail is set aside in (`.<seq>-<unix ms>` follows).
pub(crate) const TORN_FILE_PREFIX: &str = "metastore.journal.torn";
/// The frame field of a journal line.
const FIELD: &str = "entry";

/// One applied change, as the state it left behind for the keys it touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    /// The change's number: one more than the one before it.
    pub(crate) seq: u64,
    /// The versions after the change.
    versions: Versions,
    /// Each topic the change touched, with its value after it (`None`: removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    topics: Vec<TopicAfter>,
    /// Each link the change touched, with its value after it (`None`: removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    links: Vec<LinkAfter>,
    /// The whole plugin list after the change, when it changed plugins (the list is ordered
    /// and small, so it is recorded whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plugins: Option<Vec<PluginVersion>>,
    /// Each user the change touched, with its value after it (`None`: removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    users: Vec<UserAfter>,
    /// The whole ACL list after the change, when it changed ACLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acls: Option<Vec<AclRule>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UserAfter {
    name: String,
    user: Option<UserMeta>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicAfter {
    name: String,
    topic: Option<TopicMeta>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkAfter {
    parent: String,
    child: String,
    link: Option<LinkMeta>,
}

/// The keys a change may touch, read from the change (and, for a topic delete, the links the
/// state held before it): a superset of what the change modifies is harmless (an untouched
/// key is recorded with the value it already had), a missing key would lose a change, which
/// the debug builds' check after every write ([`Entry::apply_to`] against the committed state)
/// catches in every test that writes.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    topics: BTreeSet<String>,
    links: BTreeSet<(String, String)>,
    plugins: bool,
    users: BTreeSet<String>,
    acls: bool,
}

impl Touched {
    /// What `change` may touch in `before`, the state it is about to be applied to.
    pub(crate) fn of(change: &Change, before: &Snapshot) -> Touched {
        let mut t = Touched::default();
        let link = |t: &mut Touched, parent: &str, child: &str| {
            t.links.insert((parent.to_owned(), child.to_owned()));
        };
        match change {
            Change::CreateTopic(topic) => {
                t.topics.insert(topic.name.clone());
            }
            Change::DeleteTopic { name, .. } => {
                t.topics.insert(name.clone());
                t.links.extend(
                    before
                        .links
                        .keys()
                        .filter(|(p, c)| p == name || c == name)
                        .cloned(),
                );
            }
            Change::GrowPartitions { name, .. }
            | Change::SetRetention { name, .. }
            | Change::SetWritableAsChild { name, .. } => {
                t.topics.insert(name.clone());
            }
            Change::SetOwner { topic, .. } => {
                t.topics.insert(topic.clone());
            }
            Change::AttachLink(l) => link(&mut t, &l.parent, &l.child),
            Change::AttachLinkWithNewChild { child, link: l } => {
                t.topics.insert(child.name.clone());
                link(&mut t, &l.parent, &l.child);
            }
            Change::DetachLink { parent, child }
            | Change::SetLinkRouter { parent, child, .. }
            | Change::SetPaused { parent, child, .. }
            | Change::SetShadow { parent, child, .. }
            | Change::SetLinkPolicy { parent, child, .. } => link(&mut t, parent, child),
            Change::AddPlugin(_) | Change::RemovePlugin { .. } => t.plugins = true,
            Change::CreateUser(user) => {
                t.users.insert(user.name.clone());
            }
            Change::SetUserCredentials { name, .. } | Change::DeleteUser { name } => {
                t.users.insert(name.clone());
            }
            Change::AddAcl(_) | Change::RemoveAcl(_) => t.acls = true,
        }
        t
    }
}

impl Entry {
    /// The entry numbered `seq` for a change that touched `touched` and left `after`.
    pub(crate) fn record(seq: u64, touched: &Touched, after: &Snapshot) -> Entry {
        Entry {
            seq,
            versions: after.versions,
            topics: touched
                .topics
                .iter()
                .map(|name| TopicAfter {
                    name: name.clone(),
                    topic: after.topics.get(name).cloned(),
                })
                .collect(),
            links: touched
                .links
                .iter()
                .map(|(parent, child)| LinkAfter {
                    parent: parent.clone(),
                    child: child.clone(),
                    link: after.links.get(&(parent.clone(), child.clone())).cloned(),
                })
                .collect(),
            plugins: touched.plugins.then(|| after.plugins.clone()),
            users: touched
                .users
                .iter()
                .map(|name| UserAfter {
                    name: name.clone(),
                    user: after.users.get(name).cloned(),
                })
                .collect(),
            acls: touched.acls.then(|| after.acls.clone()),
        }
    }

    /// Makes `state` what the change left: the recorded keys take their recorded values.
    pub(crate) fn apply_to(&self, state: &mut Snapshot) {
        state.versions = self.versions;
        for t in &self.topics {
            match &t.topic {
                Some(topic) => {
                    state.topics.insert(t.name.clone(), topic.clone());
                }
                None => {
                    state.topics.remove(&t.name);
                }
            }
        }
        for l in &self.links {
            let key = (l.parent.clone(), l.child.clone());
            match &l.link {
                Some(link) => {
                    state.links.insert(key, link.clone());
                }
                None => {
                    state.links.remove(&key);
                }
            }
        }
        if let Some(plugins) = &self.plugins {
            state.plugins.clone_from(plugins);
        }
        if let Some(acls) = &self.acls {
            state.acls.clone_from(acls);
        }
        for u in &self.users {
            match &u.user {
                Some(user) => {
                    state.users.insert(u.name.clone(), user.clone());
                }
                None => {
                    state.users.remove(&u.name);
                }
            }
        }
    }

    /// The entry as one journal line.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let body = serde_json::to_vec(self).map_err(|e| MetastoreError::Io {
            context: "encoding a metastore journal entry".to_owned(),
            source: std::io::Error::other(e),
        })?;
        Ok(frame::encode(FIELD, &body))
    }
}

/// What a journal file holds.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// The valid lines, in file order.
    pub(crate) entries: Vec<Entry>,
    /// Where the valid lines end: the file's length when nothing follows them.
    pub(crate) valid_len: u64,
    /// The bytes after the last valid line (an interrupted append), empty when there are none.
    pub(crate) tail: Vec<u8>,
}

/// Parses the bytes of the journal file at `path`: every valid line, and the tail after the
/// last one. A damaged line with a valid line after it is [`MetastoreError::Corrupt`].
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    let corrupt = |reason: String| MetastoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
        backup: None,
    };
    let mut parsed = Parsed::default();
    let mut at = 0usize;
    // The first damaged line, if any: an error only if a valid line follows it.
    let mut damaged: Option<(usize, String)> = None;
    while at < bytes.len() {
        let end = match bytes[at..].iter().position(|&b| b == b'\n') {
            Some(i) => at + i + 1,
            None => bytes.len(),
        };
        let line = &bytes[at..end];
        match decode_line(line) {
            Ok(entry) => {
                if let Some((offset, reason)) = damaged.take() {
                    return Err(corrupt(format!(
                        "the journal line at byte {offset} is damaged ({reason}) and valid lines \
                         follow it"
                    )));
                }
                parsed.entries.push(entry);
                parsed.valid_len = end as u64;
            }
            Err(reason) => {
                if damaged.is_none() {
                    damaged = Some((at, reason.to_string()));
                }
                // Damage need not end at a newline (a range of zeros where a write was lost):
                // go on from the next place a line could start, so a valid line after the
                // damage is found and the damage reported rather than taken for a tail.
                if let Some(next) = find(&bytes[at + 1..], frame::START) {
                    at += 1 + next;
                    continue;
                }
            }
        }
        at = end;
    }
    let valid_len = usize::try_from(parsed.valid_len).unwrap_or(bytes.len());
    parsed.tail = bytes[valid_len..].to_vec();
    Ok(parsed)
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Why a journal line is not an entry.
#[derive(Debug, thiserror::Error)]
enum LineError {
    /// It is not a whole, checksummed frame.
    #[error(transparent)]
    Frame(#[from] frame::FrameError),
    /// Its body is not an entry.
    #[error("entry does not parse: {0}")]
    Entry(#[from] serde_json::Error),
}

fn decode_line(line: &[u8]) -> std::result::Result<Entry, LineError> {
    let body = frame::decode(FIELD, line)?;
    Ok(serde_json::from_slice(body)?)
}

/// Where the journal tail cut at `seq` is set aside.
pub(crate) fn torn_path(dir: &Path, seq: u64, now_ms: u128) -> PathBuf {
    dir.join(format!("{TORN_FILE_PREFIX}.{seq}-{now_ms}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::transition::apply;

    use crate::metastore::test_topic as topic;

    fn entry(seq: u64) -> Entry {
        let mut state = Snapshot::default();
        let change = Change::CreateTopic(topic(&format!("t{seq}"), 1));
        let touched = Touched::of(&change, &state);
        apply(&mut state, change).unwrap();
        Entry::record(seq, &touched, &state)
    }

    #[test]
    fn an_entry_replayed_on_the_state_before_its_change_gives_the_state_after_it() {
        let mut before = Snapshot::default();
        apply(&mut before, Change::CreateTopic(topic("orders", 2))).unwrap();
        apply(&mut before, Change::CreateTopic(topic("audit", 1))).unwrap();
        for change in [
            Change::GrowPartitions {
                name: "orders".to_owned(),
                count: 4,
                owners: Vec::new(),
            },
            Change::DeleteTopic {
                name: "audit".to_owned(),
                remove_links: true,
            },
            Change::CreateTopic(topic("billing", 3)),
        ] {
            let touched = Touched::of(&change, &before);
            let mut after = before.clone();
            apply(&mut after, change).unwrap();
            let line = Entry::record(7, &touched, &after).encode().unwrap();
            let parsed = parse(Path::new("j"), &line).unwrap();
            let mut replayed = before.clone();
            parsed.entries[0].apply_to(&mut replayed);
            assert_eq!(replayed, after);
            before = after;
        }
    }

    #[test]
    fn a_cut_last_line_is_a_tail_and_a_damaged_line_before_a_valid_one_is_corrupt() {
        let mut bytes = entry(1).encode().unwrap();
        let first_len = bytes.len() as u64;
        let second = entry(2).encode().unwrap();
        for cut in 0..second.len() {
            let mut torn = bytes.clone();
            torn.extend_from_slice(&second[..cut]);
            let parsed = parse(Path::new("j"), &torn).unwrap();
            assert_eq!(parsed.entries, vec![entry(1)], "cut at {cut}");
            assert_eq!(parsed.valid_len, first_len);
            assert_eq!(parsed.tail, &second[..cut]);
        }
        // A zeroed tail (a length that grew before its data was written) is a tail too.
        let mut zeroed = bytes.clone();
        zeroed.extend_from_slice(&[0u8; 300]);
        assert_eq!(parse(Path::new("j"), &zeroed).unwrap().tail.len(), 300);

        // The first line damaged, the second intact: acknowledged changes are damaged.
        bytes[20] ^= 0x01;
        bytes.extend_from_slice(&second);
        let err = parse(Path::new("j"), &bytes).unwrap_err();
        assert!(
            matches!(&err, MetastoreError::Corrupt { reason, .. } if reason.contains("byte 0")),
            "{err}"
        );
    }
}
