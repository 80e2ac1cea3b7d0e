//! The authoritative store: one seam, two backends (Postgres, embedded SQLite),
//! chosen by URL scheme. Both pass one conformance suite (`tests/it/store_suite.rs`).
//!
//! A claim is one transaction: claim row (`INSERT … ON CONFLICT DO NOTHING`,
//! row count decides), ledger row, running total with the per-award sequence,
//! outbox event and audit row. Commit, then answer.

pub mod postgres;
pub mod sqlite;

use crate::error::StoreError;
use crate::submission::Submission;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use uuid::Uuid;

/// The ledger row written by a claim: returned, identical, on every duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disbursement {
    pub id: Uuid,
    pub award_id: String,
    pub amount_cents: i64,
    /// Microsecond precision, UTC.
    pub recorded_at: OffsetDateTime,
    /// Per-award sequence number, from 1.
    pub sequence: i64,
}

/// The stored result of a committed claim: what every tier caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub key: String,
    pub fingerprint: String,
    pub disbursement: Disbursement,
}

impl StoredResult {
    /// Approximate heap size, for the L1 byte budget.
    pub fn weight(&self) -> u32 {
        (self.key.len() + self.fingerprint.len() + self.disbursement.award_id.len() + 96) as u32
    }
}

/// Per-item result of a claim batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This call committed the claim and its side effects.
    Claimed(StoredResult),
    /// Already committed, with the same fingerprint: the stored result.
    Duplicate(StoredResult),
    /// Already committed with a different fingerprint: refused.
    KeyReused(StoredResult),
}

/// Who is claiming, for the audit rows written in the claim transaction.
#[derive(Debug, Clone)]
pub struct ClaimContext {
    pub instance: Arc<str>,
}

/// One audit row.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub at: OffsetDateTime,
    pub decision: AuditDecision,
    /// The deciding tier for duplicates (`LOCAL_CACHE`, `REDIS`, `DATABASE`).
    pub tier: Option<&'static str>,
    pub key_prefix: String,
    pub award_id: String,
    pub instance: Arc<str>,
    /// A new key for an award id and timestamp already in the ledger under
    /// another key: the payload changed. Processed, but flagged.
    pub payload_changed: bool,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditDecision {
    Processed,
    Duplicate,
    Rejected,
}

impl AuditDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Duplicate => "duplicate",
            Self::Rejected => "rejected",
        }
    }
}

/// An outbox event leased by a relay.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    pub event_id: Uuid,
    pub event_type: String,
    pub award_id: String,
    pub sequence: i64,
    /// JSON: event id, type, award id, amount, key, sequence, recorded time.
    pub payload: String,
    pub attempts: i32,
}

/// Outbox health, for metrics.
#[derive(Debug, Clone, Default)]
pub struct OutboxStats {
    pub backlog: i64,
    pub oldest_age: Duration,
    pub quarantined: i64,
}

/// What a retention run removes.
#[derive(Debug, Clone)]
pub struct RetentionPolicy {
    /// Claims and audit rows older than this go.
    pub retention: Duration,
    /// Published outbox rows older than this go.
    pub outbox_retention: Duration,
    /// Rows per delete transaction.
    pub batch_size: i64,
}

/// What a retention run removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// False when another instance held the purge lock.
    pub ran: bool,
    pub claims_deleted: u64,
    pub audit_deleted: u64,
    pub outbox_deleted: u64,
    /// Age of the oldest claim left, for the purge-lag metric.
    pub oldest_claim_age: Option<Duration>,
}

/// Ledger-wide figures, for checks after a benchmark or a chaos run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerSummary {
    pub claims: i64,
    pub disbursements: i64,
    pub total_cents: i64,
    /// Awards whose running total or count differs from their ledger rows.
    pub mismatched_awards: i64,
    /// Awards whose sequences are not exactly 1..=count.
    pub sequence_gaps: i64,
    pub outbox_events: i64,
    pub outbox_unpublished: i64,
    pub audit_processed: i64,
    pub audit_duplicates: i64,
}

/// Which backend a store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
}

/// The authoritative store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// Applies this backend's migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Cheap reachability check.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Claims distinct keys in one transaction. Returns one outcome per
    /// item, in order. On `Err` nothing was written.
    async fn claim_unique(
        &self,
        items: &[&Submission],
        ctx: &ClaimContext,
    ) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Re-creates purged claim rows from the ledger (late redeliveries).
    async fn restore_claims(&self, keys: &[String]) -> Result<(), StoreError>;

    /// The stored result for a key: from the claim, or from the ledger when
    /// the claim was purged.
    async fn lookup(&self, key: &str) -> Result<Option<StoredResult>, StoreError>;

    /// Appends audit rows (duplicates answered by a cache tier, rejections).
    async fn append_audit(&self, rows: &[AuditEntry]) -> Result<(), StoreError>;

    /// Leases up to `limit` unpublished, unquarantined events whose lease
    /// expired, for `lease`. Replicas never lease the same row at once, and
    /// no event is leased while an earlier event of its award is still leased
    /// or postponed (per-award order survives a failed publish).
    async fn lease_outbox(
        &self,
        limit: i64,
        lease: Duration,
        owner: &str,
    ) -> Result<Vec<OutboxEvent>, StoreError>;

    /// Marks events published (ends their lease).
    async fn mark_published(&self, ids: &[Uuid]) -> Result<(), StoreError>;

    /// Records a failed publish: the event is retried after `retry_after`,
    /// or quarantined once `attempts` reaches `max_attempts`. Returns true
    /// when quarantined.
    async fn record_publish_failure(
        &self,
        id: Uuid,
        error: &str,
        max_attempts: i32,
        retry_after: Duration,
    ) -> Result<bool, StoreError>;

    /// Keeps leased events reserved for `retry_after` more (events held back
    /// behind a failed one of the same award, retried together with it).
    async fn postpone_outbox(&self, ids: &[Uuid], retry_after: Duration) -> Result<(), StoreError>;

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError>;

    /// One retention run; returns `ran: false` if another instance holds the lock.
    async fn purge(&self, policy: &RetentionPolicy) -> Result<PurgeReport, StoreError>;

    async fn ledger_summary(&self) -> Result<LedgerSummary, StoreError>;

    /// Connections open and idle, for the pool gauges.
    fn pool_usage(&self) -> Option<(u32, usize)> {
        None
    }

    /// Waits until an outbox insert is signalled or `timeout` passes.
    /// Backends without notifications just sleep (polling).
    async fn wait_for_outbox(&self, timeout: Duration);
}

/// Opens the store for a URL: `postgres://…` or `sqlite://path`.
pub async fn open(url: &str, pool_size: u32) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PostgresStore::connect(url, pool_size).await?))
    } else if let Some(path) = url.strip_prefix("sqlite://") {
        Ok(Arc::new(sqlite::SqliteStore::open(path).await?))
    } else {
        Err(StoreError::Other(format!(
            "unsupported database URL scheme in {:?}: use postgres:// or sqlite://",
            crate::config::mask_url(url)
        )))
    }
}

/// Ledger-wide figures in one statement, valid on both backends.
pub(crate) const LEDGER_SUMMARY_SQL: &str = "SELECT \
       (SELECT count(*) FROM processed_messages), \
       (SELECT count(*) FROM disbursements), \
       (SELECT CAST(coalesce(sum(amount_cents), 0) AS BIGINT) FROM disbursements), \
       (SELECT count(*) FROM award_balances b FULL JOIN ( \
          SELECT award_id, CAST(sum(amount_cents) AS BIGINT) AS s, count(*) AS n, max(sequence) AS m \
          FROM disbursements GROUP BY award_id) d USING (award_id) \
        WHERE b.total_cents IS DISTINCT FROM d.s OR b.disbursement_count IS DISTINCT FROM d.n \
           OR b.last_sequence IS DISTINCT FROM d.m), \
       (SELECT count(*) FROM (SELECT award_id FROM disbursements GROUP BY award_id \
          HAVING max(sequence) <> count(*) OR min(sequence) <> 1) g), \
       (SELECT count(*) FROM outbox), \
       (SELECT count(*) FROM outbox WHERE published_at IS NULL), \
       (SELECT count(*) FROM audit_log WHERE decision = 'processed'), \
       (SELECT count(*) FROM audit_log WHERE decision = 'duplicate')";

/// Reads a [`LEDGER_SUMMARY_SQL`] row.
pub(crate) fn ledger_summary_from_row<'r, R>(r: &'r R) -> Result<LedgerSummary, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(LedgerSummary {
        claims: r.try_get(0)?,
        disbursements: r.try_get(1)?,
        total_cents: r.try_get(2)?,
        mismatched_awards: r.try_get(3)?,
        sequence_gaps: r.try_get(4)?,
        outbox_events: r.try_get(5)?,
        outbox_unpublished: r.try_get(6)?,
        audit_processed: r.try_get(7)?,
        audit_duplicates: r.try_get(8)?,
    })
}

/// How many times a certainly-aborted transaction is retried.
const MAX_RETRIES: u32 = 4;

/// Claims a batch that may repeat keys: per-item outcomes exactly as if each
/// item had run alone, in order. The first of repeated keys is decided by the
/// store; the others are duplicates of it (or key reuse, by fingerprint).
pub async fn claim_batch(
    store: &dyn Store,
    items: &[Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let mut first_index: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    let mut unique: Vec<&Submission> = Vec::with_capacity(items.len());
    let mut slot = Vec::with_capacity(items.len());
    for item in items {
        let idx = *first_index.entry(item.key.as_str()).or_insert_with(|| {
            unique.push(item);
            unique.len() - 1
        });
        slot.push(idx);
    }
    let decided = claim_unique_with_retry(store, &unique, ctx).await?;
    let mut seen = vec![false; unique.len()];
    Ok(items
        .iter()
        .zip(slot)
        .map(|(item, idx)| {
            if !seen[idx] {
                seen[idx] = true;
                return decided[idx].clone();
            }
            let stored = match &decided[idx] {
                ClaimOutcome::Claimed(r) | ClaimOutcome::Duplicate(r) | ClaimOutcome::KeyReused(r) => r,
            };
            if stored.fingerprint == item.fingerprint {
                ClaimOutcome::Duplicate(stored.clone())
            } else {
                ClaimOutcome::KeyReused(stored.clone())
            }
        })
        .collect())
}

async fn claim_unique_with_retry(
    store: &dyn Store,
    unique: &[&Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let mut attempt = 0;
    loop {
        match store.claim_unique(unique, ctx).await {
            Err(StoreError::Retryable(msg)) if attempt < MAX_RETRIES => {
                attempt += 1;
                metrics::counter!("oncegate_db_transactions_total", "result" => "retry").increment(1);
                tracing::debug!(attempt, error = %msg, "claim transaction aborted, retrying");
                tokio::time::sleep(Duration::from_millis(2u64 << attempt)).await;
            }
            Err(StoreError::LateRedelivery(keys)) if attempt < MAX_RETRIES => {
                attempt += 1;
                metrics::counter!("oncegate_late_redeliveries_total").increment(keys.len() as u64);
                tracing::warn!(
                    count = keys.len(),
                    "redelivery of purged claims; restoring them from the ledger"
                );
                store.restore_claims(&keys).await?;
            }
            Err(err) => {
                metrics::counter!("oncegate_db_transactions_total", "result" => "abort").increment(1);
                return Err(err);
            }
            Ok(outcomes) => {
                metrics::counter!("oncegate_db_transactions_total", "result" => "commit").increment(1);
                return Ok(outcomes);
            }
        }
    }
}

/// Assigns per-award sequence numbers to claimed items, given each award's
/// `last_sequence` after the increment. Items of one award get consecutive
/// numbers in batch order.
pub(crate) fn assign_sequences(
    claimed: &[&Submission],
    last_by_award: &HashMap<String, i64>,
    count_by_award: &HashMap<&str, i64>,
) -> Vec<i64> {
    let mut next: HashMap<&str, i64> = HashMap::with_capacity(count_by_award.len());
    claimed
        .iter()
        .map(|s| {
            let n = next
                .entry(s.award_id.as_str())
                .or_insert_with(|| last_by_award[&s.award_id] - count_by_award[s.award_id.as_str()] + 1);
            let seq = *n;
            *n += 1;
            seq
        })
        .collect()
}

/// Per award: (sum of amounts, number of items), in award order (a stable lock
/// order across concurrent transactions avoids deadlocks).
pub(crate) fn totals_by_award<'a>(claimed: &[&'a Submission]) -> Vec<(&'a str, i64, i64)> {
    let mut map: std::collections::BTreeMap<&str, (i64, i64)> = Default::default();
    for s in claimed {
        let e = map.entry(s.award_id.as_str()).or_default();
        e.0 += s.amount_cents;
        e.1 += 1;
    }
    map.into_iter().map(|(a, (sum, n))| (a, sum, n)).collect()
}

/// Items claimed in this batch whose award id and timestamp already appear
/// under another key in the same batch (the changed-payload rule).
pub(crate) fn changed_within_batch(claimed: &[&Submission]) -> Vec<bool> {
    let mut first: HashMap<(&str, &str), &str> = HashMap::new();
    claimed
        .iter()
        .map(|s| {
            let k = first
                .entry((s.award_id.as_str(), s.submission_timestamp.as_str()))
                .or_insert(s.key.as_str());
            *k != s.key.as_str()
        })
        .collect()
}

/// The outbox event body: everything a downstream consumer needs, no payload.
pub(crate) fn event_json(event_id: Uuid, s: &Submission, d: &Disbursement) -> String {
    serde_json::json!({
        "event_id": event_id,
        "type": "disbursement.recorded",
        "disbursement_id": d.id,
        "award_id": d.award_id,
        "amount_cents": d.amount_cents,
        "idempotency_key": s.key,
        "sequence": d.sequence,
        "recorded_at": crate::time_fmt::rfc3339(d.recorded_at),
    })
    .to_string()
}

/// Now, truncated to microseconds (both backends store microseconds).
pub(crate) fn now_micros() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1000 * 1000)
        .unwrap_or(now)
}

/// The outcome for one claimed-or-not item given the stored result.
pub(crate) fn outcome_for(item: &Submission, stored: StoredResult) -> ClaimOutcome {
    if stored.fingerprint == item.fingerprint {
        ClaimOutcome::Duplicate(stored)
    } else {
        ClaimOutcome::KeyReused(stored)
    }
}
