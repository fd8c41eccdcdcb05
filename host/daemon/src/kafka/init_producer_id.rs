//! InitProducerId: ids for idempotent producers (transactions are not offered).
//!
//! Ids come from a counter that starts at the start time in milliseconds shifted left by
//! 20 bits, so a restarted daemon hands out ids above every id of its previous runs (unless
//! the clock went back, or a run handed out more than a million ids per millisecond it
//! lasted): a new producer can never inherit the sequences of an old one. As a Kafka broker
//! does for a producer without a transactional id, every request gets a new id, whatever id
//! and epoch it names: naming another producer's id must not reset that producer's sequence
//! state (its retries would then be written twice). A producer that asks again after a
//! timeout (Kafka 2.5+ does) starts over under its new id.

use std::sync::atomic::{AtomicI64, Ordering};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;

use super::KafkaDeps;

/// Bits left for ids handed out within one millisecond of start time (see the module doc).
const ID_BITS_PER_MS: u32 = 20;

/// The next producer id.
#[derive(Debug)]
pub(crate) struct ProducerIds {
    next: AtomicI64,
}

impl ProducerIds {
    /// Ids starting above those of any earlier run (see the module doc).
    pub(crate) fn from_clock() -> ProducerIds {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
        ProducerIds::starting_at(now_ms.max(0) << ID_BITS_PER_MS)
    }

    /// Ids starting at `first`.
    pub(crate) fn starting_at(first: i64) -> ProducerIds {
        ProducerIds {
            next: AtomicI64::new(first.max(0)),
        }
    }

    /// A fresh id.
    pub(crate) fn next(&self) -> i64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// Answers InitProducerId.
pub(crate) fn handle(deps: &KafkaDeps, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    if request
        .transactional_id
        .as_ref()
        .is_some_and(|id| !id.0.is_empty())
    {
        // Transactions need a transaction coordinator, which narad does not have.
        response.error_code = ResponseError::InvalidRequest.code();
        response.producer_id = ProducerId(-1);
        response.producer_epoch = -1;
        return response;
    }
    response.producer_id = ProducerId(deps.producer_ids.next());
    response.producer_epoch = 0;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_the_clock_are_above_ids_of_a_run_a_millisecond_earlier() {
        let earlier = ProducerIds::starting_at(0);
        for _ in 0..10 {
            earlier.next();
        }
        let now = ProducerIds::from_clock();
        let first = now.next();
        assert!(first > 1 << 40 << ID_BITS_PER_MS, "{first}");
        assert_eq!(now.next(), first + 1);
    }
}
