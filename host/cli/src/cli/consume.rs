//! `narad consume TOPIC`: a topic's records on stdout, every partition unless `--partition`.
//!
//! Output, one record at a time:
//! - default: the value and a newline (kcat's default), which `narad produce` reads back;
//! - `--format FMT`: kcat's format tokens (`%k %s %p %o %T %h %t %K %S %%`) and escapes
//!   (`\n \t \r \\ \0`), with no newline unless the format has one;
//! - `--json`: one JSON object per line, the fetch API's record shape plus `partition`, which
//!   `narad produce --json` takes as input (it ignores `offset`, `committed_at`, `origin`).
//!
//! Without `--follow` each partition is read in turn up to its end; with it every partition is
//! long-polled at once and records are printed as they come. A partition that cannot be read
//! (in cluster mode, its owner is down) does not stop the others: without `--follow` the
//! command names it at the end and fails; with it a warning says so and it is tried again.

use std::io::Write as _;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;

use super::ClientArgs;
use super::client::Client;
use narad_host::api::types::{HeaderJson, RecordJson};

/// Long-poll used by `--follow`, in milliseconds (the daemon caps `wait_ms` at 30 s; 10 s keeps
/// a dead daemon noticed soon).
const FOLLOW_WAIT_MS: u64 = 10_000;

/// How often `--follow` tries a partition again that could not be read.
const FOLLOW_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Records asked for per fetch: the fetch API's cap (`max-fetch-records` default is 1,000).
const FETCH_MAX_RECORDS: u32 = 1000;

/// `narad consume`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  narad consume orders                              every partition, values one per line
  narad consume orders -p 2 --offset -10            the last 10 records of partition 2
  narad consume orders --offset end --follow        only records produced from now on
  narad consume orders --format '%p:%o %k=%s\\n'     kcat-style lines
  narad consume orders --format '%k\\t%s\\n' | narad produce copy -K '\\t'
  narad consume orders --json | narad produce copy --json")]
pub struct ConsumeArgs {
    /// Daemon options; `--json` prints one JSON record per line (with `partition`), the form
    /// `narad produce --json` reads.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to read.
    pub topic: String,
    /// Partitions to read, comma-separated or repeated. [default: every partition]
    #[arg(long, short = 'p', value_delimiter = ',', value_name = "P")]
    pub partition: Vec<u32>,
    /// Where to start in each partition: `beginning` (the oldest stored record), `end` (only
    /// records produced from now on), an offset `N`, or `-N` for the last N records.
    #[arg(
        long,
        short = 'o',
        default_value = "beginning",
        allow_hyphen_values = true,
        value_parser = parse_offset,
        value_name = "beginning|end|N|-N"
    )]
    pub offset: OffsetSpec,
    /// Keep waiting for new records instead of stopping at the end.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Stop after this many records in all.
    #[arg(long, short = 'c', value_name = "N")]
    pub max: Option<u64>,
    /// Print each record with this format instead of its value and a newline: %s value,
    /// %k key, %p partition, %o offset, %T commit time (ms since the epoch), %h headers
    /// (name=value,...), %t topic, %S / %K value / key length, %% a percent sign; escapes
    /// \n \t \r \\ \0. A record without a key prints an empty %k and a %K of -1.
    #[arg(long, value_name = "FMT")]
    pub format: Option<String>,
}

/// Where `--offset` starts each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start.
    Beginning,
    /// The high watermark when the command starts.
    End,
    /// This offset.
    At(u64),
    /// This many records before the high watermark (or the log start, if fewer are stored).
    Last(u64),
}

/// Parses `--offset`: `beginning` (or `earliest`, `oldest`), `end` (or `latest`), `N`, `-N`.
pub fn parse_offset(text: &str) -> Result<OffsetSpec, String> {
    match text.trim() {
        "beginning" | "earliest" | "oldest" => Ok(OffsetSpec::Beginning),
        "end" | "latest" => Ok(OffsetSpec::End),
        t => {
            let bad = || format!("{t:?} is not an offset: use beginning, end, N or -N");
            match t.strip_prefix('-') {
                Some(n) => n.parse().map(OffsetSpec::Last).map_err(|_| bad()),
                None => t.parse().map(OffsetSpec::At).map_err(|_| bad()),
            }
        }
    }
}

/// One piece of a parsed `--format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Bytes printed as they are.
    Literal(Vec<u8>),
    /// `%k`.
    Key,
    /// `%K`.
    KeyLen,
    /// `%s`.
    Value,
    /// `%S`.
    ValueLen,
    /// `%p`.
    Partition,
    /// `%o`.
    Offset,
    /// `%T`.
    Timestamp,
    /// `%h`.
    Headers,
    /// `%t`.
    Topic,
}

/// Parses a kcat-style format into pieces; an unknown `%` token is an error naming it.
pub fn parse_format(format: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut literal = Vec::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        let token = match c {
            '%' => match chars.next() {
                Some('%') => {
                    literal.push(b'%');
                    continue;
                }
                Some('k') => Piece::Key,
                Some('K') => Piece::KeyLen,
                Some('s') => Piece::Value,
                Some('S') => Piece::ValueLen,
                Some('p') => Piece::Partition,
                Some('o') => Piece::Offset,
                Some('T') => Piece::Timestamp,
                Some('h') => Piece::Headers,
                Some('t') => Piece::Topic,
                other => {
                    let what = other.map_or_else(|| "%".to_owned(), |o| format!("%{o}"));
                    return Err(format!(
                        "{what:?} is not a format token: use %s %k %p %o %T %h %t %S %K or %%"
                    ));
                }
            },
            '\\' => {
                match chars.next() {
                    Some(e) => push_escape(&mut literal, e),
                    None => literal.push(b'\\'),
                }
                continue;
            }
            c => {
                let mut buf = [0u8; 4];
                literal.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                continue;
            }
        };
        if !literal.is_empty() {
            pieces.push(Piece::Literal(std::mem::take(&mut literal)));
        }
        pieces.push(token);
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// Appends the character `\<e>` stands for; an unknown escape stays as written.
fn push_escape(out: &mut Vec<u8>, e: char) {
    match e {
        'n' => out.push(b'\n'),
        't' => out.push(b'\t'),
        'r' => out.push(b'\r'),
        '0' => out.push(0),
        '\\' => out.push(b'\\'),
        other => {
            out.push(b'\\');
            let mut buf = [0u8; 4];
            out.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
        }
    }
}

/// `text` with the escapes `\n \t \r \0 \\` turned into their bytes (for `produce -K '\t'`).
pub fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e) => push_escape(&mut out, e),
                None => out.push(b'\\'),
            },
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// How records are printed.
#[derive(Debug, Clone)]
pub enum Output {
    /// One JSON object per line.
    Json,
    /// A parsed `--format` (the default is `%s\n`).
    Format(Vec<Piece>),
}

/// The `--json` line: the fetch API's record with its partition in front.
#[derive(Serialize)]
struct ConsumedRecord<'a> {
    partition: u32,
    #[serde(flatten)]
    record: &'a RecordJson,
}

fn header_bytes(h: &HeaderJson) -> anyhow::Result<Vec<u8>> {
    use base64::Engine as _;
    Ok(match (&h.value_b64, &h.value) {
        (Some(b), _) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .with_context(|| format!("header {:?} from the daemon is not base64", h.name))?,
        (None, Some(v)) => v.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    })
}

impl Output {
    /// Appends `record` of `topic` partition `partition` to `out` in this form.
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        topic: &str,
        partition: u32,
        record: &RecordJson,
    ) -> anyhow::Result<()> {
        let pieces = match self {
            Output::Json => {
                serde_json::to_writer(&mut *out, &ConsumedRecord { partition, record })?;
                out.push(b'\n');
                return Ok(());
            }
            Output::Format(pieces) => pieces,
        };
        let bad =
            |what: &str| format!("the daemon sent offset {} with a bad {what}", record.offset);
        for piece in pieces {
            match piece {
                Piece::Literal(bytes) => out.extend_from_slice(bytes),
                Piece::Key => {
                    if let Some(key) = record.key_bytes().with_context(|| bad("key"))? {
                        out.extend_from_slice(&key);
                    }
                }
                Piece::KeyLen => {
                    let len = record
                        .key_bytes()
                        .with_context(|| bad("key"))?
                        .map_or(-1, |k| k.len() as i64);
                    out.extend_from_slice(len.to_string().as_bytes());
                }
                Piece::Value => {
                    out.extend_from_slice(&record.value_bytes().with_context(|| bad("value"))?)
                }
                Piece::ValueLen => {
                    let len = record.value_bytes().with_context(|| bad("value"))?.len();
                    out.extend_from_slice(len.to_string().as_bytes());
                }
                Piece::Partition => out.extend_from_slice(partition.to_string().as_bytes()),
                Piece::Offset => out.extend_from_slice(record.offset.to_string().as_bytes()),
                Piece::Timestamp => {
                    out.extend_from_slice(record.committed_at.to_string().as_bytes())
                }
                Piece::Headers => {
                    for (i, h) in record.headers.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend_from_slice(h.name.as_bytes());
                        out.push(b'=');
                        out.extend_from_slice(&header_bytes(h)?);
                    }
                }
                Piece::Topic => out.extend_from_slice(topic.as_bytes()),
            }
        }
        Ok(())
    }
}

/// Prints records to stdout and counts them against `--max`.
struct Printer {
    output: Output,
    topic: String,
    max: Option<u64>,
    printed: u64,
}

impl Printer {
    /// True once `--max` records are printed.
    fn done(&self) -> bool {
        self.max.is_some_and(|m| self.printed >= m)
    }

    /// Prints as many of `records` as `--max` allows. A closed stdout comes back as the
    /// `BrokenPipe` error that makes the command stop quietly.
    fn print(&mut self, partition: u32, records: &[RecordJson]) -> anyhow::Result<()> {
        let mut buf = Vec::new();
        for record in records {
            if self.done() {
                break;
            }
            self.output
                .write(&mut buf, &self.topic, partition, record)?;
            self.printed += 1;
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&buf)?;
        stdout.flush()?;
        Ok(())
    }
}

/// Runs `narad consume`.
pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let output = match (&args.format, args.client.json) {
        (Some(_), true) => bail!("give --json or --format, not both"),
        (Some(format), false) => Output::Format(parse_format(format).map_err(anyhow::Error::msg)?),
        (None, true) => Output::Json,
        (None, false) => Output::Format(vec![Piece::Value, Piece::Literal(b"\n".to_vec())]),
    };
    let client = args.client.client()?;
    let count = client
        .describe_topic(&args.topic)
        .await
        .with_context(|| format!("looking up topic {}", args.topic))?
        .topic
        .partitions;
    let partitions: Vec<u32> = if args.partition.is_empty() {
        (0..count).collect()
    } else {
        if let Some(p) = args.partition.iter().find(|&&p| p >= count) {
            bail!(
                "partition {p} does not exist: topic {} has {count} (0..={})",
                args.topic,
                count.saturating_sub(1)
            );
        }
        args.partition.clone()
    };
    let mut printer = Printer {
        output,
        topic: args.topic.clone(),
        max: args.max,
        printed: 0,
    };
    if args.follow {
        follow(&client, &args, &partitions, &mut printer).await
    } else {
        // A partition that cannot be read (in cluster mode: its owner is down) does not keep
        // the others from being printed; the command names it at the end and fails.
        let mut unread = Vec::new();
        for &p in &partitions {
            if let Err(e) = read_to_end(&client, &args, p, &mut printer).await? {
                unread.push((p, e));
            }
            if printer.done() {
                break;
            }
        }
        unread_partitions(&args.topic, partitions.len(), &unread)
    }
}

/// Ok when every partition was read; otherwise an error naming each partition that was not,
/// with why.
fn unread_partitions(
    topic: &str,
    asked: usize,
    unread: &[(u32, anyhow::Error)],
) -> anyhow::Result<()> {
    if unread.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = unread
        .iter()
        .map(|(p, e)| format!("  partition {p}: {e:#}"))
        .collect();
    bail!(
        "{} of {asked} partitions of {topic} could not be read (the records of the others were \
         printed):\n{}",
        unread.len(),
        lines.join("\n")
    )
}

/// The first offset to fetch in `partition` (`None`: the log start).
async fn start_offset(
    client: &Client,
    topic: &str,
    partition: u32,
    spec: OffsetSpec,
) -> anyhow::Result<Option<u64>> {
    Ok(match spec {
        OffsetSpec::Beginning => None,
        OffsetSpec::At(offset) => Some(offset),
        OffsetSpec::End | OffsetSpec::Last(_) => {
            // A one-record fetch from the log start answers both bounds of the partition.
            let probe = client
                .fetch(topic, partition, None, Some(1), None)
                .await
                .with_context(|| format!("reading the bounds of {topic} partition {partition}"))?;
            Some(match spec {
                OffsetSpec::Last(n) => probe
                    .high_watermark
                    .saturating_sub(n)
                    .max(probe.log_start_offset),
                _ => probe.high_watermark,
            })
        }
    })
}

/// Prints `partition` from `--offset` to its high watermark. The outer error is the output's
/// (stdout closed: nothing more can be printed); the inner one says why the partition could
/// not be read (to its end), after what it printed.
async fn read_to_end(
    client: &Client,
    args: &ConsumeArgs,
    partition: u32,
    printer: &mut Printer,
) -> anyhow::Result<anyhow::Result<()>> {
    let context = || format!("fetching {} partition {partition}", args.topic);
    let mut offset = match start_offset(client, &args.topic, partition, args.offset).await {
        Ok(offset) => offset,
        Err(e) => return Ok(Err(e)),
    };
    while !printer.done() {
        let want = printer.max.map_or(FETCH_MAX_RECORDS, |m| {
            u32::try_from(m - printer.printed)
                .unwrap_or(u32::MAX)
                .min(FETCH_MAX_RECORDS)
        });
        let answer = match client
            .fetch(&args.topic, partition, offset, Some(want), None)
            .await
            .with_context(context)
        {
            Ok(answer) => answer,
            Err(e) => return Ok(Err(e)),
        };
        printer.print(partition, &answer.records)?;
        offset = Some(answer.next_offset);
        // An empty answer below the high watermark cannot advance: stop rather than spin.
        if answer.next_offset >= answer.high_watermark || answer.records.is_empty() {
            break;
        }
    }
    Ok(Ok(()))
}

/// Long-polls every partition at once and prints records as they come, until `--max`.
async fn follow(
    client: &Client,
    args: &ConsumeArgs,
    partitions: &[u32],
    printer: &mut Printer,
) -> anyhow::Result<()> {
    let (tx, mut rx) =
        tokio::sync::mpsc::channel::<(u32, Vec<RecordJson>)>(partitions.len().max(1) * 2);
    // Dropped on return, which aborts every poller.
    let mut pollers = tokio::task::JoinSet::new();
    for &partition in partitions {
        let client = client.clone();
        let topic = args.topic.clone();
        let spec = args.offset;
        let tx = tx.clone();
        pollers.spawn(async move {
            // A partition that cannot be read (its owner down) is said once on stderr and
            // tried again every FOLLOW_RETRY; the other partitions go on printing.
            let mut failing = false;
            let mut offset = None;
            let mut started = false;
            loop {
                let polled = async {
                    if !started {
                        offset = start_offset(&client, &topic, partition, spec).await?;
                        started = true;
                    }
                    client
                        .fetch(
                            &topic,
                            partition,
                            offset,
                            Some(FETCH_MAX_RECORDS),
                            Some(FOLLOW_WAIT_MS),
                        )
                        .await
                        .with_context(|| format!("fetching {topic} partition {partition}"))
                };
                match polled.await {
                    Ok(answer) => {
                        if failing {
                            failing = false;
                            eprintln!("note: {topic} partition {partition} can be read again");
                        }
                        offset = Some(answer.next_offset);
                        if !answer.records.is_empty()
                            && tx.send((partition, answer.records)).await.is_err()
                        {
                            // The printer has stopped.
                            return;
                        }
                    }
                    Err(e) => {
                        if !failing {
                            failing = true;
                            eprintln!(
                                "warning: {e:#}; the other partitions go on, this one is tried \
                                 again every {} s",
                                FOLLOW_RETRY.as_secs()
                            );
                        }
                        tokio::time::sleep(FOLLOW_RETRY).await;
                    }
                }
            }
        });
    }
    drop(tx);
    while let Some((partition, records)) = rx.recv().await {
        printer.print(partition, &records)?;
        if printer.done() {
            break;
        }
    }
    pollers.abort_all();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> RecordJson {
        RecordJson::from_parts(
            7,
            Some(b"alice"),
            Some(b"hello"),
            [("region".to_owned(), b"eu".to_vec())],
            1_764_460_800_123,
        )
    }

    fn formatted(format: &str) -> String {
        let mut out = Vec::new();
        Output::Format(parse_format(format).unwrap())
            .write(&mut out, "orders", 3, &record())
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_offset_form_parses() {
        assert_eq!(parse_offset("beginning"), Ok(OffsetSpec::Beginning));
        assert_eq!(parse_offset("end"), Ok(OffsetSpec::End));
        assert_eq!(parse_offset("latest"), Ok(OffsetSpec::End));
        assert_eq!(parse_offset("12"), Ok(OffsetSpec::At(12)));
        assert_eq!(parse_offset("-3"), Ok(OffsetSpec::Last(3)));
        assert!(parse_offset("soon").is_err());
        assert!(parse_offset("--3").is_err());
    }

    #[test]
    fn kcat_format_tokens_and_escapes_print_the_record() {
        assert_eq!(
            formatted("%t/%p@%o %k=%s (%K,%S) [%h] %T%%\\n"),
            "orders/3@7 alice=hello (5,5) [region=eu] 1764460800123%\n"
        );
        assert_eq!(formatted("%k\\t%s\\n"), "alice\thello\n");
    }

    #[test]
    fn an_unknown_format_token_is_refused_by_name() {
        let err = parse_format("%s %x").unwrap_err();
        assert!(err.contains("\"%x\""), "{err}");
        assert!(parse_format("100%").is_err());
    }

    #[test]
    fn a_keyless_record_prints_an_empty_key_of_length_minus_one() {
        let mut out = Vec::new();
        Output::Format(parse_format("[%k] %K").unwrap())
            .write(
                &mut out,
                "t",
                0,
                &RecordJson::from_parts(0, None, Some(b"v"), [], 1),
            )
            .unwrap();
        assert_eq!(out, b"[] -1");
    }

    #[test]
    fn the_json_form_carries_the_partition_beside_the_fetch_shape() {
        let mut out = Vec::new();
        Output::Json
            .write(&mut out, "orders", 3, &record())
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["partition"], 3);
        assert_eq!(v["offset"], 7);
        assert_eq!(v["key"], "alice");
        assert_eq!(v["value"], "hello");
        assert_eq!(v["headers"][0]["name"], "region");
        assert_eq!(v["committed_at"], 1_764_460_800_123i64);
    }

    #[test]
    fn escapes_in_a_delimiter_become_their_bytes() {
        assert_eq!(unescape("\\t"), b"\t");
        assert_eq!(unescape("::"), b"::");
        assert_eq!(unescape("a\\\\b\\q"), b"a\\b\\q");
    }
}
