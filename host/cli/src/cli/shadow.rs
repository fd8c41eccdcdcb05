//! `narad child shadow set|show|clear`: a link's shadow (`/v1/topics/{parent}/children/{child}/
//! shadow`), a candidate chain that routes a copy of the link's slabs and is compared with the
//! link's own chain, never committed. `narad child set-router` then swaps the chain.

use clap::Subcommand;
use reqwest::Method;
use serde::Serialize;

use super::child::ConfigSource;
use super::client::Client;
use super::{human, table};
use narad_host::api::types::{ShadowInfo, ShadowRequest, ShadowStatus};

/// Most partition pairs the table lists (the JSON output has every pair the report keeps).
const PAIRS_SHOWN: usize = 20;

/// `narad child shadow` commands.
#[derive(Debug, Subcommand)]
pub enum ShadowCommand {
    /// Route a copy of every slab of a child with a candidate chain too, and count where it
    /// would differ. Nothing it decides is committed; setting it again starts a fresh report.
    Set {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
        /// The candidate chain, comma-separated plugin names (`name` or `name@digest`).
        #[arg(long, value_delimiter = ',', required = true, value_name = "PLUGINS")]
        router: Vec<String>,
        /// The candidate's config (default: the link's own config).
        #[command(flatten)]
        config: ConfigSource,
    },
    /// Show how the candidate compares with the link's chain so far.
    Show {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// Stop the shadow and drop its report.
    Clear {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
}

fn path(parent: &str, child: &str) -> String {
    format!("/v1/topics/{parent}/children/{child}/shadow")
}

async fn call<T: serde::de::DeserializeOwned>(
    client: &Client,
    method: Method,
    parent: &str,
    child: &str,
    body: Option<&ShadowRequest>,
) -> anyhow::Result<T> {
    let body = match body {
        Some(request) => Some((serde_json::to_vec(request)?, "application/json")),
        None => None,
    };
    Ok(client
        .call_raw(method, &path(parent, child), &[], body)
        .await?)
}

/// Runs a shadow command.
pub async fn run(client: &Client, json: bool, command: ShadowCommand) -> anyhow::Result<()> {
    match command {
        ShadowCommand::Set {
            parent,
            child,
            router,
            config,
        } => {
            let request = ShadowRequest {
                router,
                config: config.read()?,
            };
            let set: ShadowInfo =
                call(client, Method::PUT, &parent, &child, Some(&request)).await?;
            print_info(json, "shadowing", &set)?;
        }
        ShadowCommand::Show { parent, child } => {
            let status: ShadowStatus = call(client, Method::GET, &parent, &child, None).await?;
            if json {
                print_json(&status)?;
            } else {
                out!("{}", status_text(&status))?;
            }
        }
        ShadowCommand::Clear { parent, child } => {
            let cleared: ShadowInfo = call(client, Method::DELETE, &parent, &child, None).await?;
            print_info(json, "cleared the shadow of", &cleared)?;
        }
    }
    Ok(())
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

fn names(router: &[narad_host::metastore::PluginRef]) -> String {
    router
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn print_info(json: bool, verb: &str, info: &ShadowInfo) -> anyhow::Result<()> {
    if json {
        return print_json(info);
    }
    outln!(
        "{verb} {} -> {} with {}",
        info.parent,
        info.child,
        names(&info.router)
    )?;
    Ok(())
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    format!("{:.2}%", part as f64 * 100.0 / whole as f64)
}

fn per_record(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// The human form of a shadow's report: what it compares, the counts, the moved partition
/// pairs, the failures by kind, and both chains' cost per record.
pub fn status_text(status: &ShadowStatus) -> String {
    let (info, r) = (&status.shadow, &status.report);
    let mut out = format!(
        "shadow of {} -> {}: candidate {} against {} (set {})\n",
        info.parent,
        info.child,
        names(&info.router),
        names(&status.current_router),
        human::rfc3339_utc(info.set_at_ms)
    );
    if !status.running {
        out.push_str("not running yet: no node has started it (or no cursor of the link runs)\n");
    }
    if !status.nodes.is_empty() {
        out.push_str(&format!("nodes: {}\n", status.nodes.join(",")));
    }
    if !status.nodes_unreachable.is_empty() {
        out.push_str(&format!(
            "not counted (no answer): {}\n",
            status.nodes_unreachable.join(",")
        ));
    }
    if let Some(why) = &r.build_error {
        out.push_str(&format!("the candidate cannot be built: {why}\n"));
    }
    out.push('\n');
    let seen = r.records_seen;
    let counts = vec![
        vec!["slabs seen".into(), r.slabs_seen.to_string(), String::new()],
        vec![
            "slabs skipped".into(),
            r.slabs_skipped.to_string(),
            format!("{} records", r.records_skipped),
        ],
        vec!["records seen".into(), seen.to_string(), String::new()],
        vec![
            "same partition".into(),
            r.records_same.to_string(),
            share(r.records_same, seen),
        ],
        vec![
            "moved".into(),
            r.records_moved.to_string(),
            share(r.records_moved, seen),
        ],
        vec![
            "undecided".into(),
            r.records_undecided.to_string(),
            share(r.records_undecided, seen),
        ],
        vec![
            "out of range".into(),
            r.records_out_of_range.to_string(),
            share(r.records_out_of_range, seen),
        ],
        vec![
            "in failed slabs".into(),
            r.records_failed.to_string(),
            format!("{} slabs", r.slabs_failed),
        ],
    ];
    out.push_str(&table::render(&["", "COUNT", "SHARE"], &counts));
    if !r.moved.is_empty() {
        out.push('\n');
        let mut rows: Vec<Vec<String>> = r
            .moved
            .iter()
            .take(PAIRS_SHOWN)
            .map(|p| {
                vec![
                    p.from.to_string(),
                    p.to.to_string(),
                    p.records.to_string(),
                    share(p.records, seen),
                ]
            })
            .collect();
        let hidden: u64 = r.moved.iter().skip(PAIRS_SHOWN).map(|p| p.records).sum();
        if hidden + r.moved_other_records > 0 {
            let other = hidden + r.moved_other_records;
            rows.push(vec![
                "other".into(),
                "other".into(),
                other.to_string(),
                share(other, seen),
            ]);
        }
        out.push_str(&table::render(
            &["FROM_P", "TO_P", "RECORDS", "SHARE"],
            &rows,
        ));
    }
    if !r.errors.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .errors
            .iter()
            .map(|(kind, slabs)| vec![kind.clone(), slabs.to_string()])
            .collect();
        out.push_str(&table::render(&["ERROR", "SLABS"], &rows));
        if let Some(last) = &r.last_error {
            out.push_str(&format!("last error: {last}\n"));
        }
    }
    out.push('\n');
    let cost = |name: &str, c: &narad_host::fanout::shadow::ChainCost| {
        vec![
            name.to_owned(),
            c.records.to_string(),
            per_record(c.nanos_per_record),
            per_record(c.fuel_per_record),
        ]
    };
    out.push_str(&table::render(
        &["CHAIN", "RECORDS", "NS_PER_RECORD", "FUEL_PER_RECORD"],
        &[cost("current", &r.current), cost("candidate", &r.candidate)],
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_shares_pairs_errors_and_both_chains_cost() {
        let status: ShadowStatus = serde_json::from_value(serde_json::json!({
            "shadow": {"parent": "orders", "child": "copy", "router": [{"name": "all-zero",
                "digest": "ab"}], "config": "", "set_at_ms": 0},
            "current_router": [{"name": "key-hash", "digest": "cd"}],
            "running": true,
            "report": {
                "slabs_seen": 3, "records_seen": 400, "slabs_skipped": 1, "records_skipped": 9,
                "records_same": 300, "records_moved": 100,
                "moved": [{"from": 1, "to": 0, "records": 60}, {"from": 2, "to": 0, "records": 40}],
                "moved_other_records": 0, "records_undecided": 0, "records_out_of_range": 0,
                "slabs_failed": 1, "records_failed": 5, "errors": {"fuel": 1},
                "last_error": "ran out of fuel", "build_error": null,
                "current": {"records": 400, "nanos": 4000, "fuel_records": 400, "fuel": 800,
                    "nanos_per_record": 10.0, "fuel_per_record": 2.0},
                "candidate": {"records": 400, "nanos": 8000, "fuel_records": 0, "fuel": 0,
                    "nanos_per_record": 20.0, "fuel_per_record": null}
            }
        }))
        .unwrap();
        let text = status_text(&status);
        assert!(
            text.contains("candidate all-zero against key-hash"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("moved") && l.contains("25.00%")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("1 ") && l.contains("60")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("fuel") && l.ends_with('1')),
            "{text}"
        );
        assert!(text.contains("last error: ran out of fuel"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("current") && l.contains("10.0") && l.contains("2.0")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("candidate") && l.contains("20.0") && l.ends_with('-')),
            "{text}"
        );
    }
}
