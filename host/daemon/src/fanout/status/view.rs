//! [`FanoutView`]: every running cursor's status on this node, by link.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use narad_storage::cursor::gaps::GapLedger;

use crate::fanout::CursorKey;

use super::{CursorReport, CursorStatus};

/// The statuses of one link's cursors, by parent partition.
type LinkCursors = BTreeMap<u32, Arc<CursorStatus>>;

/// Live fan-out state this node exposes: per link, its cursors' reports.
///
/// The reconciler writes it (a cursor's status goes in when the cursor starts and out when it
/// stops or exits); the API only reads it, through [`FanoutView::reports`].
#[derive(Default)]
pub struct FanoutView {
    cursors: Mutex<BTreeMap<(String, String), LinkCursors>>,
    shadows: crate::fanout::shadow::ShadowBoard,
}

impl FanoutView {
    /// The shadows running on this node (the reconciler lists them, the API reads reports).
    pub fn shadows(&self) -> &crate::fanout::shadow::ShadowBoard {
        &self.shadows
    }

    /// Refreshes the lag series of every cursor on this node ([`CursorStatus::refresh`]),
    /// with each parent partition's high watermark from `high_watermark` (which must not
    /// open a log: `Store::peek`).
    pub(crate) fn refresh_lags(
        &self,
        high_watermark: impl Fn(&str, u32) -> Option<u64>,
        now_ms: i64,
        no_progress_after: std::time::Duration,
    ) {
        let statuses: Vec<(String, u32, Arc<CursorStatus>)> = {
            let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
            cursors
                .iter()
                .flat_map(|((parent, _), by_partition)| {
                    by_partition
                        .iter()
                        .map(|(p, s)| (parent.clone(), *p, Arc::clone(s)))
                })
                .collect()
        };
        for (parent, partition, status) in statuses {
            status.refresh(
                high_watermark(&parent, partition),
                now_ms,
                no_progress_after,
            );
        }
    }

    /// Reports of the cursors running for `parent -> child`, by parent partition.
    pub fn reports(&self, parent: &str, child: &str) -> Vec<CursorReport> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .map(|by_partition| by_partition.values().map(|s| s.report()).collect())
            .unwrap_or_default()
    }

    /// The gap ledgers of the cursors running for `parent -> child`, by parent partition (a
    /// cursor that has not read its ledger yet is left out).
    pub fn gaps(&self, parent: &str, child: &str) -> Vec<(u32, Arc<GapLedger>)> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .map(|by_partition| {
                by_partition
                    .iter()
                    .filter_map(|(p, s)| Some((*p, s.gaps()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many cursors (of any link) read parent partition `partition` of `parent` now. A
    /// cursor leaves the view only after its task has ended, so 0 means none is running.
    pub(crate) fn running_on(&self, parent: &str, partition: u32) -> usize {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .iter()
            .filter(|((p, _), by_partition)| p == parent && by_partition.contains_key(&partition))
            .count()
    }

    /// The status of the cursor of `parent -> child` on parent partition `partition`, if one
    /// runs here.
    pub fn status(&self, parent: &str, child: &str, partition: u32) -> Option<Arc<CursorStatus>> {
        let cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .get(&(parent.to_string(), child.to_string()))
            .and_then(|by_partition| by_partition.get(&partition).cloned())
    }

    /// Lists the cursor `key` with its `status`, replacing any status listed for the same
    /// link and parent partition.
    pub fn insert(&self, key: &CursorKey, status: Arc<CursorStatus>) {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        cursors
            .entry((key.parent.clone(), key.child.clone()))
            .or_default()
            .insert(key.partition, status);
    }

    /// Stops listing the cursor of `key`'s link and parent partition; a link left with no
    /// cursor disappears from the view.
    pub fn remove(&self, key: &CursorKey) {
        let mut cursors = self.cursors.lock().unwrap_or_else(PoisonError::into_inner);
        let link = (key.parent.clone(), key.child.clone());
        if let Some(by_partition) = cursors.get_mut(&link) {
            by_partition.remove(&key.partition);
            if by_partition.is_empty() {
                cursors.remove(&link);
            }
        }
    }
}
