//! One slot a relay holds, and one step of publishing it: take the slot's
//! identity at the broker and settle (once per holding, and again after an
//! unknown outcome), read the slot's pending events in per-award order,
//! publish them as one batch, and mark, record or pause on what the broker
//! said — every store write conditional on the generation held.

use super::outage::Breaker;
use crate::broker::{Batch, PublishError, Sink, SlotId};
use crate::error::StoreError;
use crate::store::slots::SlotLease;
use crate::store::{OutboxEvent, PublishStore};
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A slot this process holds, as far as it knows.
pub struct Held {
    pub lease: SlotLease,
    /// When the lease ends by this process's clock (a margin before the
    /// store's: the renewal's send time plus 90 % of the lease).
    deadline: std::sync::Mutex<Instant>,
    /// The broker identity is taken and the slot settled.
    taken: AtomicBool,
    /// Released or lost: nothing more is done for it.
    gone: AtomicBool,
    /// Held through a step, so a release waits for the step to end.
    busy: tokio::sync::Mutex<()>,
}

impl Held {
    pub fn new(lease: SlotLease, sent_at: Instant, length: Duration) -> Self {
        Self {
            lease,
            deadline: std::sync::Mutex::new(sent_at + length * 9 / 10),
            taken: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            busy: tokio::sync::Mutex::new(()),
        }
    }

    pub fn id(&self) -> SlotId {
        SlotId {
            index: self.lease.slot as u32,
            count: self.lease.slots as u32,
        }
    }

    /// The store renewed the lease by a statement sent at `sent_at`.
    pub fn renewed(&self, sent_at: Instant, length: Duration) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = sent_at + length * 9 / 10;
    }

    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// Marks the slot gone and waits for a step in progress to end.
    pub async fn stop(&self) {
        self.gone.store(true, Ordering::SeqCst);
        let _ = self.busy.lock().await;
    }
}

/// What one step did (summed over slots by the relay's step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    pub leased: usize,
    pub published: usize,
    /// Events the broker rejected (attempts spent).
    pub failed: usize,
    pub quarantined: usize,
    /// Events held back because the broker was unusable (no attempt spent).
    pub deferred: usize,
    /// Events an earlier holder's committed transaction carried, marked
    /// without publishing them again.
    pub settled: usize,
    /// The sink could not connect or take the slot: nothing was read.
    pub unconnected: bool,
    /// A slot turned out to be another relay's: nothing more was done for it.
    pub lost: bool,
}

impl std::ops::AddAssign for StepReport {
    fn add_assign(&mut self, o: Self) {
        self.leased += o.leased;
        self.published += o.published;
        self.failed += o.failed;
        self.quarantined += o.quarantined;
        self.deferred += o.deferred;
        self.settled += o.settled;
        self.unconnected |= o.unconnected;
        self.lost |= o.lost;
    }
}

/// What a step publishes with.
pub struct Publishing<'a> {
    pub store: &'a dyn PublishStore,
    pub sink: &'a dyn Sink,
    pub breaker: &'a Breaker,
    pub batch: i64,
    pub max_attempts: i32,
    pub retry_backoff: Duration,
    pub lease: Duration,
}

impl Publishing<'_> {
    /// One step of `held`: settle if needed, then one batch.
    pub async fn step(&self, held: &Held) -> Result<StepReport, StoreError> {
        let _busy = held.busy.lock().await;
        if held.is_gone() || !self.time_left(held) {
            return Ok(StepReport::default());
        }
        let mut settled = StepReport::default();
        if !held.taken.load(Ordering::SeqCst) {
            settled = self.take(held).await?;
            if settled.unconnected || settled.lost || !self.time_left(held) {
                return Ok(settled);
            }
        }
        let events = self.store.slot_pending(&held.lease, self.batch).await?;
        if events.is_empty() {
            return Ok(settled);
        }
        let traced: Vec<(tracing::Span, Cow<'_, OutboxEvent>)> =
            events.iter().map(|e| traced(e, self.sink.name())).collect();
        let sent: Vec<&OutboxEvent> = traced.iter().map(|(_, e)| e.as_ref()).collect();
        let started = Instant::now();
        let batch = self.sink.publish(held.id(), &sent, held.deadline()).await;
        for (i, (span, _)) in traced.iter().enumerate() {
            failed_on(span, failure_of(&batch, i, &events[i]));
        }
        drop(traced);
        let mut report = self.settle_batch(held, &events, batch, started).await?;
        report.settled = settled.settled;
        Ok(report)
    }

    /// Takes the slot's broker identity (and settles) unless taken; false
    /// when that could not be done now (an outage, or the slot lost).
    pub async fn ensure_taken(&self, held: &Held) -> Result<bool, StoreError> {
        let _busy = held.busy.lock().await;
        if held.taken.load(Ordering::SeqCst) {
            return Ok(true);
        }
        let report = self.take(held).await?;
        Ok(!report.unconnected && !report.lost)
    }

    /// Whether enough of the lease is left to start a batch: a quarter.
    /// (Renewals come every third of it; a relay that cannot renew stops
    /// publishing before its lease runs out and another relay can take it.)
    fn time_left(&self, held: &Held) -> bool {
        held.deadline().saturating_duration_since(Instant::now()) >= self.lease / 4
    }

    /// Takes the slot's broker identity and marks what it settles.
    async fn take(&self, held: &Held) -> Result<StepReport, StoreError> {
        let started = Instant::now();
        let settled = match self.sink.take(held.id()).await {
            Ok(settled) => settled,
            Err(e) => {
                self.breaker.failed(&e, started);
                return Ok(StepReport {
                    unconnected: true,
                    ..Default::default()
                });
            }
        };
        self.breaker.answered(started);
        if !settled.is_empty() {
            if !self.store.mark_published(&held.lease, &settled).await? {
                return Ok(lost(held));
            }
            self.sink.marked(held.id(), &settled);
            metrics::counter!("oncegate_relay_settled_total", "sink" => self.sink.name())
                .increment(settled.len() as u64);
            tracing::info!(
                sink = self.sink.name(),
                slot = held.lease.slot,
                events = settled.len(),
                "settled events an earlier transaction had published"
            );
        }
        held.taken.store(true, Ordering::SeqCst);
        Ok(StepReport {
            settled: settled.len(),
            ..Default::default()
        })
    }

    /// Marks what the broker has, records what it refused, pauses on an outage.
    async fn settle_batch(
        &self,
        held: &Held,
        events: &[OutboxEvent],
        batch: Batch,
        started: Instant,
    ) -> Result<StepReport, StoreError> {
        let mut report = StepReport {
            leased: events.len(),
            ..Default::default()
        };
        if !batch.published.is_empty() {
            if !self.store.mark_published(&held.lease, &batch.published).await? {
                return Ok(lost(held));
            }
            self.sink.marked(held.id(), &batch.published);
            metrics::counter!("oncegate_outbox_published_total", "sink" => self.sink.name())
                .increment(batch.published.len() as u64);
            report.published = batch.published.len();
        }
        for (i, why) in &batch.rejected {
            report.failed += 1;
            match self.rejected(held, &events[*i], why).await? {
                Some(quarantined) => report.quarantined += usize::from(quarantined),
                None => return Ok(lost(held)),
            }
        }
        if batch.unknown {
            held.taken.store(false, Ordering::SeqCst);
            metrics::counter!("oncegate_relay_unknown_outcomes_total", "sink" => self.sink.name())
                .increment(1);
        }
        match &batch.stopped {
            Some(outage) => {
                metrics::counter!("oncegate_outbox_publish_errors_total", "sink" => self.sink.name(), "kind" => "unavailable").increment(1);
                self.breaker.failed(outage, started);
                report.deferred = events.len() - report.published - report.failed;
            }
            None if report.published + report.failed > 0 => self.breaker.answered(started),
            None => {}
        }
        Ok(report)
    }

    /// Records a rejection; `Some(true)` once the event is quarantined,
    /// `None` when the slot was lost (nothing recorded).
    async fn rejected(
        &self,
        held: &Held,
        event: &OutboxEvent,
        error: &str,
    ) -> Result<Option<bool>, StoreError> {
        metrics::counter!("oncegate_outbox_publish_errors_total", "sink" => self.sink.name(), "kind" => "rejected").increment(1);
        let backoff = self.backoff(event.attempts + 1);
        let quarantined = self
            .store
            .record_publish_failure(&held.lease, event.event_id, error, self.max_attempts, backoff)
            .await?;
        match quarantined {
            Some(true) => {
                metrics::counter!("oncegate_outbox_quarantined_total").increment(1);
                tracing::error!(event_id = %event.event_id, award_id = %event.award_id, sequence = event.sequence, attempts = event.attempts + 1, error = %error, "outbox event quarantined after repeated rejections");
            }
            Some(false) if crate::log_fold::RELAY.first(&format!("publish rejected: {error}")) => {
                tracing::warn!(event_id = %event.event_id, award_id = %event.award_id, attempts = event.attempts + 1, retry_in_ms = backoff.as_millis() as u64, error = %error, "publish rejected; the award's events will be retried in order");
            }
            Some(false) | None => {}
        }
        Ok(quarantined)
    }

    /// Retry delay after the `attempt`-th failure: the base backoff
    /// doubling, at most the lease.
    fn backoff(&self, attempt: i32) -> Duration {
        let exp = attempt.clamp(1, 16) as u32 - 1;
        (self.retry_backoff * 2u32.pow(exp)).min(self.lease)
    }
}

/// The slot is another relay's now (its generation moved on).
fn lost(held: &Held) -> StepReport {
    held.gone.store(true, Ordering::SeqCst);
    metrics::counter!("oncegate_relay_slot_changes_total", "change" => "lost").increment(1);
    tracing::info!(
        slot = held.lease.slot,
        generation = held.lease.generation,
        "slot taken by another relay; nothing more written for it"
    );
    StepReport {
        lost: true,
        ..Default::default()
    }
}

/// Why event `i` of a batch did not go out, if it did not.
fn failure_of<'a>(batch: &'a Batch, i: usize, event: &OutboxEvent) -> Option<Cow<'a, str>> {
    if batch.published.contains(&event.event_id) {
        return None;
    }
    if let Some((_, why)) = batch.rejected.iter().find(|(j, _)| *j == i) {
        return Some(Cow::Borrowed(why.as_str()));
    }
    batch
        .stopped
        .as_ref()
        .map(|e: &PublishError| Cow::Owned(e.to_string()))
}

/// The span of one event's publish, a child of the trace the event was
/// recorded under; and the event as the sink sends it: carrying the publish
/// span's `traceparent` while traces are exported (the consumer's span
/// then follows the publish), else the stored one unchanged (no copy).
fn traced<'a>(event: &'a OutboxEvent, sink: &'static str) -> (tracing::Span, Cow<'a, OutboxEvent>) {
    let span = crate::trace_span!(
        "relay.publish",
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        messaging.system = sink,
        messaging.message.id = %event.event_id,
        oncegate.event_type = %event.event_type,
        oncegate.sequence = event.sequence,
    );
    crate::telemetry::set_parent(&span, event.traceparent.as_deref());
    match crate::telemetry::traceparent_of(&span) {
        Some(own) => {
            let sent = OutboxEvent {
                traceparent: Some(own),
                ..event.clone()
            };
            (span, Cow::Owned(sent))
        }
        None => (span, Cow::Borrowed(event)),
    }
}

/// Marks a publish span failed (the error is the broker's, never the
/// event's payload).
fn failed_on(span: &tracing::Span, error: Option<Cow<'_, str>>) {
    if let Some(e) = error {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", tracing::field::display(e));
    }
}
