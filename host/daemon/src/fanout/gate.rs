//! The delay gate: a delay child copies only records committed at least `delay` ago on this
//! node's clock, and sleeps, rather than polls, until the next one is due.

use std::time::Duration;

/// The newest commit time a delay child may copy at `now_ms`: `now - delay`. `None` for a
/// child without delay (every record is due).
pub(crate) fn max_committed_at(now_ms: i64, delay_ms: u64) -> Option<i64> {
    if delay_ms == 0 {
        return None;
    }
    Some(now_ms.saturating_sub(i64::try_from(delay_ms).unwrap_or(i64::MAX)))
}

/// How long to sleep before a record committed at `committed_at_ms` is due, at most
/// `max_sleep` (the cursor's [`super::FanoutTiming::delay_max_sleep`], by default
/// [`super::DELAY_MAX_SLEEP`]). Zero when it is already due.
///
/// The record is due when `now - delay >= committed_at`, i.e. at `committed_at + delay`. The
/// caller re-checks the gate after waking, so a clock that stepped back while it slept makes it
/// sleep again rather than deliver early.
pub(crate) fn sleep_until_due(
    committed_at_ms: i64,
    delay_ms: u64,
    now_ms: i64,
    max_sleep: Duration,
) -> Duration {
    let due_at = committed_at_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
    let wait_ms = due_at.saturating_sub(now_ms);
    if wait_ms <= 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(u64::try_from(wait_ms).unwrap_or(u64::MAX)).min(max_sleep)
}

/// How far behind the due frontier a cursor runs, in seconds: the age past its due time of the
/// oldest record it has not copied (`committed_at + delay`), or 0 when nothing due is waiting.
pub(crate) fn due_lag_seconds(
    oldest_pending_committed_at_ms: Option<i64>,
    delay_ms: u64,
    now_ms: i64,
) -> f64 {
    match oldest_pending_committed_at_ms {
        None => 0.0,
        Some(committed_at) => {
            let due_at = committed_at.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
            (now_ms.saturating_sub(due_at)).max(0) as f64 / 1000.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::DELAY_MAX_SLEEP;

    const HOUR_MS: u64 = 3_600_000;

    #[test]
    fn a_child_without_delay_has_no_gate() {
        assert_eq!(max_committed_at(1_000, 0), None);
    }

    #[test]
    fn the_gate_stands_at_now_minus_the_delay() {
        // 13:00:00.5 with a one-hour delay: the gate is 12:00:00.5.
        let now = 13 * HOUR_MS as i64 + 500;
        assert_eq!(
            max_committed_at(now, HOUR_MS),
            Some(12 * HOUR_MS as i64 + 500)
        );
    }

    #[test]
    fn the_cursor_sleeps_until_the_first_record_not_due_becomes_due() {
        // r2 committed at 12:00:01, now 13:00:00.5: due in 0.5 s.
        let now = 13 * HOUR_MS as i64 + 500;
        let r2 = 12 * HOUR_MS as i64 + 1_000;
        assert_eq!(
            sleep_until_due(r2, HOUR_MS, now, DELAY_MAX_SLEEP),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn the_sleep_is_capped_at_thirty_seconds() {
        assert_eq!(
            sleep_until_due(10_000, HOUR_MS, 0, DELAY_MAX_SLEEP),
            DELAY_MAX_SLEEP
        );
        // A cursor given a shorter cap (tests) wakes that often to look at the gate again.
        let cap = Duration::from_millis(5);
        assert_eq!(sleep_until_due(10_000, HOUR_MS, 0, cap), cap);
    }

    #[test]
    fn a_due_record_needs_no_sleep() {
        assert_eq!(
            sleep_until_due(0, 1_000, 1_000, DELAY_MAX_SLEEP),
            Duration::ZERO
        );
        assert_eq!(
            sleep_until_due(0, 1_000, 5_000, DELAY_MAX_SLEEP),
            Duration::ZERO
        );
    }

    #[test]
    fn due_lag_counts_only_time_past_the_due_moment() {
        assert_eq!(due_lag_seconds(None, 1_000, 50_000), 0.0);
        assert_eq!(due_lag_seconds(Some(10_000), 1_000, 50_000), 39.0);
        assert_eq!(due_lag_seconds(Some(49_500), 1_000, 50_000), 0.0);
    }
}
