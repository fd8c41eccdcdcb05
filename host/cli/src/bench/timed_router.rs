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
    /// CPU time of the routing threads inside the routers: unlike the wall time, it does not
    /// count the time a routing thread waited for a core while others ran.
    cpu_nanos: AtomicU64,
    /// Whether every call could read its thread's CPU time.
    cpu_known: AtomicU64,
    slabs: AtomicU64,
    records: AtomicU64,
}

impl RouteTiming {
    /// Total time inside the wrapped routers.
    pub fn time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// CPU time inside the wrapped routers, or `None` where a thread's CPU time cannot be
    /// read.
    pub fn cpu_time(&self) -> Option<Duration> {
        (self.cpu_known.load(Ordering::Relaxed) == self.slabs())
            .then(|| Duration::from_nanos(self.cpu_nanos.load(Ordering::Relaxed)))
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
        // CPU readings inside the wall-clock ones: a thread's CPU time never exceeds its wall
        // time over the same span.
        let start = Instant::now();
        let cpu_start = thread_cpu_ns();
        let result = self.inner.route(input, records);
        let cpu_end = thread_cpu_ns();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // The router runs on this thread from start to end, so its CPU time is this thread's.
        if let (Some(from), Some(to)) = (cpu_start, cpu_end) {
            self.timing
                .cpu_nanos
                .fetch_add(to.saturating_sub(from), Ordering::Relaxed);
            self.timing.cpu_known.fetch_add(1, Ordering::Relaxed);
        }
        self.timing.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.timing.slabs.fetch_add(1, Ordering::Relaxed);
        self.timing
            .records
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        result
    }
}

/// The calling thread's CPU time, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, exact at the
/// moment of the call, unlike `/proc`'s tick-updated figures).
fn thread_cpu_ns() -> Option<u64> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u64::try_from(t.tv_nsec).ok()?;
    Some(secs * 1_000_000_000 + nanos)
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
            value: Some(bytes::Bytes::from_static(b"v")),
            origin: None,
        }
    }

    /// A route input for one parent and one child partition.
    fn input() -> RouteInput {
        RouteInput {
            parent_topic: "p".into(),
            parent_partition: 0,
            parent_partition_count: 1,
            child_topic: "c".into(),
            child_partition_count: 1,
            attempt: 0,
            config: Vec::new(),
        }
    }

    #[test]
    fn the_wrapped_routers_answer_and_time_are_kept() {
        let timing = Arc::new(RouteTiming::default());
        let mut router = TimedRouter::new(Box::new(Slow), Arc::clone(&timing));
        let input = input();
        let decisions = router.route(&input, &[record(0), record(1)]).unwrap();
        assert_eq!(decisions, vec![0, 0]);
        assert_eq!(timing.slabs(), 1);
        assert_eq!(timing.records(), 2);
        assert!(timing.time() >= Duration::from_millis(20));
        // Sleeping is not routing work: the CPU time is a small part of the wall time.
        let cpu = timing.cpu_time().expect("a thread CPU clock");
        assert!(cpu < Duration::from_millis(10), "{cpu:?}");
    }

    struct Busy;

    impl SlabRouter for Busy {
        fn route(
            &mut self,
            _input: &RouteInput,
            records: &[StoredRecord],
        ) -> Result<Vec<u32>, RouteFailure> {
            let until = Instant::now() + Duration::from_millis(30);
            let mut spins = 0u64;
            while Instant::now() < until {
                spins = std::hint::black_box(spins + 1);
            }
            Ok(vec![0; records.len()])
        }
    }

    #[test]
    fn a_router_busy_on_its_thread_is_counted_in_cpu_time() {
        let timing = Arc::new(RouteTiming::default());
        let mut router = TimedRouter::new(Box::new(Busy), Arc::clone(&timing));
        let input = input();
        router.route(&input, &[record(0)]).unwrap();
        let cpu = timing.cpu_time().expect("a thread CPU clock");
        assert!(
            cpu > Duration::ZERO && cpu <= timing.time(),
            "{cpu:?} of {:?}",
            timing.time()
        );
    }
}
