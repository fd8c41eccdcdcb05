//! `narad plugin deploy|list|remove` (clients of `/v1/plugins`) and `narad plugin test`, which
//! runs a chain locally on NDJSON records with no daemon.
//!
//! `test` builds the same runtime as the daemon (same limits, no compiled-code cache), loads
//! each plugin with every deploy check, and routes the records in slabs of 4,096 through one
//! chain, as a cursor would (so round-robin continues across slabs). Each record line is
//! `{"key"? | "key_b64"?, "value"? | "value_b64"?, "headers"?, "offset"?, "committed_at"?}`:
//! no key means a keyless record (which differs from `"key": ""`); `headers` takes the
//! produce API's object or list form; `offset` defaults to the previous record's plus one (the
//! first: 0); `committed_at` (ms) defaults to 0.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::{Args, Subcommand};
use narad_runtime::{Chain, Plugin, RouteContext, Runtime, RuntimeConfig, SlabRecord, run_trial};
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::ClientArgs;
use super::{human, table};
use narad_host::api::plugins::{PluginInfo, PluginList, RemovedPlugin};
use narad_host::api::types::{HeadersJson, Text};

/// `narad plugin`.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The plugin command.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// Plugin commands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Upload a .wasm routing plugin; the daemon checks it fully before accepting it.
    Deploy {
        /// The module.
        file: PathBuf,
        /// Name to record it under (1 to 64 of a-z 0-9 - _). Default: the manifest's name.
        #[arg(long)]
        name: Option<String>,
    },
    /// List every plugin version (built-ins included).
    List,
    /// Remove every version of a plugin (refused while a link uses it, and for built-ins).
    Remove {
        /// Plugin name.
        name: String,
    },
    /// Run a chain locally on NDJSON records (no daemon) and print each record's partition
    /// and the count per partition.
    Test(TestArgs),
}

/// `narad plugin test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// The chain, in order: .wasm files or built-in names (key-hash, keyless-index,
    /// round-robin, header-route; an existing file of that name wins); 1 to 8, comma- or
    /// space-separated (`key-hash,round-robin` as `child attach --router` takes it).
    #[arg(
        value_delimiter = ',',
        value_name = "PLUGIN",
        required_unless_present = "router",
        conflicts_with = "router"
    )]
    pub plugins: Vec<String>,
    /// The chain as `child attach --router` takes it: comma-separated plugin names or files.
    #[arg(long, value_delimiter = ',', value_name = "PLUGINS")]
    pub router: Option<Vec<String>>,
    /// NDJSON file of records ("-" for stdin): {"key"?|"key_b64"?, "value"?|"value_b64"?,
    /// "headers"?, "offset"?, "committed_at"?}.
    #[arg(long, value_name = "FILE")]
    pub records: PathBuf,
    /// Partition count of the parent topic.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub parent_partitions: u32,
    /// Partition count of the child topic. [default: the parent's]
    #[arg(long, value_name = "M")]
    pub child_partitions: Option<u32>,
    /// The parent partition the records come from.
    #[arg(long, default_value_t = 0, value_name = "P")]
    pub parent_partition: u32,
    /// File whose bytes are the link's plugin config (default: empty).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Parent topic name shown to the plugins.
    #[arg(long, default_value = "parent")]
    pub parent_topic: String,
    /// Child topic name shown to the plugins.
    #[arg(long, default_value = "child")]
    pub child_topic: String,
}

impl TestArgs {
    /// The chain, from the positional names or `--router`.
    pub fn chain(&self) -> &[String] {
        self.router.as_deref().unwrap_or(&self.plugins)
    }
}

/// One input record of `narad plugin test`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialRecordJson {
    /// Key as text; absent (and no `key_b64`) means no key.
    #[serde(default)]
    pub key: Option<String>,
    /// Key as base64.
    #[serde(default)]
    pub key_b64: Option<String>,
    /// Value as text (default empty).
    #[serde(default)]
    pub value: Option<String>,
    /// Value as base64.
    #[serde(default)]
    pub value_b64: Option<String>,
    /// Headers, in the produce API's object or list form.
    #[serde(default)]
    pub headers: Option<HeadersJson>,
    /// Parent offset (default: the previous record's plus one).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Commit time, ms since the Unix epoch (default 0).
    #[serde(default)]
    pub committed_at: Option<i64>,
}

/// A decoded input record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialRecord {
    /// Parent offset.
    pub offset: u64,
    /// Commit time in ms.
    pub committed_at_ms: i64,
    /// Key; `None` for none.
    pub key: Option<Vec<u8>>,
    /// `(name, value)` headers, in order.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Value.
    pub value: Vec<u8>,
}

impl SlabRecord for TrialRecord {
    fn parent_offset(&self) -> u64 {
        self.offset
    }
    fn committed_at_ms(&self) -> i64 {
        self.committed_at_ms
    }
    fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()))
    }
    fn value(&self) -> &[u8] {
        &self.value
    }
}

/// One routed record in `narad plugin test --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialDecision {
    /// Parent offset.
    pub offset: u64,
    /// Key as text (absent for a keyless record or a non-UTF-8 key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Key as base64 when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    /// The child partition the chain chose.
    pub partition: u32,
}

/// `narad plugin test --json` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialOutput {
    /// The chain's plugins (manifest names), in order.
    pub chain: Vec<String>,
    /// Child partition count.
    pub child_partitions: u32,
    /// Each record's decision, in input order.
    pub records: Vec<TrialDecision>,
    /// Records per child partition (index = partition).
    pub distribution: Vec<u64>,
    /// What each plugin of the chain did, in chain order.
    pub plugins: Vec<TrialPluginWork>,
    /// Fuel a call gets per record it is handed (the runtime's default; the daemon's
    /// `--plugin-fuel-per-record`), on top of a fixed amount per call and an amount per byte.
    pub fuel_allowance_per_record: u64,
}

/// One plugin's share of a `narad plugin test` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialPluginWork {
    /// The plugin's manifest name.
    pub name: String,
    /// Records handed to it (those still undecided when its turn came).
    pub records_in: u64,
    /// Records it decided.
    pub records_decided: u64,
    /// Fuel its calls spent (about one unit per Wasm instruction; deterministic).
    pub fuel_consumed: u64,
    /// Fuel per record handed in, rounded up (0 when it was handed none). On a small trial
    /// this includes the per-call work (reading the context and config).
    pub fuel_per_record: u64,
    /// Fuel spent by the call that came closest to its budget (0 when it was never called).
    pub peak_call_fuel: u64,
    /// That call's fuel budget: `peak_call_fuel / peak_call_budget` is the plugin's headroom.
    pub peak_call_budget: u64,
}

/// Runs a plugin command.
pub async fn run(args: PluginArgs) -> anyhow::Result<()> {
    let json = args.client.json;
    // Sends the token (`--token` / `NARAD_TOKEN`) like every other client command.
    let client = args.client.client()?;
    match args.command {
        PluginCommand::Deploy { file, name } => {
            let bytes = std::fs::read(&file)
                .with_context(|| format!("reading plugin module {}", file.display()))?;
            let query: Vec<(&str, &str)> = name.iter().map(|n| ("name", n.as_str())).collect();
            let info: PluginInfo = client
                .call_raw(
                    Method::POST,
                    "/v1/plugins",
                    &query,
                    Some((bytes, "application/wasm")),
                )
                .await?;
            if json {
                print_json(&info)?;
            } else {
                outln!(
                    "deployed {} version {} ({}, {} bytes, needs {})",
                    info.name,
                    info.version,
                    info.digest,
                    info.size_bytes,
                    info.needs.as_deref().unwrap_or_default().join(", ")
                )?;
                // The JSON's `deploy_check` caveat (routing not checked) must not be hidden.
                if let Some(caveat) = &info.deploy_check {
                    outln!("deploy check: {caveat}")?;
                }
            }
        }
        PluginCommand::List => {
            let list: PluginList = client
                .call_raw(Method::GET, "/v1/plugins", &[], None)
                .await?;
            if json {
                print_json(&list)?;
            } else {
                out!("{}", list_table(&list.plugins))?;
            }
        }
        PluginCommand::Remove { name } => {
            let removed: RemovedPlugin = client
                .call_raw(Method::DELETE, &format!("/v1/plugins/{name}"), &[], None)
                .await?;
            if json {
                print_json(&removed)?;
            } else {
                outln!(
                    "removed plugin {} ({})",
                    removed.name,
                    human::plural(removed.removed.len() as u64, "version")
                )?;
            }
        }
        PluginCommand::Test(test) => {
            let output = narad_host::blocking::run(move || trial(&test))
                .await
                .context("the trial task failed")??;
            if json {
                print_json(&output)?;
            } else {
                out!("{}", trial_text(&output))?;
            }
        }
    }
    Ok(())
}

/// Runs `narad plugin test` and returns what it prints with `--json`.
pub fn trial(args: &TestArgs) -> anyhow::Result<TrialOutput> {
    let parent_partitions = args.parent_partitions;
    let child_partitions = args.child_partitions.unwrap_or(parent_partitions);
    if parent_partitions == 0 || child_partitions == 0 {
        bail!("--parent-partitions and --child-partitions must be at least 1");
    }
    if args.parent_partition >= parent_partitions {
        bail!(
            "--parent-partition {} does not exist: the parent has {parent_partitions} partitions",
            args.parent_partition
        );
    }
    let config = match &args.config {
        Some(path) => std::fs::read(path)
            .with_context(|| format!("reading the plugin config {}", path.display()))?,
        None => Vec::new(),
    };
    let records = read_records(&args.records)?;
    let runtime = Runtime::new(RuntimeConfig::default()).context("starting the plugin runtime")?;
    let plugins = args
        .chain()
        .iter()
        .map(|spec| load_plugin(&runtime, spec))
        .collect::<anyhow::Result<Vec<Plugin>>>()?;
    let chain_names: Vec<String> = plugins.iter().map(|p| p.name().to_owned()).collect();
    let mut chain = Chain::new(plugins)?;
    let ctx = RouteContext {
        parent_topic: args.parent_topic.clone(),
        parent_partition: args.parent_partition,
        parent_partition_count: parent_partitions,
        child_topic: args.child_topic.clone(),
        child_partition_count: child_partitions,
        attempt: 0,
        config,
    };
    let report = match run_trial(&mut chain, &ctx, &records) {
        Ok(report) => report,
        Err(e) => match &e.poison {
            Some(poison) => {
                // The record's own failure, once: the slab's mostly repeats it (with the fuel
                // budget of the whole slab), and the daemon's listing says it the same way.
                let key = records.get(poison.index).map_or_else(String::new, |r| {
                    format!(", {}", narad_runtime::text::describe_key(r.key.as_deref()))
                });
                bail!(
                    "plugin {} failed on the record at index {} of the input (0-based; parent \
                     offset {}{key}): {}{}",
                    poison.error.who(),
                    poison.index,
                    poison.parent_offset,
                    poison.error.failure,
                    if poison.alone {
                        ""
                    } else {
                        "; it fails only after the records before it, not alone"
                    }
                )
            }
            None => bail!("{}", e.error),
        },
    };
    let decisions = records
        .iter()
        .zip(&report.decisions)
        .map(|(record, &partition)| {
            let (key, key_b64) = match record.key.as_deref().map(Text::of) {
                None => (None, None),
                Some(Text::Utf8(s)) => (Some(s), None),
                Some(Text::Base64(s)) => (None, Some(s)),
            };
            TrialDecision {
                offset: record.offset,
                key,
                key_b64,
                partition,
            }
        })
        .collect();
    let plugins = chain
        .stats()
        .into_iter()
        .map(|stats| TrialPluginWork {
            fuel_per_record: if stats.records_in == 0 {
                0
            } else {
                stats.fuel_consumed.div_ceil(stats.records_in)
            },
            peak_call_fuel: stats.peak_fuel_use.0,
            peak_call_budget: stats.peak_fuel_use.1,
            name: stats.name,
            records_in: stats.records_in,
            records_decided: stats.records_decided,
            fuel_consumed: stats.fuel_consumed,
        })
        .collect();
    Ok(TrialOutput {
        chain: chain_names,
        child_partitions,
        records: decisions,
        distribution: report.distribution,
        plugins,
        fuel_allowance_per_record: runtime.limits().fuel.per_record,
    })
}

/// A chain entry: a built-in's name, or a `.wasm` file.
fn load_plugin(runtime: &Runtime, spec: &str) -> anyhow::Result<Plugin> {
    let path = Path::new(spec);
    let bytes: Vec<u8> = match narad_builtin_plugins::get(spec) {
        Some(bytes) if !path.exists() => bytes.to_vec(),
        _ => std::fs::read(path).with_context(|| {
            let builtins: Vec<&str> = narad_builtin_plugins::all()
                .iter()
                .map(|(n, _)| *n)
                .collect();
            format!(
                "{spec} is neither a readable .wasm file nor a built-in plugin ({})",
                builtins.join(", ")
            )
        })?,
    };
    Plugin::load(runtime, &bytes).with_context(|| format!("plugin {spec} is refused"))
}

/// Reads and decodes the NDJSON records (blank lines skipped).
pub fn read_records(path: &Path) -> anyhow::Result<Vec<TrialRecord>> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading records from stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("reading records from {}", path.display()))?
    };
    let mut records: Vec<TrialRecord> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let json: TrialRecordJson = serde_json::from_str(line).with_context(|| {
            format!(
                "{} is not a record {{\"key\"?|\"key_b64\"?, \"value\"?|\"value_b64\"?, \"headers\"?, \"offset\"?}}",
                at()
            )
        })?;
        let next_offset = records.last().map_or(0, |r| r.offset.saturating_add(1));
        records.push(decode_record(json, next_offset).with_context(at)?);
    }
    if records.is_empty() {
        bail!("{} holds no records", path.display());
    }
    Ok(records)
}

fn decode_record(r: TrialRecordJson, next_offset: u64) -> anyhow::Result<TrialRecord> {
    let key = match (r.key, r.key_b64) {
        (Some(_), Some(_)) => bail!("give \"key\" or \"key_b64\", not both"),
        (Some(k), None) => Some(k.into_bytes()),
        (None, Some(b)) => Some(b64("key_b64", &b)?),
        (None, None) => None,
    };
    let value = match (r.value, r.value_b64) {
        (Some(_), Some(_)) => bail!("give \"value\" or \"value_b64\", not both"),
        (Some(v), None) => v.into_bytes(),
        (None, Some(b)) => b64("value_b64", &b)?,
        (None, None) => Vec::new(),
    };
    let headers = match r.headers {
        None => Vec::new(),
        Some(HeadersJson::Map(map)) => map
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect(),
        Some(HeadersJson::List(list)) => list
            .into_iter()
            .map(|h| {
                let value = match (h.value, h.value_b64) {
                    (Some(_), Some(_)) => {
                        bail!(
                            "header {:?}: give \"value\" or \"value_b64\", not both",
                            h.name
                        )
                    }
                    (Some(v), None) => v.into_bytes(),
                    (None, Some(b)) => b64("value_b64", &b)?,
                    (None, None) => Vec::new(),
                };
                Ok((h.name.into_bytes(), value))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    Ok(TrialRecord {
        offset: r.offset.unwrap_or(next_offset),
        committed_at_ms: r.committed_at.unwrap_or(0),
        key,
        headers,
        value,
    })
}

fn b64(field: &str, text: &str) -> anyhow::Result<Vec<u8>> {
    B64.decode(text)
        .with_context(|| format!("\"{field}\" is not valid base64 (standard alphabet, padded)"))
}

fn trial_text(out: &TrialOutput) -> String {
    let rows: Vec<Vec<String>> = out
        .records
        .iter()
        .map(|r| {
            let key = match (&r.key, &r.key_b64) {
                (Some(k), _) => format!("{k:?}"),
                (None, Some(b)) => format!("base64:{b}"),
                (None, None) => "(none)".to_owned(),
            };
            vec![r.offset.to_string(), key, r.partition.to_string()]
        })
        .collect();
    let mut text = format!("chain: {}\n\n", out.chain.join(", "));
    text.push_str(&table::render(&["OFFSET", "KEY", "PARTITION"], &rows));
    text.push('\n');
    let total = out.records.len().max(1) as f64;
    let rows: Vec<Vec<String>> = out
        .distribution
        .iter()
        .enumerate()
        .map(|(p, &n)| {
            vec![
                p.to_string(),
                n.to_string(),
                format!("{:.1}%", n as f64 * 100.0 / total),
            ]
        })
        .collect();
    text.push_str(&table::render(&["PARTITION", "RECORDS", "SHARE"], &rows));
    text.push('\n');
    let rows: Vec<Vec<String>> = out
        .plugins
        .iter()
        .map(|p| {
            let peak = if p.peak_call_budget == 0 {
                "-".to_owned()
            } else {
                format!(
                    "{:.2}%",
                    p.peak_call_fuel as f64 * 100.0 / p.peak_call_budget as f64
                )
            };
            vec![
                p.name.clone(),
                p.records_in.to_string(),
                p.records_decided.to_string(),
                p.fuel_per_record.to_string(),
                peak,
            ]
        })
        .collect();
    text.push_str(&table::render(
        &[
            "PLUGIN",
            "RECORDS IN",
            "DECIDED",
            "FUEL/RECORD",
            "OF BUDGET (PEAK CALL)",
        ],
        &rows,
    ));
    text.push_str(&format!(
        "fuel allowance: {} per record, plus a fixed amount per call and per input byte \
         (the daemon's --plugin-fuel-per-record raises it)\n",
        out.fuel_allowance_per_record
    ));
    text
}

fn list_table(plugins: &[PluginInfo]) -> String {
    let rows: Vec<Vec<String>> = plugins
        .iter()
        .map(|p| {
            let mut flags = Vec::new();
            if p.builtin {
                flags.push("builtin");
            }
            if p.latest {
                flags.push("latest");
            }
            vec![
                p.name.clone(),
                p.version.clone(),
                p.digest.chars().take(12).collect(),
                p.size_bytes.to_string(),
                if p.builtin {
                    "-".to_owned()
                } else {
                    human::rfc3339_utc(p.uploaded_at)
                },
                p.needs
                    .as_ref()
                    .map_or_else(|| "?".to_owned(), |n| n.join(",")),
                flags.join(","),
                match &p.load_error {
                    Some(e) => format!("LOAD ERROR: {e}"),
                    None => p.description.clone(),
                },
            ]
        })
        .collect();
    table::render(
        &[
            "NAME",
            "VERSION",
            "DIGEST",
            "BYTES",
            "UPLOADED",
            "NEEDS",
            "FLAGS",
            "DESCRIPTION",
        ],
        &rows,
    )
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}
