//! `narad node list`.

use clap::{Args, Subcommand};

use super::ClientArgs;
use super::{human, table};
use crate::api::types::NodeList;

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
}

/// Runs a node command.
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let client = args.client.client();
    match args.command {
        NodeCommand::List => {
            let list = client.list_nodes().await?;
            if args.client.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print!("{}", node_rows(&list));
            }
        }
    }
    Ok(())
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
            ]
        })
        .collect();
    let mut text = table::render(&["NODE", "ADDRESS", "JOINED"], &rows);
    if list.mode == "single" {
        text.push_str("(single node: no --etcd)\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::types::NodeInfo;

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
                },
                NodeInfo {
                    id: "n2".into(),
                    advertise: Some("http://127.0.0.1:7002".into()),
                    joined_at: Some(0),
                },
            ],
        };
        let text = node_rows(&list);
        assert!(text.contains("n2*"), "{text}");
        assert!(!text.contains("n1*"), "{text}");
        assert!(text.contains("http://127.0.0.1:7001"), "{text}");
        let single = NodeList {
            mode: "single".into(),
            this_node: "local".into(),
            nodes: vec![NodeInfo {
                id: "local".into(),
                advertise: None,
                joined_at: None,
            }],
        };
        assert!(node_rows(&single).contains("single node"));
    }
}
