//! `narad node list`, `narad node drain`, `narad node cordon` and `narad node uncordon`.

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
    let client = args.client.client();
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
