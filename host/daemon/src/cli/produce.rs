//! `narad produce TOPIC`: NDJSON records on stdin, sent in batches.
//!
//! Each line is one record: `{"key"?, "key_b64"?, "value" | "value_b64", "headers"?,
//! "partition"?}` (the produce API's record shape). Blank lines are skipped. A line that is
//! not such an object stops the command with its line number before it is sent; batches
//! already sent stay committed.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::Args;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::ClientArgs;
use crate::api::types::ProduceRecordJson;

/// `narad produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to produce to.
    pub topic: String,
    /// Records per request.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
}

/// What a produce run did.
#[derive(Debug, Default, serde::Serialize)]
pub struct ProduceSummary {
    /// Records committed.
    pub records: u64,
    /// Requests sent.
    pub requests: u64,
    /// Records per partition.
    pub partitions: BTreeMap<u32, u64>,
}

/// Runs `narad produce`.
pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be at least 1");
    let client = args.client.client();
    let progress = std::io::stderr().is_terminal();
    let mut summary = ProduceSummary::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut batch = Vec::with_capacity(args.batch_size);
    let mut line_no = 0u64;
    loop {
        let line = lines.next_line().await.context("reading stdin")?;
        if let Some(line) = &line {
            line_no += 1;
            if !line.trim().is_empty() {
                let record: ProduceRecordJson = serde_json::from_str(line).with_context(|| {
                    format!("stdin line {line_no} is not a record object {{\"key\"?, \"value\", \"headers\"?, \"partition\"?}}")
                })?;
                batch.push(record);
            }
        }
        let done = line.is_none();
        if batch.len() >= args.batch_size || (done && !batch.is_empty()) {
            let sent = std::mem::take(&mut batch);
            let answer = client.produce(&args.topic, sent).await.with_context(|| {
                format!(
                    "producing to {} (after {} records committed)",
                    args.topic, summary.records
                )
            })?;
            summary.requests += 1;
            for o in &answer.offsets {
                summary.records += 1;
                *summary.partitions.entry(o.partition).or_default() += 1;
            }
            if progress {
                eprint!("\rproduced {} records", summary.records);
            }
        }
        if done {
            break;
        }
    }
    if progress {
        eprintln!();
    }
    if args.client.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        let spread: Vec<String> = summary
            .partitions
            .iter()
            .map(|(p, n)| format!("p{p}={n}"))
            .collect();
        println!(
            "produced {} records to {} in {} request(s) ({})",
            summary.records,
            args.topic,
            summary.requests,
            spread.join(" ")
        );
    }
    Ok(())
}
