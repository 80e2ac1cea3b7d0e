//! Shutdown as a value: one [`Shutdown`] moves through its [`Phase`]s in
//! order, and each component holds a [`Stop`] for the phase that ends it:
//!
//! 1. [`Phase::StopAccepting`]: the gRPC server stops taking calls and
//!    finishes the ones in flight (their transactions commit or roll back);
//! 2. [`Phase::StopBackground`]: the relay, the purge and the gauges stop;
//! 3. [`Phase::FlushAudit`]: the audit queue is written out, then sealed
//!    (the sealer waits for the flusher to finish);
//! 4. [`Phase::Stopped`]: the metrics endpoint closes.
//!
//! Background work runs in a [`Tasks`] set: each task has a name, and the
//! first one that ends before shutdown is reported (which, and why) and ends
//! the process with a non-zero code.

use std::future::Future;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The phases of a shutdown, in the order they are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Running,
    StopAccepting,
    StopBackground,
    FlushAudit,
    Stopped,
}

/// The owner's side: advances the phase, never backwards.
#[derive(Debug)]
pub struct Shutdown {
    phase: watch::Sender<Phase>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self {
            phase: watch::channel(Phase::Running).0,
        }
    }

    /// Moves to `phase` (and so past every earlier one).
    pub fn advance(&self, phase: Phase) {
        self.phase.send_if_modified(|current| {
            let later = phase > *current;
            if later {
                *current = phase;
            }
            later
        });
    }

    /// The signal of a component that ends at `phase`.
    pub fn stop_at(&self, phase: Phase) -> Stop {
        Stop {
            phase: self.phase.subscribe(),
            at: phase,
        }
    }
}

/// A component's side: tells it when its phase is reached.
#[derive(Debug, Clone)]
pub struct Stop {
    phase: watch::Receiver<Phase>,
    at: Phase,
}

impl Stop {
    /// True once the phase is reached.
    pub fn is_requested(&self) -> bool {
        *self.phase.borrow() >= self.at
    }

    /// Resolves once the phase is reached (or the [`Shutdown`] is dropped).
    pub async fn requested(&mut self) {
        let at = self.at;
        let _ = self.phase.wait_for(|p| *p >= at).await;
    }

    /// [`Stop::requested`] consuming the signal, for servers that take an
    /// owned shutdown future.
    pub async fn into_future(mut self) {
        self.requested().await
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a signal that comes in
/// between is kept, not the default action that ends the process undrained.
pub fn signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "signal received"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "signal received"),
        }
    }
}

/// How a named task ended.
pub type TaskExit = (&'static str, Result<anyhow::Result<()>, tokio::task::JoinError>);

/// The named background tasks of a process.
#[derive(Default)]
pub struct Tasks {
    set: JoinSet<(&'static str, anyhow::Result<()>)>,
}

impl Tasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` under `name`.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.set.spawn(async move { (name, task.await) });
    }

    /// The next task to end; pending forever when there are none (so it can
    /// sit in a `select!` beside the shutdown signal).
    pub async fn next_exit(&mut self) -> TaskExit {
        match self.set.join_next().await {
            Some(Ok((name, result))) => (name, Ok(result)),
            Some(Err(e)) => ("background task", Err(e)),
            None => std::future::pending().await,
        }
    }

    /// Waits for every task until `deadline`, logging each; returns false
    /// when some were still running (they are aborted).
    pub async fn join_all(mut self, deadline: tokio::time::Instant) -> bool {
        loop {
            match tokio::time::timeout_at(deadline, self.set.join_next()).await {
                Ok(None) => return true,
                Ok(Some(Ok((name, Ok(()))))) => tracing::info!(task = name, "stopped"),
                Ok(Some(Ok((name, Err(e))))) => {
                    tracing::error!(
                        task = name,
                        error = format!("{e:#}"),
                        "task failed while stopping"
                    )
                }
                Ok(Some(Err(e))) => tracing::error!(error = %e, "task panicked while stopping"),
                Err(_) => {
                    tracing::warn!(
                        left = self.set.len(),
                        "tasks outlived the shutdown grace; aborting them"
                    );
                    self.set.abort_all();
                    return false;
                }
            }
        }
    }
}

/// A task that ended before shutdown, as the error that ends the process
/// (zero-to-production's `report_exit`).
pub fn unexpected_exit((name, ended): TaskExit) -> anyhow::Error {
    let why = match ended {
        Ok(Ok(())) => "ended on its own".to_string(),
        Ok(Err(e)) => format!("failed: {e:#}"),
        Err(e) if e.is_panic() => "panicked".to_string(),
        Err(e) => format!("was cancelled: {e}"),
    };
    tracing::error!(task = name, why = %why, "a background task ended before shutdown");
    anyhow::anyhow!("{name} {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn phases_are_reached_in_order_and_never_undone() {
        let shutdown = Shutdown::new();
        let relay = shutdown.stop_at(Phase::StopBackground);
        let mut audit = shutdown.stop_at(Phase::FlushAudit);
        shutdown.advance(Phase::StopAccepting);
        assert!(!relay.is_requested());
        shutdown.advance(Phase::FlushAudit);
        assert!(relay.is_requested(), "a later phase passes the earlier ones");
        shutdown.advance(Phase::StopAccepting);
        assert!(audit.is_requested(), "advancing backwards is ignored");
        audit.requested().await;
    }

    #[tokio::test]
    async fn the_first_task_to_end_is_named() {
        let mut tasks = Tasks::new();
        tasks.spawn("sleeper", async {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            Ok(())
        });
        tasks.spawn("outbox relay", async { Err(anyhow::anyhow!("sink gone")) });
        let err = unexpected_exit(tasks.next_exit().await);
        assert_eq!(err.to_string(), "outbox relay failed: sink gone");
    }
}
