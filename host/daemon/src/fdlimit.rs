//! The open-file (descriptor) limit: raised from the soft to the hard limit when the daemon
//! starts, and the default HTTP connection cap derived from it.
//!
//! Every HTTP connection, open partition segment and cursor file takes a descriptor. Many
//! systems start services with a soft limit of 1024 (or less) under a hard limit hundreds of
//! times higher; a process may raise its own soft limit up to the hard one without privilege,
//! so the daemon does that first thing and logs both values. The connection cap then leaves
//! the daemon's own files room under that limit (see [`default_max_connections`]).

/// The descriptor limits of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft (effective) limit; `None`: unlimited.
    pub soft: Option<u64>,
    /// The hard limit, the most the soft one may be raised to; `None`: unlimited.
    pub hard: Option<u64>,
}

/// What to raise the soft limit to when the hard limit is "unlimited": Linux refuses an
/// unlimited `RLIMIT_NOFILE` and caps it at `fs.nr_open`, whose default is 1,048,576.
const UNLIMITED_TARGET_FDS: u64 = 1_048_576;

/// Descriptors held back from HTTP connections before the rest is shared: the listener, the
/// data-dir lock, the metastore, logs, plugin module files, the blocking pool's transient
/// files and a margin. 1024 is also the usual soft limit, so a daemon that could not raise its
/// limit still gets the smallest cap ([`MIN_CONNECTIONS`]).
pub(crate) const FD_RESERVE: u64 = 1024;

/// The smallest default connection cap: enough for a handful of producers and consumers and
/// their CLI even on a machine with a tiny descriptor limit.
pub(crate) const MIN_CONNECTIONS: u32 = 64;

/// The largest default connection cap: 16384 connections of hyper's 8 KiB starting read
/// buffer are 128 MiB, about what the default request-body budget allows; more clients than
/// that should be spread over more nodes (or the cap raised by hand).
pub(crate) const MAX_DEFAULT_CONNECTIONS: u32 = 16_384;

/// Reads the current limits.
pub fn current() -> FdLimit {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    FdLimit {
        soft: limit.current,
        hard: limit.maximum,
    }
}

/// Raises the soft descriptor limit to the hard one (or to 1,048,576 when the hard one is
/// unlimited) and returns the limits in force afterwards. Never lowers the limit; when the
/// system refuses (a sandbox, a platform cap), logs a warning and keeps the old limit.
pub fn raise_to_hard() -> FdLimit {
    let before = current();
    let target = before.hard.unwrap_or(UNLIMITED_TARGET_FDS);
    let wants_raise = before.soft.is_some_and(|soft| soft < target);
    if wants_raise {
        let new = rustix::process::Rlimit {
            current: Some(target),
            maximum: before.hard,
        };
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Nofile, new) {
            tracing::warn!(
                soft = before.soft,
                hard = before.hard,
                error = %e,
                "cannot raise the open-file limit to the hard limit; keeping it"
            );
        }
    }
    let after = current();
    tracing::info!(
        soft_before = before.soft,
        hard = before.hard,
        soft_now = after.soft,
        "open-file (descriptor) limit"
    );
    after
}

/// The connection cap of each listener when none is configured: half of what the soft limit
/// leaves after [`FD_RESERVE`] goes to connections (the other half stays for partition logs
/// and cursor files), all of it to the HTTP listener alone, or half each when a Kafka
/// listener runs too (`listeners` = 2), clamped to
/// [`MIN_CONNECTIONS`]..=[`MAX_DEFAULT_CONNECTIONS`].
pub(crate) fn default_max_connections(limit: FdLimit, listeners: u64) -> u32 {
    let share = files_share(limit) / listeners.max(1);
    let capped = share.clamp(
        u64::from(MIN_CONNECTIONS),
        u64::from(MAX_DEFAULT_CONNECTIONS),
    );
    u32::try_from(capped).unwrap_or(MAX_DEFAULT_CONNECTIONS)
}

/// Descriptors one open partition log may hold: its active segment, its high-watermark file,
/// an older segment a read has open, and a cursor file beside it.
pub(crate) const DESCRIPTORS_PER_OPEN_LOG: u64 = 4;

/// The fewest logs kept open at once, whatever the limit.
pub(crate) const MIN_OPEN_LOGS: u64 = 64;

/// Most partition logs open at once: the half of the descriptors beyond [`FD_RESERVE`] that
/// connections do not get, [`DESCRIPTORS_PER_OPEN_LOG`] each. Opening one more closes the
/// least recently used, so a request naming thousands of partitions cannot run the daemon
/// out of descriptors.
pub(crate) fn default_max_open_logs(limit: FdLimit) -> usize {
    let logs = (files_share(limit) / DESCRIPTORS_PER_OPEN_LOG).max(MIN_OPEN_LOGS);
    usize::try_from(logs).unwrap_or(usize::MAX)
}

/// Half of the descriptors beyond [`FD_RESERVE`].
fn files_share(limit: FdLimit) -> u64 {
    limit
        .soft
        .unwrap_or(UNLIMITED_TARGET_FDS)
        .saturating_sub(FD_RESERVE)
        / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft(n: u64) -> FdLimit {
        FdLimit {
            soft: Some(n),
            hard: Some(n),
        }
    }

    #[test]
    fn the_default_cap_leaves_half_of_the_descriptors_beyond_the_reserve_to_files() {
        assert_eq!(default_max_connections(soft(4096), 1), 1536);
        assert_eq!(default_max_connections(soft(1024), 1), MIN_CONNECTIONS);
        assert_eq!(default_max_connections(soft(256), 1), MIN_CONNECTIONS);
        assert_eq!(
            default_max_connections(soft(524_288), 1),
            MAX_DEFAULT_CONNECTIONS
        );
        let unlimited = FdLimit {
            soft: None,
            hard: None,
        };
        assert_eq!(
            default_max_connections(unlimited, 1),
            MAX_DEFAULT_CONNECTIONS
        );
    }

    #[test]
    fn a_kafka_listener_shares_the_connections_half_and_logs_keep_the_other() {
        // 4096 - 1024 = 3072: 1536 for connections, 1536 for files.
        assert_eq!(default_max_connections(soft(4096), 2), 768);
        assert_eq!(default_max_open_logs(soft(4096)), 384);
        // Connections of both listeners and open logs together stay within the limit.
        let limit = soft(20_000);
        let used = 2 * u64::from(default_max_connections(limit, 2))
            + DESCRIPTORS_PER_OPEN_LOG * default_max_open_logs(limit) as u64
            + FD_RESERVE;
        assert!(used <= 20_000, "{used}");
        assert_eq!(default_max_open_logs(soft(1024)), MIN_OPEN_LOGS as usize);
    }

    #[test]
    fn raising_never_lowers_the_soft_limit() {
        let before = current();
        let after = raise_to_hard();
        match (before.soft, after.soft) {
            (Some(b), Some(a)) => assert!(a >= b),
            (None, a) => assert_eq!(a, None),
            (Some(_), None) => {}
        }
        assert_eq!(after.hard, before.hard);
    }
}
