//! The demo's live view: per child, records copied, lag, due lag, dropped and state. On a
//! terminal the table is redrawn in place; otherwise (piped, CI) a plain line is printed every
//! few seconds.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::cli::table;
use narad_host::api::children::ChildList;
use narad_host::fanout::status::CursorState;

/// Widest line drawn on a terminal: a wrapped line would throw the in-place redraw off, so
/// longer lines (a long stall reason) are cut; the verdict still says everything.
pub const TERMINAL_LINE_CHARS: usize = 79;

/// How often plain (non-terminal) output prints a progress line.
pub const PLAIN_EVERY: Duration = Duration::from_secs(2);

/// One child's figures, summed over its parent partitions.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildRow {
    /// Child topic.
    pub name: String,
    /// What kind of child it is (its router or delay), for the table.
    pub kind: String,
    /// Parent records committed to the child since the attach.
    pub copied: u64,
    /// Records not yet copied; `None` while some partition's lag is unknown.
    pub lag: Option<u64>,
    /// Largest due lag over the partitions, in seconds.
    pub due_lag_seconds: f64,
    /// Records dropped (aged out of the parent first).
    pub dropped: u64,
    /// `stalled` if any cursor is, else `waiting` if any is, else `running`; `starting`
    /// before the cursors report.
    pub state: String,
    /// The error of a stalled cursor.
    pub last_error: Option<String>,
}

/// Sums a children listing into rows, in `order`; `attach` holds each child's attach point
/// and `kinds` its description.
pub fn rows(
    list: &ChildList,
    order: &[String],
    attach: &BTreeMap<String, Vec<u64>>,
    kinds: &BTreeMap<String, String>,
) -> Vec<ChildRow> {
    order
        .iter()
        .map(|name| {
            let child = list.children.iter().find(|c| &c.name == name);
            let start = attach.get(name);
            let mut row = ChildRow {
                name: name.clone(),
                kind: kinds.get(name).cloned().unwrap_or_default(),
                copied: 0,
                lag: child.filter(|c| c.lag_complete).map(|_| 0),
                due_lag_seconds: 0.0,
                dropped: 0,
                state: "starting".into(),
                last_error: None,
            };
            let Some(child) = child else {
                row.state = "detached".into();
                return row;
            };
            let mut state = None;
            for p in &child.partitions {
                let from = start
                    .and_then(|s| s.get(p.partition as usize))
                    .copied()
                    .unwrap_or(0);
                row.copied += p.next_offset.unwrap_or(from).saturating_sub(from);
                row.lag = match (row.lag, p.lag_messages) {
                    (Some(sum), Some(lag)) => Some(sum + lag),
                    _ => None,
                };
                row.due_lag_seconds = row.due_lag_seconds.max(p.due_lag_seconds);
                row.dropped += p.dropped_messages;
                state = Some(match (state, p.state) {
                    // Halted waits for an operator: it outranks a stall, which retries.
                    (_, CursorState::Halted) | (Some(CursorState::Halted), _) => {
                        row.last_error = p.last_error.clone().or(row.last_error.take());
                        CursorState::Halted
                    }
                    (_, CursorState::Stalled) | (Some(CursorState::Stalled), _) => {
                        row.last_error = p.last_error.clone().or(row.last_error.take());
                        CursorState::Stalled
                    }
                    (_, CursorState::Unknown) | (Some(CursorState::Unknown), _) => {
                        row.last_error = p.last_error.clone().or(row.last_error.take());
                        CursorState::Unknown
                    }
                    (_, CursorState::Waiting) | (Some(CursorState::Waiting), _) => {
                        CursorState::Waiting
                    }
                    _ => CursorState::Running,
                });
            }
            if let Some(s) = state {
                row.state = match s {
                    CursorState::Running => "running",
                    CursorState::Waiting => "waiting",
                    CursorState::Stalled => "stalled",
                    CursorState::Paused => "paused",
                    CursorState::Halted => "halted",
                    CursorState::Unknown => "unknown",
                }
                .into();
            }
            row
        })
        .collect()
}

/// Renders rows as the table.
pub fn render(rows: &[ChildRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.kind.clone(),
                r.copied.to_string(),
                r.lag.map_or_else(|| "?".into(), |l| l.to_string()),
                format!("{:.1}s", r.due_lag_seconds),
                r.dropped.to_string(),
                match &r.last_error {
                    Some(e) if r.state == "stalled" || r.state == "unknown" => {
                        format!("{}: {e}", r.state)
                    }
                    _ => r.state.clone(),
                },
            ]
        })
        .collect();
    table::render(
        &[
            "CHILD", "ROUTER", "COPIED", "LAG", "DUE LAG", "DROPPED", "STATE",
        ],
        &cells,
    )
}

/// Where the view goes.
#[derive(Debug)]
pub struct Screen {
    quiet: bool,
    terminal: bool,
    drawn_lines: usize,
    last_plain: Option<Instant>,
    started: Instant,
}

impl Screen {
    /// A view that redraws in place when `terminal`, else prints plain lines.
    pub fn new(terminal: bool) -> Screen {
        Screen {
            quiet: false,
            terminal,
            drawn_lines: 0,
            last_plain: None,
            started: Instant::now(),
        }
    }

    /// A view that shows nothing (`narad demo --json`).
    pub fn quiet() -> Screen {
        Screen {
            quiet: true,
            ..Screen::new(false)
        }
    }

    /// Shows `headline` and the rows (on a terminal, over the previous drawing; otherwise at
    /// most every [`PLAIN_EVERY`] unless `force`).
    pub fn show(&mut self, headline: &str, rows: &[ChildRow], force: bool) {
        if self.quiet {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.terminal {
            let text = format!("{headline}\n{}", render(rows));
            // Move to the start of the previous drawing, then overwrite it line by line.
            if self.drawn_lines > 0 {
                let _ = write!(out, "\x1b[{}F", self.drawn_lines);
            }
            for line in text.lines() {
                let _ = writeln!(out, "\x1b[2K{}", clip(line, TERMINAL_LINE_CHARS));
            }
            self.drawn_lines = text.lines().count();
        } else {
            let due = self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
            if !(due || force) {
                return;
            }
            self.last_plain = Some(Instant::now());
            let children: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{} copied={} lag={} due_lag={:.1}s dropped={} {}",
                        r.name,
                        r.copied,
                        r.lag.map_or_else(|| "?".into(), |l| l.to_string()),
                        r.due_lag_seconds,
                        r.dropped,
                        r.state
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "[{:>5.1}s] {headline} | {}",
                self.started.elapsed().as_secs_f64(),
                children.join(" | ")
            );
        }
        let _ = out.flush();
    }
}

/// `line` cut to `max` characters, the last one an ellipsis when cut.
fn clip(line: &str, max: usize) -> String {
    if line.chars().count() <= max {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_host::api::children::{ChildInfo, ChildPartition};

    fn partition(p: u32, next: u64, lag: u64, state: CursorState) -> ChildPartition {
        ChildPartition {
            partition: p,
            next_offset: Some(next),
            lag_messages: Some(lag),
            due_lag_seconds: f64::from(p),
            dropped_messages: 1,
            state,
            halted_gap: None,
            last_error: (state == CursorState::Stalled).then(|| "plugin trapped".to_owned()),
            parent_end_rewinds: 0,
            skipped_by_seek: 0,
            dead_lettered: 0,
            last_error_at_ms: None,
            previous_error: None,
            previous_error_at_ms: None,
            last_progress_at_ms: None,
            node: None,
            refused: false,
            remote_state: None,
            recovery_point: None,
        }
    }

    #[test]
    fn long_lines_are_clipped_to_the_width_and_short_ones_kept() {
        assert_eq!(clip("abc", 5), "abc");
        assert_eq!(clip("abcdefgh", 5), "abcd…");
        assert_eq!(clip("abcdefgh", 5).chars().count(), 5);
    }

    #[test]
    fn rows_sum_partitions_from_the_attach_point_and_the_worst_state_wins() {
        let list = ChildList {
            children: vec![ChildInfo {
                name: "a".into(),
                delay_ms: 0,
                router: vec![],
                config: String::new(),
                attach_epoch: "e".into(),
                paused: Vec::new(),
                lag_complete: true,
                partitions: vec![
                    partition(0, 15, 2, CursorState::Running),
                    partition(1, 30, 3, CursorState::Stalled),
                ],
                remote: None,
                on_gap: Default::default(),
                dead_letter: None,
            }],
        };
        let attach = BTreeMap::from([("a".to_owned(), vec![5, 10])]);
        let order = vec!["a".to_owned(), "gone".to_owned()];
        let r = rows(&list, &order, &attach, &BTreeMap::new());
        assert_eq!(r[0].copied, 10 + 20);
        assert_eq!(r[0].lag, Some(5));
        assert_eq!(r[0].dropped, 2);
        assert_eq!(r[0].due_lag_seconds, 1.0);
        assert_eq!(r[0].state, "stalled");
        assert_eq!(r[0].last_error.as_deref(), Some("plugin trapped"));
        assert_eq!(r[1].state, "detached");
        assert!(render(&r).contains("stalled: plugin trapped"));
    }
}
