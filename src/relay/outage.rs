//! The relay's view of its broker: reachable, or paused by an outage —
//! unreachable, or a destination it cannot use (a missing topic, a denied
//! ACL), named for what it is. One log line per transition, a breaker
//! gauge per sink, and `oncegate_relay_outage{sink,cause,resource}` at 1
//! while that cause holds (the label `outbox list` reads).

use crate::broker::PublishError;
use std::time::Duration;
use tokio::time::Instant;

/// Longest pause between probes of an unreachable broker.
pub const MAX_OUTAGE_BACKOFF: Duration = Duration::from_secs(30);

pub struct Breaker {
    sink: &'static str,
    first_pause: Duration,
    state: std::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set while the broker is unusable: when it began, the current pause
    /// between probes, and the cause (its label and resource).
    since: Option<(Instant, Duration)>,
    cause: Option<(&'static str, String)>,
    /// When the broker last answered after an outage.
    answered: Option<Instant>,
}

impl Breaker {
    pub fn new(sink: &'static str, first_pause: Duration) -> Self {
        metrics::gauge!("oncegate_relay_breaker_state", "sink" => sink).set(0.0);
        Self {
            sink,
            first_pause: first_pause.max(Duration::from_millis(10)),
            state: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while the broker is considered unusable.
    pub fn is_open(&self) -> bool {
        self.lock().since.is_some()
    }

    /// The current pause between probes, while open.
    pub fn pause(&self) -> Option<Duration> {
        self.lock().since.map(|(_, p)| p)
    }

    /// The broker answered an attempt begun at `started`: ends an outage
    /// (one log line). An attempt begun before the outage opened says
    /// nothing about it (several slots publish at once: one whose publish
    /// went out just before the broker was lost finishes after another
    /// slot met the loss), so it ends nothing.
    pub fn answered(&self, started: Instant) {
        let mut state = self.lock();
        let Some((since, _)) = state.since else {
            return;
        };
        if started < since {
            return;
        }
        state.since = None;
        state.answered = Some(Instant::now());
        if let Some((cause, resource)) = state.cause.take() {
            metrics::gauge!("oncegate_relay_outage", "sink" => self.sink, "cause" => cause, "resource" => resource)
                .set(0.0);
        }
        metrics::gauge!("oncegate_relay_breaker_state", "sink" => self.sink).set(0.0);
        tracing::info!(
            sink = self.sink,
            outage_ms = since.elapsed().as_millis() as u64,
            "broker reachable again; relay resumed"
        );
    }

    /// Records an outage met by an attempt begun at `started`; returns how
    /// long to pause. A new outage, or a change of cause, is one log line.
    /// An attempt begun before the broker last answered again met the
    /// outage that already ended (several slots publish at once): it opens
    /// nothing.
    pub fn failed(&self, error: &PublishError, started: Instant) -> Duration {
        let mut state = self.lock();
        if state.since.is_none() && state.answered.is_some_and(|a| started < a) {
            return self.first_pause;
        }
        let cause = (error.cause(), error.resource().to_string());
        let changed = state.cause.as_ref() != Some(&cause);
        if changed {
            if let Some((old, resource)) = state.cause.take() {
                metrics::gauge!("oncegate_relay_outage", "sink" => self.sink, "cause" => old, "resource" => resource)
                    .set(0.0);
            }
            metrics::gauge!("oncegate_relay_outage", "sink" => self.sink, "cause" => cause.0, "resource" => cause.1.clone())
                .set(1.0);
            self.log(error);
            state.cause = Some(cause);
        }
        match state.since {
            Some((since, pause)) => {
                let next = (pause * 2).min(MAX_OUTAGE_BACKOFF);
                state.since = Some((since, next));
                next
            }
            None => {
                state.since = Some((Instant::now(), self.first_pause));
                metrics::gauge!("oncegate_relay_breaker_state", "sink" => self.sink).set(1.0);
                metrics::counter!("oncegate_relay_outages_total", "sink" => self.sink).increment(1);
                self.first_pause
            }
        }
    }

    fn log(&self, error: &PublishError) {
        match error {
            PublishError::Blocked(b) => tracing::warn!(
                sink = self.sink,
                cause = b.cause.as_str(),
                topic = %b.resource,
                error = %error,
                "destination unusable; relay paused, no attempts spent"
            ),
            _ => {
                tracing::warn!(sink = self.sink, error = %error, "broker unreachable; relay paused, no attempts spent")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage() -> PublishError {
        PublishError::Unavailable("connection closed".into())
    }

    #[test]
    fn an_answer_to_an_attempt_begun_before_the_outage_ends_nothing() {
        let breaker = Breaker::new("test-early", Duration::from_millis(10));
        // Slot A's publish goes out; then slot B's meets the loss.
        let a_started = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        breaker.failed(&outage(), Instant::now());
        assert!(breaker.is_open());
        // A's answer arrives after: it left before the outage, so it says
        // nothing about whether the broker is back.
        breaker.answered(a_started);
        assert!(breaker.is_open(), "an earlier attempt's answer ended the outage");
        // A probe begun after the outage opened answers: it is over.
        std::thread::sleep(Duration::from_millis(2));
        breaker.answered(Instant::now());
        assert!(!breaker.is_open());
    }

    #[test]
    fn a_failure_of_an_attempt_begun_before_the_last_answer_opens_nothing() {
        let breaker = Breaker::new("test-late", Duration::from_millis(10));
        breaker.failed(&outage(), Instant::now());
        let b_started = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        breaker.answered(Instant::now());
        assert!(!breaker.is_open());
        breaker.failed(&outage(), b_started);
        assert!(
            !breaker.is_open(),
            "an attempt from the ended outage opened a new one"
        );
    }
}
