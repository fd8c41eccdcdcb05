//! `narad node list`, `narad node drain`, `narad node recreate`, `narad node cordon` and
//! `narad node uncordon`.

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::{human, table};
use narad_host::api::types::NodeList;

/// `narad node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The node command.
    #[command(subcommand)]
    pub command: NodeCommand,
}

/// Node commands.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List the live nodes of the cluster and the addresses they advertise.
    List,
    /// Move every partition a node owns to the other live nodes, one at a time (each a
    /// fenced `partition move`), showing each as it finishes. Cordons the node first, so no
    /// new partition lands there meanwhile. Run it again to resume after a failure: what
    /// moved stays moved.
    Drain {
        /// The node to empty.
        id: String,
    },
    /// Re-create every partition a dead node owns, empty, on the live nodes (each a
    /// `partition recreate`, placed on the live node owning the fewest partitions), when its
    /// disk is not coming back. Every record only that node held is lost. A partition that
    /// must wait for another (its link's child partition was on the same node) is retried once
    /// that one is done. Run it again to resume after a failure.
    Recreate {
        /// The dead node.
        id: String,
        /// Required: you accept that the records only that node held are lost.
        #[arg(long)]
        accept_loss: bool,
    },
    /// Stop giving a node new partitions (spread placements, and moves or re-creations
    /// without a named target skip it); what it owns it keeps serving.
    Cordon {
        /// The node.
        id: String,
    },
    /// Give a cordoned node new partitions again (after a drain, or a cordon, is done with).
    Uncordon {
        /// The node.
        id: String,
    },
}

/// Runs a node command.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    match args.command {
        NodeCommand::List => {
            let list = client.list_nodes().await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&list)?)?;
            } else {
                out!("{}", node_rows(&list))?;
            }
        }
        NodeCommand::Drain { id } => drain(&client, &id, args.client.json).await?,
        NodeCommand::Recreate { id, accept_loss } => {
            recreate_all(&client, &id, accept_loss, args.client.json).await?;
        }
        NodeCommand::Cordon { id } => {
            let answer = client.cordon(&id, true).await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&answer)?)?;
            } else {
                outln!(
                    "node {id} is cordoned: it gets no new partitions (`narad node uncordon {id}` to undo)"
                )?;
            }
        }
        NodeCommand::Uncordon { id } => {
            let answer = client.cordon(&id, false).await?;
            if args.client.json {
                outln!("{}", serde_json::to_string_pretty(&answer)?)?;
            } else {
                outln!("node {id} may be given new partitions again")?;
            }
        }
    }
    Ok(())
}

/// The partitions `node` owns, as (topic, partition), in topic order.
fn owned_by(topics: &[narad_host::api::types::TopicInfo], node: &str) -> Vec<(String, u32)> {
    let mut owned = Vec::new();
    for topic in topics {
        for (p, owner) in topic.owners.iter().enumerate() {
            if owner == node
                && let Ok(p) = u32::try_from(p)
            {
                owned.push((topic.name.clone(), p));
            }
        }
    }
    owned
}

async fn drain(client: &super::client::Client, node: &str, json: bool) -> anyhow::Result<()> {
    // First, so a topic created while the drain runs does not put partitions back on it.
    client.cordon(node, true).await?;
    if !json {
        outln!(
            "node {node} is cordoned: it gets no new partitions (`narad node uncordon {node}` to undo)"
        )?;
    }
    let topics = client.list_topics().await?.topics;
    let todo = owned_by(&topics, node);
    if todo.is_empty() {
        if !json {
            outln!("node {node} owns no partitions: nothing to drain")?;
        }
        return Ok(());
    }
    let (total, mut failed, mut reports) = (todo.len(), Vec::new(), Vec::new());
    for (i, (topic, p)) in todo.into_iter().enumerate() {
        match client.move_partition(&topic, p, None).await {
            Ok(report) => {
                if !json {
                    outln!(
                        "[{}/{total}] {}",
                        i + 1,
                        super::partition::move_line(&report)
                    )?;
                }
                reports.push(report);
            }
            Err(e) => {
                eprintln!("[{}/{total}] {topic}/{p}: {e}", i + 1);
                failed.push(format!("{topic}/{p}"));
            }
        }
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&reports)?)?;
    }
    if failed.is_empty() {
        if !json {
            outln!(
                "node {node} is drained: its {} moved",
                human::plural(total as u64, "partition")
            )?;
        }
        Ok(())
    } else {
        anyhow::bail!(
            "{} of {total} partitions did not move ({}); run `narad node drain {node}` again to \
             resume (a partition whose move stopped part way is sealed until its move resumes \
             or is cancelled with `narad partition move T/P --cancel`)",
            failed.len(),
            failed.join(", ")
        )
    }
}

/// `narad node recreate`: every partition of dead `node` re-created elsewhere, in passes, so a
/// partition whose link's child partition was on the same node goes once that child has.
async fn recreate_all(
    client: &super::client::Client,
    node: &str,
    accept_loss: bool,
    json: bool,
) -> anyhow::Result<()> {
    if !accept_loss {
        anyhow::bail!(
            "re-creating node {node}'s partitions loses every record only that node held; run \
             it again with --accept-loss if its disk is not coming back"
        );
    }
    let nodes = client.list_nodes().await?;
    if nodes.mode == "single" {
        anyhow::bail!(
            "the daemon runs as a single node (no --etcd): there is no other node to re-create \
             partitions on"
        );
    }
    if nodes.nodes.iter().any(|n| n.id == node) {
        anyhow::bail!(
            "node {node} is alive: nothing of it needs re-creating; move its partitions with \
             `narad node drain {node}`, which loses nothing"
        );
    }
    let mut todo = owned_by(&client.list_topics().await?.topics, node);
    if todo.is_empty() {
        if !json {
            outln!("node {node} owns no partitions: nothing to re-create")?;
        }
        return Ok(());
    }
    let total = todo.len();
    let mut reports = Vec::new();
    let mut failures: Vec<(String, String)> = Vec::new();
    loop {
        let before = todo.len();
        failures.clear();
        let mut waiting = Vec::new();
        for (topic, p) in todo {
            let request = narad_host::api::types::RecreateRequest {
                on: None,
                accept_loss: true,
                start_offset: None,
            };
            match client.recreate_partition(&topic, p, &request).await {
                Ok(report) => {
                    if !json {
                        let lines = super::partition::recreate_lines(&report);
                        outln!("[{}/{total}] {}", reports.len() + 1, lines.join("\n"))?;
                    }
                    reports.push(report);
                }
                Err(e) => {
                    failures.push((format!("{topic}/{p}"), e.to_string()));
                    waiting.push((topic, p));
                }
            }
        }
        todo = waiting;
        // Done, or a pass that re-created nothing: another would fail the same way.
        if todo.is_empty() || todo.len() == before {
            break;
        }
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&reports)?)?;
    }
    if failures.is_empty() {
        if !json {
            outln!(
                "node {node}'s {} re-created; start it on a new disk with \
                 --new-data-dir-for {node}, or leave it out",
                human::plural(total as u64, "partition")
            )?;
        }
        return Ok(());
    }
    for (partition, error) in &failures {
        eprintln!("{partition}: {error}");
    }
    anyhow::bail!(
        "{} of {total} partitions of node {node} were not re-created (above); fix what each \
         says and run `narad node recreate {node} --accept-loss` again to resume",
        failures.len()
    )
}

/// The node table: the answering node marked with `*`.
fn node_rows(list: &NodeList) -> String {
    let rows: Vec<Vec<String>> = list
        .nodes
        .iter()
        .map(|n| {
            let mark = if n.id == list.this_node { "*" } else { "" };
            vec![
                format!("{}{mark}", n.id),
                n.advertise.clone().unwrap_or_else(|| "-".to_owned()),
                n.joined_at
                    .map_or_else(|| "-".to_owned(), human::rfc3339_utc),
                if n.cordoned { "cordoned" } else { "-" }.to_owned(),
            ]
        })
        .collect();
    let mut text = table::render(&["NODE", "ADDRESS", "JOINED", "CORDON"], &rows);
    if list.mode == "single" {
        text.push_str("(single node: no --etcd)\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_host::api::types::NodeInfo;

    #[test]
    fn the_answering_node_is_marked_and_a_single_node_says_so() {
        let list = NodeList {
            mode: "cluster".into(),
            this_node: "n2".into(),
            nodes: vec![
                NodeInfo {
                    id: "n1".into(),
                    advertise: Some("http://127.0.0.1:7001".into()),
                    joined_at: Some(0),
                    cordoned: true,
                },
                NodeInfo {
                    id: "n2".into(),
                    advertise: Some("http://127.0.0.1:7002".into()),
                    joined_at: Some(0),
                    cordoned: false,
                },
            ],
        };
        let text = node_rows(&list);
        assert!(text.contains("n2*"), "{text}");
        assert!(!text.contains("n1*"), "{text}");
        assert!(text.contains("http://127.0.0.1:7001"), "{text}");
        let n1 = text.lines().find(|l| l.starts_with("n1")).unwrap_or("");
        assert!(n1.contains("cordoned"), "{text}");
        let single = NodeList {
            mode: "single".into(),
            this_node: "local".into(),
            nodes: vec![NodeInfo {
                id: "local".into(),
                advertise: None,
                joined_at: None,
                cordoned: false,
            }],
        };
        assert!(node_rows(&single).contains("single node"));
    }
}
