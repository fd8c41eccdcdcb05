//! Access control lists: allow rules of principals on topics, consumer groups and the cluster,
//! and the one decision every listener asks ([`AclSet::allows`]).
//!
//! The rules, as Kafka's authorizer has them (allow rules only):
//! - no rule at all: everything is allowed (a cluster without ACLs works as before);
//! - once any rule exists, a principal may do only what a rule allows it;
//! - a rule names a principal (`User:alice`, or `User:*` for every user), a resource (a topic,
//!   a group, or the cluster) by its exact name, by a prefix, or `*` for every name of its
//!   kind, and one operation or `all`;
//! - `read`, `write`, `delete` and `alter` on a resource imply `describe` on it;
//! - the API token's holder (the operator) is not a principal rules apply to: it may do
//!   everything, as before.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The principal of a client that did not authenticate (Kafka's name for it).
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// Longest resource name or principal a rule may hold, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    /// A topic.
    Topic,
    /// A consumer group.
    Group,
    /// The cluster: topic creation with no topic rule, moves, nodes, plugins, users and ACLs.
    Cluster,
}

/// How a rule's name matches.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PatternKind {
    /// The exact name (`*`: every name).
    #[default]
    Literal,
    /// Every name starting with it.
    Prefixed,
}

/// What a principal does to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Fetch records; join a group and commit its offsets.
    Read,
    /// Produce records.
    Write,
    /// See that it exists: metadata, offsets, a group's state.
    Describe,
    /// Create a topic.
    Create,
    /// Delete a topic or a group.
    Delete,
    /// Change it: partitions, retention, links, cluster operations.
    Alter,
    /// Every operation.
    All,
}

impl Operation {
    /// Every operation, in the order they are listed.
    pub const EACH: [Operation; 7] = [
        Operation::Read,
        Operation::Write,
        Operation::Describe,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::All,
    ];

    /// The operation's name, as rules and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Describe => "describe",
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Alter => "alter",
            Operation::All => "all",
        }
    }

    /// Whether a rule granting `self` allows `asked`.
    fn grants(self, asked: Operation) -> bool {
        self == Operation::All
            || self == asked
            || (asked == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ))
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One allow rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// `User:NAME`, or `User:*` for every authenticated user and the anonymous one.
    pub principal: String,
    /// The kind of resource.
    pub resource: ResourceKind,
    /// How `name` matches.
    #[serde(default)]
    pub pattern: PatternKind,
    /// The resource's name, prefix, or `*`; empty for the cluster.
    #[serde(default)]
    pub name: String,
    /// The operation allowed.
    pub operation: Operation,
}

impl AclRule {
    /// Checks the rule's shape: a `User:` principal, a name for a topic or group (none for the
    /// cluster), lengths within [`MAX_NAME_BYTES`].
    pub fn check(&self) -> Result<(), String> {
        let Some(user) = self.principal.strip_prefix("User:") else {
            return Err(format!(
                "principal {:?}: expected User:NAME or User:*",
                self.principal
            ));
        };
        if user.is_empty() || self.principal.len() > MAX_NAME_BYTES {
            return Err(format!(
                "principal {:?}: a user name of 1 to {} bytes",
                self.principal,
                MAX_NAME_BYTES - 5
            ));
        }
        match self.resource {
            ResourceKind::Cluster if !self.name.is_empty() => {
                return Err("a cluster rule names no resource".to_owned());
            }
            ResourceKind::Cluster if self.pattern != PatternKind::Literal => {
                return Err("a cluster rule has no pattern".to_owned());
            }
            ResourceKind::Topic | ResourceKind::Group if self.name.is_empty() => {
                return Err(format!(
                    "a {} rule needs a name, a prefix or *",
                    self.resource.name()
                ));
            }
            _ => {}
        }
        if self.name.len() > MAX_NAME_BYTES || self.name.chars().any(char::is_control) {
            return Err(format!(
                "resource name {:?}: at most {MAX_NAME_BYTES} bytes, no control characters",
                self.name
            ));
        }
        Ok(())
    }

    fn matches(&self, principal: &str, kind: ResourceKind, name: &str, asked: Operation) -> bool {
        self.resource == kind
            && (self.principal == principal || self.principal == "User:*")
            && self.operation.grants(asked)
            && match (kind, self.pattern) {
                (ResourceKind::Cluster, _) => true,
                (_, PatternKind::Literal) => self.name == name || self.name == "*",
                (_, PatternKind::Prefixed) => name.starts_with(&self.name),
            }
    }
}

impl fmt::Display for AclRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} may {} ", self.principal, self.operation)?;
        match (self.resource, self.pattern) {
            (ResourceKind::Cluster, _) => f.write_str("the cluster"),
            (kind, PatternKind::Literal) => write!(f, "{} {:?}", kind.name(), self.name),
            (kind, PatternKind::Prefixed) => {
                write!(f, "every {} named {:?}...", kind.name(), self.name)
            }
        }
    }
}

impl ResourceKind {
    /// The kind's name: `topic`, `group` or `cluster`.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Topic => "topic",
            ResourceKind::Group => "group",
            ResourceKind::Cluster => "cluster",
        }
    }
}

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator (the API token's holder, or anyone on a daemon without one): rules do not
    /// apply.
    Operator,
    /// A user (`User:NAME`), or [`ANONYMOUS`].
    User(String),
}

impl Principal {
    /// The principal of user `name`.
    pub fn user(name: &str) -> Principal {
        Principal::User(format!("User:{name}"))
    }

    /// The principal of a client that did not authenticate.
    pub fn anonymous() -> Principal {
        Principal::User(ANONYMOUS.to_owned())
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Operator => f.write_str("the operator"),
            Principal::User(name) => f.write_str(name),
        }
    }
}

/// The rules in force, as one decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AclSet {
    rules: Vec<AclRule>,
    /// Allow no user anything (the rules could not be read).
    deny_all: bool,
}

impl AclSet {
    /// The set of `rules`.
    pub fn new(rules: Vec<AclRule>) -> AclSet {
        AclSet {
            rules,
            deny_all: false,
        }
    }

    /// A set that allows no user anything (the operator still may).
    pub fn deny_all() -> AclSet {
        AclSet {
            rules: Vec::new(),
            deny_all: true,
        }
    }

    /// Whether any rule exists (with none, everything is allowed).
    pub fn enforced(&self) -> bool {
        self.deny_all || !self.rules.is_empty()
    }

    /// Whether `principal` may do `operation` to the resource `kind` named `name` (empty for
    /// the cluster).
    pub fn allows(
        &self,
        principal: &Principal,
        kind: ResourceKind,
        name: &str,
        operation: Operation,
    ) -> bool {
        let Principal::User(user) = principal else {
            return true;
        };
        !self.enforced()
            || self
                .rules
                .iter()
                .any(|rule| rule.matches(user, kind, name, operation))
    }

    /// Whether `principal` may write to some topic (what an idempotent producer's id needs,
    /// as Kafka asks).
    pub fn allows_some_write(&self, principal: &Principal) -> bool {
        let Principal::User(user) = principal else {
            return true;
        };
        !self.enforced()
            || self.rules.iter().any(|rule| {
                (rule.principal == *user || rule.principal == "User:*")
                    && ((rule.resource == ResourceKind::Topic
                        && rule.operation.grants(Operation::Write))
                        || (rule.resource == ResourceKind::Cluster
                            && rule.operation.grants(Operation::Alter)))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        principal: &str,
        resource: ResourceKind,
        pattern: PatternKind,
        name: &str,
        op: Operation,
    ) -> AclRule {
        AclRule {
            principal: principal.to_owned(),
            resource,
            pattern,
            name: name.to_owned(),
            operation: op,
        }
    }

    #[test]
    fn without_rules_everyone_may_and_with_one_only_what_a_rule_allows() {
        let alice = Principal::user("alice");
        let bob = Principal::user("bob");
        let none = AclSet::default();
        assert!(none.allows(&alice, ResourceKind::Topic, "orders", Operation::Write));
        let set = AclSet::new(vec![rule(
            "User:alice",
            ResourceKind::Topic,
            PatternKind::Literal,
            "orders",
            Operation::Read,
        )]);
        assert!(set.allows(&alice, ResourceKind::Topic, "orders", Operation::Read));
        assert!(set.allows(&alice, ResourceKind::Topic, "orders", Operation::Describe));
        assert!(!set.allows(&alice, ResourceKind::Topic, "orders", Operation::Write));
        assert!(!set.allows(&alice, ResourceKind::Topic, "orders2", Operation::Read));
        assert!(!set.allows(&alice, ResourceKind::Group, "orders", Operation::Read));
        assert!(!set.allows(&bob, ResourceKind::Topic, "orders", Operation::Read));
        assert!(!set.allows(
            &Principal::anonymous(),
            ResourceKind::Topic,
            "orders",
            Operation::Read
        ));
        assert!(set.allows(
            &Principal::Operator,
            ResourceKind::Cluster,
            "",
            Operation::Alter
        ));
        assert!(!set.allows_some_write(&alice));
    }

    #[test]
    fn prefixes_wildcards_and_all_match_as_kafka_matches_them() {
        let alice = Principal::user("alice");
        let set = AclSet::new(vec![
            rule(
                "User:alice",
                ResourceKind::Topic,
                PatternKind::Prefixed,
                "sales.",
                Operation::Write,
            ),
            rule(
                "User:*",
                ResourceKind::Group,
                PatternKind::Literal,
                "*",
                Operation::Read,
            ),
            rule(
                "User:alice",
                ResourceKind::Cluster,
                PatternKind::Literal,
                "",
                Operation::All,
            ),
        ]);
        assert!(set.allows(&alice, ResourceKind::Topic, "sales.eu", Operation::Write));
        assert!(set.allows(&alice, ResourceKind::Topic, "sales.eu", Operation::Describe));
        assert!(!set.allows(&alice, ResourceKind::Topic, "sale", Operation::Write));
        assert!(!set.allows(&alice, ResourceKind::Topic, "sales.eu", Operation::Read));
        assert!(set.allows(
            &Principal::user("zed"),
            ResourceKind::Group,
            "any",
            Operation::Read
        ));
        assert!(set.allows(
            &Principal::anonymous(),
            ResourceKind::Group,
            "any",
            Operation::Describe
        ));
        assert!(set.allows(&alice, ResourceKind::Cluster, "", Operation::Create));
        assert!(set.allows_some_write(&alice));
        assert!(!set.allows_some_write(&Principal::user("zed")));
    }

    #[test]
    fn malformed_rules_are_refused_with_the_reason() {
        let ok = rule(
            "User:a",
            ResourceKind::Topic,
            PatternKind::Literal,
            "t",
            Operation::Read,
        );
        assert!(ok.check().is_ok());
        for (bad, says) in [
            (
                AclRule {
                    principal: "alice".into(),
                    ..ok.clone()
                },
                "User:NAME",
            ),
            (
                AclRule {
                    principal: "User:".into(),
                    ..ok.clone()
                },
                "1 to",
            ),
            (
                AclRule {
                    name: String::new(),
                    ..ok.clone()
                },
                "needs a name",
            ),
            (
                AclRule {
                    resource: ResourceKind::Cluster,
                    ..ok.clone()
                },
                "names no resource",
            ),
            (
                AclRule {
                    name: "a\nb".into(),
                    ..ok.clone()
                },
                "control",
            ),
        ] {
            let err = bad.check().unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        assert_eq!(ok.to_string(), "User:a may read topic \"t\"");
    }
}
