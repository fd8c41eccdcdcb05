//! Progress lines on a terminal: rewritten in place on stderr, a few times a second, and
//! nothing at all when stderr is not a terminal (piped or in tests), so output stays clean.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

/// Shortest pause between two progress lines.
const REFRESH_INTERVAL: Duration = Duration::from_millis(200);

/// A progress line on stderr, or nothing.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// Shows progress only if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Progress {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
            last: None,
            shown: false,
        }
    }

    /// Progress that never prints.
    pub fn silent() -> Progress {
        Progress::new(false)
    }

    /// Shows `line()` if enough time passed since the last line (`line` is not called
    /// otherwise).
    pub fn update(&mut self, line: impl FnOnce() -> String) {
        if !self.enabled || self.last.is_some_and(|t| t.elapsed() < REFRESH_INTERVAL) {
            return;
        }
        self.last = Some(Instant::now());
        self.shown = true;
        // Progress is best effort: a failed write to the terminal must not fail the bench.
        let _ = write!(std::io::stderr(), "\r{}\x1b[K", line());
    }

    /// Prints `line` as a finished step on its own line (terminal only).
    pub fn step(&mut self, line: &str) {
        if !self.enabled {
            return;
        }
        let _ = writeln!(std::io::stderr(), "\r{line}\x1b[K");
        self.shown = false;
        self.last = None;
    }

    /// Ends the current progress line, if one is showing.
    pub fn finish(&mut self) {
        if self.enabled && self.shown {
            let _ = writeln!(std::io::stderr());
        }
        self.shown = false;
        self.last = None;
    }
}
