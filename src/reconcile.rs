//! Reconciliation (DESIGN §10.1): proves ledger = claims = running totals =
//! sequences = outbox events, and with a broker also = the events the
//! broker holds. `oncegate reconcile` prints the [`Report`]; `serve` runs
//! it every `ONCEGATE_RECONCILE_INTERVAL` and exports
//! `oncegate_reconciliation_mismatches{check}`.
//!
//! Large tables: every read is one short statement over a key range
//! ([`ReconcileSettings::batch`] ledger rows, or awards covering about as
//! many rows), so the run never locks the ledger, never holds a snapshot
//! for longer than one batch, and the writers go on meanwhile. Each batch
//! reads both sides of a comparison in the same statement, so a claim
//! committing meanwhile is seen with its ledger row or not at all.
//!
//! 1. the broker (if any), read a page at a time: every entry, checked
//!    against the ledger row its body names, and each award's events in
//!    sequence order (a jump is a mismatch, and so is a repeat on a broker
//!    that delivers once, Kafka's read_committed); what it holds is kept
//!    per award (a range of sequences), so memory grows with the awards,
//!    not with the log;
//! 2. keys: ledger rows and claims by key range (same key, award,
//!    fingerprint, amount), and whether each recent ledger row has its event;
//! 3. events: outbox rows by id range against the ledger row of their
//!    award and sequence; a published event must be among the broker's;
//! 4. awards: running totals against their ledger rows' sum, count and
//!    last sequence, and the sequences against 1..n.
//!
//! What retention removes is not a mismatch: a ledger row older than
//! `ONCEGATE_RETENTION` may have lost its claim, one older than
//! `ONCEGATE_OUTBOX_RETENTION` its published event (both with an hour's
//! margin), a trimmed broker its oldest entries.

mod compare;
mod report;
mod seen;

pub use report::{Check, CheckReport, Mismatch, Report};

use crate::broker::{BrokerEntry, BrokerLog, Coverage, SinkSettings};
use crate::error::StoreError;
use crate::shutdown::Stop;
use crate::store::OpsStore;
use crate::store::ops::LedgerMatch;
use compare::{EntryVerdict, Windows};
use report::Tally;
use seen::{BrokerSeen, LedgerEntry};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use uuid::Uuid;

/// Slack on the retention windows: a purge may run while reconcile does.
const RETENTION_MARGIN: Duration = Duration::from_secs(3600);

/// The scheduled run's first delay after start, at most.
const FIRST_RUN_DELAY: Duration = Duration::from_secs(60);

/// Broker entries read per ledger lookup.
const BROKER_BATCH: usize = 500;

/// How a reconcile run reads and what it may take as removed by retention.
#[derive(Debug, Clone)]
pub struct ReconcileSettings {
    /// Ledger rows per statement.
    pub batch: i64,
    /// `ONCEGATE_RETENTION`: older claims may have been purged.
    pub retention: Duration,
    /// `ONCEGATE_OUTBOX_RETENTION`: older published events may have been cleaned up.
    pub outbox_retention: Duration,
    /// Mismatches kept per check for the report (all are counted).
    pub examples: usize,
    /// The relay's sink: a broker that keeps a log (Redis, NATS, Kafka) is
    /// read back. `None`, or a `none`/`log`/AMQP sink: no broker check.
    pub broker: Option<SinkSettings>,
}

/// Why a run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the broker: {0}")]
    Broker(String),
}

pub struct Reconciler {
    store: Arc<dyn OpsStore>,
    settings: ReconcileSettings,
}

/// `now - d`, or the earliest time when that is before it.
fn before(now: OffsetDateTime, d: Duration) -> OffsetDateTime {
    time::Duration::try_from(d)
        .ok()
        .and_then(|d| now.checked_sub(d))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

impl Reconciler {
    pub fn new(store: Arc<dyn OpsStore>, settings: ReconcileSettings) -> Self {
        Self { store, settings }
    }

    /// One full run.
    pub async fn run(&self) -> Result<Report, ReconcileError> {
        let clock = std::time::Instant::now();
        let start = self.store.reconcile_start().await?;
        let s = &self.settings;
        let windows = Windows {
            claims_since: before(start.now, s.retention) + RETENTION_MARGIN,
            events_since: before(start.now, s.outbox_retention) + RETENTION_MARGIN,
            oldest_claim: start.oldest_claim,
            retention: s.retention,
        };
        let mut tally = Tally::new(s.examples);
        let seen = self.read_broker(start.now, &mut tally).await?;
        self.check_keys(&windows, &mut tally).await?;
        self.check_events(seen.as_ref(), &mut tally).await?;
        self.check_awards(&mut tally).await?;
        let seconds = clock.elapsed().as_secs_f64();
        Ok(tally.finish(self.store.backend().as_str(), start.now, seconds))
    }

    async fn check_keys(&self, w: &Windows, t: &mut Tally) -> Result<(), ReconcileError> {
        let mut after = String::new();
        loop {
            let until = self.store.key_batch_end(&after, self.settings.batch).await?;
            let pairs = self
                .store
                .reconcile_keys(&after, until.as_deref(), w.events_since)
                .await?;
            for pair in &pairs {
                compare::check_key(pair, w, t);
            }
            match until {
                Some(u) => after = u,
                None => return Ok(()),
            }
        }
    }

    async fn check_events(&self, broker: Option<&BrokerSeen>, t: &mut Tally) -> Result<(), ReconcileError> {
        let mut after = Uuid::nil();
        loop {
            let pairs = self.store.reconcile_events(after, self.settings.batch).await?;
            for pair in &pairs {
                compare::check_event(pair, t);
                if let (Some(b), Some(published)) = (broker, pair.event.published_at) {
                    check_published(&pair.event, published, b, t);
                }
            }
            match pairs.last() {
                Some(last) if pairs.len() as i64 == self.settings.batch => after = last.event.event_id,
                _ => return Ok(()),
            }
        }
    }

    async fn check_awards(&self, t: &mut Tally) -> Result<(), ReconcileError> {
        let mut after = String::new();
        loop {
            let until = self.store.award_batch_end(&after, self.settings.batch).await?;
            let awards = self.store.reconcile_awards(&after, until.as_deref()).await?;
            for a in &awards {
                t.checked(Check::Totals, 1);
                if let Some(m) = compare::check_totals(a) {
                    t.mismatch(Check::Totals, m);
                }
                let Some(l) = &a.ledger else { continue };
                t.checked(Check::Sequences, 1);
                if !compare::sequences_dense(l) {
                    let gap = self.store.first_sequence_gap(&a.award_id).await?;
                    t.mismatch(Check::Sequences, compare::sequence_mismatch(&a.award_id, l, gap));
                }
            }
            match until {
                Some(u) => after = u,
                None => return Ok(()),
            }
        }
    }

    /// Reads the whole broker log (if there is a broker), checking each
    /// entry against the ledger; returns the event ids it holds.
    async fn read_broker(
        &self,
        now: OffsetDateTime,
        t: &mut Tally,
    ) -> Result<Option<BrokerSeen>, ReconcileError> {
        let Some(settings) = &self.settings.broker else {
            t.remark(Check::Broker, false, "no broker given (--sink)".into());
            return Ok(None);
        };
        let Some(mut log) = settings.open_log().await.map_err(ReconcileError::Broker)? else {
            let why = format!(
                "the sink {} keeps no log to read back (the Redis, NATS and Kafka sinks do)",
                settings.spec
            );
            t.remark(Check::Broker, false, why);
            return Ok(None);
        };
        let exactly_once = settings.spec.broker().is_some_and(|b| b.exactly_once);
        let result = self.read_log(&mut *log, now, exactly_once, t).await;
        log.close().await;
        result.map(Some)
    }

    async fn read_log(
        &self,
        log: &mut dyn BrokerLog,
        now: OffsetDateTime,
        exactly_once: bool,
        t: &mut Tally,
    ) -> Result<BrokerSeen, ReconcileError> {
        let coverage = log.coverage().await.map_err(ReconcileError::Broker)?;
        let describe = log.describe();
        remark_coverage(&describe, &coverage, t);
        let mut seen = BrokerSeen::new(coverage, now, describe, exactly_once);
        loop {
            let entries = log
                .next_batch(BROKER_BATCH)
                .await
                .map_err(ReconcileError::Broker)?;
            if entries.is_empty() {
                return Ok(seen);
            }
            self.check_entries(&entries, &mut seen, t).await?;
        }
    }

    /// One page of broker entries against the ledger rows their bodies
    /// name, and each in its award's sequence.
    async fn check_entries(
        &self,
        entries: &[BrokerEntry],
        seen: &mut BrokerSeen,
        t: &mut Tally,
    ) -> Result<(), ReconcileError> {
        let keys: Vec<String> = entries.iter().filter_map(compare::entry_key).collect();
        let matches: HashMap<String, LedgerMatch> = self
            .store
            .ledger_matches(&keys)
            .await?
            .into_iter()
            .map(|m| (m.ledger.idempotency_key.clone(), m))
            .collect();
        for entry in entries {
            t.checked(Check::Broker, 1);
            match compare::check_entry(entry, &matches) {
                EntryVerdict::Ledger(id) => {
                    let key = compare::entry_key(entry);
                    let Some(m) = key.as_ref().and_then(|k| matches.get(k)) else {
                        continue;
                    };
                    let e = LedgerEntry {
                        award_id: &m.ledger.award_id,
                        sequence: m.ledger.sequence,
                        event_id: id,
                        key: key.as_deref(),
                        position: &entry.position,
                    };
                    seen.ledger(&e, t);
                }
                EntryVerdict::Other(id) => {
                    t.note(Check::Broker, "entries_of_other_event_types", 1);
                    seen.other(id, &entry.position, t);
                }
                EntryVerdict::Mismatch(_, m) => t.mismatch(Check::Broker, m),
            }
        }
        Ok(())
    }
}

/// Says in the report what part of the published events the broker must hold.
fn remark_coverage(describe: &str, coverage: &Coverage, t: &mut Tally) {
    let remark = match coverage {
        Coverage::Everything => format!("{describe}: nothing trimmed, every published event must be there"),
        Coverage::Since(since) => format!(
            "{describe}: trimmed by its limits, events published since {} must be there",
            crate::time_fmt::rfc3339(*since)
        ),
        Coverage::Unknowable(why) => format!("{describe}: presence of published events not checked: {why}"),
    };
    t.remark(Check::Broker, true, remark);
}

/// A published event must be among the broker's entries, unless it was
/// published after the broker was read or before what the broker keeps.
fn check_published(
    event: &crate::store::ops::EventRecord,
    published: OffsetDateTime,
    b: &BrokerSeen,
    t: &mut Tally,
) {
    if !b.must_hold(published) {
        t.note(
            Check::Broker,
            "published_events_not_expected_there_(trimmed_or_newer)",
            1,
        );
        return;
    }
    t.note(Check::Broker, "published_events_checked", 1);
    let held = if event.event_type == crate::store::ops::LEDGER_EVENT_TYPE {
        b.holds_ledger(&event.award_id, event.sequence)
    } else {
        b.holds_other(event.event_id)
    };
    if held {
        return;
    }
    t.mismatch(
        Check::Broker,
        Mismatch {
            kind: "missing_from_broker",
            idempotency_key: event.key(),
            award_id: Some(event.award_id.clone()),
            event_id: Some(event.event_id),
            detail: format!(
                "event (sequence {}) published {} is not in the {}",
                event.sequence,
                crate::time_fmt::rfc3339(published),
                b.describe
            ),
        },
    );
}

impl Reconciler {
    /// Runs every `interval` until shutdown (`serve`), one instance at a
    /// time, exporting each run's result. The first run comes a minute after
    /// start (sooner for a shorter interval): not on every restart at once,
    /// but still on pods restarted more often than the interval.
    pub async fn run_every(self, interval: Duration, mut stop: Stop) {
        let first = tokio::time::Instant::now() + interval.min(FIRST_RUN_DELAY);
        let mut tick = tokio::time::interval_at(first, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.requested() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = stop.requested() => return,
                result = self.scheduled_step() => if let Err(e) = result {
                    metrics::counter!("oncegate_reconciliation_runs_total", "result" => "error").increment(1);
                    tracing::warn!(error = %e, "reconciliation failed");
                },
            }
        }
    }

    /// One scheduled run: `None` when another instance holds the lock.
    pub async fn scheduled_step(&self) -> Result<Option<Report>, ReconcileError> {
        let Some(_lock) = self.store.try_reconcile_lock().await? else {
            metrics::counter!("oncegate_reconciliation_runs_total", "result" => "skipped").increment(1);
            tracing::debug!("reconciliation skipped: another instance is running it");
            return Ok(None);
        };
        let report = self.run().await?;
        export(&report);
        Ok(Some(report))
    }
}

/// The award checks of a reconcile run (its running total against its
/// ledger rows, its sequences 1, 2, 3, …) for one award: the mismatches,
/// none when it agrees. The console's award page shows them.
pub async fn check_award(store: &dyn OpsStore, award_id: &str) -> Result<Vec<Mismatch>, StoreError> {
    let totals = store.award_totals(award_id).await?;
    let mut found: Vec<Mismatch> = compare::check_totals(&totals).into_iter().collect();
    if let Some(l) = &totals.ledger
        && !compare::sequences_dense(l)
    {
        let gap = store.first_sequence_gap(award_id).await?;
        found.push(compare::sequence_mismatch(award_id, l, gap));
    }
    Ok(found)
}

/// The run's gauges, and one log line (WARN with the counts when not clean).
fn export(report: &Report) {
    for c in report.checks.iter().filter(|c| c.ran) {
        metrics::gauge!("oncegate_reconciliation_mismatches", "check" => c.check.as_str())
            .set(c.mismatches as f64);
    }
    let finished = report.started_at + Duration::from_secs_f64(report.duration_seconds);
    metrics::gauge!("oncegate_reconciliation_last_run_timestamp_seconds")
        .set(finished.unix_timestamp_nanos() as f64 / 1e9);
    metrics::gauge!("oncegate_reconciliation_last_duration_seconds").set(report.duration_seconds);
    let result = if report.clean { "clean" } else { "mismatch" };
    metrics::counter!("oncegate_reconciliation_runs_total", "result" => result).increment(1);
    let counts: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.ran)
        .map(|c| format!("{}={}", c.check.as_str(), c.mismatches))
        .collect();
    if report.clean {
        tracing::info!(seconds = report.duration_seconds, "reconciliation clean");
    } else {
        let first = report.checks.iter().flat_map(|c| &c.examples).next();
        tracing::warn!(
            mismatches = report.mismatches,
            by_check = %counts.join(" "),
            first_kind = first.map(|m| m.kind).unwrap_or(""),
            first_key = first.and_then(|m| m.idempotency_key.as_deref()).map(crate::key::key_prefix).unwrap_or(""),
            first_award = first.and_then(|m| m.award_id.as_deref()).unwrap_or(""),
            "reconciliation found mismatches; run `oncegate reconcile` for the report"
        );
    }
}
