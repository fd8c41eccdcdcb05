//! Why a cursor stops: told to, its link gone, its start deferred, or (inside the cursor
//! only) paused while stalled.

use super::position::Deferred;
use crate::metastore::link::BadEpoch;

/// Why a cursor stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorExit {
    /// Told to stop (detach, shutdown, ownership moved).
    Stopped,
    /// Its epoch is no longer the link's; the reconciler starts the right cursor.
    LinkGone(LinkGone),
    /// Its start could not be confirmed against the metastore; retried on a later tick.
    Deferred(Deferred),
    /// Paused by an operator while stalled on a slab: the slab is dropped (nothing of it is
    /// on file) and the cursor waits paused, where it can be sought past the slab. Handled
    /// inside the cursor; [`run_cursor`](crate::fanout::cursor::run_cursor) never returns it.
    PausedWhileStalled,
}

impl std::fmt::Display for CursorExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CursorExit::Stopped => f.write_str("stopped"),
            CursorExit::LinkGone(gone) => write!(f, "link gone: {gone}"),
            CursorExit::Deferred(why) => write!(f, "start deferred: {why}"),
            CursorExit::PausedWhileStalled => f.write_str("paused while stalled"),
        }
    }
}

/// Why a cursor's link is no longer the one it serves. The `Display` text is what the cursor's
/// exit says.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkGone {
    /// Before routing a slab, the metastore no longer had the cursor's epoch as the link's,
    /// or no longer had the link's parent or child topic: the link was detached, re-attached
    /// or a topic deleted.
    #[error("{parent} -> {child} was detached or re-attached")]
    DetachedOrReattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The link's metadata, swapped in by the reconciler, carries another attach epoch than
    /// the cursor's.
    #[error("{parent} -> {child} was re-attached")]
    Reattached {
        /// Parent topic.
        parent: String,
        /// Child topic.
        child: String,
    },
    /// The cursor's own epoch is not a valid epoch, so no link can be its.
    #[error(transparent)]
    BadEpoch(#[from] BadEpoch),
}
