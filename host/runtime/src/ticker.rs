//! The one epoch ticker thread of a runtime.
//!
//! Every call gets an epoch deadline (`set_epoch_deadline`) as a wall-clock backstop; epochs
//! only advance if someone increments them, which is this thread's whole job. It holds a weak
//! reference to the engine and stops when told to (the runtime dropped) or when the engine is
//! gone, so it never keeps an engine alive nor outlives it by more than one tick.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the epoch advances: 5 ms, so a 100 ms deadline is enforced within 5 % and the
/// thread costs 200 wake-ups a second, nothing on a 2-core machine.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Owns the ticker thread; dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct EpochTicker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts ticking `engine`'s epoch every [`EPOCH_TICK`].
    pub(crate) fn start(engine: &wasmtime::Engine) -> std::io::Result<Self> {
        let weak = engine.weak();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("narad-epoch-ticker".into())
            .spawn(move || {
                loop {
                    match stopped.recv_timeout(EPOCH_TICK) {
                        Err(RecvTimeoutError::Timeout) => match weak.upgrade() {
                            Some(engine) => engine.increment_epoch(),
                            None => return,
                        },
                        // Told to stop, or the runtime (the sender) is gone.
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(EpochTicker {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        // Dropping the sender disconnects the channel; the thread wakes at once and returns.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only ever returns; a join error would mean it panicked, which there
            // is nothing to do about during drop.
            let _ = thread.join();
        }
    }
}

/// The number of epoch ticks that guarantees at least `deadline` of wall-clock time: the
/// current tick may be about to end, so one more tick than the deadline's length.
pub(crate) fn deadline_ticks(deadline: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    let ticks = deadline.as_nanos().div_ceil(tick);
    u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_ticks_cover_the_whole_deadline() {
        assert_eq!(deadline_ticks(Duration::from_millis(100)), 21);
        assert_eq!(deadline_ticks(Duration::from_millis(1)), 2);
        assert_eq!(deadline_ticks(Duration::ZERO), 1);
    }

    #[test]
    fn ticker_thread_stops_when_dropped() {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = wasmtime::Engine::new(&config).unwrap();
        let ticker = EpochTicker::start(&engine).unwrap();
        // Drop joins the thread: if it did not stop, this test would hang.
        drop(ticker);
    }
}
