//! `narad topic create|list|describe|grow|delete`.

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::table;
use crate::api::types::{CreateTopicRequest, TopicDescription, TopicInfo};

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
    },
    /// List topics.
    List,
    /// Show a topic's settings and each partition's offsets, size and state.
    Describe {
        /// Topic name.
        name: String,
    },
    /// Raise a topic's partition count (it can never shrink).
    Grow {
        /// Topic name.
        name: String,
        /// The new partition count.
        #[arg(long)]
        partitions: u32,
    },
    /// Delete a topic and all its records.
    Delete {
        /// Topic name.
        name: String,
    },
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
            ]
        })
        .collect();
    table::render(
        &["NAME", "PARTITIONS", "RETENTION_MS", "RETENTION_BYTES"],
        &rows,
    )
}

fn describe_text(d: &TopicDescription) -> String {
    let mut out = topic_rows(std::slice::from_ref(&d.topic));
    out.push('\n');
    let rows: Vec<Vec<String>> = d
        .partition_stats
        .iter()
        .map(|p| {
            vec![
                p.partition.to_string(),
                p.log_start_offset.to_string(),
                p.high_watermark
                    .map_or_else(|| "?".to_owned(), |v| v.to_string()),
                p.size_bytes.to_string(),
                p.segments.to_string(),
                match &p.reason {
                    Some(r) => format!("{}: {r}", p.state),
                    None => p.state.clone(),
                },
            ]
        })
        .collect();
    out.push_str(&table::render(
        &[
            "PARTITION",
            "LOG_START",
            "HIGH_WATERMARK",
            "BYTES",
            "SEGMENTS",
            "STATE",
        ],
        &rows,
    ));
    // Records recovery cut off a torn tail are shown under the table: they may have been
    // acknowledged, and the operator has to decide about the kept-aside bytes.
    for p in &d.partition_stats {
        if let Some(c) = &p.recovered_cut {
            let at_least = if c.records_exact { "" } else { "at least " };
            out.push_str(&format!(
                "partition {}: recovery cut {at_least}{} record(s), {} byte(s), from offset {} ({} cut(s)); kept at {}\n",
                p.partition, c.records, c.bytes, c.from_offset, c.cuts, c.kept_at
            ));
        }
    }
    out
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Runs a topic command.
pub async fn run(args: TopicArgs) -> anyhow::Result<()> {
    let client = args.client.client();
    let json = args.client.json;
    match args.command {
        TopicCommand::Create {
            name,
            partitions,
            retention_ms,
            retention_bytes,
        } => {
            let t = client
                .create_topic(&CreateTopicRequest {
                    name,
                    partitions,
                    retention_ms,
                    retention_bytes,
                })
                .await?;
            if json {
                print_json(&t)?;
            } else {
                println!("created topic {} with {} partitions", t.name, t.partitions);
            }
        }
        TopicCommand::List => {
            let list = client.list_topics().await?;
            if json {
                print_json(&list)?;
            } else {
                print!("{}", topic_rows(&list.topics));
            }
        }
        TopicCommand::Describe { name } => {
            let d = client.describe_topic(&name).await?;
            if json {
                print_json(&d)?;
            } else {
                print!("{}", describe_text(&d));
            }
        }
        TopicCommand::Grow { name, partitions } => {
            let t = client.grow_partitions(&name, partitions).await?;
            if json {
                print_json(&t)?;
            } else {
                println!("topic {} now has {} partitions", t.name, t.partitions);
            }
        }
        TopicCommand::Delete { name } => {
            let t = client.delete_topic(&name).await?;
            if json {
                print_json(&t)?;
            } else {
                println!("deleted topic {}", t.name);
            }
        }
    }
    Ok(())
}
