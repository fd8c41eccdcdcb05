//! `narad child attach|detach|list|set|set-router|pause|resume|seek|gaps|shadow`: the children API
//! (`/v1/topics/{parent}/children`); `shadow` is [`super::shadow`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::ClientArgs;
use super::duration::{format_duration, parse_duration};
use super::{human, table};
use narad_host::api::children::{
    AttachRequest, AttachStart, ChildList, LinkInfo, RouterChange, RouterEntry,
};
use narad_host::fanout::status::{CursorReport, CursorState};
use narad_host::metastore::link::OnGap;
use narad_host::plugins::MIN_DIGEST_PREFIX_HEX;

/// `narad child`.
#[derive(Debug, Args)]
pub struct ChildArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The child command.
    #[command(subcommand)]
    pub command: ChildCommand,
}

/// The plugin config of a link: a file's bytes or text on the command line.
#[derive(Debug, Clone, Default, Args)]
#[group(multiple = false)]
pub struct ConfigSource {
    /// File whose contents are handed to every plugin of the chain as its config.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The plugin config as text (e.g. "header = region\nus = 0").
    #[arg(long, value_name = "TEXT")]
    pub config_text: Option<String>,
}

impl ConfigSource {
    /// The config given, as the API takes it (a JSON string), or `None` when neither was.
    pub fn read(&self) -> anyhow::Result<Option<serde_json::Value>> {
        Ok(match (&self.config, &self.config_text) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading plugin config {}", path.display()))?;
                Some(serde_json::Value::String(text))
            }
            (None, Some(text)) => Some(serde_json::Value::String(unescape_newlines(text))),
            (None, None) => None,
        })
    }
}

/// Turns the two characters `\n` into a line break, so a multi-line config fits on one
/// command line.
fn unescape_newlines(text: &str) -> String {
    text.replace("\\n", "\n")
}

/// Child commands.
#[derive(Debug, Subcommand)]
pub enum ChildCommand {
    /// Attach a child to a parent: from now on every record committed to the parent is copied
    /// to the child. Creates the child topic with --partitions, else it must exist.
    Attach {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// Create the child topic with this many partitions.
        #[arg(long, short = 'p', value_name = "N")]
        partitions: Option<u32>,
        /// Make it a delay child: a record is copied once it is this old (e.g. 10s, 5m, 1h).
        #[arg(long, value_parser = parse_duration, conflicts_with = "delay_ms")]
        delay: Option<Duration>,
        /// The delay in milliseconds.
        #[arg(long, value_name = "MS")]
        delay_ms: Option<u64>,
        /// The router chain, comma-separated plugin names (`name` or `name@digest`).
        /// [default: key-hash,keyless-index,round-robin]
        #[arg(long, value_delimiter = ',', value_name = "PLUGINS")]
        router: Option<Vec<String>>,
        /// The plugins' config.
        #[command(flatten)]
        config: ConfigSource,
        /// Make it a remote child: its records go to topic --remote-topic of the narad at
        /// this URL (which must have the topic), through its batch produce.
        #[arg(
            long,
            value_name = "URL",
            requires = "remote_topic",
            conflicts_with = "partitions"
        )]
        remote_url: Option<String>,
        /// The topic of the remote child's target.
        #[arg(long, value_name = "TOPIC", requires = "remote_url")]
        remote_topic: Option<String>,
        /// A file holding the bearer token the target wants (read by the sender; never stored).
        #[arg(long, value_name = "FILE", requires = "remote_url")]
        remote_token_file: Option<String>,
        /// PEM CA certificate(s) the target's TLS certificate is checked against, beside the
        /// system's (an https:// target signed by a private CA; read by the sender).
        #[arg(long, value_name = "FILE", requires = "remote_url")]
        remote_ca_file: Option<String>,
        /// Where copying begins: `attach` (records committed from now on), `earliest` (the
        /// parent's whole retained history, then everything after) or `group:NAME` (where a
        /// Kafka consumer group's committed offsets stand: what it has not read yet).
        #[arg(long, value_name = "FROM", value_parser = parse_start, default_value = "attach")]
        start: AttachStart,
        /// When records aged out of the parent before they were copied: `skip` them (written
        /// on the gap ledger) or `halt` until an operator accepts the loss.
        #[arg(long, value_name = "POLICY", value_parser = parse_on_gap, default_value = "skip")]
        on_gap: OnGap,
        /// A topic (it must exist) that takes, whole, each record the router chain cannot
        /// route, so the rest of the slab goes on; without it such a record stalls the cursor.
        #[arg(long, value_name = "TOPIC")]
        dead_letter: Option<String>,
    },
    /// Detach a child: copying stops; the child topic and its records stay.
    Detach {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// Pause the cursors of a child (all parent partitions, or --partitions): each finishes the
    /// slab it is committing and copies nothing more, across restarts, until resumed.
    Pause {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// Only these parent partitions (comma-separated; default: every one).
        #[arg(long, value_delimiter = ',', value_name = "P,...")]
        partitions: Option<Vec<u32>>,
    },
    /// Resume paused cursors exactly where they stopped; with --accept-gap, halted cursors
    /// skip the records that aged out before they copied them (written on the gap ledger).
    Resume {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// Only these parent partitions (comma-separated; default: every one).
        #[arg(long, value_delimiter = ',', value_name = "P,...")]
        partitions: Option<Vec<u32>>,
        /// Accept the loss each halted cursor (`on_gap: halt`) reports now: it skips to the
        /// parent's oldest record and goes on.
        #[arg(long)]
        accept_gap: bool,
    },
    /// Move a paused cursor: back, and the records from there are copied again; forward, and
    /// the records in between are skipped (counted as skipped by seek, not as dropped).
    Seek {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// The parent partition (its cursor must be paused).
        #[arg(long)]
        partition: u32,
        /// The parent offset to copy next.
        #[arg(long)]
        offset: u64,
    },
    /// Show the gap ledger of a child: every range of parent offsets its cursors moved past
    /// without copying (aged out by retention, lost with a re-created partition, or skipped
    /// by a seek), why, when and on which node. Kept across restarts and moves.
    Gaps {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// The newest ranges listed per parent partition (default 20, at most 1,000).
        #[arg(long, value_name = "N")]
        ranges: Option<usize>,
    },
    /// List a parent's children with each parent partition's progress.
    List {
        /// Parent topic.
        parent: String,
    },
    /// Change what a child's cursors do when records aged out of the parent before they
    /// were copied (--on-gap), or when the router chain cannot route a record
    /// (--dead-letter).
    #[command(group(clap::ArgGroup::new("change").required(true).multiple(true)))]
    Set {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// `skip` the records (written on the gap ledger) or `halt` until an operator
        /// accepts the loss (`narad child resume --accept-gap`).
        #[arg(long, value_name = "POLICY", value_parser = parse_on_gap, group = "change")]
        on_gap: Option<OnGap>,
        /// The topic that takes records the chain cannot route; "" removes it (such a record
        /// then stalls the cursor).
        #[arg(long, value_name = "TOPIC", group = "change")]
        dead_letter: Option<String>,
    },
    /// Swap a child's router chain (and config), effective at each cursor's next slab.
    SetRouter {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// The new chain, comma-separated plugin names.
        #[arg(long, value_delimiter = ',', required = true, value_name = "PLUGINS")]
        router: Vec<String>,
        /// A new config (the current one stays when neither is given).
        #[command(flatten)]
        config: ConfigSource,
    },
    /// Try a candidate chain on a child's live slabs without committing anything it decides:
    /// set it, show how it compares with the current chain, clear it.
    #[command(subcommand)]
    Shadow(super::shadow::ShadowCommand),
}

/// Runs a child command.
pub async fn run(args: ChildArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    let json = args.client.json;
    match args.command {
        ChildCommand::Attach {
            parent,
            child,
            partitions,
            delay,
            delay_ms,
            router,
            config,
            remote_url,
            remote_topic,
            remote_token_file,
            remote_ca_file,
            start,
            on_gap,
            dead_letter,
        } => {
            let delay_ms = match (delay, delay_ms) {
                (Some(d), _) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                (None, ms) => ms,
            };
            let remote = match (remote_url, remote_topic) {
                (Some(url), Some(topic)) => Some(narad_host::api::children::RemoteAttach {
                    url,
                    topic,
                    token_file: remote_token_file,
                    ca_file: remote_ca_file,
                }),
                _ => None,
            };
            let req = AttachRequest {
                partitions,
                delay_ms,
                router,
                config: config.read()?,
                remote,
                start: (start != AttachStart::Attach).then_some(start),
                on_gap: (on_gap != OnGap::Skip).then_some(on_gap),
                dead_letter,
            };
            let link = client.attach_child(&parent, &child, &req).await?;
            print_link(json, "attached", &link)?;
        }
        ChildCommand::Detach { parent, child } => {
            let link = client.detach_child(&parent, &child).await?;
            print_link(json, "detached", &link)?;
        }
        ChildCommand::Pause {
            parent,
            child,
            partitions,
        } => {
            let answer = client
                .set_child_paused(&parent, &child, partitions, true, false)
                .await?;
            print_paused(json, &answer)?;
        }
        ChildCommand::Resume {
            parent,
            child,
            partitions,
            accept_gap,
        } => {
            let answer = client
                .set_child_paused(&parent, &child, partitions, false, accept_gap)
                .await?;
            if accept_gap && answer.gaps_accepted.is_empty() && !json {
                outln!("{parent} -> {child}: no cursor was halted before a gap; nothing accepted")?;
            }
            print_paused(json, &answer)?;
        }
        ChildCommand::Seek {
            parent,
            child,
            partition,
            offset,
        } => {
            let done = client
                .seek_child(&parent, &child, partition, offset)
                .await?;
            if json {
                print_json(&done)?;
            } else if done.skipped > 0 {
                outln!(
                    "{parent} -> {child} partition {}: moved from {} to {}, skipping {} records",
                    done.partition,
                    done.from,
                    done.to,
                    done.skipped
                )?;
            } else {
                outln!(
                    "{parent} -> {child} partition {}: moved from {} to {}; {} records will be copied again",
                    done.partition,
                    done.from,
                    done.to,
                    done.from.saturating_sub(done.to)
                )?;
            }
        }
        ChildCommand::Gaps {
            parent,
            child,
            ranges,
        } => {
            let gaps = client.child_gaps(&parent, &child, ranges).await?;
            if json {
                print_json(&gaps)?;
            } else {
                out!("{}", gaps_text(&gaps))?;
            }
        }
        ChildCommand::List { parent } => {
            let list = client.list_children(&parent).await?;
            if json {
                print_json(&list)?;
            } else {
                out!("{}", list_text(&list))?;
            }
        }
        ChildCommand::Set {
            parent,
            child,
            on_gap,
            dead_letter,
        } => {
            let req = RouterChange {
                on_gap,
                dead_letter,
                ..RouterChange::default()
            };
            let link = client.set_child_router(&parent, &child, &req).await?;
            if json {
                print_json(&link)?;
            } else {
                outln!(
                    "{parent} -> {child}: on a gap, cursors {}; a record the chain cannot route {}",
                    match link.on_gap {
                        OnGap::Skip => "skip it (written on the gap ledger)",
                        OnGap::Halt => "halt until an operator accepts it",
                    },
                    match &link.dead_letter {
                        Some(topic) => format!("goes to the dead-letter topic {topic}"),
                        None => "stalls the cursor until the chain is fixed".to_owned(),
                    }
                )?;
            }
        }
        ChildCommand::SetRouter {
            parent,
            child,
            router,
            config,
        } => {
            let req = RouterChange {
                router,
                config: config.read()?,
                ..RouterChange::default()
            };
            let link = client.set_child_router(&parent, &child, &req).await?;
            print_link(json, "changed the router of", &link)?;
        }
        ChildCommand::Shadow(command) => super::shadow::run(&client, json, command).await?,
    }
    Ok(())
}

/// The ledger as text: a line per range, then what is missing.
fn gaps_text(link: &narad_host::api::gaps::LinkGaps) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    let ranges: usize = link.partitions.iter().map(|p| p.gaps.len()).sum();
    let _ = writeln!(
        text,
        "{} -> {}: {} records lost, {} ranges on record",
        link.parent, link.child, link.lost, ranges
    );
    for partition in &link.partitions {
        for gap in &partition.gaps {
            let node = gap
                .node
                .as_deref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                text,
                "  partition {}: offsets {}..{} ({}) {} at {}{node}",
                partition.partition,
                gap.from,
                gap.to,
                super::human::plural(gap.len(), "record"),
                gap.reason,
                super::human::rfc3339_utc(gap.at_ms),
            );
        }
        if partition.unlisted > 0 {
            let _ = writeln!(
                text,
                "  partition {}: {} older ranges not listed (--ranges N lists more)",
                partition.partition, partition.unlisted
            );
        }
        let older = partition.older;
        if older.lost + older.skipped > 0 {
            let _ = writeln!(
                text,
                "  partition {}: older ranges no longer listed: {} records lost, {} skipped by seeks",
                partition.partition, older.lost, older.skipped
            );
        }
    }
    if !link.complete {
        let _ = writeln!(
            text,
            "  (not every parent partition answered: a cursor not running, or its node away)"
        );
    }
    text
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

fn router_names(link: &LinkInfo) -> String {
    link.router
        .iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a pause or resume left paused.
fn print_paused(json: bool, answer: &narad_host::api::children::PauseInfo) -> anyhow::Result<()> {
    if json {
        return print_json(answer);
    }
    let link = &answer.link;
    for gap in &answer.gaps_accepted {
        outln!(
            "{} -> {} partition {}: accepted the loss of offsets {} to {} ({} records, more if \
             retention removed more since); it goes on from the parent's oldest record",
            link.parent,
            link.name,
            gap.partition,
            gap.from,
            gap.to,
            gap.to.saturating_sub(gap.from)
        )?;
    }
    if link.paused.is_empty() {
        outln!("{} -> {}: every cursor copies", link.parent, link.name)?;
    } else {
        let list: Vec<String> = link.paused.iter().map(u32::to_string).collect();
        outln!(
            "{} -> {}: paused parent partitions {}",
            link.parent,
            link.name,
            list.join(",")
        )?;
    }
    Ok(())
}

fn print_link(json: bool, verb: &str, link: &LinkInfo) -> anyhow::Result<()> {
    if json {
        return print_json(link);
    }
    let delay = if link.delay_ms > 0 {
        format!(
            ", delay {}",
            format_duration(Duration::from_millis(link.delay_ms))
        )
    } else {
        String::new()
    };
    outln!(
        "{verb} {} -> {} (epoch {}, router {}{delay})",
        link.parent,
        link.name,
        link.attach_epoch,
        router_names(link)
    )?;
    if !link.shares_node.is_empty() {
        let partitions: Vec<String> = link.shares_node.iter().map(u32::to_string).collect();
        outln!(
            "note: child partitions {} are on the same node as the parent partition of their \
             index, so a keyless copy shares a disk with its original; `narad partition move \
             {} P` puts one elsewhere",
            partitions.join(", "),
            link.name
        )?;
    }
    Ok(())
}

/// The human form of a children listing: one table of children, one of their partitions.
pub fn list_text(list: &ChildList) -> String {
    if list.children.is_empty() {
        return "no children\n".to_owned();
    }
    let mut children: Vec<Vec<String>> = list
        .children
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                if c.delay_ms > 0 {
                    format_duration(Duration::from_millis(c.delay_ms))
                } else {
                    "-".into()
                },
                router_text(&c.router),
                c.attach_epoch.clone(),
                c.remote
                    .as_ref()
                    .map_or_else(|| "-".into(), |r| format!("{} at {}", r.topic, r.url)),
                c.dead_letter.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut partitions = Vec::new();
    let clustered = list
        .children
        .iter()
        .any(|c| c.partitions.iter().any(|p| p.node.is_some()));
    for c in &list.children {
        for p in &c.partitions {
            partitions.push(vec![
                c.name.clone(),
                p.partition.to_string(),
                p.next_offset.map_or_else(|| "-".into(), |o| o.to_string()),
                p.lag_messages.map_or_else(|| "?".into(), |l| l.to_string()),
                format!("{:.1}", p.due_lag_seconds),
                p.dropped_messages.to_string(),
                state_text(p),
                p.last_error_at_ms
                    .filter(|_| p.last_error.is_some())
                    .map_or_else(|| "-".into(), human::rfc3339_utc),
                p.last_error.clone().unwrap_or_default(),
            ]);
            if clustered {
                // Cluster mode: the node that runs the cursor, after the parent partition.
                if let Some(row) = partitions.last_mut() {
                    row.insert(2, p.node.clone().unwrap_or_else(|| "-".into()));
                }
            }
        }
    }
    let mut header = vec!["CHILD", "DELAY", "ROUTER", "EPOCH", "REMOTE", "DEAD_LETTER"];
    // Optional columns, shown only when a child has them (last first, by index).
    let shown = [
        list.children.iter().any(|c| c.remote.is_some()),
        list.children.iter().any(|c| c.dead_letter.is_some()),
    ];
    for (i, shown) in shown.iter().enumerate().rev() {
        if !shown {
            header.remove(4 + i);
            children.iter_mut().for_each(|row| {
                row.remove(4 + i);
            });
        }
    }
    let mut out = table::render(&header, &children);
    out.push('\n');
    let mut headers = vec![
        "CHILD",
        // The parent's partition: a cursor reads one parent partition and writes to any
        // child partition, so "PARTITION" alone reads as the child's.
        "PARENT_P",
        "NEXT_OFFSET",
        "LAG",
        "DUE_LAG_S",
        "DROPPED",
        "STATE",
        "ERROR_AT",
        "LAST_ERROR",
    ];
    if clustered {
        headers.insert(2, "NODE");
    }
    out.push_str(&table::render(&headers, &partitions));
    if list
        .children
        .iter()
        .flat_map(|c| &c.partitions)
        .any(|p| p.lag_messages.is_none())
    {
        out.push_str(
            "(LAG ?: no cursor reported the partition (LAST_ERROR says why), or the parent \
             partition's log is closed)\n",
        );
    }
    out
}

/// A router chain as the table shows it: each plugin as `name@digest` with the digest cut to
/// the shortest prefix `--router` takes, so the text names the pinned version exactly, and
/// the version its manifest declares.
fn router_text(router: &[RouterEntry]) -> String {
    router
        .iter()
        .map(|r| {
            let digest: String = r.digest.chars().take(MIN_DIGEST_PREFIX_HEX).collect();
            match &r.version {
                Some(version) => format!("{}@{digest} ({version})", r.name),
                None => format!("{}@{digest}", r.name),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A cursor's state as the table shows it: a stalled remote child's says whether it waits for
/// its target (`retrying`) or was refused by it (`failed`).
fn state_text(p: &CursorReport) -> String {
    let text = |v: Result<serde_json::Value, serde_json::Error>| {
        v.ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    match (p.state, p.remote_state) {
        (CursorState::Stalled, Some(remote)) => text(serde_json::to_value(remote)),
        (state, _) => text(serde_json::to_value(state)),
    }
}

/// Parses `--on-gap`: `skip` or `halt`.
fn parse_on_gap(text: &str) -> Result<OnGap, String> {
    match text {
        "skip" => Ok(OnGap::Skip),
        "halt" => Ok(OnGap::Halt),
        other => Err(format!(
            "{other:?} is not a gap policy: give skip (go on, the loss on the gap ledger) or halt (wait for an operator)"
        )),
    }
}

/// Parses `--start`: `attach` or `earliest` (also `beginning`, `oldest`).
fn parse_start(text: &str) -> Result<AttachStart, String> {
    match text {
        "attach" | "now" => Ok(AttachStart::Attach),
        "earliest" | "beginning" | "oldest" => Ok(AttachStart::Earliest),
        other => match other.strip_prefix("group:") {
            Some(group) if !group.is_empty() => Ok(AttachStart::Group(group.to_owned())),
            _ => Err(format!(
                "{other:?} is not a start point: give attach (from now on), earliest (the \
                 parent's oldest record) or group:NAME (a consumer group's committed offsets)"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(node: Option<&str>) -> ChildList {
        serde_json::from_value(serde_json::json!({"children": [{
            "name": "copy", "delay_ms": 0, "router": [], "attach_epoch": "00", "lag_complete": true,
            "partitions": [{
                "partition": 0, "next_offset": 5, "lag_messages": 0, "due_lag_seconds": 0.0,
                "dropped_messages": 0, "state": "running", "last_error": null, "node": node
            }]
        }]}))
        .unwrap()
    }

    #[test]
    fn in_cluster_mode_the_listing_names_the_node_that_runs_each_cursor() {
        let text = list_text(&listing(Some("n2")));
        let header = text.lines().find(|l| l.contains("PARENT_P")).unwrap();
        assert!(header.contains("NODE"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("copy") && l.contains(" n2 ")),
            "{text}"
        );
        assert!(!list_text(&listing(None)).contains("NODE"));
    }

    #[test]
    fn a_stalled_remote_child_shows_whether_its_target_is_away_or_refuses() {
        let mut list = listing(None);
        list.children[0].remote = Some(narad_host::api::children::RemoteInfo {
            url: "http://dc2:7070".into(),
            topic: "orders-copy".into(),
            partitions: 3,
            token_file: false,
            ca_file: None,
        });
        let cursor = &mut list.children[0].partitions[0];
        cursor.state = CursorState::Stalled;
        cursor.remote_state = Some(narad_host::fanout::status::RemoteState::Failed);
        let text = list_text(&list);
        assert!(text.contains("orders-copy at http://dc2:7070"), "{text}");
        let row = text
            .lines()
            .filter(|l| l.starts_with("copy"))
            .nth(1)
            .unwrap_or("");
        assert!(row.contains(" failed "), "{text}");
        assert!(!row.contains("stalled"), "{text}");
        assert!(!list_text(&listing(None)).contains("REMOTE"));
    }

    #[test]
    fn an_escaped_newline_in_config_text_becomes_a_line_break() {
        assert_eq!(
            unescape_newlines("header = region\\nus = 0"),
            "header = region\nus = 0"
        );
    }
}
