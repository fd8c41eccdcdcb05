//! The one way the daemon runs blocking work (file I/O, fsyncs, compiling plugins) from async
//! code: [`run`] puts one piece of work on tokio's blocking pool, [`run_all`] several at once,
//! and both report a task that did not return as a [`BlockingError`], the same way for every
//! caller. Each caller's error type carries it unchanged in its `Task` variant
//! (`Task(#[from] BlockingError)`), so the wording is the same everywhere and nothing is
//! turned into a made-up `io::Error` or a bare string.
//!
//! Outside `fanout/` nothing else calls `spawn_blocking`.

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
pub async fn run<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingError> {
    Ok(tokio::task::spawn_blocking(work).await?)
}

/// Runs every piece of `works` on the blocking pool at once and waits for all of them (a
/// blocking task cannot be stopped, so none is left running behind the caller's back); returns
/// each one's value, or why it returned nothing, in the order given.
pub(crate) async fn run_all<T, W>(
    works: impl IntoIterator<Item = W>,
) -> Vec<Result<T, BlockingError>>
where
    T: Send + 'static,
    W: FnOnce() -> T + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let mut slots = std::collections::HashMap::new();
    for (index, work) in works.into_iter().enumerate() {
        slots.insert(tasks.spawn_blocking(work).id(), index);
    }
    let mut out: Vec<Option<Result<T, BlockingError>>> = (0..slots.len()).map(|_| None).collect();
    while let Some(joined) = tasks.join_next_with_id().await {
        let (id, outcome) = match joined {
            Ok((id, value)) => (id, Ok(value)),
            Err(e) => (e.id(), Err(BlockingError::from(e))),
        };
        if let Some(slot) = slots.get(&id).and_then(|&index| out.get_mut(index)) {
            *slot = Some(outcome);
        }
    }
    // Every task spawned was joined above, so every slot is filled.
    out.into_iter()
        .map(|slot| slot.unwrap_or(Err(BlockingError::Cancelled)))
        .collect()
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

    #[tokio::test]
    async fn run_all_returns_every_outcome_in_the_order_given_panics_included() {
        // The first waits for the third, so it finishes last and still comes back first.
        let (done, third_done) = std::sync::mpsc::channel();
        let works: Vec<Box<dyn FnOnce() -> u32 + Send>> = vec![
            Box::new(move || third_done.recv().map_or(0, |()| 1)),
            Box::new(|| panic!("second fails")),
            Box::new(move || done.send(()).map_or(0, |()| 3)),
        ];
        let outcomes = run_all(works).await;
        assert_eq!(
            outcomes,
            vec![
                Ok(1),
                Err(BlockingError::Panicked("second fails".to_owned())),
                Ok(3)
            ]
        );
        assert!(run_all(Vec::<fn() -> u8>::new()).await.is_empty());
    }
}
