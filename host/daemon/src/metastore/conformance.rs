//! The behaviour every [`Metastore`] backend must show, as one suite: a backend's tests call
//! [`run`] with a fresh, empty instance. The embedded file runs it in `file.rs`; a shared
//! store (etcd) runs the same suite against its own backend.

use super::{
    Change, LinkMeta, LinkRuleError, Metastore, MetastoreError, PartitionOwner, PluginRef,
    PluginVersion, TopicMeta, UserMeta, Versions,
};
use crate::acl::{AclRule, Operation, PatternKind, ResourceKind};
use crate::scram::{Mechanism, ScramCredential};

fn topic(name: &str, partitions: u32, retention_ms: Option<u64>) -> TopicMeta {
    TopicMeta {
        writable_as_child: false,
        name: name.to_owned(),
        partitions,
        retention_ms,
        retention_bytes: None,
        created_at_ms: 1_700_000_000_000,
        owners: Vec::new(),
    }
}

fn link(parent: &str, child: &str, delay_ms: u64, router: Vec<PluginRef>) -> LinkMeta {
    LinkMeta {
        parent: parent.to_owned(),
        child: child.to_owned(),
        attach_epoch: "0011223344556677".to_owned(),
        attach_offsets: Some(vec![0, 0]),
        delay_ms,
        router,
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

fn plugin(name: &str, digest: char) -> PluginVersion {
    PluginVersion {
        name: name.to_owned(),
        digest: digest.to_string().repeat(64),
        size_bytes: 10,
        version: "1.0.0".to_owned(),
        description: String::new(),
        uploaded_at_ms: 0,
    }
}

fn pinned(p: &PluginVersion) -> PluginRef {
    PluginRef {
        name: p.name.clone(),
        digest: p.digest.clone(),
    }
}

/// Recognises the error a refused change must give.
type IsExpected = fn(&MetastoreError) -> bool;

/// Runs the whole suite against `store`, which must be empty.
pub(crate) async fn run(store: &dyn Metastore) {
    assert_eq!(store.versions().await.unwrap(), Versions::default());
    topics(store).await;
    links(store).await;
    plugins(store).await;
    attach_with_new_child(store).await;
    link_views(store).await;
    owners(store).await;
    child_writes(store).await;
    users(store).await;
    acls(store).await;
    let confirmed = store.confirm().await.unwrap();
    assert_eq!(confirmed, store.snapshot().await.unwrap());
    assert_eq!(confirmed.versions, store.versions().await.unwrap());
}

/// A child's parents are known cheaply, and whether producers may write to it is a setting
/// kept with the topic.
async fn child_writes(store: &dyn Metastore) {
    store
        .create_topic(topic("cw-parent", 1, None))
        .await
        .unwrap();
    store
        .create_topic(topic("cw-child", 1, None))
        .await
        .unwrap();
    assert!(store.parents_of("cw-child").await.unwrap().is_empty());
    store
        .attach_link(link("cw-parent", "cw-child", 0, vec![]))
        .await
        .unwrap();
    assert_eq!(store.parents_of("cw-child").await.unwrap(), ["cw-parent"]);
    assert!(
        !store
            .topic("cw-child")
            .await
            .unwrap()
            .unwrap()
            .writable_as_child
    );
    let before = store.versions().await.unwrap();
    let set = store.set_writable_as_child("cw-child", true).await.unwrap();
    assert!(set.writable_as_child);
    assert!(
        store
            .topic("cw-child")
            .await
            .unwrap()
            .unwrap()
            .writable_as_child
    );
    assert_eq!(store.versions().await.unwrap().topics, before.topics + 1);
    // Setting it again changes nothing.
    store.set_writable_as_child("cw-child", true).await.unwrap();
    assert_eq!(store.versions().await.unwrap().topics, before.topics + 1);
    assert!(matches!(
        store.set_writable_as_child("nope", true).await,
        Err(MetastoreError::UnknownTopic { .. })
    ));
}

async fn topics(store: &dyn Metastore) {
    let v0 = store.versions().await.unwrap();
    store.create_topic(topic("orders", 2, None)).await.unwrap();
    assert_eq!(
        store.versions().await.unwrap(),
        Versions {
            topics: v0.topics + 1,
            ..v0
        }
    );
    let v1 = store.versions().await.unwrap();
    assert!(matches!(
        store.create_topic(topic("orders", 3, None)).await,
        Err(MetastoreError::TopicExists { .. })
    ));
    assert!(matches!(
        store.grow_partitions("orders", 1).await,
        Err(MetastoreError::CannotShrink {
            current: 2,
            requested: 1,
            ..
        })
    ));
    assert!(matches!(
        store.grow_partitions("nope", 3).await,
        Err(MetastoreError::UnknownTopic { .. })
    ));
    assert!(matches!(
        store.delete_topic("nope", true).await,
        Err(MetastoreError::UnknownTopic { .. })
    ));
    assert_eq!(
        store.grow_partitions("orders", 2).await.unwrap().partitions,
        2
    );
    store.set_retention("orders", None, None).await.unwrap();
    assert_eq!(
        store.versions().await.unwrap(),
        v1,
        "refusals and no-ops move no version"
    );
    assert_eq!(
        store.grow_partitions("orders", 4).await.unwrap().partitions,
        4
    );
    assert_eq!(store.topic("orders").await.unwrap().unwrap().partitions, 4);
    assert_eq!(store.versions().await.unwrap().topics, v1.topics + 1);
}

async fn links(store: &dyn Metastore) {
    store
        .create_topic(topic("retried", 2, Some(7_200_000)))
        .await
        .unwrap();
    store.create_topic(topic("copy", 2, None)).await.unwrap();
    store.create_topic(topic("later", 2, None)).await.unwrap();
    let before = store.versions().await.unwrap();

    let refusals: Vec<(LinkMeta, IsExpected)> = vec![
        (link("orders", "missing", 0, vec![]), |e| {
            matches!(e, MetastoreError::UnknownTopic { .. })
        }),
        (link("orders", "orders", 0, vec![]), |e| {
            matches!(e, MetastoreError::LinkRule(LinkRuleError::SelfLink(_)))
        }),
        (link("orders", "copy", 366 * 86_400_000, vec![]), |e| {
            matches!(
                e,
                MetastoreError::LinkRule(LinkRuleError::DelayTooLong { .. })
            )
        }),
        // 2 h of retention is not the 3 h a two-hour delay needs.
        (link("retried", "copy", 7_200_000, vec![]), |e| {
            matches!(e, MetastoreError::LinkRule(_))
        }),
        (
            link("orders", "copy", 0, vec![pinned(&plugin("ghost", 'a'))]),
            |e| matches!(e, MetastoreError::UnknownPlugin { .. }),
        ),
    ];
    for (refused, is_expected) in refusals {
        let err = store.attach_link(refused.clone()).await.unwrap_err();
        assert!(is_expected(&err), "{refused:?} gave {err:?}");
    }
    assert_eq!(store.versions().await.unwrap(), before);

    store
        .attach_link(link("orders", "copy", 0, vec![]))
        .await
        .unwrap();
    assert!(matches!(
        store.attach_link(link("orders", "copy", 0, vec![])).await,
        Err(MetastoreError::LinkExists { .. })
    ));
    store
        .attach_link(link("copy", "later", 0, vec![]))
        .await
        .unwrap();
    assert!(matches!(
        store.attach_link(link("later", "orders", 0, vec![])).await,
        Err(MetastoreError::LinkRule(LinkRuleError::Cycle { .. }))
    ));
    let after = store.versions().await.unwrap();
    assert_eq!(
        after,
        Versions {
            links: before.links + 2,
            ..before
        }
    );

    // A router change that changes nothing moves nothing; an unknown link is refused.
    store
        .set_link_router("orders", "copy", vec![], None)
        .await
        .unwrap();
    assert_eq!(store.versions().await.unwrap(), after);
    assert!(matches!(
        store.set_link_router("orders", "nope", vec![], None).await,
        Err(MetastoreError::UnknownLink { .. })
    ));
    assert!(matches!(
        store.detach_link("orders", "nope").await,
        Err(MetastoreError::UnknownLink { .. })
    ));

    // A delete not meant to remove links is refused, naming them, and changes nothing.
    for (topic, want) in [
        ("copy", &[("copy", "later"), ("orders", "copy")][..]),
        ("orders", &[("orders", "copy")][..]),
    ] {
        match store.delete_topic(topic, false).await {
            Err(MetastoreError::TopicHasLinks { name, links }) => {
                assert_eq!(name, topic);
                let links: Vec<(&str, &str)> = links
                    .iter()
                    .map(|(p, c)| (p.as_str(), c.as_str()))
                    .collect();
                assert_eq!(links, want);
            }
            other => panic!("deleting {topic} without its links: {other:?}"),
        }
    }
    assert_eq!(store.versions().await.unwrap(), after);
    // A deleted topic takes its links with it, as parent and as child.
    let deleted = store.delete_topic("copy", true).await.unwrap();
    assert_eq!(deleted.name, "copy");
    let snapshot = store.snapshot().await.unwrap();
    assert!(snapshot.links.is_empty(), "{:?}", snapshot.links);
    assert_eq!(snapshot.versions.links, after.links + 1);
    assert_eq!(snapshot.versions.topics, after.topics + 1);
}

async fn plugins(store: &dyn Metastore) {
    let v0 = store.versions().await.unwrap();
    let hash = plugin("hash", 'b');
    store.add_plugin(hash.clone()).await.unwrap();
    store.add_plugin(hash.clone()).await.unwrap();
    assert_eq!(store.versions().await.unwrap().plugins, v0.plugins + 1);
    assert!(matches!(
        store.remove_plugin("ghost").await,
        Err(MetastoreError::UnknownPlugin { .. })
    ));
    store
        .attach_link(link("orders", "later", 0, vec![pinned(&hash)]))
        .await
        .unwrap();
    assert!(matches!(
        store.remove_plugin("hash").await,
        Err(MetastoreError::PluginInUse { .. })
    ));
    store.detach_link("orders", "later").await.unwrap();
    assert_eq!(store.remove_plugin("hash").await.unwrap(), vec![hash]);
    assert!(store.snapshot().await.unwrap().plugins.is_empty());
}

async fn attach_with_new_child(store: &dyn Metastore) {
    let before = store.versions().await.unwrap();
    // A refused link records neither the link nor the child topic.
    let err = store
        .attach_link_with_new_child(
            topic("fresh", 3, None),
            link("orders", "fresh", 366 * 86_400_000, vec![]),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetastoreError::LinkRule(_)), "{err:?}");
    assert!(store.topic("fresh").await.unwrap().is_none());
    assert!(matches!(
        store
            .attach_link_with_new_child(
                topic("orders", 1, None),
                link("later", "orders", 0, vec![])
            )
            .await,
        Err(MetastoreError::TopicExists { .. })
    ));
    assert_eq!(store.versions().await.unwrap(), before);

    store
        .attach_link_with_new_child(topic("fresh", 3, None), link("orders", "fresh", 0, vec![]))
        .await
        .unwrap();
    let snapshot = store.snapshot().await.unwrap();
    assert_eq!(snapshot.topics["fresh"].partitions, 3);
    assert!(
        snapshot
            .links
            .contains_key(&("orders".to_owned(), "fresh".to_owned()))
    );
    assert_eq!(
        snapshot.versions,
        Versions {
            topics: before.topics + 1,
            links: before.links + 1,
            ..before
        }
    );
}

/// The one-link read (what a cursor checks before routing each slab) shows what the snapshot
/// shows, follows router, config and partition changes, and is `None` without the link.
async fn link_views(store: &dyn Metastore) {
    let pair = ("orders".to_owned(), "fresh".to_owned());
    let view = store.link_view("orders", "fresh").await.unwrap();
    let snapshot = store.snapshot().await.unwrap();
    let view = view.expect("orders -> fresh is linked");
    assert_eq!(view.link, snapshot.links[&pair]);
    assert_eq!(view.parent, snapshot.topics["orders"]);
    assert_eq!(view.child, snapshot.topics["fresh"]);
    let missing = [
        ("fresh", "orders"),
        ("orders", "later"),
        ("orders", "ghost"),
    ];
    for (parent, child) in missing {
        let view = store.link_view(parent, child).await.unwrap();
        assert!(view.is_none(), "{parent} -> {child} is no link: {view:?}");
    }

    store
        .set_link_router("orders", "fresh", vec![], Some("{\"spread\":2}".to_owned()))
        .await
        .unwrap();
    store.grow_partitions("fresh", 5).await.unwrap();
    let view = store.link_view("orders", "fresh").await.unwrap().unwrap();
    assert_eq!(view.link.config, "{\"spread\":2}");
    assert_eq!((view.parent.partitions, view.child.partitions), (4, 5));
    assert_eq!(view.link.attach_epoch, snapshot.links[&pair].attach_epoch);

    // The reconciler's read: every link and plugin, and exactly the topics links name.
    let full = store.snapshot().await.unwrap();
    let linked = store.links_snapshot().await.unwrap();
    assert_eq!(
        (&linked.links, &linked.plugins),
        (&full.links, &full.plugins)
    );
    assert_eq!(linked.versions, full.versions);
    let named: std::collections::BTreeSet<&String> =
        full.links.keys().flat_map(|(p, c)| [p, c]).collect();
    assert!(
        full.topics.keys().any(|t| !named.contains(t)),
        "the suite has unlinked topics"
    );
    for (name, topic) in &full.topics {
        assert_eq!(
            linked.topics.get(name),
            named.contains(name).then_some(topic),
            "{name}"
        );
    }

    // A shadow is stored with its link and read back whole; only the links' version moves.
    let candidate = plugin("shadowed", 'e');
    store.add_plugin(candidate.clone()).await.unwrap();
    let before = store.versions().await.unwrap();
    let shadow = super::ShadowSpec {
        router: vec![pinned(&candidate)],
        config: "candidate config".to_owned(),
        set_at_ms: 1_700_000_000_123,
    };
    let link = store
        .set_shadow("orders", "fresh", Some(shadow.clone()))
        .await
        .unwrap();
    assert_eq!(link.shadow.as_ref(), Some(&shadow));
    let view = store.link_view("orders", "fresh").await.unwrap().unwrap();
    assert_eq!(view.link.shadow, Some(shadow));
    assert_eq!(view.link.config, "{\"spread\":2}");
    assert_eq!(
        store.versions().await.unwrap(),
        Versions {
            links: before.links + 1,
            ..before
        }
    );
    assert!(matches!(
        store.remove_plugin("shadowed").await,
        Err(MetastoreError::PluginInUse { .. })
    ));
    let cleared = store.set_shadow("orders", "fresh", None).await.unwrap();
    assert_eq!(cleared.shadow, None);
    store.remove_plugin("shadowed").await.unwrap();

    store.delete_topic("fresh", true).await.unwrap();
    assert_eq!(store.link_view("orders", "fresh").await.unwrap(), None);
}

/// Owners (cluster mode) are stored with their topic and grow with it, in the same write.
async fn owners(store: &dyn Metastore) {
    let placed = TopicMeta {
        owners: vec![PartitionOwner::first("n1"), PartitionOwner::first("n2")],
        ..topic("placed", 2, None)
    };
    store.create_topic(placed.clone()).await.unwrap();
    assert_eq!(store.topic("placed").await.unwrap(), Some(placed));
    let grown = store
        .apply(Change::GrowPartitions {
            name: "placed".to_owned(),
            count: 3,
            owners: vec![PartitionOwner::first("n3")],
        })
        .await
        .unwrap()
        .into_topic()
        .unwrap();
    let nodes: Vec<&str> = grown.owners.iter().map(|o| o.node.as_str()).collect();
    assert_eq!((grown.partitions, nodes), (3, vec!["n1", "n2", "n3"]));
    let v = store.versions().await.unwrap();
    let refused = store
        .apply(Change::GrowPartitions {
            name: "placed".to_owned(),
            count: 4,
            owners: Vec::new(),
        })
        .await;
    assert!(
        matches!(refused, Err(MetastoreError::Placement { .. })),
        "{refused:?}"
    );
    assert_eq!(store.versions().await.unwrap(), v);
    assert_eq!(store.topic("placed").await.unwrap(), Some(grown));
}

fn user(name: &str, password: &[u8]) -> UserMeta {
    UserMeta {
        name: name.to_owned(),
        credentials: Mechanism::ALL
            .iter()
            .map(|&m| ScramCredential::new(m, password, 4096).unwrap())
            .collect(),
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_000_000,
    }
}

/// Users: created once, found by name, a new password replaces the credentials, deleted;
/// names and credentials that break the rules are refused; each write raises the users
/// version and no other.
async fn users(store: &dyn Metastore) {
    let v0 = store.versions().await.unwrap();
    let alice = user("alice", b"first");
    assert_eq!(store.create_user(alice.clone()).await.unwrap(), alice);
    assert!(matches!(
        store.create_user(user("alice", b"other")).await,
        Err(MetastoreError::UserExists { .. })
    ));
    let after_create = store.versions().await.unwrap();
    assert_eq!(after_create.users, v0.users + 1);
    assert_eq!(
        (
            after_create.topics,
            after_create.links,
            after_create.plugins
        ),
        (v0.topics, v0.links, v0.plugins)
    );
    assert_eq!(store.user("alice").await.unwrap(), Some(alice.clone()));
    assert_eq!(store.user("bob").await.unwrap(), None);
    for bad in [
        "",
        "has space",
        "slash/y",
        &"x".repeat(129),
        "ANONYMOUS",
        "anonymous",
    ] {
        assert!(
            matches!(
                store.create_user(user(bad, b"pw")).await,
                Err(MetastoreError::BadUser(_))
            ),
            "{bad:?}"
        );
    }
    let mut twice = user("carol", b"pw");
    twice.credentials.push(twice.credentials[0].clone());
    assert!(matches!(
        store.create_user(twice).await,
        Err(MetastoreError::BadUser(_))
    ));

    let new = user("alice", b"second").credentials;
    let changed = store
        .set_user_credentials("alice", new.clone(), 1_700_000_000_500)
        .await
        .unwrap();
    assert_eq!(changed.credentials, new);
    assert_eq!(changed.created_at_ms, alice.created_at_ms);
    let found = store.user("alice").await.unwrap().unwrap();
    assert!(found.credentials[0].verify_password(b"second"));
    assert!(!found.credentials[0].verify_password(b"first"));
    assert!(matches!(
        store.set_user_credentials("bob", new, 0).await,
        Err(MetastoreError::UnknownUser { .. })
    ));

    assert_eq!(store.delete_user("alice").await.unwrap(), changed);
    assert_eq!(store.user("alice").await.unwrap(), None);
    assert!(matches!(
        store.delete_user("alice").await,
        Err(MetastoreError::UnknownUser { .. })
    ));
    // Kept for the reopen checks some backends run after the suite.
    store.create_user(user("dave", b"pw")).await.unwrap();
    assert_eq!(store.versions().await.unwrap().users, v0.users + 4);
}

fn rule(principal: &str, name: &str, operation: Operation) -> AclRule {
    AclRule {
        principal: principal.to_owned(),
        resource: ResourceKind::Topic,
        pattern: PatternKind::Literal,
        name: name.to_owned(),
        operation,
    }
}

/// ACL rules: each kept once and in order, a rule added twice is a no-op, a removal of a rule
/// that is not there is refused, a malformed rule is refused; each change raises the ACL
/// version and no other.
async fn acls(store: &dyn Metastore) {
    let v0 = store.versions().await.unwrap();
    let write = rule("User:bob", "orders/eu", Operation::Write);
    let read = rule("User:alice", "orders", Operation::Read);
    store.add_acl(write.clone()).await.unwrap();
    store.add_acl(read.clone()).await.unwrap();
    store.add_acl(read.clone()).await.unwrap();
    let after = store.versions().await.unwrap();
    assert_eq!(after.acls, v0.acls + 2);
    assert_eq!((after.users, after.topics), (v0.users, v0.topics));
    assert_eq!(
        store.acls().await.unwrap(),
        vec![read.clone(), write.clone()]
    );
    assert!(matches!(
        store.add_acl(rule("bob", "t", Operation::Read)).await,
        Err(MetastoreError::BadAcl(_))
    ));
    assert_eq!(store.remove_acl(write.clone()).await.unwrap(), write);
    assert!(matches!(
        store.remove_acl(write).await,
        Err(MetastoreError::UnknownAcl { .. })
    ));
    assert_eq!(store.acls().await.unwrap(), vec![read]);
    assert_eq!(store.versions().await.unwrap().acls, v0.acls + 3);
}
