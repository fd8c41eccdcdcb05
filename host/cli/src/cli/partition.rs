//! `narad partition move` and `narad partition recreate`.

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::human;
use narad_host::operations::moves::MoveReport;
use narad_host::operations::recreate::RecreateReport;

/// `narad partition`.
#[derive(Debug, Args)]
pub struct PartitionArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The partition command.
    #[command(subcommand)]
    pub command: PartitionCommand,
}

/// Partition commands.
#[derive(Debug, Subcommand)]
pub enum PartitionCommand {
    /// Move a partition (its log and its fan-out cursor files) to another node, fenced: it
    /// takes no writes while it moves, and nothing is lost or copied twice. Waits until the
    /// new owner serves it. A move that stopped part way resumes when asked again.
    Move {
        /// The partition, as TOPIC/PARTITION (`orders/3`).
        partition: String,
        /// The node to move it to (default: where a stopped move was going, else the live
        /// node owning the fewest partitions).
        #[arg(long, conflicts_with = "cancel")]
        to: Option<String>,
        /// Cancel a move under way instead: the partition stays with its owner and serves
        /// again.
        #[arg(long)]
        cancel: bool,
    },
    /// Re-create a partition whose node is dead and not coming back, empty, on another node
    /// (on a single node: a partition whose directory is gone, quarantined at start, empty on
    /// this node). Every record only that node (or directory) held is lost; each link from the
    /// partition counts what it
    /// lost on narad_fanout_child_dropped_messages. Refused while the owner is alive (use
    /// `move`) and until every child partition of its links can say what it holds.
    Recreate {
        /// The partition, as TOPIC/PARTITION (`orders/3`).
        partition: String,
        /// The node to re-create it on (default: the live node owning the fewest partitions).
        #[arg(long)]
        on: Option<String>,
        /// Required: you accept that the records only the dead node held are lost.
        #[arg(long)]
        accept_loss: bool,
        /// The lowest offset the new log may start at; pass the last high watermark you saw
        /// so consumers reading the partition never meet a reused offset (default: just above
        /// what its children hold).
        #[arg(long)]
        start_offset: Option<u64>,
    },
}

/// `TOPIC/PARTITION` split, with an error that shows the expected shape.
pub fn parse_partition(text: &str) -> anyhow::Result<(String, u32)> {
    let parsed = text
        .rsplit_once('/')
        .and_then(|(topic, p)| Some((topic, p.parse::<u32>().ok()?)))
        .filter(|(topic, _)| !topic.is_empty());
    match parsed {
        Some((topic, p)) => Ok((topic.to_owned(), p)),
        None => anyhow::bail!("{text:?} is not TOPIC/PARTITION (for example orders/3)"),
    }
}

/// One line about a finished move, and a note when the named target holds the same
/// partition of a linked topic.
pub fn move_line(report: &MoveReport) -> String {
    let mut line = format!(
        "moved {}/{} from {} to {} (generation {}): {} files, {}, high watermark {}, in {}",
        report.topic,
        report.partition,
        report.from,
        report.to,
        report.generation,
        report.files,
        human::bytes(report.bytes),
        report.high_watermark,
        human::millis(report.elapsed_ms),
    );
    if !report.shares_node_with.is_empty() {
        let linked: Vec<String> = report
            .shares_node_with
            .iter()
            .map(|t| format!("{t}/{}", report.partition))
            .collect();
        line.push_str(&format!(
            "\nnote: {} is also on {}: a copy and its original now share a disk (move one of \
             them without --to to separate them)",
            linked.join(", "),
            report.to
        ));
    }
    line
}

/// What a re-creation did, for people: one line, then one per link.
pub fn recreate_lines(report: &RecreateReport) -> Vec<String> {
    let mut lines = vec![if report.from == report.to {
        format!(
            "re-created {}/{} empty on {}: the new log starts at offset {}",
            report.topic, report.partition, report.to, report.start_offset,
        )
    } else {
        format!(
            "re-created {}/{} on {} (was {}, generation {}): the new log starts at offset {}",
            report.topic,
            report.partition,
            report.to,
            report.from,
            report.generation,
            report.start_offset,
        )
    }];
    for link in &report.links {
        let holds = match link.child_holds_up_to {
            Some(h) => format!("holds up to offset {h}"),
            None => "holds none it still remembers".to_owned(),
        };
        lines.push(format!(
            "  -> {}: {holds}; resumes at {}, counting at most {} dropped",
            link.child, link.resume_offset, link.dropped_at_most
        ));
    }
    for parent in &report.fed_by {
        lines.push(format!(
            "  <- {parent}: what the partition held of it is lost; its cursors go on from where they are"
        ));
    }
    lines
}

/// Runs a partition command.
pub async fn run(args: PartitionArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    match args.command {
        PartitionCommand::Move {
            partition,
            to,
            cancel,
        } => {
            let (topic, index) = parse_partition(&partition)?;
            if cancel {
                let answer = client.cancel_move(&topic, index).await?;
                if args.client.json {
                    outln!("{}", serde_json::to_string_pretty(&answer)?)?;
                } else {
                    outln!(
                        "cancelled the move of {topic}/{index}: {} owns it and serves it again",
                        answer.owner
                    )?;
                }
                return Ok(());
            }
            let report = client.move_partition(&topic, index, to).await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                outln!("{}", move_line(&report))?;
            }
        }
        PartitionCommand::Recreate {
            partition,
            on,
            accept_loss,
            start_offset,
        } => {
            let (topic, index) = parse_partition(&partition)?;
            if !accept_loss {
                anyhow::bail!(
                    "re-creating {topic}/{index} loses every record only its dead owner (or its \
                     lost directory) held; run it again with --accept-loss if that node or \
                     directory is not coming back"
                );
            }
            let request = narad_host::api::types::RecreateRequest {
                on,
                accept_loss,
                start_offset,
            };
            let report = client.recreate_partition(&topic, index, &request).await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                for line in recreate_lines(&report) {
                    outln!("{line}")?;
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
    fn a_partition_is_named_topic_slash_index() {
        assert_eq!(
            parse_partition("orders/3").unwrap(),
            ("orders".to_owned(), 3)
        );
        assert_eq!(parse_partition("a.b-c/0").unwrap(), ("a.b-c".to_owned(), 0));
        for bad in ["orders", "orders/", "/3", "orders/x", "orders/-1"] {
            let e = parse_partition(bad).unwrap_err().to_string();
            assert!(e.contains("TOPIC/PARTITION"), "{bad}: {e}");
        }
    }
}
