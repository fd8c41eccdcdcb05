//! `GET /v1/topics/{parent}/children/{child}/gaps`: the gap ledger of a link, per parent
//! partition: every range of parent offsets its cursors moved past without copying, why, when
//! and on which node. In cluster mode the ledgers of the partitions other nodes own are asked
//! of those nodes, concurrently, as the children listing is.

use axum::Json;
use axum::extract::State;
use narad_storage::cursor::gaps::{Gap, OlderGaps};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::topics::require_topic;

/// Ranges listed per parent partition unless the query asks for more: a link of 1,024 parent
/// partitions answers in about 2 MB at most.
pub const DEFAULT_RANGES_PER_PARTITION: usize = 20;

/// `GET .../gaps` query string.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GapsQuery {
    /// Only this node's cursors (what nodes ask each other).
    #[serde(default)]
    pub local: bool,
    /// The newest ranges listed per parent partition: [`DEFAULT_RANGES_PER_PARTITION`] when
    /// absent, at most a ledger's `MAX_GAPS`.
    #[serde(default)]
    pub ranges: Option<usize>,
}

/// One parent partition's ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionGaps {
    /// The parent partition.
    pub partition: u32,
    /// Cluster mode: the node whose cursor holds this ledger (the partition's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Records lost (retention, re-creation), the ranges folded into `older` included: the
    /// count `narad_fanout_child_dropped_messages` shows.
    pub lost: u64,
    /// Records operators' forward seeks skipped (not a loss).
    pub skipped_by_seek: u64,
    /// The newest ranges, oldest of them first (`ranges` of the query at most).
    pub gaps: Vec<Gap>,
    /// Ranges on the ledger not listed here (older than those listed); their records are in
    /// `lost` and `skipped_by_seek`.
    #[serde(default)]
    pub unlisted: usize,
    /// Totals of older ranges no longer listed one by one.
    pub older: OlderGaps,
}

/// The answer: the link's ledgers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkGaps {
    /// The parent topic.
    pub parent: String,
    /// The child topic.
    pub child: String,
    /// Records lost over every partition listed.
    pub lost: u64,
    /// Whether every parent partition answered (a partition whose cursor does not run, or
    /// whose node did not answer, is missing).
    pub complete: bool,
    /// Per parent partition, in order.
    pub partitions: Vec<PartitionGaps>,
}

/// `GET /v1/topics/{parent}/children/{child}/gaps`.
pub async fn list(
    State(state): State<AppState>,
    ApiPath((parent, child)): ApiPath<(String, String)>,
    ApiQuery(query): ApiQuery<GapsQuery>,
) -> Result<Json<LinkGaps>, ApiError> {
    let ranges = query
        .ranges
        .unwrap_or(DEFAULT_RANGES_PER_PARTITION)
        .min(narad_storage::cursor::gaps::MAX_GAPS);
    let topic = require_topic(&state, &parent).await?;
    let snapshot = state.metastore.snapshot().await?;
    if !snapshot
        .links
        .contains_key(&(parent.clone(), child.clone()))
    {
        return Err(ApiError::not_found(format!(
            "{child} is not a child of {parent}"
        )));
    }
    let here = state.cluster.as_ref().map(|c| c.node_id().to_owned());
    let mut partitions: Vec<PartitionGaps> = state
        .fanout
        .gaps(&parent, &child)
        .into_iter()
        .map(|(partition, ledger)| {
            let unlisted = ledger.gaps.len().saturating_sub(ranges);
            PartitionGaps {
                partition,
                node: here.clone(),
                lost: ledger.lost(),
                skipped_by_seek: ledger.skipped_by_seek(),
                gaps: ledger.gaps.get(unlisted..).unwrap_or_default().to_vec(),
                unlisted,
                older: ledger.older,
            }
        })
        .collect();
    if let (Some(cluster), false) = (&state.cluster, query.local) {
        let path = format!("/v1/topics/{parent}/children/{child}/gaps?local=true&ranges={ranges}");
        let answers: Vec<(String, Result<LinkGaps, crate::cluster::PeerError>)> =
            super::internal::ask_other_owners(cluster, &topic, &path).await;
        for (node, answer) in answers {
            match answer {
                Ok(theirs) => partitions.extend(theirs.partitions),
                Err(reason) => {
                    tracing::debug!(%node, %reason, "a node's gap ledgers could not be listed");
                }
            }
        }
    }
    partitions.sort_by_key(|p| p.partition);
    partitions.dedup_by_key(|p| p.partition);
    Ok(Json(LinkGaps {
        lost: partitions.iter().map(|p| p.lost).sum(),
        complete: partitions.len() == topic.partitions as usize,
        parent,
        child,
        partitions,
    }))
}
