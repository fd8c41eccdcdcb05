//! The one way the daemon runs blocking work (file I/O, fsyncs, compiling plugins) from async
//! code: [`run`] puts it on tokio's blocking pool and reports a task that did not return as a
//! [`BlockingError`], the same way for every caller. Each caller's error type turns that into
//! its own `Task` variant with `BlockingError`'s message, so the wording is the same
//! everywhere.

/// Why blocking work returned no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockingError {
    /// The work panicked; the message is the panic's, when it was a string.
    #[error("blocking task panicked: {0}")]
    Panicked(String),
    /// The work was cancelled before it finished: the runtime is shutting down.
    #[error("blocking task was cancelled: the runtime is shutting down")]
    Cancelled,
}

impl From<tokio::task::JoinError> for BlockingError {
    fn from(e: tokio::task::JoinError) -> BlockingError {
        if e.is_cancelled() {
            return BlockingError::Cancelled;
        }
        let message = match e.try_into_panic() {
            Ok(payload) => payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned()),
            Err(e) => e.to_string(),
        };
        BlockingError::Panicked(message)
    }
}

/// Runs `work` on the blocking pool and returns what it returned, or why it returned nothing.
pub(crate) async fn run<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    Ok(tokio::task::spawn_blocking(work).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_reported_with_its_message_and_a_value_comes_back() {
        assert_eq!(run(|| 7).await, Ok(7));
        let err = run(|| -> u8 { panic!("disk on fire") }).await.unwrap_err();
        assert_eq!(err, BlockingError::Panicked("disk on fire".to_owned()));
        assert_eq!(err.to_string(), "blocking task panicked: disk on fire");
    }
}
