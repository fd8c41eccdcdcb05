//! Graceful shutdown: one [`ShutdownTrigger`] fires, every [`ShutdownSignal`] clone sees it.
//!
//! The HTTP server, each background loop and each long-poll select on a signal, so a SIGINT or
//! SIGTERM stops accepting work, lets in-flight requests finish, ends the loops, and only then
//! closes the store (writing the high-watermark files). Built on a `watch` channel so a signal
//! created after the trigger fired still sees it.

use tokio::sync::watch;

/// The sending side: firing it asks everything holding a [`ShutdownSignal`] to stop.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

/// The receiving side, cheap to clone into every task.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    rx: watch::Receiver<bool>,
}

/// A new trigger and a signal connected to it.
pub fn channel() -> (ShutdownTrigger, ShutdownSignal) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger { tx }, ShutdownSignal { rx })
}

impl ShutdownTrigger {
    /// Asks every connected signal to stop. Idempotent.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// A new signal connected to this trigger.
    pub fn subscribe(&self) -> ShutdownSignal {
        ShutdownSignal {
            rx: self.tx.subscribe(),
        }
    }
}

impl ShutdownSignal {
    /// Whether shutdown has been asked for.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown is asked for, or when every trigger is gone (nothing could ever
    /// ask any more, so waiting on would hang).
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An Err means the trigger was dropped: treat it as a shutdown.
        let _ = rx.wait_for(|stop| *stop).await;
    }
}

/// Resolves when the process receives SIGINT (Ctrl-C) or SIGTERM, naming which.
///
/// Errors only when the signal handlers cannot be installed.
pub async fn os_signal() -> std::io::Result<&'static str> {
    Ok(StopSignals::install()?.next().await)
}

/// SIGINT and SIGTERM handlers, installed when made: a signal that arrives after
/// [`StopSignals::install`] returns is kept for [`StopSignals::next`], however late it is
/// awaited (the process is not ended by the default action meanwhile).
#[derive(Debug)]
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers. Needs a Tokio runtime; errors only when they cannot be installed.
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT, named.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Bound on a wait that must end at once: a broken signal fails the test, not hangs it.
    const WAIT: Duration = Duration::from_secs(10);

    async fn released(signal: &ShutdownSignal) -> bool {
        tokio::time::timeout(WAIT, signal.wait()).await.is_ok()
    }

    #[tokio::test]
    async fn a_signal_subscribed_after_the_trigger_still_sees_it() {
        let (trigger, signal) = channel();
        assert!(!signal.is_triggered());
        trigger.trigger();
        let late = trigger.subscribe();
        assert!(released(&late).await, "a late subscriber waits forever");
        assert!(released(&signal).await, "the signal waits forever");
        assert!(late.is_triggered());
    }

    #[tokio::test]
    async fn dropping_every_trigger_releases_waiters() {
        let (trigger, signal) = channel();
        drop(trigger);
        assert!(released(&signal).await, "a waiter outlives every trigger");
    }
}
