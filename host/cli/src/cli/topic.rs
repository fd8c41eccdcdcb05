//! `narad topic create|list|describe|grow|delete`.

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::{human, table};
use narad_host::api::types::{CreateTopicRequest, DeletedTopic, TopicDescription, TopicInfo};

/// `narad topic`.
#[derive(Debug, Args)]
pub struct TopicArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The topic command.
    #[command(subcommand)]
    pub command: TopicCommand,
}

/// Topic commands.
#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        /// Name: 1 to 249 characters of A-Z a-z 0-9 . _ -
        name: String,
        /// Partition count (1 to 1024).
        #[arg(long, short = 'p', default_value_t = 1)]
        partitions: u32,
        /// Delete records older than this many milliseconds (default: keep forever).
        #[arg(long)]
        retention_ms: Option<u64>,
        /// Trim each partition to about this many bytes (default: no cap).
        #[arg(long)]
        retention_bytes: Option<u64>,
        /// Cluster mode: the node of each partition, comma-separated, by index (default:
        /// spread over the live nodes).
        #[arg(long, value_delimiter = ',', value_name = "NODE,...")]
        placement: Option<Vec<String>>,
    },
    /// List topics.
    List,
    /// Show a topic's settings and each partition's offsets, size and state.
    Describe {
        /// Topic name.
        name: String,
    },
    /// Change a topic's retention, or whether producers may write to it while it is a
    /// fan-out child. What is not given keeps its value.
    Set {
        /// Topic name.
        name: String,
        /// Delete records older than this many milliseconds; `none` keeps them forever.
        #[arg(long, value_name = "MS|none", value_parser = parse_limit)]
        retention_ms: Option<Limit>,
        /// Trim each partition to about this many bytes; `none` removes the cap.
        #[arg(long, value_name = "BYTES|none", value_parser = parse_limit)]
        retention_bytes: Option<Limit>,
        /// Whether producers may write to the topic while it is a fan-out child (a child
        /// refuses them by default: its records are the copier's).
        #[arg(long, value_name = "true|false")]
        writable_as_child: Option<bool>,
    },
    /// Raise a topic's partition count (it can never shrink).
    Grow {
        /// Topic name.
        name: String,
        /// The new partition count.
        #[arg(long)]
        partitions: u32,
    },
    /// Delete a topic and all its records. A topic that has children or is a child is
    /// deleted only with --force, which removes those links too (and says which).
    Delete {
        /// Topic name.
        name: String,
        /// Delete it even though it has fan-out children or is one, removing those links.
        #[arg(long)]
        force: bool,
    },
}

/// A retention limit given on the command line: a number, or `none` for no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit(Option<u64>);

fn parse_limit(text: &str) -> Result<Limit, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    text.parse::<u64>()
        .map(|n| Limit(Some(n)))
        .map_err(|_| format!("{text:?} is neither a whole number nor `none`"))
}

fn topic_rows(topics: &[TopicInfo]) -> String {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.partitions.to_string(),
                t.retention_ms
                    .map_or_else(|| "-".to_owned(), |v| v.to_string()),
                t.retention_bytes
                    .map_or_else(|| "-".to_owned(), |v| v.to_string()),
                human::rfc3339_utc(t.created_at),
            ]
        })
        .collect();
    table::render(
        &[
            "NAME",
            "PARTITIONS",
            "RETENTION_MS",
            "RETENTION_BYTES",
            "CREATED",
        ],
        &rows,
    )
}

fn describe_text(d: &TopicDescription) -> String {
    let mut out = topic_rows(std::slice::from_ref(&d.topic));
    out.push('\n');
    // Cluster mode: which node holds each partition (its figures come from there).
    let clustered = d.partition_stats.iter().any(|p| p.owner.is_some());
    let rows: Vec<Vec<String>> = d
        .partition_stats
        .iter()
        .map(|p| {
            let mut row = vec![
                p.partition.to_string(),
                p.log_start_offset.to_string(),
                p.high_watermark
                    .map_or_else(|| "?".to_owned(), |v| v.to_string()),
                p.size_bytes.to_string(),
                p.segments.to_string(),
                // The state alone: its reason (a peer's whole error chain, a quarantine's
                // cause) goes under the table, so one long reason does not widen every row.
                p.state.clone(),
            ];
            if clustered {
                row.push(p.owner.clone().unwrap_or_else(|| "-".to_owned()));
            }
            row
        })
        .collect();
    let mut header = vec![
        "PARTITION",
        "LOG_START",
        "HIGH_WATERMARK",
        "BYTES",
        "SEGMENTS",
        "STATE",
    ];
    if clustered {
        header.push("OWNER");
    }
    out.push_str(&table::render(&header, &rows));
    for p in &d.partition_stats {
        if let Some(reason) = &p.reason {
            out.push_str(&format!(
                "partition {} {}: {reason}\n",
                p.partition, p.state
            ));
        }
    }
    // Records recovery cut off a torn tail are shown under the table: they may have been
    // acknowledged, and the operator has to decide about the kept-aside bytes.
    for p in &d.partition_stats {
        if let Some(c) = &p.recovered_cut {
            let at_least = if c.records_exact { "" } else { "at least " };
            out.push_str(&format!(
                "partition {}: recovery cut {at_least}{}, {}, from offset {} ({}, the latest at {}); kept at {}\n",
                p.partition,
                human::plural(c.records, "record"),
                human::plural(c.bytes, "byte"),
                c.from_offset,
                human::plural(u64::from(c.cuts), "cut"),
                human::rfc3339_utc(c.at_ms),
                c.kept_at
            ));
        }
    }
    out
}

/// What `topic delete` prints: the topic, and each link that went with it.
fn deleted_text(d: &DeletedTopic) -> String {
    let mut out = format!("deleted topic {}", d.topic.name);
    if d.removed_links.is_empty() {
        out.push('\n');
        return out;
    }
    let links: Vec<String> = d
        .removed_links
        .iter()
        .map(|l| format!("{} -> {}", l.parent, l.child))
        .collect();
    out.push_str(&format!(
        " and its {}: {}\n",
        human::plural(links.len() as u64, "link"),
        links.join(", ")
    ));
    out
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// Runs a topic command.
pub async fn run(args: TopicArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    let json = args.client.json;
    match args.command {
        TopicCommand::Create {
            name,
            partitions,
            retention_ms,
            retention_bytes,
            placement,
        } => {
            let t = client
                .create_topic(&CreateTopicRequest {
                    name,
                    partitions,
                    retention_ms,
                    retention_bytes,
                    placement,
                })
                .await?;
            if json {
                print_json(&t)?;
            } else {
                outln!(
                    "created topic {} with {}",
                    t.name,
                    human::plural(u64::from(t.partitions), "partition")
                )?;
            }
        }
        TopicCommand::List => {
            let list = client.list_topics().await?;
            if json {
                print_json(&list)?;
            } else {
                out!("{}", topic_rows(&list.topics))?;
            }
        }
        TopicCommand::Describe { name } => {
            let d = client.describe_topic(&name).await?;
            if json {
                print_json(&d)?;
            } else {
                out!("{}", describe_text(&d))?;
            }
        }
        TopicCommand::Set {
            name,
            retention_ms,
            retention_bytes,
            writable_as_child,
        } => {
            let mut change = serde_json::Map::new();
            if let Some(Limit(ms)) = retention_ms {
                change.insert("retention_ms".into(), serde_json::json!(ms));
            }
            if let Some(Limit(bytes)) = retention_bytes {
                change.insert("retention_bytes".into(), serde_json::json!(bytes));
            }
            if let Some(writable) = writable_as_child {
                change.insert("writable_as_child".into(), serde_json::json!(writable));
            }
            if change.is_empty() {
                anyhow::bail!(
                    "nothing to change: give --retention-ms, --retention-bytes or \
                     --writable-as-child"
                );
            }
            let t = client
                .change_topic(&name, &serde_json::Value::Object(change))
                .await?;
            if json {
                print_json(&t)?;
            } else {
                let limit = |v: Option<u64>, unit: &str| {
                    v.map_or_else(|| "none".to_owned(), |v| format!("{v} {unit}"))
                };
                outln!(
                    "topic {}: retention {} / {} per partition; producers may write to it as a \
                     fan-out child: {}",
                    t.name,
                    limit(t.retention_ms, "ms"),
                    limit(t.retention_bytes, "bytes"),
                    t.writable_as_child
                )?;
            }
        }
        TopicCommand::Grow { name, partitions } => {
            let t = client.grow_partitions(&name, partitions).await?;
            if json {
                print_json(&t)?;
            } else {
                outln!(
                    "topic {} now has {}",
                    t.name,
                    human::plural(u64::from(t.partitions), "partition")
                )?;
            }
        }
        TopicCommand::Delete { name, force } => {
            let deleted = client.delete_topic(&name, force).await?;
            if json {
                print_json(&deleted)?;
            } else {
                out!("{}", deleted_text(&deleted))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_host::api::types::{LinkEnds, PartitionInfo};

    fn topic(name: &str) -> TopicInfo {
        TopicInfo {
            name: name.to_owned(),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            created_at: 1_764_460_800_123,
            owners: Vec::new(),
            writable_as_child: false,
        }
    }

    #[test]
    fn in_cluster_mode_a_topic_description_names_each_partitions_owner() {
        let partition = |p: u32, owner: Option<&str>| PartitionInfo {
            partition: p,
            log_start_offset: 0,
            high_watermark: Some(7),
            size_bytes: 100,
            segments: 1,
            state: "ok".into(),
            reason: None,
            recovered_cut: None,
            owner: owner.map(str::to_owned),
        };
        let clustered = describe_text(&TopicDescription {
            topic: topic("orders"),
            partition_stats: vec![partition(0, Some("n2")), partition(1, Some("n3"))],
        });
        let lines: Vec<&str> = clustered.lines().collect();
        let header = lines.iter().find(|l| l.starts_with("PARTITION")).unwrap();
        assert!(header.trim_end().ends_with("OWNER"), "{clustered}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with('0') && l.trim_end().ends_with("n2")),
            "{clustered}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with('1') && l.trim_end().ends_with("n3")),
            "{clustered}"
        );
        let single = describe_text(&TopicDescription {
            topic: topic("orders"),
            partition_stats: vec![partition(0, None)],
        });
        assert!(!single.contains("OWNER"), "{single}");
    }

    #[test]
    fn a_partitions_reason_is_shown_under_the_table_not_in_its_state_column() {
        let reason = "node n3 did not answer: error sending request for url \
                      (http://127.0.0.1:23795/internal/v1/...): tcp connect error: Connection \
                      refused (os error 111)";
        let down = PartitionInfo {
            partition: 2,
            log_start_offset: 0,
            high_watermark: None,
            size_bytes: 0,
            segments: 0,
            state: "unavailable".into(),
            reason: Some(reason.into()),
            recovered_cut: None,
            owner: Some("n3".into()),
        };
        let text = describe_text(&TopicDescription {
            topic: topic("orders"),
            partition_stats: vec![down],
        });
        let row = text.lines().find(|l| l.starts_with('2')).unwrap();
        assert!(
            row.contains("unavailable") && !row.contains("os error"),
            "{text}"
        );
        assert!(
            text.contains(&format!("partition 2 unavailable: {reason}")),
            "{text}"
        );
    }

    #[test]
    fn a_forced_delete_names_every_link_that_went() {
        let text = deleted_text(&DeletedTopic {
            topic: topic("orders"),
            removed_links: vec![
                LinkEnds {
                    parent: "orders".into(),
                    child: "audit".into(),
                },
                LinkEnds {
                    parent: "raw".into(),
                    child: "orders".into(),
                },
            ],
        });
        assert_eq!(
            text,
            "deleted topic orders and its 2 links: orders -> audit, raw -> orders\n"
        );
    }

    #[test]
    fn the_topic_table_shows_the_creation_time_in_utc() {
        let text = topic_rows(&[topic("orders")]);
        assert!(text.contains("2025-11-30T00:00:00Z"), "{text}");
        assert!(!text.contains("1764460800123"), "{text}");
    }
}
