//! How often a stalled cursor logs its stall: at once when the reason changes (a new stall, or
//! another failure), then at most once per [`STALL_LOG_EVERY`] while the same reason repeats,
//! saying how many tries went unlogged. A cursor retrying every second used to log every try
//! for as long as the stall lasted; the listing and `/metrics` still show every try.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Longest quiet between two log lines of the same stall.
pub(crate) const STALL_LOG_EVERY: Duration = Duration::from_secs(60);

/// The last stall line one cursor logged.
#[derive(Debug, Default)]
pub(crate) struct StallLog {
    last: Mutex<Option<Logged>>,
}

#[derive(Debug)]
struct Logged {
    reason: String,
    at: Instant,
    unlogged: u64,
}

impl StallLog {
    /// Whether a failed try with `reason`, at `now`, is logged: `Some(n)` with the tries not
    /// logged since the last line, `None` to stay quiet (the try is counted).
    pub(crate) fn admit(&self, reason: &str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match last.as_mut() {
            Some(logged)
                if logged.reason == reason
                    && now.saturating_duration_since(logged.at) < STALL_LOG_EVERY =>
            {
                logged.unlogged += 1;
                None
            }
            _ => {
                let unlogged = last.as_ref().map_or(0, |l| l.unlogged);
                *last = Some(Logged {
                    reason: reason.to_owned(),
                    at: now,
                    unlogged: 0,
                });
                Some(unlogged)
            }
        }
    }

    /// The cursor moved again: the next failure starts a new stall and is logged at once.
    pub(crate) fn reset(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_stall_logs_once_a_minute_and_a_new_reason_or_a_recovery_at_once() {
        let log = StallLog::default();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(log.admit("owner n3 down", at(0)), Some(0));
        for s in 1..60 {
            assert_eq!(log.admit("owner n3 down", at(s)), None, "try at {s} s");
        }
        // A minute on: logged again, with the 59 tries in between.
        assert_eq!(log.admit("owner n3 down", at(60)), Some(59));
        assert_eq!(log.admit("owner n3 down", at(61)), None);
        // Another reason is news.
        assert_eq!(log.admit("owner n3 refused", at(62)), Some(1));
        // After the cursor moved again, the next failure is a new stall.
        log.reset();
        assert_eq!(log.admit("owner n3 refused", at(63)), Some(0));
    }
}
