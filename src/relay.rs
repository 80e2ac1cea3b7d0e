//! The outbox relay: leases unpublished events (`FOR UPDATE SKIP LOCKED` on
//! Postgres, so replicas never block each other or share a row), publishes
//! them in order, marks them published. At least once: a relay that dies
//! after publishing but before marking leaves the lease to expire, and the
//! event is published again; the event id lets the broker (JetStream's
//! `Nats-Msg-Id`) or the consumer drop the repeat.
//!
//! Two kinds of failure, told apart by the sink ([`PublishError`]):
//! - the broker **rejects** an event: that event and the rest of its award's
//!   events in the batch are postponed by a backoff
//!   (`ONCEGATE_RELAY_RETRY_BACKOFF`, 100 ms, doubling, at most the lease),
//!   no later event of that award is leased meanwhile, so an award's events
//!   go out in sequence order; after `max_attempts` rejections the event is
//!   quarantined and the award's events flow again;
//! - the broker is **unreachable** or times out: an outage, not the event's
//!   fault. No attempt is spent; the rest of the batch is postponed, the
//!   relay pauses with a growing backoff (breaker state
//!   `oncegate_relay_breaker_state`, one log line per transition) and
//!   resumes by itself, in per-award order, when the broker answers again.
//!
//! A broker that is down when the sidecar starts is the same outage: the
//! sink connects (and declares its stream, exchange or transactional id)
//! inside the relay loop, with the relay paused and claims served meanwhile,
//! and again after any connection it had is lost.
//!
//! A transactional sink (Kafka) publishes a whole batch in one broker
//! transaction together with its high-water mark, and on (re)connecting
//! reports what its last committed transaction carried ([`Sink::settled`]),
//! which the relay marks published without publishing it again.

pub mod amqp;
pub mod kafka;
pub mod log;
pub mod nats;
pub mod redis_stream;

use crate::error::StoreError;
use crate::secret::mask_url;
use crate::shutdown::Stop;
use crate::store::{OutboxEvent, Store};
use async_trait::async_trait;
use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Where events go. Adding a broker is one new file implementing this.
#[async_trait]
pub trait Sink: Send + Sync {
    fn name(&self) -> &'static str;
    /// Publishes one event; `Ok` only once the broker has it.
    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError>;

    /// Makes sure the sink is connected and its declarations made; `Ok(true)`
    /// when this call (re)established the connection. Called before every
    /// step, so it must be cheap once connected.
    async fn connect(&self) -> Result<bool, PublishError> {
        Ok(false)
    }

    /// True for a sink that publishes a batch atomically
    /// ([`Sink::publish_transaction`]) instead of event by event.
    fn transactional(&self) -> bool {
        false
    }

    /// Publishes `events` in one broker transaction: all of them, or none.
    async fn publish_transaction(&self, _events: &[&OutboxEvent]) -> Result<(), TransactionFailure> {
        Err(TransactionFailure {
            index: None,
            error: PublishError::Unavailable(format!("the {} sink is not transactional", self.name())),
        })
    }

    /// Events a committed transaction carried that may not be marked
    /// published yet (known from the broker after a (re)connect, or from an
    /// earlier step whose mark failed): the relay marks them without
    /// publishing them again.
    fn settled(&self) -> Vec<uuid::Uuid> {
        Vec::new()
    }

    /// The relay marked these events published.
    fn marked(&self, _ids: &[uuid::Uuid]) {}
}

/// Why a transaction was not committed: `index` names the event the broker
/// refused, when one did (the transaction was aborted, nothing published).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionFailure {
    pub index: Option<usize>,
    pub error: PublishError,
}

/// Why a publish failed: the sink decides, because only it knows its
/// broker's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The broker answered and refused this event (counts toward quarantine).
    #[error("rejected by the broker: {0}")]
    Rejected(String),
    /// The broker could not be reached or did not answer in time: an
    /// outage, the event is not at fault.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

/// How long a sink waits for its broker before calling it unavailable.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest pause between probes of an unreachable broker.
const MAX_OUTAGE_BACKOFF: Duration = Duration::from_secs(30);

/// The configured sink, parsed from `ONCEGATE_RELAY_SINK`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    None,
    Log,
    Redis(String),
    Nats(String),
    Amqp(String),
    /// `kafka://host:port[,host:port…]`.
    Kafka(String),
}

impl SinkSpec {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "none" => Ok(Self::None),
            "log" => Ok(Self::Log),
            u if u.starts_with("redis://") || u.starts_with("rediss://") => {
                redis_stream::check_url(u)?;
                Ok(Self::Redis(u.into()))
            }
            u if u.starts_with("nats://") || u.starts_with("tls://") => {
                nats::check_url(u)?;
                Ok(Self::Nats(u.into()))
            }
            u if u.starts_with("amqp://") || u.starts_with("amqps://") => {
                amqp::check_url(u)?;
                Ok(Self::Amqp(u.into()))
            }
            u if u.starts_with("kafka://") => {
                kafka::KafkaUrl::parse(u)?;
                Ok(Self::Kafka(u.into()))
            }
            other => Err(format!(
                "ONCEGATE_RELAY_SINK must be none, log, redis://…, nats://…, amqp://… or kafka://…, got {:?}",
                mask_url(other)
            )),
        }
    }
}

impl std::fmt::Display for SinkSpec {
    /// The sink as configured, password masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Log => f.write_str("log"),
            Self::Redis(url) | Self::Nats(url) | Self::Amqp(url) | Self::Kafka(url) => {
                f.write_str(&mask_url(url))
            }
        }
    }
}

/// Which sink, and where in it events go.
#[derive(Debug, Clone)]
pub struct SinkSettings {
    pub spec: SinkSpec,
    /// Redis stream key, JetStream stream name, or AMQP exchange.
    pub stream: String,
    /// Names this process's broker connection (AMQP `connection_name`).
    pub connection_name: String,
    /// JetStream subject.
    pub subject: String,
    /// Approximate Redis stream cap (`XADD MAXLEN ~`).
    pub stream_maxlen: u64,
    /// Kafka `transactional.id`.
    pub transactional_id: String,
    /// The relay's lease: a Kafka transaction must end well within it.
    pub lease: Duration,
}

impl SinkSettings {
    /// Builds the sink (`None` for `none`) without reaching the broker: the
    /// relay connects it. Fails only on a setting no retry can fix (a URL
    /// that does not parse).
    pub fn build(&self) -> anyhow::Result<Option<Arc<dyn Sink>>> {
        Ok(match &self.spec {
            SinkSpec::None => None,
            SinkSpec::Log => Some(Arc::new(log::LogSink)),
            SinkSpec::Redis(url) => Some(Arc::new(redis_stream::RedisStreamSink::new(
                url,
                &self.stream,
                self.stream_maxlen,
            )?)),
            SinkSpec::Nats(url) => Some(Arc::new(nats::JetStreamSink::new(
                url,
                &self.stream,
                &self.subject,
            )?)),
            SinkSpec::Amqp(url) => Some(Arc::new(amqp::AmqpSink::new(
                url,
                &self.stream,
                &self.connection_name,
            )?)),
            SinkSpec::Kafka(url) => Some(Arc::new(kafka::KafkaSink::new(
                url,
                &self.stream,
                &self.transactional_id,
                self.lease,
            )?)),
        })
    }

    /// Builds the sink and connects it once, failing if the broker does
    /// not answer (for tools that need the broker now).
    pub async fn connect(&self) -> anyhow::Result<Option<Arc<dyn Sink>>> {
        let sink = self.build()?;
        if let Some(sink) = &sink {
            sink.connect().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(sink)
    }
}

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub batch: i64,
    pub lease: Duration,
    pub poll: Duration,
    pub max_attempts: i32,
    pub owner: String,
    /// Delay before the first retry of a failed publish; doubles per attempt.
    pub retry_backoff: Duration,
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepReport {
    pub leased: usize,
    pub published: usize,
    /// Events the broker rejected (attempts spent).
    pub failed: usize,
    pub quarantined: usize,
    /// Events held back because the broker was unreachable (no attempt spent).
    pub deferred: usize,
    /// The sink could not connect: nothing was leased.
    pub unconnected: bool,
}

/// The relay's view of its broker: reachable, or paused by an outage.
#[derive(Debug, Default)]
struct Outage {
    /// Set while the broker is unreachable: when the outage began, and the
    /// current pause between probes.
    since: Option<(tokio::time::Instant, Duration)>,
}

pub struct Relay {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    settings: RelaySettings,
    outage: std::sync::Mutex<Outage>,
}

impl Relay {
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, settings: RelaySettings) -> Self {
        metrics::gauge!("oncegate_relay_breaker_state", "sink" => sink.name()).set(0.0);
        Self {
            store,
            sink,
            settings,
            outage: Default::default(),
        }
    }

    /// True while the broker is considered unreachable.
    pub fn is_paused(&self) -> bool {
        self.lock_outage().since.is_some()
    }

    fn lock_outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the broker answered: ends an outage (one log line).
    fn broker_answered(&self) {
        let mut outage = self.lock_outage();
        if let Some((since, _)) = outage.since.take() {
            metrics::gauge!("oncegate_relay_breaker_state", "sink" => self.sink.name()).set(0.0);
            tracing::info!(
                sink = self.sink.name(),
                outage_ms = since.elapsed().as_millis() as u64,
                "broker reachable again; relay resumed"
            );
        }
    }

    /// Records an unreachable broker; returns how long to pause.
    fn broker_unreachable(&self, error: &str) -> Duration {
        let mut outage = self.lock_outage();
        match outage.since {
            Some((since, pause)) => {
                let next = (pause * 2).min(MAX_OUTAGE_BACKOFF);
                outage.since = Some((since, next));
                next
            }
            None => {
                let first = self.settings.retry_backoff.max(Duration::from_millis(10));
                outage.since = Some((tokio::time::Instant::now(), first));
                metrics::gauge!("oncegate_relay_breaker_state", "sink" => self.sink.name()).set(1.0);
                metrics::counter!("oncegate_relay_outages_total", "sink" => self.sink.name()).increment(1);
                tracing::warn!(sink = self.sink.name(), error = %error, "broker unreachable; relay paused, no attempts spent");
                first
            }
        }
    }

    /// Leases a batch. Exposed so tests can stop between publish and mark.
    pub async fn lease(&self) -> Result<Vec<OutboxEvent>, StoreError> {
        self.store
            .lease_outbox(self.settings.batch, self.settings.lease, &self.settings.owner)
            .await
    }

    /// Publishes leased events in order; returns the ids published and the
    /// report. Nothing is marked. A rejected event and the rest of its
    /// award's events in this batch are postponed together by a backoff, so
    /// they are retried in order (the lease query keeps later events of that
    /// award back meanwhile). An unreachable broker ends the batch: the
    /// events not yet published are postponed by the outage pause, with no
    /// attempt spent.
    pub async fn publish(&self, events: &[OutboxEvent]) -> Result<(Vec<uuid::Uuid>, StepReport), StoreError> {
        if self.sink.transactional() {
            return self.publish_transaction(events).await;
        }
        let mut report = StepReport {
            leased: events.len(),
            ..Default::default()
        };
        let mut held_back: HashSet<&str> = HashSet::new();
        let mut postponed = Vec::new();
        let mut retry_after = Duration::ZERO;
        let mut published = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            if held_back.contains(event.award_id.as_str()) {
                postponed.push(event.event_id);
                continue;
            }
            let (span, sent) = traced(event, self.sink.name());
            let result = self.sink.publish(&sent).instrument(span.clone()).await;
            failed_on(&span, result.as_ref().err());
            match result {
                Ok(()) => {
                    self.broker_answered();
                    published.push(event.event_id);
                }
                Err(PublishError::Unavailable(error)) => {
                    metrics::counter!("oncegate_outbox_publish_errors_total", "sink" => self.sink.name(), "kind" => "unavailable").increment(1);
                    let pause = self.broker_unreachable(&error);
                    let rest: Vec<uuid::Uuid> = events[i..].iter().map(|e| e.event_id).collect();
                    report.deferred = rest.len();
                    postponed.extend(rest);
                    retry_after = retry_after.max(pause);
                    break;
                }
                Err(PublishError::Rejected(error)) => {
                    self.broker_answered();
                    report.failed += 1;
                    if let Some(backoff) = self.rejected(event, &error, &mut report).await? {
                        held_back.insert(event.award_id.as_str());
                        retry_after = retry_after.max(backoff);
                    }
                }
            }
        }
        if !postponed.is_empty() {
            self.store.postpone_outbox(&postponed, retry_after).await?;
        }
        report.published = published.len();
        Ok((published, report))
    }

    /// Publishes the batch in one transaction. Events a committed
    /// transaction already carried are not published again. A rejected
    /// event aborts the transaction: it spends an attempt, the others are
    /// retried at once (in order: the lease query holds back the rest of the
    /// rejected event's award).
    async fn publish_transaction(
        &self,
        events: &[OutboxEvent],
    ) -> Result<(Vec<uuid::Uuid>, StepReport), StoreError> {
        let mut report = StepReport {
            leased: events.len(),
            ..Default::default()
        };
        let settled: HashSet<uuid::Uuid> = self.sink.settled().into_iter().collect();
        let (done, todo): (Vec<&OutboxEvent>, Vec<&OutboxEvent>) =
            events.iter().partition(|e| settled.contains(&e.event_id));
        let mut published: Vec<uuid::Uuid> = done.iter().map(|e| e.event_id).collect();
        if todo.is_empty() {
            report.published = published.len();
            return Ok((published, report));
        }
        // One span per event, each as long as the transaction that carries it.
        let traced: Vec<(tracing::Span, Cow<'_, OutboxEvent>)> =
            todo.iter().map(|e| traced(e, self.sink.name())).collect();
        let sent: Vec<&OutboxEvent> = traced.iter().map(|(_, e)| e.as_ref()).collect();
        let result = self.sink.publish_transaction(&sent).await;
        for (span, _) in &traced {
            failed_on(span, result.as_ref().err().map(|f| &f.error));
        }
        drop(traced);
        match result {
            Ok(()) => {
                self.broker_answered();
                published.extend(todo.iter().map(|e| e.event_id));
            }
            Err(TransactionFailure {
                index: Some(i),
                error: PublishError::Rejected(error),
            }) if i < todo.len() => {
                self.broker_answered();
                report.failed += 1;
                let _ = self.rejected(todo[i], &error, &mut report).await?;
                let others: Vec<uuid::Uuid> = todo
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, e)| e.event_id)
                    .collect();
                if !others.is_empty() {
                    self.store.postpone_outbox(&others, Duration::ZERO).await?;
                }
            }
            Err(TransactionFailure { error, .. }) => {
                metrics::counter!("oncegate_outbox_publish_errors_total", "sink" => self.sink.name(), "kind" => "unavailable").increment(1);
                let pause = self.broker_unreachable(&error.to_string());
                let rest: Vec<uuid::Uuid> = todo.iter().map(|e| e.event_id).collect();
                report.deferred = rest.len();
                self.store.postpone_outbox(&rest, pause).await?;
            }
        }
        report.published = published.len();
        Ok((published, report))
    }

    /// Connects the sink if it is not; on a fresh connection marks what the
    /// broker says earlier transactions already carried. `false` when the
    /// broker cannot be reached (the relay pauses).
    async fn ensure_connected(&self) -> Result<bool, StoreError> {
        match self.sink.connect().await {
            Ok(fresh) => {
                if fresh {
                    self.broker_answered();
                }
                let settled = self.sink.settled();
                if fresh && !settled.is_empty() {
                    self.store.mark_published(&settled).await?;
                    self.sink.marked(&settled);
                    tracing::info!(
                        sink = self.sink.name(),
                        events = settled.len(),
                        "settled events an earlier transaction had published"
                    );
                }
                Ok(true)
            }
            Err(e) => {
                self.broker_unreachable(&e.to_string());
                Ok(false)
            }
        }
    }

    /// Records a rejection; returns the backoff, or `None` once the event is
    /// quarantined.
    async fn rejected(
        &self,
        event: &OutboxEvent,
        error: &str,
        report: &mut StepReport,
    ) -> Result<Option<Duration>, StoreError> {
        metrics::counter!("oncegate_outbox_publish_errors_total", "sink" => self.sink.name(), "kind" => "rejected").increment(1);
        let backoff = self.backoff(event.attempts + 1);
        let quarantined = self
            .store
            .record_publish_failure(event.event_id, error, self.settings.max_attempts, backoff)
            .await?;
        if quarantined {
            report.quarantined += 1;
            metrics::counter!("oncegate_outbox_quarantined_total").increment(1);
            tracing::error!(event_id = %event.event_id, award_id = %event.award_id, sequence = event.sequence, attempts = event.attempts + 1, error = %error, "outbox event quarantined after repeated rejections");
            return Ok(None);
        }
        tracing::warn!(event_id = %event.event_id, award_id = %event.award_id, attempts = event.attempts + 1, retry_in_ms = backoff.as_millis() as u64, error = %error, "publish rejected; the award's events will be retried in order");
        Ok(Some(backoff))
    }

    /// Retry delay after the `attempt`-th failure: the base backoff
    /// doubling, at most the lease.
    fn backoff(&self, attempt: i32) -> Duration {
        let exp = attempt.clamp(1, 16) as u32 - 1;
        (self.settings.retry_backoff * 2u32.pow(exp)).min(self.settings.lease)
    }

    /// One full step: lease, publish, mark.
    pub async fn step(&self) -> Result<StepReport, StoreError> {
        if !self.ensure_connected().await? {
            return Ok(StepReport {
                unconnected: true,
                ..Default::default()
            });
        }
        let events = self.lease().await?;
        if events.is_empty() {
            return Ok(StepReport::default());
        }
        let (published, report) = self.publish(&events).await?;
        if !published.is_empty() {
            self.store.mark_published(&published).await?;
            self.sink.marked(&published);
            metrics::counter!("oncegate_outbox_published_total", "sink" => self.sink.name())
                .increment(published.len() as u64);
        }
        Ok(report)
    }

    /// Steps until shutdown: immediately again while there is work, else
    /// waits for a notification or the poll interval.
    pub async fn run(self, mut stop: Stop) {
        tracing::info!(sink = self.sink.name(), "outbox relay started");
        let mut backoff = Duration::from_millis(100);
        while !stop.is_requested() {
            let busy = match self.step().await {
                Ok(r) if r.deferred > 0 || r.unconnected => {
                    let pause = self.lock_outage().since.map(|(_, p)| p).unwrap_or(backoff);
                    tokio::select! {
                        _ = stop.requested() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
                Ok(r) => {
                    backoff = Duration::from_millis(100);
                    r.leased as i64 == self.settings.batch && r.failed == 0
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay step failed");
                    tokio::select! {
                        _ = stop.requested() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            if !busy {
                tokio::select! {
                    _ = stop.requested() => {}
                    _ = self.store.wait_for_outbox(self.settings.poll) => {}
                }
            }
        }
        tracing::info!("outbox relay stopped");
    }
}

impl Relay {
    /// The relay for the configured sink (`None` when it is `none`). The
    /// broker is not reached here: the relay connects in its loop, so a
    /// broker that is down at start-up pauses the relay and nothing else.
    pub async fn connect(
        sink: &SinkSettings,
        settings: RelaySettings,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<Option<Self>> {
        use anyhow::Context;
        let sink = sink.build().context("configuring ONCEGATE_RELAY_SINK")?;
        Ok(sink.map(|sink| Self::new(store, sink, settings)))
    }
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

/// Marks a publish span failed (the error is the broker's, never the event's
/// payload).
fn failed_on(span: &tracing::Span, error: Option<&PublishError>) {
    if let Some(e) = error {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", tracing::field::display(e));
    }
}

/// Refreshes the outbox gauges from the store every `interval`, whatever
/// the relay is doing (paused by an outage, backing off, busy), so the
/// backlog alert sees events waiting during an outage.
pub async fn report_outbox_gauges(store: &dyn Store, interval: Duration, mut stop: Stop) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.requested() => return,
            _ = tick.tick() => {
                match tokio::time::timeout(interval.max(Duration::from_secs(1)), store.outbox_stats()).await {
                    Ok(Ok(s)) => {
                        metrics::gauge!("oncegate_outbox_backlog").set(s.backlog as f64);
                        metrics::gauge!("oncegate_outbox_oldest_age_seconds").set(s.oldest_age.as_secs_f64());
                        metrics::gauge!("oncegate_outbox_quarantined").set(s.quarantined as f64);
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "reading the outbox statistics failed"),
                    Err(_) => tracing::debug!("reading the outbox statistics timed out"),
                }
            }
        }
    }
}
