//! `narad demo`: start a daemon in this process on a temporary data dir (or `--data-dir`),
//! create a topic, produce keyed and keyless records over HTTP, fetch every partition back and
//! check that each acknowledged record is there, at its offset, in order, with keyed records
//! on Kafka's partition for their key. Prints a one-line verdict; any mismatch is an error
//! (non-zero exit).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;

use super::client::Client;
use crate::api::types::{CreateTopicRequest, ProduceRecordJson};
use crate::config::Config;
use crate::server::run_server;
use crate::shutdown;

/// `narad demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Data directory to use (default: a temporary one, removed afterwards).
    #[arg(long, env = "NARAD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Keyed records to produce (spread over 10 keys); as many keyless ones are added.
    #[arg(long, default_value_t = 1000)]
    pub records: u32,
}

/// What the demo checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    /// Records produced and found again.
    pub records: u64,
    /// Records per partition.
    pub per_partition: BTreeMap<u32, u64>,
}

/// Runs `narad demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let temp;
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary data dir")?;
            temp.path().to_path_buf()
        }
    };
    let mut config = Config::new(&data_dir);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let (trigger, signal) = shutdown::channel();
    let server = run_server(config, signal)
        .await
        .with_context(|| format!("starting the demo daemon on {}", data_dir.display()))?;
    let url = format!("http://{}", server.local_addr());
    let outcome = check(&Client::new(&url), &args).await;
    trigger.trigger();
    server.wait().await.context("stopping the demo daemon")?;
    let report = outcome?;
    let spread: Vec<String> = report
        .per_partition
        .iter()
        .map(|(p, n)| format!("p{p}={n}"))
        .collect();
    println!(
        "demo OK: {} records produced and fetched back in order ({}), keyed records on Kafka's partitions",
        report.records,
        spread.join(" ")
    );
    Ok(())
}

/// Produces and checks against a running daemon; `Err` names the first mismatch.
pub async fn check(client: &Client, args: &DemoArgs) -> anyhow::Result<DemoReport> {
    let topic = format!(
        "demo-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    client
        .create_topic(&CreateTopicRequest {
            name: topic.clone(),
            partitions: args.partitions,
            retention_ms: None,
            retention_bytes: None,
        })
        .await?;

    // Interleave keyed and keyless records so every request mixes both.
    let mut sent = Vec::new();
    for i in 0..args.records {
        sent.push(ProduceRecordJson {
            key: Some(format!("user-{}", i % 10)),
            value: Some(format!("keyed #{i}")),
            ..ProduceRecordJson::default()
        });
        sent.push(ProduceRecordJson {
            value: Some(format!("keyless #{i}")),
            ..ProduceRecordJson::default()
        });
    }
    // (partition, offset) -> (key, value), in acknowledgement order per partition.
    let mut acked: BTreeMap<u32, Vec<(u64, Option<String>, String)>> = BTreeMap::new();
    for chunk in sent.chunks(500) {
        let answer = client.produce(&topic, chunk.to_vec()).await?;
        if answer.offsets.len() != chunk.len() {
            bail!(
                "produce answered {} offsets for {} records",
                answer.offsets.len(),
                chunk.len()
            );
        }
        for (o, r) in answer.offsets.iter().zip(chunk) {
            if let Some(key) = &r.key {
                let expected = narad_abi::partition_for_key(key.as_bytes(), args.partitions);
                if expected != Some(o.partition) {
                    bail!(
                        "key {key:?} went to partition {}, Kafka's partitioner says {expected:?}",
                        o.partition
                    );
                }
            }
            acked.entry(o.partition).or_default().push((
                o.offset,
                r.key.clone(),
                r.value.clone().unwrap_or_default(),
            ));
        }
    }

    let mut report = DemoReport {
        records: 0,
        per_partition: BTreeMap::new(),
    };
    for (&p, expected) in &acked {
        if !expected.windows(2).all(|w| w[0].0 < w[1].0) {
            bail!("partition {p}: acknowledged offsets are not increasing in produce order");
        }
        let mut fetched = Vec::new();
        let mut offset = 0;
        loop {
            let answer = client
                .fetch(&topic, p, Some(offset), Some(1000), None)
                .await?;
            fetched.extend(answer.records);
            offset = answer.next_offset;
            if offset >= answer.high_watermark {
                break;
            }
        }
        if fetched.len() != expected.len() {
            bail!(
                "partition {p}: produced {} records, fetched {}",
                expected.len(),
                fetched.len()
            );
        }
        for ((offset, key, value), got) in expected.iter().zip(&fetched) {
            if got.offset != *offset || &got.key != key || got.value.as_ref() != Some(value) {
                bail!(
                    "partition {p}: expected offset {offset} key {key:?} value {value:?}, fetched offset {} key {:?} value {:?}",
                    got.offset,
                    got.key,
                    got.value
                );
            }
        }
        report.records += fetched.len() as u64;
        report.per_partition.insert(p, fetched.len() as u64);
    }
    let total = u64::from(args.records) * 2;
    if report.records != total {
        bail!("produced {total} records, found {}", report.records);
    }
    Ok(report)
}
