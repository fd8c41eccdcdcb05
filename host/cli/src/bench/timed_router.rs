//! A [`SlabRouter`] wrapper that times the router it wraps, so the bench can say what share
//! of slab time routing takes without touching the cursor.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use narad_storage::StoredRecord;

use narad_host::fanout::route::{RouteFailure, RouteInput, SlabRouter};

/// Time spent routing, summed over every slab of the routers sharing it.
#[derive(Debug, Default)]
pub struct RouteTiming {
    nanos: AtomicU64,
    slabs: AtomicU64,
    records: AtomicU64,
}

impl RouteTiming {
    /// Total time inside the wrapped routers.
    pub fn time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Slabs routed (successfully or not).
    pub fn slabs(&self) -> u64 {
        self.slabs.load(Ordering::Relaxed)
    }

    /// Records in those slabs.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }
}

/// Routes through `inner` and adds the time each call took to a shared [`RouteTiming`].
pub struct TimedRouter {
    inner: Box<dyn SlabRouter>,
    timing: Arc<RouteTiming>,
}

impl TimedRouter {
    /// Wraps `inner`, adding its time to `timing`.
    pub fn new(inner: Box<dyn SlabRouter>, timing: Arc<RouteTiming>) -> TimedRouter {
        TimedRouter { inner, timing }
    }
}

impl SlabRouter for TimedRouter {
    fn route(
        &mut self,
        input: &RouteInput,
        records: &[StoredRecord],
    ) -> Result<Vec<u32>, RouteFailure> {
        let start = Instant::now();
        let result = self.inner.route(input, records);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.timing.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.timing.slabs.fetch_add(1, Ordering::Relaxed);
        self.timing
            .records
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slow;

    impl SlabRouter for Slow {
        fn route(
            &mut self,
            _input: &RouteInput,
            records: &[StoredRecord],
        ) -> Result<Vec<u32>, RouteFailure> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(vec![0; records.len()])
        }
    }

    fn record(offset: u64) -> StoredRecord {
        StoredRecord {
            offset,
            committed_at_ms: 0,
            key: None,
            headers: Vec::new(),
            value: bytes::Bytes::from_static(b"v"),
            origin: None,
        }
    }

    #[test]
    fn the_wrapped_routers_answer_and_time_are_kept() {
        let timing = Arc::new(RouteTiming::default());
        let mut router = TimedRouter::new(Box::new(Slow), Arc::clone(&timing));
        let input = RouteInput {
            parent_topic: "p".into(),
            parent_partition: 0,
            parent_partition_count: 1,
            child_topic: "c".into(),
            child_partition_count: 1,
            attempt: 0,
            config: Vec::new(),
        };
        let decisions = router.route(&input, &[record(0), record(1)]).unwrap();
        assert_eq!(decisions, vec![0, 0]);
        assert_eq!(timing.slabs(), 1);
        assert_eq!(timing.records(), 2);
        assert!(timing.time() >= Duration::from_millis(20));
    }
}
