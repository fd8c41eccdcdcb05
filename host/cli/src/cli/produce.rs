//! `narad produce TOPIC`: records from stdin, one per line, sent in batches.
//!
//! A line is a record's value (kcat's default), or `key<DELIM>value` with `-K DELIM`, or a
//! JSON record with `--json` (the produce API's shape; the extra fields `narad consume --json`
//! prints are accepted and ignored, so its output produces back). Lines are bytes: a value
//! that is not UTF-8 is sent as base64. Empty lines are skipped. A JSON line that is not a
//! record stops the command with its line number before its batch is sent; batches already
//! sent stay committed.

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::ClientArgs;
use super::consume::unescape;
use super::human::plural;
use narad_host::api::types::{HeaderJson, HeadersJson, ProduceRecordJson, Text};

/// `narad produce`.
#[derive(Debug, Args)]
#[command(after_help = "\
Input: one record per line of stdin (empty lines are skipped).
  (default)      the line is the value:              echo hello | narad produce t
  --key KEY      ... and every record has this key:  echo hello | narad produce t --key k1
  -K DELIM       each line is KEY<DELIM>VALUE, split at the first DELIM (escapes \\t \\n \\\\ work):
                   printf 'k1:hello\\n' | narad produce t -K :
                 a line without DELIM is a value without a key
  --json         each line is a JSON record, the produce API's shape:
                   {\"key\"?|\"key_b64\"?, \"value\"|\"value_b64\", \"headers\"?, \"partition\"?}
                 \"offset\", \"committed_at\" and \"origin\" (what `narad consume --json` adds) are
                 ignored, so `narad consume a --json | narad produce b --json` copies records.
-H/--header NAME=VALUE (repeatable) adds a header to every record;
-p/--partition P sends every record to partition P. Otherwise keyed records go to the partition
Kafka's default partitioner picks, and keyless ones round-robin.")]
pub struct ProduceArgs {
    /// Daemon options; `--json` reads JSON records and prints the summary as JSON.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to produce to.
    pub topic: String,
    /// The key of every record (plain lines only).
    #[arg(long, conflicts_with = "key_delimiter", value_name = "KEY")]
    pub key: Option<String>,
    /// Split each line at the first DELIM into key and value (kcat's -K).
    #[arg(short = 'K', long, value_name = "DELIM")]
    pub key_delimiter: Option<String>,
    /// A header added to every record, NAME=VALUE; repeat for more.
    #[arg(short = 'H', long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<HeaderJson>,
    /// Send every record to this partition (instead of by key, or round-robin).
    #[arg(short = 'p', long, value_name = "P")]
    pub partition: Option<u32>,
    /// Records per request.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// How long records not stored because their partition's owner is unavailable (cluster
    /// mode) are retried, each to its own partition, before the command gives up and names
    /// them (e.g. 30s, 2m; 0 does not retry).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = super::duration::parse_duration)]
    pub retry_for: std::time::Duration,
}

/// Parses `--header NAME=VALUE` (split at the first `=`).
fn parse_header(text: &str) -> Result<HeaderJson, String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok(HeaderJson {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            value_b64: None,
        }),
        _ => Err(format!("{text:?} is not a header: use NAME=VALUE")),
    }
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

/// One `--json` input line: the produce API's record plus the fields of a consumed record,
/// which cannot be produced (the daemon assigns them) and are ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLine {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_b64: Option<String>,
    #[serde(default, deserialize_with = "narad_host::api::types::present_or_null")]
    value: Option<Option<String>>,
    #[serde(default)]
    value_b64: Option<String>,
    #[serde(default)]
    headers: Option<HeadersJson>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default, rename = "offset")]
    _offset: serde::de::IgnoredAny,
    #[serde(default, rename = "committed_at")]
    _committed_at: serde::de::IgnoredAny,
    #[serde(default, rename = "origin")]
    _origin: serde::de::IgnoredAny,
}

/// How lines become records.
#[derive(Debug, Clone, Default)]
pub struct LineRules {
    /// Lines are JSON records.
    pub json: bool,
    /// The key of every plain line.
    pub key: Option<Vec<u8>>,
    /// The key delimiter of plain lines.
    pub delimiter: Option<Vec<u8>>,
    /// Headers added to every record.
    pub headers: Vec<HeaderJson>,
    /// The partition of every record.
    pub partition: Option<u32>,
}

impl LineRules {
    /// The rules `args` give; refuses combinations that mean nothing.
    pub fn from_args(args: &ProduceArgs) -> anyhow::Result<LineRules> {
        let json = args.client.json;
        if json && (args.key.is_some() || args.key_delimiter.is_some()) {
            bail!("--key and -K apply to plain lines; with --json give \"key\" in each record");
        }
        let delimiter = args.key_delimiter.as_deref().map(unescape);
        if delimiter.as_ref().is_some_and(Vec::is_empty) {
            bail!("-K needs a delimiter of at least one character");
        }
        Ok(LineRules {
            json,
            key: args.key.as_ref().map(|k| k.as_bytes().to_vec()),
            delimiter,
            headers: args.headers.clone(),
            partition: args.partition,
        })
    }

    /// The record of one line (without its line break); `None` for an empty line.
    pub fn record(&self, line: &[u8]) -> anyhow::Result<Option<ProduceRecordJson>> {
        if line.iter().all(u8::is_ascii_whitespace) && (self.json || line.is_empty()) {
            return Ok(None);
        }
        let mut record = if self.json {
            let j: JsonLine = serde_json::from_slice(line).context(
                "not a JSON record {\"key\"?|\"key_b64\"?, \"value\"|\"value_b64\", \"headers\"?, \"partition\"?}",
            )?;
            ProduceRecordJson {
                key: j.key,
                key_b64: j.key_b64,
                value: j.value,
                value_b64: j.value_b64,
                headers: j.headers,
                partition: j.partition,
            }
        } else {
            let (key, value) = match (&self.delimiter, &self.key) {
                (Some(d), _) => match find(line, d) {
                    Some(at) => (Some(&line[..at]), &line[at + d.len()..]),
                    None => (None, line),
                },
                (None, key) => (key.as_deref(), line),
            };
            let mut record = ProduceRecordJson::default();
            match key.map(Text::of) {
                Some(Text::Utf8(k)) => record.key = Some(k),
                Some(Text::Base64(k)) => record.key_b64 = Some(k),
                None => {}
            }
            match Text::of(value) {
                Text::Utf8(v) => record.value = Some(Some(v)),
                Text::Base64(v) => record.value_b64 = Some(v),
            }
            record
        };
        if !self.headers.is_empty() {
            let mut list = match record.headers.take() {
                None => Vec::new(),
                Some(HeadersJson::List(list)) => list,
                // The map form is stored sorted by name; the list keeps that order.
                Some(HeadersJson::Map(map)) => map
                    .into_iter()
                    .map(|(name, value)| HeaderJson {
                        name,
                        value: Some(value),
                        value_b64: None,
                    })
                    .collect(),
            };
            list.extend(self.headers.iter().cloned());
            record.headers = Some(HeadersJson::List(list));
        }
        if self.partition.is_some() {
            record.partition = self.partition;
        }
        Ok(Some(record))
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// True when a plain line looks like a JSON object (the old input format), worth a hint.
fn looks_like_json_record(line: &[u8]) -> bool {
    line.first() == Some(&b'{')
        && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line).is_ok()
}

/// Runs `narad produce`.
pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch_size > 0, "--batch-size must be at least 1");
    let rules = LineRules::from_args(&args)?;
    let client = args.client.client()?;
    let progress = std::io::stderr().is_terminal();
    let mut summary = ProduceSummary::default();
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut batch = Vec::with_capacity(args.batch_size);
    let mut line_no = 0u64;
    let mut hinted = false;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = stdin
            .read_until(b'\n', &mut line)
            .await
            .context("reading stdin")?;
        let done = read == 0;
        if !done {
            line_no += 1;
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            if !rules.json && !hinted && looks_like_json_record(&line) {
                hinted = true;
                // Not an error: a JSON text is a fine value. Only a hint for the old habit.
                let _ = writeln!(
                    std::io::stderr(),
                    "{}note: line {line_no} is a JSON object and is sent as a plain value; \
                     pass --json to read JSON records",
                    if progress { CLEAR_LINE } else { "" }
                );
            }
            if let Some(record) = rules
                .record(&line)
                .with_context(|| format!("stdin line {line_no}"))?
            {
                batch.push((line_no, record));
            }
        }
        if batch.len() >= args.batch_size || (done && !batch.is_empty()) {
            let sent = std::mem::take(&mut batch);
            let before = summary.records;
            send_batch(&client, &args.topic, sent, args.retry_for, &mut summary)
                .await
                .inspect_err(|_| {
                    if progress {
                        // The error starts on a clean line, not after the progress count.
                        let _ = write!(std::io::stderr(), "{CLEAR_LINE}");
                    }
                })
                .with_context(|| {
                    format!(
                        "producing to {} ({} of earlier batches committed)",
                        args.topic,
                        plural(before, "record")
                    )
                })?;
            if progress {
                let _ = write!(
                    std::io::stderr(),
                    "\rproduced {}",
                    plural(summary.records, "record")
                );
            }
        }
        if done {
            break;
        }
    }
    if progress {
        // The summary takes the progress count's place.
        let _ = write!(std::io::stderr(), "{CLEAR_LINE}");
    }
    let mut stdout = std::io::stdout().lock();
    if args.client.json {
        writeln!(stdout, "{}", serde_json::to_string(&summary)?)?;
    } else {
        writeln!(stdout, "{}", summary_text(&args.topic, &summary))?;
    }
    Ok(())
}

/// Back to the start of the terminal line and clear it: where the progress count was.
const CLEAR_LINE: &str = "\r\x1b[K";

/// A pause between two tries of records whose owner was unavailable.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// One record of a batch and the stdin line it came from.
type Lined = (u64, ProduceRecordJson);

/// Sends `batch`; counts what was stored in `summary`. A request that fails after storing part
/// of it (an owner down in cluster mode) says which partitions it stored and where each record
/// went: the stored records are counted and never sent again, the others are sent again, each
/// to the partition it was placed in, one request per partition, for up to `retry_for`. What
/// is still not stored then, and what may or may not have been (an owner that lost its lease
/// before answering), is named by stdin line in the error.
async fn send_batch(
    client: &super::client::Client,
    topic: &str,
    batch: Vec<Lined>,
    retry_for: std::time::Duration,
    summary: &mut ProduceSummary,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + retry_for;
    let total = batch.len();
    let stored_before = summary.records;
    let stored = |summary: &ProduceSummary| summary.records.saturating_sub(stored_before);
    let mut requests: Vec<Vec<Lined>> = vec![batch];
    let mut unknown: Vec<u64> = Vec::new();
    loop {
        let mut not_stored: Vec<Lined> = Vec::new();
        let mut last_error = None;
        let mut pending = requests.into_iter();
        while let Some(request) = pending.next() {
            let records: Vec<ProduceRecordJson> = request.iter().map(|(_, r)| r.clone()).collect();
            summary.requests += 1;
            match client.produce(topic, records).await {
                Ok(answer) => {
                    for o in &answer.offsets {
                        summary.records += 1;
                        *summary.partitions.entry(o.partition).or_default() += 1;
                    }
                }
                Err(e) => {
                    let retryable = matches!(e.status().map(|s| s.as_u16()), Some(502..=504));
                    match Outcome::of(&e, request.len()) {
                        None => not_stored.extend(request),
                        Some(split) => {
                            for ((line, mut record), placed) in
                                request.into_iter().zip(split.placement)
                            {
                                if split.committed.contains(&placed) {
                                    summary.records += 1;
                                    *summary.partitions.entry(placed).or_default() += 1;
                                } else if split.uncertain.contains(&placed) {
                                    unknown.push(line);
                                } else {
                                    record.partition = Some(placed);
                                    not_stored.push((line, record));
                                }
                            }
                        }
                    }
                    if !retryable {
                        // The requests not sent yet are not stored either.
                        not_stored.extend(pending.by_ref().flatten());
                        let lines: Vec<u64> = not_stored.iter().map(|(l, _)| *l).collect();
                        return Err(not_all_stored(
                            e.into(),
                            total,
                            stored(summary),
                            &lines,
                            &unknown,
                        ));
                    }
                    last_error = Some(e);
                }
            }
        }
        if not_stored.is_empty() {
            if unknown.is_empty() {
                return Ok(());
            }
            return Err(not_all_stored(
                anyhow::anyhow!("an owner lost its lease before it answered"),
                total,
                stored(summary),
                &[],
                &unknown,
            ));
        }
        if std::time::Instant::now() + RETRY_PAUSE > deadline {
            let lines: Vec<u64> = not_stored.iter().map(|(l, _)| *l).collect();
            let error =
                last_error.map_or_else(|| anyhow::anyhow!("not stored"), anyhow::Error::from);
            return Err(not_all_stored(
                error,
                total,
                stored(summary),
                &lines,
                &unknown,
            ));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
        // One request per partition: a partition whose owner is still down holds back no other.
        let mut by_partition: BTreeMap<Option<u32>, Vec<Lined>> = BTreeMap::new();
        for (line, record) in not_stored {
            by_partition
                .entry(record.partition)
                .or_default()
                .push((line, record));
        }
        requests = by_partition.into_values().collect();
    }
}

/// What a failed produce request says it stored.
struct Outcome {
    /// Partitions whose records were committed.
    committed: Vec<u32>,
    /// Partitions whose records may or may not have been.
    uncertain: Vec<u32>,
    /// The partition of each record of the request, in order.
    placement: Vec<u32>,
}

impl Outcome {
    /// Read from the error of a request of `records` records, when it says all of it.
    fn of(error: &super::client::ApiCallError, records: usize) -> Option<Outcome> {
        let super::client::ApiCallError::Status { body, .. } = error else {
            return None;
        };
        let list = |key: &str| -> Option<Vec<u32>> {
            body.get(key)?
                .as_array()?
                .iter()
                .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()
        };
        let placement = list("record_partitions")?;
        (placement.len() == records).then(|| Outcome {
            committed: list("committed_partitions").unwrap_or_default(),
            uncertain: list("uncertain_partitions").unwrap_or_default(),
            placement,
        })
    }
}

/// The error of a batch of `total` records not all stored: how many of it were, the stdin
/// lines not stored and of unknown outcome, then `error`, the answer to the last try.
fn not_all_stored(
    error: anyhow::Error,
    total: usize,
    stored: u64,
    lines: &[u64],
    unknown: &[u64],
) -> anyhow::Error {
    let mut parts = vec![format!(
        "{stored} of this batch of {} stored",
        plural(total as u64, "record")
    )];
    if !lines.is_empty() {
        parts.push(format!(
            "{} not (stdin {}): send {} again",
            lines.len(),
            lines_word(lines),
            if lines.len() == 1 { "it" } else { "those" }
        ));
    }
    if !unknown.is_empty() {
        parts.push(format!(
            "{} may or may not have been (stdin {}): check before sending {} again",
            unknown.len(),
            lines_word(unknown),
            if unknown.len() == 1 { "it" } else { "them" }
        ));
    }
    error.context(format!("{}; the last try got", parts.join(", ")))
}

/// `line 4` or `lines 3-5, 9`.
fn lines_word(lines: &[u64]) -> String {
    let word = if lines.len() == 1 { "line" } else { "lines" };
    format!("{word} {}", line_ranges(lines))
}

/// Line numbers as ranges: `3-5, 9, 12-13`.
fn line_ranges(lines: &[u64]) -> String {
    let mut sorted = lines.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(", ")
}

/// The human summary line.
fn summary_text(topic: &str, summary: &ProduceSummary) -> String {
    let spread: Vec<String> = summary
        .partitions
        .iter()
        .map(|(p, n)| format!("p{p}={n}"))
        .collect();
    let mut text = format!(
        "produced {} to {topic} in {}",
        plural(summary.records, "record"),
        plural(summary.requests, "request")
    );
    if !spread.is_empty() {
        text.push_str(&format!(" ({})", spread.join(" ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> LineRules {
        LineRules::default()
    }

    #[test]
    fn a_plain_line_is_the_value_of_a_keyless_record() {
        let r = plain().record(b"hello").unwrap().unwrap();
        assert_eq!(r.value.clone().flatten().as_deref(), Some("hello"));
        assert_eq!(r.key, None);
        assert_eq!(plain().record(b"").unwrap(), None);
        // A line of spaces is a value; only an empty line is skipped.
        assert_eq!(
            plain()
                .record(b"  ")
                .unwrap()
                .unwrap()
                .value
                .clone()
                .flatten()
                .as_deref(),
            Some("  ")
        );
    }

    #[test]
    fn the_key_delimiter_splits_at_its_first_occurrence() {
        let rules = LineRules {
            delimiter: Some(b"::".to_vec()),
            ..plain()
        };
        let r = rules.record(b"k1::a::b").unwrap().unwrap();
        assert_eq!(r.key.as_deref(), Some("k1"));
        assert_eq!(r.value.clone().flatten().as_deref(), Some("a::b"));
        let r = rules.record(b"no delimiter").unwrap().unwrap();
        assert_eq!(r.key, None);
        assert_eq!(r.value.clone().flatten().as_deref(), Some("no delimiter"));
    }

    #[test]
    fn a_binary_line_travels_as_base64() {
        let r = plain().record(&[0xff, 0x00]).unwrap().unwrap();
        assert_eq!(r.value_b64.as_deref(), Some("/wA="));
        assert_eq!(r.value, None);
    }

    #[test]
    fn a_consumed_json_record_is_accepted_and_its_read_only_fields_ignored() {
        let rules = LineRules {
            json: true,
            ..plain()
        };
        let line = br#"{"partition":1,"offset":7,"key":"alice","value":"hello","headers":[{"name":"region","value":"eu"}],"committed_at":1764460800123,"origin":{"epoch":"67953471cc57a32a","partition":0,"offset":3,"slab_start":0}}"#;
        let r = rules.record(line).unwrap().unwrap();
        assert_eq!(r.key.as_deref(), Some("alice"));
        assert_eq!(r.value.clone().flatten().as_deref(), Some("hello"));
        assert_eq!(r.partition, Some(1));
        assert!(rules.record(br#"{"value":"x","valu":"y"}"#).is_err());
    }

    #[test]
    fn header_flags_are_added_after_the_records_own() {
        let rules = LineRules {
            json: true,
            headers: vec![parse_header("source=cli").unwrap()],
            partition: Some(2),
            ..plain()
        };
        let r = rules
            .record(br#"{"value":"x","headers":{"a":"1"},"partition":0}"#)
            .unwrap()
            .unwrap();
        let Some(HeadersJson::List(list)) = r.headers else {
            panic!("headers are a list: {r:?}");
        };
        let names: Vec<&str> = list.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a", "source"]);
        assert_eq!(r.partition, Some(2));
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("=v").is_err());
    }

    #[test]
    fn line_numbers_print_as_ranges() {
        assert_eq!(line_ranges(&[9, 3, 4, 5, 12, 13, 4]), "3-5, 9, 12-13");
        assert_eq!(line_ranges(&[7]), "7");
    }

    #[test]
    fn a_failed_produce_says_what_it_stored_only_when_it_names_every_records_partition() {
        let failed = |body: serde_json::Value| super::super::client::ApiCallError::Status {
            status: reqwest::StatusCode::SERVICE_UNAVAILABLE,
            message: "owner down".into(),
            body,
        };
        let outcome = Outcome::of(
            &failed(
                serde_json::json!({"error": "x", "committed_partitions": [1],
                "uncertain_partitions": [2], "record_partitions": [0, 1, 2]}),
            ),
            3,
        )
        .unwrap();
        assert_eq!(outcome.committed, [1]);
        assert_eq!(outcome.uncertain, [2]);
        assert_eq!(outcome.placement, [0, 1, 2]);
        // Another request's placement, or none: nothing is assumed stored.
        let wrong =
            failed(serde_json::json!({"committed_partitions": [1], "record_partitions": [1]}));
        assert!(Outcome::of(&wrong, 3).is_none());
        assert!(Outcome::of(&failed(serde_json::json!({"committed_partitions": []})), 3).is_none());
    }

    #[test]
    fn the_summary_counts_in_the_singular_for_one() {
        let mut s = ProduceSummary {
            records: 1,
            requests: 1,
            ..ProduceSummary::default()
        };
        s.partitions.insert(0, 1);
        assert_eq!(
            summary_text("t", &s),
            "produced 1 record to t in 1 request (p0=1)"
        );
    }
}
