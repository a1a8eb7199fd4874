//! Background tasks that must live as long as the binary (watches, servers, refreshers).
//! A task that ends early, or panics, is never dropped in silence: [`Background::ended`]
//! says which one and how, so the binary can log it and stop (its pod restarts clean)
//! rather than keep serving with, say, a status watch that is gone.

use std::{collections::HashMap, future::Future};

use tokio::task::{Id, JoinError, JoinHandle, JoinSet};

/// Named background tasks.
#[derive(Debug, Default)]
pub struct Background {
    set: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
}

impl Background {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` as `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(async move {
            task.await;
            Ok(())
        });
        self.names.insert(handle.id(), name);
    }

    /// Takes over a task already spawned.
    pub fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        let handle = self.set.spawn(async move { handle.await.map_err(|e| describe(&e)) });
        self.names.insert(handle.id(), name);
    }

    /// Number of tasks still running.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is running.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits until one task ends and says which and how (`"status watch ended"`,
    /// `"status watch panicked: …"`). Never completes when there is none, so it can sit in
    /// a `tokio::select!` beside the main loop. Cancel-safe.
    pub async fn ended(&mut self) -> String {
        match self.set.join_next_with_id().await {
            Some(result) => self.outcome(result),
            None => std::future::pending().await,
        }
    }

    /// After shutdown: waits for every task, logging those that failed.
    pub async fn join_all(mut self) {
        while let Some(result) = self.set.join_next_with_id().await {
            let failed = matches!(&result, Ok((_, Err(_))) | Err(_));
            let outcome = self.outcome(result);
            if failed {
                tracing::error!(task = %outcome, "a background task failed");
            }
        }
    }

    fn outcome(&mut self, result: Result<(Id, Result<(), String>), JoinError>) -> String {
        let (id, failure) = match result {
            Ok((id, Ok(()))) => (id, None),
            Ok((id, Err(failure))) => (id, Some(failure)),
            Err(e) => (e.id(), Some(describe(&e))),
        };
        let name = self.names.remove(&id).unwrap_or("a background task");
        match failure {
            None => format!("{name} ended"),
            Some(failure) => format!("{name} {failure}"),
        }
    }
}

/// Logs how a task `name` ended when it did not end well (awaited at shutdown, where
/// `let _ = handle.await` would drop a panic in silence).
pub async fn join_logged(name: &'static str, handle: JoinHandle<()>) {
    if let Err(e) = handle.await
        && !e.is_cancelled()
    {
        tracing::error!(task = name, failure = %describe(&e), "a background task failed");
    }
}

fn describe(e: &JoinError) -> String {
    if e.is_cancelled() {
        return "was cancelled".to_owned();
    }
    // A panic's payload is a &str or a String when raised by panic!/expect.
    let payload = e.to_string();
    format!("panicked: {payload}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_or_panics_is_named() {
        let mut tasks = Background::new();
        tasks.spawn("forever", std::future::pending());
        tasks.spawn("status watch", async {});
        assert_eq!(tasks.ended().await, "status watch ended");
        tasks.adopt(
            "hint consumer",
            tokio::spawn(async {
                #[allow(clippy::panic)]
                {
                    panic!("boom")
                }
            }),
        );
        let ended = tasks.ended().await;
        assert!(ended.starts_with("hint consumer panicked"), "{ended}");
        assert_eq!(tasks.len(), 1);
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), tasks.ended()).await;
        assert!(waiting.is_err(), "the task still running is not reported");
    }
}
