//! `narad acl add`, `narad acl list` and `narad acl remove`: the allow rules the Kafka listener
//! enforces once any exists (see docs/security.md).

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::table;
use narad_host::acl::{AclRule, Operation, PatternKind, ResourceKind};

/// `narad acl`.
#[derive(Debug, Args)]
pub struct AclArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The ACL command.
    #[command(subcommand)]
    pub command: AclCommand,
}

/// ACL commands.
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Allow a principal an operation on a topic, a group or the cluster. Once any rule
    /// exists, Kafka clients may do only what a rule allows them.
    Add(RuleArgs),
    /// List the rules.
    List,
    /// Remove a rule (the same flags as when it was added).
    Remove(RuleArgs),
}

/// One rule, as flags.
#[derive(Debug, Args)]
pub struct RuleArgs {
    /// Who: `User:NAME` (a user of `narad user`), or `User:*` for everyone, the anonymous
    /// included.
    #[arg(long)]
    principal: String,
    /// The topic (`*`: every topic).
    #[arg(long)]
    topic: Option<String>,
    /// The consumer group (`*`: every group).
    #[arg(long)]
    group: Option<String>,
    /// The cluster: creating topics without a topic rule, and describing the cluster.
    #[arg(long)]
    cluster: bool,
    /// The topic or group name is a prefix: the rule covers every name starting with it.
    #[arg(long)]
    prefixed: bool,
    /// What the rule allows: read, write, describe, create, delete, alter or all (read, write,
    /// delete and alter also allow describe).
    #[arg(long, value_parser = parse_operation)]
    operation: Operation,
}

fn parse_operation(text: &str) -> Result<Operation, String> {
    Operation::EACH
        .into_iter()
        .find(|op| op.name() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = Operation::EACH.iter().map(|op| op.name()).collect();
            format!("expected one of {}", names.join(", "))
        })
}

impl RuleArgs {
    fn rule(&self) -> anyhow::Result<AclRule> {
        let (resource, name) = match (&self.topic, &self.group, self.cluster) {
            (Some(topic), None, false) => (ResourceKind::Topic, topic.clone()),
            (None, Some(group), false) => (ResourceKind::Group, group.clone()),
            (None, None, true) => (ResourceKind::Cluster, String::new()),
            _ => anyhow::bail!("name one of --topic, --group and --cluster"),
        };
        if self.cluster && self.prefixed {
            anyhow::bail!("--prefixed applies to a topic or a group, not the cluster");
        }
        let rule = AclRule {
            principal: self.principal.clone(),
            resource,
            pattern: if self.prefixed {
                PatternKind::Prefixed
            } else {
                PatternKind::Literal
            },
            name,
            operation: self.operation,
        };
        rule.check().map_err(anyhow::Error::msg)?;
        Ok(rule)
    }
}

/// Runs an ACL command.
pub async fn run(args: AclArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    let json = args.client.json;
    match args.command {
        AclCommand::Add(rule) => {
            let added = client.add_acl(&rule.rule()?).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&added)?)?;
            } else {
                outln!("added: {added}")?;
            }
        }
        AclCommand::Remove(rule) => {
            let removed = client.remove_acl(&rule.rule()?).await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&removed)?)?;
            } else {
                outln!("removed: {removed}")?;
            }
        }
        AclCommand::List => {
            let list = client.list_acls().await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&list)?)?;
            } else if list.acls.is_empty() {
                outln!("no rules: Kafka clients may do everything (narad acl add adds one)")?;
            } else {
                out!("{}", rows(&list.acls))?;
            }
        }
    }
    Ok(())
}

fn rows(rules: &[AclRule]) -> String {
    let rows: Vec<Vec<String>> = rules
        .iter()
        .map(|r| {
            vec![
                r.principal.clone(),
                r.operation.name().to_owned(),
                r.resource.name().to_owned(),
                match (r.resource, r.pattern) {
                    (ResourceKind::Cluster, _) => "-".to_owned(),
                    (_, PatternKind::Literal) => r.name.clone(),
                    (_, PatternKind::Prefixed) => format!("{}*  (prefix)", r.name),
                },
            ]
        })
        .collect();
    table::render(&["PRINCIPAL", "OPERATION", "RESOURCE", "NAME"], &rows)
}
