//! `narad demo`: the main job in one command, checked end to end.
//!
//! It starts a daemon in this process on a temporary data dir (or `--data-dir`), creates the
//! parent `orders` (4 partitions) and attaches three children: `analytics` (the default chain,
//! 3 partitions), `retry` (a delay child, 4 partitions) and `by-region` (`header-route` on the
//! `region` header, then the default rules, 3 partitions). It produces a steady stream of
//! keyed, keyless and region-headed records for `--duration` at `--rate` while a live table
//! shows each child's progress, then stops producing, waits for every child to catch up (the
//! delay child until its records are due), and checks every child against the parent
//! ([`verify`]). The last line printed is the verdict; any problem exits non-zero.
//!
//! Ctrl-C once stops producing early and goes on to the checks; a second Ctrl-C quits at once
//! (the daemon still shuts down cleanly).
//!
//! - [`workload`]: the records and the producer; [`display`]: the live table;
//!   [`verify`]: the checks.

pub mod display;
pub mod verify;
pub mod workload;

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;

use super::client::Client;
use super::duration::{format_duration, parse_duration};
use display::{ChildRow, Screen};
use narad_host::api::children::{AttachRequest, ChildList};
use narad_host::api::types::CreateTopicRequest;
use narad_host::config::Config;
use narad_host::server::run_server;
use narad_host::shutdown::{self, ShutdownSignal, ShutdownTrigger};
use verify::{ChildVerdict, Expectation, Record, RegionMap};

/// The parent topic.
pub const PARENT: &str = "orders";
/// Partitions of the parent.
pub const PARENT_PARTITIONS: u32 = 4;
/// The plain child on the default chain.
pub const ANALYTICS: &str = "analytics";
/// The delay child.
pub const RETRY: &str = "retry";
/// The child routed by the `region` header.
pub const BY_REGION: &str = "by-region";
/// The `by-region` child's `header-route` config.
pub const BY_REGION_CONFIG: &str = "header = region\nus = 0\neu = 1\n* = 2\n";

/// How often the live table refreshes.
const REFRESH: Duration = Duration::from_millis(250);

/// How long children may take to catch up after the last record is due before the demo calls
/// it a failure. Generous: on a busy two-core machine a healthy child catches up in seconds.
const CATCH_UP_GRACE: Duration = Duration::from_secs(60);

/// `narad demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Data directory to use and keep (default: a temporary one, removed afterwards). It must
    /// not already hold the demo's topics.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How long to produce (e.g. 20s, 2m).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Records produced per second.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Delay of the `retry` child (e.g. 10s); the demo waits this long after the last record.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub delay: Duration,
    /// No live table; print the result as one JSON object (for scripts).
    #[arg(long)]
    pub json: bool,
}

/// A child of the demo and what its router must do.
#[derive(Debug, Clone)]
struct DemoChild {
    name: &'static str,
    kind: String,
    attach: AttachRequest,
    expect: Expectation,
}

fn children(delay: Duration) -> Vec<DemoChild> {
    let expect = |child_partitions, regions| Expectation {
        parent_partitions: PARENT_PARTITIONS,
        child_partitions,
        regions,
    };
    vec![
        DemoChild {
            name: ANALYTICS,
            kind: "default chain".into(),
            attach: AttachRequest {
                partitions: Some(3),
                ..AttachRequest::default()
            },
            expect: expect(3, None),
        },
        DemoChild {
            name: RETRY,
            kind: format!("default chain, {} delay", format_duration(delay)),
            attach: AttachRequest {
                partitions: Some(PARENT_PARTITIONS),
                delay_ms: Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
                ..AttachRequest::default()
            },
            expect: expect(PARENT_PARTITIONS, None),
        },
        DemoChild {
            name: BY_REGION,
            kind: "header-route chain".into(),
            attach: AttachRequest {
                partitions: Some(3),
                router: Some(vec![
                    "header-route".into(),
                    "key-hash".into(),
                    "round-robin".into(),
                ]),
                config: Some(serde_json::Value::String(BY_REGION_CONFIG.into())),
                ..AttachRequest::default()
            },
            expect: expect(
                3,
                Some(RegionMap {
                    map: vec![("us".into(), 0), ("eu".into(), 1)],
                    fallback: Some(2),
                }),
            ),
        },
    ]
}

/// Runs `narad demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rate > 0, "--rate must be at least 1 record per second");
    let temp;
    let data_dir = match &args.data_dir {
        Some(d) => d.clone(),
        None => {
            // Owner-only, as a data dir must be (else the store warns at its first open).
            temp = tempfile::Builder::new()
                .prefix("narad-demo-")
                .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .tempdir()
                .context("creating a temporary data dir")?;
            temp.path().to_path_buf()
        }
    };
    let mut config = Config::new(&data_dir);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let (daemon_trigger, daemon_signal) = shutdown::channel();
    let server = run_server(config, daemon_signal)
        .await
        .with_context(|| format!("starting the demo daemon on {}", data_dir.display()))?;
    let url = format!("http://{}", server.local_addr());
    // With --json, stdout carries only the result.
    let intro = format!(
        "narad demo: daemon on {url}, data dir {}{}",
        data_dir.display(),
        if args.data_dir.is_some() {
            " (kept)"
        } else {
            " (temporary)"
        }
    );
    if args.json {
        eprintln!("{intro}");
    } else {
        outln!("{intro}")?;
    }

    // First Ctrl-C: stop producing, then check. Second: quit.
    let (stop_producing, producing) = shutdown::channel();
    let (quit_trigger, quit) = shutdown::channel();
    let signals = tokio::spawn(watch_interrupts(stop_producing, quit_trigger));

    let client = Client::new(&url);
    let outcome = tokio::select! {
        outcome = scenario(&client, &args, producing) => outcome,
        () = quit.wait() => Err(anyhow::anyhow!("interrupted; nothing was checked")),
    };
    signals.abort();
    daemon_trigger.trigger();
    server.wait().await.context("stopping the demo daemon")?;
    let verdict = outcome?;
    if args.json {
        outln!("{}", serde_json::to_string(&verdict.report)?)?;
    } else {
        outln!("{}", verdict.line)?;
    }
    if verdict.ok {
        Ok(())
    } else {
        bail!("the demo found problems (see the line above)")
    }
}

async fn watch_interrupts(stop_producing: ShutdownTrigger, quit: ShutdownTrigger) {
    let mut count = 0;
    while let Ok(name) = shutdown::os_signal().await {
        count += 1;
        if count == 1 {
            eprintln!(
                "{name}: producing stops now; the children are still checked (again to quit)"
            );
            stop_producing.trigger();
        } else {
            quit.trigger();
            return;
        }
    }
}

/// The demo's conclusion.
struct Verdict {
    ok: bool,
    line: String,
    report: DemoReport,
}

/// What `narad demo --json` prints.
#[derive(Debug, serde::Serialize)]
pub struct DemoReport {
    /// True when every check passed.
    pub ok: bool,
    /// Records acknowledged by the parent.
    pub records: u64,
    /// Per child, what its check found (absent for a child that did not catch up).
    pub children: BTreeMap<String, ChildVerdict>,
    /// Every problem found, one sentence each.
    pub problems: Vec<String>,
}

async fn scenario(
    client: &Client,
    args: &DemoArgs,
    producing: ShutdownSignal,
) -> anyhow::Result<Verdict> {
    let demo_children = children(args.delay);
    let existing = client.list_topics().await?;
    for name in std::iter::once(PARENT).chain(demo_children.iter().map(|c| c.name)) {
        if existing.topics.iter().any(|t| t.name == name) {
            bail!("the data dir already holds topic {name:?}; give the demo a fresh --data-dir");
        }
    }
    // No retention on the parent: a delay child needs the parent to keep records at least
    // delay + 1 h, and the demo's records must all stay for the checks.
    client
        .create_topic(&CreateTopicRequest {
            name: PARENT.into(),
            partitions: PARENT_PARTITIONS,
            retention_ms: None,
            retention_bytes: None,
            placement: None,
        })
        .await
        .context("creating the parent topic")?;
    let mut attach_points = BTreeMap::new();
    let mut kinds = BTreeMap::new();
    for child in &demo_children {
        let link = client
            .attach_child(PARENT, child.name, &child.attach)
            .await
            .with_context(|| format!("attaching {}", child.name))?;
        attach_points.insert(
            child.name.to_owned(),
            link.attach_offsets.unwrap_or_default(),
        );
        kinds.insert(child.name.to_owned(), child.kind.clone());
    }
    let order: Vec<String> = demo_children.iter().map(|c| c.name.to_owned()).collect();
    if !args.json {
        outln!(
            "created {PARENT} ({PARENT_PARTITIONS} partitions) and attached {}; producing {} records/s for {}",
            order.join(", "),
            args.rate,
            format_duration(args.duration)
        )?;
    }

    let mut screen = if args.json {
        Screen::quiet()
    } else {
        Screen::new(std::io::stdout().is_terminal())
    };
    let view = |list: &ChildList| display::rows(list, &order, &attach_points, &kinds);

    // Produce, refreshing the table meanwhile.
    let progress = Arc::new(workload::Progress::default());
    let started = Instant::now();
    let producer = workload::produce(
        client,
        PARENT,
        args.rate,
        args.duration,
        producing,
        Arc::clone(&progress),
    );
    tokio::pin!(producer);
    let mut refresh = tokio::time::interval(REFRESH);
    let acked = loop {
        tokio::select! {
            acked = &mut producer => break acked?,
            _ = refresh.tick() => {
                let list = client.list_children(PARENT).await?;
                let left = args.duration.saturating_sub(started.elapsed());
                let headline = format!(
                    "producing to {PARENT}: {} records ({} /s), {:.0}s left",
                    progress.produced.load(Ordering::Relaxed),
                    args.rate,
                    left.as_secs_f64().ceil()
                );
                screen.show(&headline, &view(&list), false);
            }
        }
    };
    let produced_for = started.elapsed();

    // Wait for every child to copy everything; the delay child until its records are due.
    let deadline = Instant::now() + args.delay + CATCH_UP_GRACE;
    let rows = loop {
        let list = client.list_children(PARENT).await?;
        let rows = view(&list);
        let caught_up = rows.iter().all(|r| r.lag == Some(0));
        let headline = format!(
            "produced {} records in {:.1}s; catching up (retry copies records {} after)",
            acked.len(),
            produced_for.as_secs_f64(),
            format_duration(args.delay)
        );
        if caught_up || Instant::now() >= deadline {
            screen.show(&headline, &rows, true);
            break rows;
        }
        screen.show(&headline, &rows, false);
        tokio::time::sleep(REFRESH).await;
    };

    // Check the parent against the acknowledgements, then every child against the parent.
    let parent = fetch_topic(client, PARENT, PARENT_PARTITIONS).await?;
    let mut problems = verify::check_parent(&acked, &parent, PARENT_PARTITIONS)
        .into_iter()
        .map(|p| format!("{PARENT}: {p}"))
        .collect::<Vec<_>>();
    let mut duplicates = 0;
    let mut verdicts = BTreeMap::new();
    for child in &demo_children {
        let row = rows.iter().find(|r| r.name == child.name);
        if let Some(row) = row.filter(|r| r.lag != Some(0)) {
            problems.push(not_caught_up(row));
            continue;
        }
        let start = attach_points.get(child.name).cloned().unwrap_or_default();
        let from_attach: Vec<Record> = parent
            .iter()
            .filter(|r| r.offset >= start.get(r.partition as usize).copied().unwrap_or(0))
            .cloned()
            .collect();
        let copies = fetch_topic(client, child.name, child.expect.child_partitions).await?;
        let verdict: ChildVerdict = verify::check_child(&from_attach, &copies, &child.expect);
        duplicates += verdict.duplicates;
        verdicts.insert(child.name.to_owned(), verdict.clone());
        if !verdict.ok() {
            problems.push(format!(
                "{}: {} missing, {} misplaced, {} out of order, {} unknown (first: {})",
                child.name,
                verdict.missing,
                verdict.misplaced,
                verdict.order_breaks,
                verdict.unknown,
                verdict.first_problem.as_deref().unwrap_or("-")
            ));
        }
    }
    let line = if problems.is_empty() {
        format!(
            "demo OK: {} records produced to {PARENT}; {} each hold every one ({duplicates} duplicates), per-key order kept, every record in the partition its router must choose",
            acked.len(),
            order.join(", ")
        )
    } else {
        format!("demo FAILED: {}", problems.join("; "))
    };
    Ok(Verdict {
        ok: problems.is_empty(),
        report: DemoReport {
            ok: problems.is_empty(),
            records: acked.len() as u64,
            children: verdicts,
            problems: problems.clone(),
        },
        line,
    })
}

fn not_caught_up(row: &ChildRow) -> String {
    format!(
        "{}: did not catch up in time (lag {}, state {}{})",
        row.name,
        row.lag.map_or_else(|| "unknown".into(), |l| l.to_string()),
        row.state,
        row.last_error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    )
}

/// Every record of every partition of `topic`.
async fn fetch_topic(client: &Client, topic: &str, partitions: u32) -> anyhow::Result<Vec<Record>> {
    let mut out = Vec::new();
    for p in 0..partitions {
        let mut offset = None;
        loop {
            let answer = client
                .fetch(topic, p, offset, Some(10_000), None)
                .await
                .with_context(|| format!("reading {topic} partition {p}"))?;
            out.extend(answer.records.iter().map(|r| Record::from_json(p, r)));
            if answer.next_offset >= answer.high_watermark {
                break;
            }
            offset = Some(answer.next_offset);
        }
    }
    Ok(out)
}
