//! The ACL rules in force, kept between requests and read again only when the ACL version of
//! the metadata moves: a request pays one version check (no copy), not a copy of every rule.

use std::sync::{Arc, Mutex, PoisonError};

use super::Metastore;
use crate::acl::AclSet;

/// The rules of the metastore's ACL domain, cached by version.
pub struct AclCache {
    metastore: Arc<dyn Metastore>,
    /// The version read and its rules; `None` before the first read.
    known: Mutex<Option<(u64, Arc<AclSet>)>>,
}

impl std::fmt::Debug for AclCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclCache").finish_non_exhaustive()
    }
}

impl AclCache {
    /// A cache over `metastore`'s rules.
    pub fn new(metastore: Arc<dyn Metastore>) -> AclCache {
        AclCache {
            metastore,
            known: Mutex::new(None),
        }
    }

    /// Whether the rules last read hold anyone to anything (no read yet: no).
    pub fn last_enforced(&self) -> bool {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|(_, set)| set.enforced())
    }

    /// The rules in force. When the metadata cannot be read, the rules last read (with a
    /// warning); when none were ever read, a set that allows no user anything, so an outage
    /// never opens what the rules close.
    pub async fn current(&self) -> Arc<AclSet> {
        let cached = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let version = match self.metastore.versions().await {
            Ok(versions) => versions.acls,
            Err(e) => return self.fallback(cached, &e),
        };
        if let Some((known, set)) = &cached
            && *known == version
        {
            return Arc::clone(set);
        }
        match self.metastore.acls().await {
            Ok(rules) => {
                let set = Arc::new(AclSet::new(rules));
                *self.known.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((version, Arc::clone(&set)));
                set
            }
            Err(e) => self.fallback(cached, &e),
        }
    }

    fn fallback(
        &self,
        cached: Option<(u64, Arc<AclSet>)>,
        error: &super::MetastoreError,
    ) -> Arc<AclSet> {
        tracing::warn!(%error, "ACL rules could not be read; deciding with the rules last read");
        match cached {
            Some((_, set)) => set,
            None => Arc::new(AclSet::deny_all()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{AclRule, Operation, PatternKind, Principal, ResourceKind};

    #[tokio::test]
    async fn a_rule_added_is_in_force_at_the_next_request() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Metastore> =
            Arc::new(super::super::FileMetastore::open(dir.path()).unwrap());
        let cache = AclCache::new(Arc::clone(&store));
        let alice = Principal::user("alice");
        assert!(
            cache
                .current()
                .await
                .allows(&alice, ResourceKind::Topic, "t", Operation::Write)
        );
        store
            .add_acl(AclRule {
                principal: "User:alice".into(),
                resource: ResourceKind::Topic,
                pattern: PatternKind::Literal,
                name: "t".into(),
                operation: Operation::Read,
            })
            .await
            .unwrap();
        let now = cache.current().await;
        assert!(now.allows(&alice, ResourceKind::Topic, "t", Operation::Read));
        assert!(!now.allows(&alice, ResourceKind::Topic, "t", Operation::Write));
    }
}
