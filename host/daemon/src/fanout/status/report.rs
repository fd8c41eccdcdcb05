//! What a cursor's status reports: its state, a halted gap, a remote target's state, and the
//! row the children listing shows.

use serde::{Deserialize, Serialize};

/// What a cursor is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CursorState {
    /// Copying, or idle at the parent's tail.
    Running,
    /// A delay cursor sleeping until its next record is due.
    Waiting,
    /// Retrying after a failure (plugin error, failing child commit, offset file I/O); the
    /// reason is in `last_error` until the cursor is healthy again. A stalled cursor never
    /// skips a record.
    Stalled,
    /// Paused by an operator (`POST .../pause`): its position is on file and it copies
    /// nothing until resumed; its lag keeps counting.
    Paused,
    /// Stopped before records it has not copied that aged out of the parent, on a link with
    /// `on_gap: halt`: `halted_gap` names them. It skips nothing until an operator accepts the
    /// loss (`resume --accept-gap`) or moves it (pause, seek).
    Halted,
    /// No report (only in a listing): the node that runs this cursor did not answer, or no
    /// cursor runs for the partition now (its parent partition is quarantined, has no live
    /// owner, or its cursor is starting); `last_error` says which.
    Unknown,
}

/// The records a halted cursor would lose: parent offsets `[from, to)`, gone from the parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltedGap {
    /// The cursor's position.
    pub from: u64,
    /// The parent's oldest record when the cursor last looked.
    pub to: u64,
}

/// How a remote child's cursor is doing, as its listing names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteState {
    /// Delivering, idle at the tail, waiting for a delayed record, or paused.
    Running,
    /// Stalled on a target that does not answer, fails (5xx) or sheds load (429): retried.
    Retrying,
    /// Stalled on a refusal (401/403, the topic gone, a record refused): retried every
    /// back-off, never skipped, until the target's side is fixed.
    Failed,
}

impl CursorReport {
    /// The listing's row for parent partition `partition` when no cursor reported it:
    /// state [`CursorState::Unknown`], `reason` in `last_error`, `node` the parent partition's
    /// owner when known.
    pub fn unknown(partition: u32, node: Option<String>, reason: String) -> CursorReport {
        CursorReport {
            partition,
            next_offset: None,
            lag_messages: None,
            due_lag_seconds: 0.0,
            dropped_messages: 0,
            parent_end_rewinds: 0,
            skipped_by_seek: 0,
            dead_lettered: 0,
            state: CursorState::Unknown,
            halted_gap: None,
            last_error: Some(reason),
            last_error_at_ms: None,
            previous_error: None,
            previous_error_at_ms: None,
            last_progress_at_ms: None,
            node,
            refused: false,
            remote_state: None,
            recovery_point: None,
        }
    }

    /// Fills the remote child's fields ([`CursorReport::remote_state`],
    /// [`CursorReport::recovery_point`]) from the cursor's state.
    pub(crate) fn mark_remote(&mut self) {
        self.remote_state = Some(match (self.state, self.refused) {
            (CursorState::Stalled, true) => RemoteState::Failed,
            (CursorState::Stalled, false) => RemoteState::Retrying,
            _ => RemoteState::Running,
        });
        self.recovery_point = self.next_offset;
    }
}

/// One cursor's figures, as the children listing reports them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CursorReport {
    /// Parent partition.
    pub partition: u32,
    /// First parent offset not yet committed to the child (`None` before the cursor has
    /// resolved its start).
    pub next_offset: Option<u64>,
    /// Parent high watermark minus `next_offset`.
    pub lag_messages: Option<u64>,
    /// Seconds the oldest due, uncopied record has waited past its due time.
    pub due_lag_seconds: f64,
    /// Records skipped because they aged out of the parent before being copied.
    pub dropped_messages: u64,
    /// Times this cursor found its position past the parent's high watermark (the parent lost
    /// records the cursor had already copied, such as a torn tail cut at start-up) and moved
    /// back to the parent's end, so records written again at those offsets are copied too.
    #[serde(default)]
    pub parent_end_rewinds: u64,
    /// Records operators' forward seeks skipped on purpose (not dropped).
    #[serde(default)]
    pub skipped_by_seek: u64,
    /// Records the router chain could not route that went to the link's dead-letter topic
    /// (since this cursor started).
    #[serde(default)]
    pub dead_lettered: u64,
    /// Running, waiting, stalled, paused or halted.
    pub state: CursorState,
    /// A halted cursor: the parent offsets it would lose by going on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_gap: Option<HaltedGap>,
    /// Why the cursor is stalled now; `None` once it is healthy again. Escaped and cut to
    /// [`MAX_ERROR_TEXT_BYTES`](crate::fanout::status::MAX_ERROR_TEXT_BYTES).
    pub last_error: Option<String>,
    /// When `last_error` was last recorded (Unix ms, this node's clock).
    #[serde(default)]
    pub last_error_at_ms: Option<i64>,
    /// The last error of the most recent trouble the cursor recovered from.
    #[serde(default)]
    pub previous_error: Option<String>,
    /// When `previous_error` was last recorded (Unix ms, this node's clock).
    #[serde(default)]
    pub previous_error_at_ms: Option<i64>,
    /// When the cursor's position last moved, or it last found nothing to copy (Unix ms, the
    /// node's clock).
    #[serde(default)]
    pub last_progress_at_ms: Option<i64>,
    /// Cluster mode: the node that runs this cursor (the parent partition's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The stall is a refusal by a remote child's target (its token, its topic gone, a record
    /// it will not take) that only a change there, or of the link, can lift.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
    /// A remote child: `running`, `retrying` (stalled, the target away or overloaded) or
    /// `failed` (stalled on a refusal); absent for a local child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_state: Option<RemoteState>,
    /// A remote child: the offset a restart would resume from (the offset file's position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_point: Option<u64>,
}
