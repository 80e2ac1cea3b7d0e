//! Idempotency records for effects outside the ledger (DESIGN §9): the row
//! types of the store seam. Both backends keep one row per
//! `(namespace, idempotency_key)` in `effects`; the lease lives there, never
//! only in a cache.

use super::AuditDecision;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

/// The record states, as stored.
pub const IN_PROGRESS: &str = "in_progress";
pub const COMPLETED: &str = "completed";
pub const RELEASED: &str = "released";

/// Audit detail of a fingerprint mismatch.
pub const REQUEST_MISMATCH: &str = "idempotency key reused with a different request";

/// A `Begin` that reached the store: who asks, for which record, with which
/// request fingerprint, and the lease it would take.
#[derive(Debug, Clone)]
pub struct EffectBegin {
    pub namespace: String,
    pub key: String,
    /// Lowercase hex SHA-256 of the request bytes.
    pub fingerprint: String,
    /// The token of the lease this call takes, if it takes one.
    pub token: String,
    pub lease_ttl: Duration,
    pub instance: Arc<str>,
}

/// Names the lease a `Complete` or `Release` acts under.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    pub namespace: &'a str,
    pub key: &'a str,
    pub token: &'a str,
    pub instance: &'a str,
}

/// A completed record: what every tier may answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedEffect {
    pub namespace: String,
    pub key: String,
    pub fingerprint: String,
    pub response: Vec<u8>,
    /// Microsecond precision, UTC.
    pub completed_at: OffsetDateTime,
    pub attempt: i32,
}

impl CompletedEffect {
    /// Approximate heap size, for the L1 byte budget.
    pub fn weight(&self) -> u32 {
        (self.namespace.len() + self.key.len() + self.fingerprint.len() + self.response.len() + 64)
            .min(u32::MAX as usize) as u32
    }
}

/// How a lease was taken, for the audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The record did not exist.
    First,
    /// The previous holder released it.
    AfterRelease,
    /// The previous holder's lease expired.
    AfterExpiry,
}

/// What `Begin` found in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginOutcome {
    /// This call holds the lease (its [`EffectBegin::token`]).
    Acquired { attempt: i32, taken: Taken },
    /// Completed with the same fingerprint: the stored response.
    Completed(CompletedEffect),
    /// A live lease held by another caller; it expires in `expires_in`
    /// unless completed or released first.
    Held { expires_in: Duration },
    /// The record's fingerprint differs: the key was reused with another
    /// request. Audited by the store.
    Mismatch,
}

/// What a fenced `Complete` or `Release` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FencedOutcome<T> {
    /// The transition happened now (or this exact call was repeated).
    Done(T),
    /// The token is not the current lease's: another attempt holds or
    /// completed the record, or there is no such record.
    LeaseLost,
    /// Completed before under this token with a different response.
    Conflict,
}

/// One record as stored, for `oncegate effect get` (never the request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    pub state: String,
    pub attempt: i32,
    pub lease_expires_at: Option<OffsetDateTime>,
    pub completed: Option<CompletedEffect>,
    pub updated_at: OffsetDateTime,
}

/// The audit decision and detail of a lease taken.
pub(crate) fn acquired_audit(taken: Taken, attempt: i32) -> (AuditDecision, String) {
    match taken {
        Taken::First => (AuditDecision::EffectAcquired, format!("attempt {attempt}")),
        Taken::AfterRelease => (
            AuditDecision::EffectAcquired,
            format!("attempt {attempt} after a release"),
        ),
        Taken::AfterExpiry => (
            AuditDecision::EffectRetaken,
            format!("attempt {attempt}: lease expired"),
        ),
    }
}

/// The `effect.completed` outbox event body: namespace, key, attempt and the
/// response's size and digest, never the response itself (it may carry a
/// provider's account data; consumers read it through `Begin`).
pub(crate) fn completed_event_json(event_id: uuid::Uuid, c: &CompletedEffect) -> String {
    serde_json::json!({
        "event_id": event_id,
        "type": "effect.completed",
        "namespace": c.namespace,
        "idempotency_key": c.key,
        "attempt": c.attempt,
        "sequence": c.attempt,
        "response_bytes": c.response.len(),
        "response_sha256": crate::key::payload_digest(&c.response),
        "completed_at": crate::time_fmt::rfc3339(c.completed_at),
    })
    .to_string()
}
