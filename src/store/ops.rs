//! The rows of the operator commands (DESIGN §10), as both backends read
//! them: what `reconcile` compares (`crate::reconcile` does the comparing),
//! what `inspect` and `outbox list` show, and what a redrive changes.

use super::{AuditDecision, AuditEntry, AuditRecord};
use crate::time_fmt::serde_rfc3339;
use serde::Serialize;
use std::sync::Arc;
use time::OffsetDateTime;
use uuid::Uuid;

/// The only event type a ledger row has; other types (DESIGN §9's
/// `effect.completed`) have no ledger row and are not reconciled with one.
pub const LEDGER_EVENT_TYPE: &str = "disbursement.recorded";

/// A ledger row, every column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerRow {
    pub id: Uuid,
    pub idempotency_key: String,
    pub award_id: String,
    pub amount_cents: i64,
    pub sequence: i64,
    pub submission_timestamp: String,
    pub payload_digest: String,
    pub fingerprint: String,
    #[serde(serialize_with = "serde_rfc3339::serialize")]
    pub recorded_at: OffsetDateTime,
}

/// A claim row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRow {
    pub idempotency_key: String,
    pub award_id: String,
    pub fingerprint: String,
    pub disbursement_id: Uuid,
    #[serde(serialize_with = "serde_rfc3339::serialize")]
    pub claimed_at: OffsetDateTime,
}

/// One key of a reconcile batch: its ledger row and its claim (either may be
/// missing), and — for a ledger row recent enough that its event cannot have
/// been cleaned up yet — how many ledger events the outbox holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub key: String,
    pub ledger: Option<LedgerRow>,
    pub claim: Option<ClaimRow>,
    pub events: Option<i64>,
}

/// An outbox row, every column but the lease bookkeeping's internals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    pub event_id: Uuid,
    pub event_type: String,
    pub award_id: String,
    pub sequence: i64,
    /// The event body (JSON), as published.
    pub payload: String,
    #[serde(serialize_with = "serde_rfc3339::serialize")]
    pub created_at: OffsetDateTime,
    #[serde(serialize_with = "serde_rfc3339::option")]
    pub published_at: Option<OffsetDateTime>,
    pub attempts: i32,
    /// A rejected event waits for its retry until then.
    #[serde(serialize_with = "serde_rfc3339::option")]
    pub leased_until: Option<OffsetDateTime>,
    pub last_error: Option<String>,
    #[serde(serialize_with = "serde_rfc3339::option")]
    pub quarantined_at: Option<OffsetDateTime>,
}

/// Where an outbox event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    Published,
    /// Refused by the broker `max_attempts` times; waits for a redrive.
    Quarantined,
    /// Rejected by the broker, held back until its retry (`leased_until`);
    /// the award's later events wait behind it.
    Retrying,
    /// Waiting for a relay.
    Pending,
}

impl EventState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Published => "published",
            Self::Quarantined => "quarantined",
            Self::Retrying => "retrying",
            Self::Pending => "pending",
        }
    }
}

impl EventRecord {
    /// The state at `now`.
    pub fn state(&self, now: OffsetDateTime) -> EventState {
        if self.published_at.is_some() {
            EventState::Published
        } else if self.quarantined_at.is_some() {
            EventState::Quarantined
        } else if self.leased_until.is_some_and(|t| t >= now) {
            EventState::Retrying
        } else {
            EventState::Pending
        }
    }

    /// The idempotency key the body names, if it names one.
    pub fn key(&self) -> Option<String> {
        let body: serde_json::Value = serde_json::from_str(&self.payload).ok()?;
        body.get("idempotency_key")?.as_str().map(str::to_string)
    }
}

/// An outbox event with the ledger row of its award and sequence, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPair {
    pub event: EventRecord,
    pub ledger: Option<LedgerRow>,
}

/// An award's running total row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Balance {
    pub award_id: String,
    pub total_cents: i64,
    pub disbursement_count: i64,
    pub last_sequence: i64,
    #[serde(serialize_with = "serde_rfc3339::serialize")]
    pub updated_at: OffsetDateTime,
}

/// What an award's ledger rows add up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerAggregate {
    /// Exact (a sum of `i64` amounts can pass `i64::MAX` in a corrupted ledger).
    pub sum_cents: i128,
    pub rows: i64,
    pub distinct_sequences: i64,
    pub min_sequence: i64,
    pub max_sequence: i64,
}

/// One award of a reconcile batch: its running total row and its ledger
/// rows' aggregate (either may be missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwardTotals {
    pub award_id: String,
    pub balance: Option<Balance>,
    pub ledger: Option<LedgerAggregate>,
}

/// The first place an award's sequence numbers stop counting 1, 2, 3, …:
/// the row at `found` where `expected` was due (a gap when `found` is
/// larger, a repeat when smaller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceGap {
    pub expected: i64,
    pub found: i64,
    pub idempotency_key: String,
}

/// A ledger row found by key, with the ids of the ledger events the outbox
/// still holds for it (none once they were published and cleaned up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMatch {
    pub ledger: LedgerRow,
    pub event_ids: Vec<Uuid>,
}

/// Where a reconcile run starts: the store's clock (the one `published_at`
/// and the purge use) and the oldest claim and published event left, which
/// bound what retention can have removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileStart {
    pub now: OffsetDateTime,
    pub oldest_claim: Option<OffsetDateTime>,
    pub oldest_published_event: Option<OffsetDateTime>,
}

/// Held while one instance runs the scheduled reconcile (Postgres: a
/// session advisory lock on a connection of its own, released when this is
/// dropped).
pub struct RunLock(pub Box<dyn Send>);

/// Everything the store holds about one key. Audit rows hold only the key's
/// first 12 characters, so `audit` is every row with that prefix, in time
/// order (a row of another award is a key reuse, or — rarely — another key
/// with the same prefix).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInspection {
    pub idempotency_key: String,
    pub claim: Option<ClaimRow>,
    pub ledger: Option<LedgerRow>,
    pub events: Vec<EventRecord>,
    pub audit: Vec<AuditRecord>,
}

impl KeyInspection {
    /// True when the store knows nothing of the key.
    pub fn is_empty(&self) -> bool {
        self.claim.is_none() && self.ledger.is_none() && self.events.is_empty() && self.audit.is_empty()
    }
}

/// Which outbox events `outbox list` shows: unpublished ones (pending,
/// leased or quarantined), oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxFilter {
    pub quarantined_only: bool,
    pub award_id: Option<String>,
    pub limit: i64,
}

/// Which events a redrive puts back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveTarget {
    /// These events (each must be quarantined).
    Events(Vec<Uuid>),
    /// The oldest quarantined events (of one award, if given), at most the
    /// call's limit.
    AllQuarantined { award_id: Option<String> },
}

/// Who redrives, and why: written to each event's audit row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveBy {
    pub actor: Arc<str>,
    pub reason: String,
}

/// What a redrive did with one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveOutcome {
    /// Back to pending; the record is the event as it was (attempts, last error).
    Redriven(EventRecord),
    /// Not quarantined (published, pending or leased): left alone.
    NotQuarantined(EventRecord),
    NotFound(Uuid),
}

/// The audit row of a redrive: decision `redriven`, the operator as the
/// instance, and the event, its failed attempts, its last error and the
/// operator's reason as JSON detail.
pub fn redrive_audit(event: &EventRecord, by: &RedriveBy, at: OffsetDateTime) -> AuditEntry {
    let key = event.key().unwrap_or_default();
    let detail = serde_json::json!({
        "event_id": event.event_id,
        "sequence": event.sequence,
        "attempts": event.attempts,
        "quarantined_at": event.quarantined_at.map(crate::time_fmt::rfc3339),
        "last_error": event.last_error,
        "reason": by.reason,
    });
    AuditEntry {
        at,
        decision: AuditDecision::Redriven,
        tier: None,
        key_prefix: crate::key::key_prefix(&key).to_string(),
        award_id: event.award_id.clone(),
        instance: by.actor.clone(),
        payload_changed: false,
        detail: Some(detail.to_string()),
    }
}

/// Awards a batch boundary looks ahead over.
pub(crate) const AWARD_LOOKAHEAD: i64 = 1000;

/// The last award of a batch of about `max_rows` ledger rows (at least one
/// award), from the next awards and their running row counts; `None` when
/// all of the rest fits (fewer than `lookahead` came back).
pub(crate) fn batch_end(cumulative: &[(String, i64)], max_rows: i64, lookahead: i64) -> Option<String> {
    let mut end = None;
    for (award, rows) in cumulative {
        if end.is_some() && *rows > max_rows {
            return end;
        }
        end = Some(award.clone());
    }
    if (cumulative.len() as i64) < lookahead {
        None
    } else {
        end
    }
}

/// What a redrive of `target` does with the `events` it locked: each
/// requested event in table order, then the ids not found.
pub(crate) fn redrive_outcomes(target: &RedriveTarget, events: Vec<EventRecord>) -> Vec<RedriveOutcome> {
    let mut outcomes: Vec<RedriveOutcome> = events
        .into_iter()
        .map(|e| {
            if e.quarantined_at.is_some() && e.published_at.is_none() {
                RedriveOutcome::Redriven(e)
            } else {
                RedriveOutcome::NotQuarantined(e)
            }
        })
        .collect();
    if let RedriveTarget::Events(ids) = target {
        let found: std::collections::HashSet<Uuid> = outcomes
            .iter()
            .filter_map(|o| match o {
                RedriveOutcome::Redriven(e) | RedriveOutcome::NotQuarantined(e) => Some(e.event_id),
                RedriveOutcome::NotFound(_) => None,
            })
            .collect();
        let mut seen = found;
        let missing = ids.iter().copied().filter(|id| seen.insert(*id));
        outcomes.extend(missing.map(RedriveOutcome::NotFound).collect::<Vec<_>>());
    }
    outcomes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cum(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
        rows.iter().map(|(a, n)| (a.to_string(), *n)).collect()
    }

    #[test]
    fn a_batch_ends_before_the_award_that_overflows_it_but_holds_at_least_one() {
        let next = cum(&[("a", 400), ("b", 900), ("c", 1500)]);
        assert_eq!(batch_end(&next, 1000, 3), Some("b".into()));
        assert_eq!(
            batch_end(&cum(&[("huge", 5000), ("b", 5001)]), 1000, 3),
            Some("huge".into())
        );
        assert_eq!(
            batch_end(&cum(&[("a", 1), ("b", 2)]), 1000, 3),
            None,
            "the rest fits"
        );
        assert_eq!(
            batch_end(&cum(&[("a", 1), ("b", 2), ("c", 3)]), 1000, 3),
            Some("c".into())
        );
        assert_eq!(batch_end(&[], 1000, 3), None);
    }
}
