//! `narad consume TOPIC --partition P`: records as NDJSON on stdout, one per line, in the
//! fetch API's record shape. Stops at the end of the partition unless `--follow`.

use std::io::Write as _;

use anyhow::Context as _;
use clap::Args;

use super::ClientArgs;

/// Long-poll used by `--follow`, in milliseconds.
const FOLLOW_WAIT_MS: u64 = 10_000;

/// `narad consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Daemon options (`--json` changes nothing: the output is always NDJSON).
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to read.
    pub topic: String,
    /// Partition to read.
    #[arg(long, short = 'p')]
    pub partition: u32,
    /// First offset (default: the oldest stored record).
    #[arg(long)]
    pub offset: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Stop after this many records.
    #[arg(long)]
    pub max: Option<u64>,
}

/// Runs `narad consume`.
pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let client = args.client.client();
    let mut offset = args.offset;
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        if args.max.is_some_and(|m| printed >= m) {
            break;
        }
        let want = args
            .max
            .map(|m| u32::try_from(m - printed).unwrap_or(u32::MAX).min(1000));
        let wait = args.follow.then_some(FOLLOW_WAIT_MS);
        let answer = client
            .fetch(&args.topic, args.partition, offset, want, wait)
            .await
            .with_context(|| format!("fetching {} partition {}", args.topic, args.partition))?;
        let mut out = stdout.lock();
        for record in &answer.records {
            serde_json::to_writer(&mut out, record)?;
            out.write_all(b"\n")?;
            printed += 1;
        }
        out.flush()?;
        offset = Some(answer.next_offset);
        if !args.follow && answer.next_offset >= answer.high_watermark {
            break;
        }
    }
    Ok(())
}
