//! `narad admin`: the operator's repair commands.
//!
//! - `narad admin set-aside list|adopt|purge`: the directories start-up could not account for
//!   (through the daemon's API);
//! - `narad admin rebuild-metastore --data-dir D`: a lost metastore rebuilt from the
//!   directories, offline (the daemon must be stopped; the data-dir lock enforces it).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::ClientArgs;
use super::{human, table};
use narad_host::topics::rebuild::{self, RebuildReport};
use narad_host::topics::set_aside::SetAsideEntry;

/// `narad admin`.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The admin command.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Admin commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Directories start-up found but could not account for, kept intact in set-aside/.
    #[command(subcommand, name = "set-aside")]
    SetAside(SetAsideCommand),
    /// Rebuild a lost metastore from the topic directories (offline: stop the daemon first).
    /// Partition counts come from the partition directories; retention, children and plugin
    /// names cannot be recovered and are reported.
    RebuildMetastore {
        /// The daemon's data directory.
        #[arg(long, env = "NARAD_DATA_DIR", value_name = "DIR")]
        data_dir: PathBuf,
        /// Report what would be recorded and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `narad admin set-aside` commands.
#[derive(Debug, Subcommand)]
pub enum SetAsideCommand {
    /// List the entries.
    List,
    /// Bring an entry back: a topic becomes a topic again (without retention limits, which you
    /// set again), a partition becomes its topic's next partition.
    Adopt {
        /// The entry's id (from `list`).
        id: String,
    },
    /// Delete an entry and every record in it, for good.
    Purge {
        /// The entry's id (from `list`).
        id: String,
    },
}

fn entry_rows(entries: &[SetAsideEntry]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.id.clone(),
                e.topic.clone(),
                e.partition
                    .map_or_else(|| "all".to_owned(), |p| p.to_string()),
                e.segment_bytes.to_string(),
                human::rfc3339_utc(e.set_aside_at_ms),
                e.reason.clone(),
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "TOPIC",
            "PARTITION",
            "SEGMENT_BYTES",
            "SET_ASIDE_AT",
            "REASON",
        ],
        &rows,
    )
}

fn rebuild_text(report: &RebuildReport) -> String {
    let mut out = String::new();
    if report.dry_run {
        out.push_str("dry run: nothing was written\n\n");
    }
    let rows: Vec<Vec<String>> = report
        .topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.partitions.to_string(),
                t.segment_bytes.to_string(),
                if t.missing_partitions.is_empty() {
                    "-".to_owned()
                } else {
                    format!(
                        "{:?} had no directory: made empty, they start again at offset 0",
                        t.missing_partitions
                    )
                },
            ]
        })
        .collect();
    out.push_str(&table::render(
        &["TOPIC", "PARTITIONS", "SEGMENT_BYTES", "NOTE"],
        &rows,
    ));
    for skipped in &report.skipped {
        out.push_str(&format!("left out: {skipped}\n"));
    }
    out.push_str(
        "\nNot recoverable from the directories:\n\
         - retention: every rebuilt topic keeps its records until you set retention_ms / \
         retention_bytes again (PATCH /v1/topics/{topic});\n",
    );
    if report.children_seen.is_empty() {
        out.push_str("- children: no cursor files were found;\n");
    } else {
        out.push_str(
            "- children: their routers and delays are gone; attach them again (a new attach \
             starts each cursor at the new attach point; records produced since the old \
             cursors' positions are not copied):\n",
        );
        for (parent, child) in &report.children_seen {
            out.push_str(&format!("    narad child attach {parent} {child}\n"));
        }
    }
    if report.plugin_files.is_empty() {
        out.push_str("- uploaded plugins: none found.\n");
    } else {
        out.push_str(&format!(
            "- uploaded plugins: their names are gone; {} {} kept for you to \
             deploy again with `narad plugin deploy NAME FILE`:\n",
            human::plural(report.plugin_files.len() as u64, "module file"),
            match (report.dry_run, report.plugin_files.len()) {
                (true, _) => "would be",
                (false, 1) => "is",
                (false, _) => "are",
            }
        ));
        for file in &report.plugin_files {
            out.push_str(&format!("    {}\n", file.display()));
        }
    }
    out
}

/// Runs an admin command.
pub async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let json = args.client.json;
    match args.command {
        AdminCommand::RebuildMetastore { data_dir, dry_run } => {
            let report = rebuild::rebuild(&data_dir, dry_run)
                .await
                .with_context(|| {
                    format!("cannot rebuild the metastore of {}", data_dir.display())
                })?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                out!("{}", rebuild_text(&report))?;
            }
        }
        AdminCommand::SetAside(command) => {
            let client = args.client.client()?;
            match command {
                SetAsideCommand::List => {
                    let list = client.list_set_aside().await?;
                    if json {
                        outln!("{}", serde_json::to_string_pretty(&list)?)?;
                    } else if list.entries.is_empty() {
                        outln!("nothing is set aside")?;
                    } else {
                        out!("{}", entry_rows(&list.entries))?;
                    }
                }
                SetAsideCommand::Adopt { id } => {
                    let topic = client.adopt_set_aside(&id).await?;
                    if json {
                        outln!("{}", serde_json::to_string_pretty(&topic)?)?;
                    } else {
                        outln!(
                            "adopted {id}: topic {} now has {} (no retention limits: set them again if it had any)",
                            topic.name,
                            human::plural(u64::from(topic.partitions), "partition")
                        )?;
                    }
                }
                SetAsideCommand::Purge { id } => {
                    let entry = client.purge_set_aside(&id).await?;
                    if json {
                        outln!("{}", serde_json::to_string_pretty(&entry)?)?;
                    } else {
                        outln!(
                            "purged {id}: {} of segments of {} removed",
                            human::plural(entry.segment_bytes, "byte"),
                            entry.topic
                        )?;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_aside_table_shows_when_in_utc() {
        let text = entry_rows(&[SetAsideEntry {
            id: "orders.1764460800123".into(),
            topic: "orders".into(),
            partition: Some(2),
            reason: "not in the metastore".into(),
            set_aside_at_ms: 1_764_460_800_123,
            segment_bytes: 4096,
        }]);
        assert!(text.contains("SET_ASIDE_AT"), "{text}");
        assert!(text.contains("2025-11-30T00:00:00Z"), "{text}");
    }
}
