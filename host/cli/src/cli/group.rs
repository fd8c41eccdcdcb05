//! `narad group list` and `narad group describe`: the Kafka listener's consumer groups, with
//! each committed offset's lag (`/v1/groups`).

use clap::{Args, Subcommand};

use super::{ClientArgs, human, table};
use narad_host::api::groups::{GroupInfo, GroupList, ResetDone, ResetOffsets, ResetTo};

/// `narad group`.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The group command.
    #[command(subcommand)]
    pub command: GroupCommand,
}

/// Group commands.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List the consumer groups (with members, or with committed offsets) and their state.
    List,
    /// Show a group's members, the partitions each is assigned, and per committed offset the
    /// partition's end and the lag.
    Describe {
        /// Group id.
        group: String,
    },
    /// Move an empty group's committed offsets: to each partition's start or end, to an
    /// offset, or to the first record committed at or after a time. Shows the plan; writes
    /// it only with --execute (as kafka-consumer-groups.sh does).
    ResetOffsets {
        /// Group id.
        group: String,
        /// Where to: earliest, latest, an offset (e.g. 1200), or an RFC 3339 time
        /// (e.g. 2026-12-03T18:00:00Z).
        #[arg(long, value_parser = parse_reset_to)]
        to: ResetTo,
        /// A topic to reset (repeat for more); default: every topic the group has offsets for.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Write the new offsets (without it, nothing changes).
        #[arg(long)]
        execute: bool,
    },
}

/// `--to`: earliest, latest, an offset or an RFC 3339 time.
fn parse_reset_to(text: &str) -> Result<ResetTo, String> {
    match text {
        "earliest" => Ok(ResetTo::Earliest),
        "latest" => Ok(ResetTo::Latest),
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t
            .parse()
            .map(ResetTo::Offset)
            .map_err(|e| format!("{t:?} is not an offset: {e}")),
        t => human::parse_rfc3339(t)
            .map(ResetTo::TimestampMs)
            .map_err(|e| format!("expected earliest, latest, an offset or a time: {e}")),
    }
}

/// Runs a group command.
pub async fn run(args: GroupArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    match args.command {
        GroupCommand::List => {
            let list = client.list_groups().await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&list)?)?;
            } else {
                out!("{}", list_text(&list))?;
            }
        }
        GroupCommand::ResetOffsets {
            group,
            to,
            topics,
            execute,
        } => {
            let done = client
                .reset_group_offsets(
                    &group,
                    &ResetOffsets {
                        to,
                        topics,
                        execute,
                    },
                )
                .await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&done)?)?;
            } else {
                out!("{}", reset_text(&done))?;
            }
        }
        GroupCommand::Describe { group } => {
            let info = client.describe_group(&group).await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&info)?)?;
            } else {
                out!("{}", describe_text(&info))?;
            }
        }
    }
    Ok(())
}

fn reset_text(done: &ResetDone) -> String {
    let rows: Vec<Vec<String>> = done
        .offsets
        .iter()
        .map(|o| {
            vec![
                o.topic.clone(),
                o.partition.to_string(),
                o.from.map_or_else(|| "-".into(), |f| f.to_string()),
                o.to.to_string(),
            ]
        })
        .collect();
    let mut out = table::render(&["TOPIC", "PARTITION", "FROM", "TO"], &rows);
    out.push_str(&if done.executed {
        format!(
            "group {}: {} reset\n",
            done.group,
            human::plural(done.offsets.len() as u64, "offset")
        )
    } else {
        format!(
            "group {}: nothing changed yet; run again with --execute to write these offsets\n",
            done.group
        )
    });
    out
}

fn list_text(list: &GroupList) -> String {
    if list.groups.is_empty() && list.unanswered.is_empty() {
        return "no consumer groups\n".to_owned();
    }
    let clustered = list.groups.iter().any(|g| g.node.is_some());
    let rows: Vec<Vec<String>> = list
        .groups
        .iter()
        .map(|g| {
            let mut row = vec![g.group.clone(), g.state.clone()];
            if clustered {
                row.push(g.node.clone().unwrap_or_else(|| "-".into()));
            }
            row
        })
        .collect();
    let mut header = vec!["GROUP", "STATE"];
    if clustered {
        header.push("COORDINATOR");
    }
    let mut out = table::render(&header, &rows);
    if !list.unanswered.is_empty() {
        out.push_str(&format!(
            "(nodes {} did not answer: their groups are missing)\n",
            list.unanswered.join(", ")
        ));
    }
    out
}

fn describe_text(info: &GroupInfo) -> String {
    let mut out = format!(
        "group {}: {}{}, {} members, total lag {}\n",
        info.group,
        info.state,
        match info.protocol.as_str() {
            "" => String::new(),
            protocol => format!(" ({protocol})"),
        },
        info.members.len(),
        info.total_lag
    );
    if let Some(node) = &info.node {
        out.push_str(&format!("coordinator: node {node}\n"));
    }
    let owner_of = |partition: &str| {
        info.members
            .iter()
            .find(|m| m.assigned.iter().any(|a| a == partition))
            .map_or_else(|| "-".to_owned(), |m| m.client_id.clone())
    };
    let rows: Vec<Vec<String>> = info
        .offsets
        .iter()
        .map(|o| {
            vec![
                o.topic.clone(),
                o.partition.to_string(),
                o.committed.to_string(),
                o.high_watermark
                    .map_or_else(|| "?".into(), |h| h.to_string()),
                o.lag.map_or_else(|| "?".into(), |l| l.to_string()),
                owner_of(&format!("{}/{}", o.topic, o.partition)),
                human::rfc3339_utc(o.committed_at_ms),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no committed offsets\n");
    } else {
        out.push('\n');
        out.push_str(&table::render(
            &[
                "TOPIC",
                "PARTITION",
                "COMMITTED",
                "END",
                "LAG",
                "CLIENT",
                "COMMITTED_AT",
            ],
            &rows,
        ));
    }
    if !info.members.is_empty() {
        out.push('\n');
        let members: Vec<Vec<String>> = info
            .members
            .iter()
            .map(|m| {
                vec![
                    m.client_id.clone(),
                    m.client_host.clone(),
                    m.assigned.join(","),
                    m.member_id.clone(),
                ]
            })
            .collect();
        out.push_str(&table::render(
            &["CLIENT", "HOST", "ASSIGNED", "MEMBER"],
            &members,
        ));
    }
    out
}
