//! The embedded default store: one SQLite file in WAL mode with full
//! synchronous durability. Same tables, same one-transaction claim.
//!
//! SQLite has one writer at a time, so the write pool has one connection and
//! every write transaction starts `IMMEDIATE`: no `SKIP LOCKED` is needed for
//! the relay's leases, and no advisory lock for the purge, because nothing
//! can interleave with a write transaction. The relay polls, and is woken
//! in-process after each commit that wrote outbox rows. This file has the
//! claims' capability and administration; each other capability is a file
//! of its own (`slots`, `effect`, `ops`, and `seal`, which also purges audit
//! rows).

mod seal;

mod effect;

mod ops;

mod slots;

use super::shared::{LEDGER_SUMMARY_SQL, event_json, ledger_summary_from_row};
use super::*;
use crate::error::StoreError;
use crate::key::key_prefix;
use crate::store::rows::stored_result;
use crate::time_fmt::to_micros;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};
use tokio::sync::Notify;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    outbox_written: Notify,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path`.
    pub async fn open(path: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options.read_only(true));
        Ok(Self {
            writer,
            reader,
            outbox_written: Notify::new(),
        })
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }
}

const SELECT_STORED: &str = "SELECT idempotency_key, fingerprint, id, award_id, amount_cents, \
     recorded_at, sequence FROM disbursements WHERE idempotency_key = ?";

async fn load_stored(
    tx: &mut Transaction<'_, Sqlite>,
    key: &str,
) -> Result<Option<StoredResult>, StoreError> {
    let row = sqlx::query(SELECT_STORED)
        .bind(key)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.as_ref().map(stored_result).transpose()?)
}

/// The side effects of one claimed item: total, ledger row, outbox event,
/// audit row. Returns the ledger row, or `None` when the ledger already
/// holds the key (a claim purged long ago: late redelivery).
async fn apply_claim(
    tx: &mut Transaction<'_, Sqlite>,
    s: &Submission,
    id: Uuid,
    now: OffsetDateTime,
    ctx: &ClaimContext,
) -> Result<Option<Disbursement>, StoreError> {
    let sequence = bump_balance(tx, s, now).await?;
    // Checked before this item's own ledger row exists; earlier items of the
    // batch are already in, so a within-batch payload change is seen too.
    let payload_changed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM disbursements \
           WHERE award_id = ?1 AND submission_timestamp = ?2 AND idempotency_key <> ?3)",
    )
    .bind(&s.award_id)
    .bind(&s.submission_timestamp)
    .bind(&s.key)
    .fetch_one(&mut **tx)
    .await?;
    let d = Disbursement {
        id,
        award_id: s.award_id.clone(),
        amount_cents: s.amount_cents,
        recorded_at: now,
        sequence,
    };
    if !insert_ledger_row(tx, s, &d).await? {
        return Ok(None);
    }
    let event_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, traceparent, award_hash) \
         VALUES (?1, 'disbursement.recorded', ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .bind(event_id.to_string())
    .bind(&s.award_id)
    .bind(sequence)
    .bind(event_json(event_id, s, &d))
    .bind(to_micros(now))
    .bind(s.traceparent.as_deref())
    .bind(super::slots::award_hash(&s.award_id))
    .execute(&mut **tx)
    .await?;
    if payload_changed {
        metrics::counter!("oncegate_payload_changed_resubmissions_total").increment(1);
    }
    insert_audit_row(tx, now, (AuditDecision::Processed, None), s, ctx, payload_changed).await?;
    Ok(Some(d))
}

/// Adds the item to its award's running total; returns its sequence number.
/// A total that would overflow is left alone (SQLite would turn it into a
/// REAL) and reported: the caller rolls back.
async fn bump_balance(
    tx: &mut Transaction<'_, Sqlite>,
    s: &Submission,
    now: OffsetDateTime,
) -> Result<i64, StoreError> {
    let sequence: Option<i64> = sqlx::query_scalar(
        "INSERT INTO award_balances (award_id, total_cents, disbursement_count, last_sequence, updated_at) \
         VALUES (?1, ?2, 1, 1, ?3) \
         ON CONFLICT (award_id) DO UPDATE SET total_cents = total_cents + excluded.total_cents, \
           disbursement_count = disbursement_count + 1, last_sequence = last_sequence + 1, \
           updated_at = excluded.updated_at \
         WHERE total_cents <= 9223372036854775807 - excluded.total_cents \
         RETURNING last_sequence",
    )
    .bind(&s.award_id)
    .bind(s.amount_cents)
    .bind(to_micros(now))
    .fetch_optional(&mut **tx)
    .await?;
    sequence.ok_or_else(|| StoreError::TotalOverflow(s.award_id.clone()))
}

/// Inserts the ledger row; false when the ledger already holds the key.
async fn insert_ledger_row(
    tx: &mut Transaction<'_, Sqlite>,
    s: &Submission,
    d: &Disbursement,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence, \
           submission_timestamp, payload_digest, fingerprint, recorded_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(d.id.to_string())
    .bind(&s.key)
    .bind(&s.award_id)
    .bind(s.amount_cents)
    .bind(d.sequence)
    .bind(&s.submission_timestamp)
    .bind(&s.payload_digest)
    .bind(&s.fingerprint)
    .bind(to_micros(d.recorded_at))
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// One audit row for a decision of this transaction.
async fn insert_audit_row(
    tx: &mut Transaction<'_, Sqlite>,
    at: OffsetDateTime,
    (decision, tier): (AuditDecision, Option<Tier>),
    s: &Submission,
    ctx: &ClaimContext,
    payload_changed: bool,
) -> Result<(), StoreError> {
    let detail = (decision == AuditDecision::Rejected).then_some(KEY_REUSED);
    sqlx::query(
        "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .bind(to_micros(at))
    .bind(decision.as_str())
    .bind(tier.map(Tier::as_str))
    .bind(key_prefix(&s.key))
    .bind(&s.award_id)
    .bind(&*ctx.instance)
    .bind(payload_changed)
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

const KEY_REUSED: &str = "idempotency key reused with a different submission";

/// Claims `batch` inside `tx`: its unique keys one by one, then the audit
/// rows of its repeats. Returns the outcomes and whether outbox rows were
/// written.
async fn claim_in_tx(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &ClaimBatch<'_>,
    ctx: &ClaimContext,
) -> Result<(Vec<ClaimOutcome>, bool), StoreError> {
    let now = crate::time_fmt::now_micros();
    let mut decided = Vec::with_capacity(batch.unique().len());
    let mut late = Vec::new();
    for s in batch.unique() {
        match claim_one(tx, s, now, ctx).await? {
            Some(outcome) => decided.push(outcome),
            None => late.push(s.key.clone()),
        }
    }
    if !late.is_empty() {
        return Err(StoreError::LateRedelivery(late));
    }
    let outcomes = batch.expand(&decided);
    for (i, (s, outcome)) in batch.items().iter().zip(&outcomes).enumerate() {
        if batch.is_repeat(i) {
            insert_audit_row(tx, now, outcome.audit(), s, ctx, false).await?;
        }
    }
    let wrote_outbox = decided.iter().any(|o| matches!(o, ClaimOutcome::Claimed(_)));
    Ok((outcomes, wrote_outbox))
}

/// Claims one key: `None` when its claim was purged but its ledger row is
/// there (a late redelivery).
async fn claim_one(
    tx: &mut Transaction<'_, Sqlite>,
    s: &Submission,
    now: OffsetDateTime,
    ctx: &ClaimContext,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let id = Uuid::now_v7();
    let claimed = sqlx::query(
        "INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(&s.key)
    .bind(&s.award_id)
    .bind(&s.fingerprint)
    .bind(id.to_string())
    .bind(to_micros(now))
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1;
    if claimed {
        return Ok(apply_claim(tx, s, id, now, ctx).await?.map(|d| {
            ClaimOutcome::Claimed(StoredResult {
                key: s.key.clone(),
                fingerprint: s.fingerprint.clone(),
                disbursement: d,
            })
        }));
    }
    let stored = load_stored(tx, &s.key)
        .await?
        .ok_or_else(|| StoreError::Other(format!("claim {} has no ledger row", key_prefix(&s.key))))?;
    let outcome = stored.outcome_for(s);
    insert_audit_row(tx, now, outcome.audit(), s, ctx, false).await?;
    Ok(Some(outcome))
}

impl StoreBase for SqliteStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }
}

#[async_trait]
impl ClaimStore for SqliteStore {
    async fn claim_batch(
        &self,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut tx = self.begin().await?;
        let (outcomes, wrote_outbox) = claim_in_tx(&mut tx, batch, ctx).await?;
        tx.commit().await?;
        if wrote_outbox {
            self.outbox_written.notify_one();
        }
        Ok(outcomes)
    }

    async fn restore_claims(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        for key in keys {
            sqlx::query(
                "INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at) \
                 SELECT idempotency_key, award_id, fingerprint, id, ?2 FROM disbursements \
                 WHERE idempotency_key = ?1 ON CONFLICT (idempotency_key) DO NOTHING",
            )
            .bind(key)
            .bind(to_micros(OffsetDateTime::now_utc()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn lookup(&self, key: &str) -> Result<Option<StoredResult>, StoreError> {
        let row = sqlx::query(SELECT_STORED)
            .bind(key)
            .fetch_optional(&self.reader)
            .await?;
        Ok(row.as_ref().map(stored_result).transpose()?)
    }

    async fn append_audit(&self, rows: &[AuditEntry]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        for r in rows {
            sqlx::query(
                "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .bind(to_micros(r.at))
            .bind(r.decision.as_str())
            .bind(r.tier.map(Tier::as_str))
            .bind(&r.key_prefix)
            .bind(&r.award_id)
            .bind(&*r.instance)
            .bind(r.payload_changed)
            .bind(r.detail.as_deref())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl AdminStore for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.writer).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(err) => StoreError::from_sqlx(err),
            other => StoreError::Other(format!("migration failed: {other}")),
        })?;
        // Rows written before the slots existed get their award hash (SQLite
        // has no SHA-256 to do it in the migration).
        slots::backfill_award_hashes(&self.writer).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn purge(&self, policy: &RetentionPolicy) -> Result<PurgeReport, StoreError> {
        let now = OffsetDateTime::now_utc();
        let cutoff = to_micros(now - policy.retention);
        let outbox_cutoff = to_micros(now - policy.outbox_retention);
        let mut report = PurgeReport {
            ran: true,
            ..Default::default()
        };
        report.claims_deleted = self
            .delete_in_batches(
                "DELETE FROM processed_messages WHERE idempotency_key IN ( \
                   SELECT idempotency_key FROM processed_messages WHERE claimed_at < ?1 \
                   ORDER BY claimed_at LIMIT ?2)",
                cutoff,
                policy.batch_size,
            )
            .await?;
        report.effects_deleted = self
            .delete_in_batches(effect::PURGE_SQL, cutoff, policy.batch_size)
            .await?;
        report.audit_deleted = self.purge_audit(cutoff, policy.batch_size).await?;
        report.outbox_deleted = self
            .delete_in_batches(
                "DELETE FROM outbox WHERE event_id IN ( \
                   SELECT event_id FROM outbox WHERE published_at < ?1 LIMIT ?2)",
                outbox_cutoff,
                policy.batch_size,
            )
            .await?;
        let oldest: Option<i64> = sqlx::query_scalar("SELECT min(claimed_at) FROM processed_messages")
            .fetch_one(&self.reader)
            .await?;
        report.oldest_claim_age =
            oldest.map(|t| Duration::from_micros((to_micros(OffsetDateTime::now_utc()) - t).max(0) as u64));
        Ok(report)
    }

    async fn ledger_summary(&self) -> Result<LedgerSummary, StoreError> {
        let row = sqlx::query(LEDGER_SUMMARY_SQL).fetch_one(&self.reader).await?;
        Ok(ledger_summary_from_row(&row)?)
    }

    async fn privilege_excess(&self) -> Result<Option<Vec<String>>, StoreError> {
        Ok(None)
    }

    async fn grant_app_role(&self, _role: &str) -> Result<(), StoreError> {
        Err(StoreError::Other(
            "database roles are a Postgres feature; the SQLite file has none".into(),
        ))
    }

    async fn read_only_excess(&self) -> Result<Option<Vec<String>>, StoreError> {
        Ok(None)
    }

    async fn grant_console_role(&self, _role: &str) -> Result<(), StoreError> {
        Err(StoreError::Other(
            "database roles are a Postgres feature; the SQLite file has none".into(),
        ))
    }

    /// SQLite holds no floor of its own: `ONCEGATE_RETENTION_FLOOR` is
    /// checked in the configuration.
    async fn retention_floor(&self) -> Result<Option<Duration>, StoreError> {
        Ok(None)
    }
}

impl SqliteStore {
    /// Runs a `(cutoff, batch)` delete until a batch comes back short, each
    /// batch its own transaction.
    async fn delete_in_batches(&self, sql: &'static str, cutoff: i64, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let mut tx = self.begin().await?;
            let n = sqlx::query(sql)
                .bind(cutoff)
                .bind(batch)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }

    /// Audit rows older than `cutoff`, in batches, recorded (see
    /// [`seal::purge_audit_batch`]).
    async fn purge_audit(&self, cutoff: i64, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let n = seal::purge_audit_batch(self, cutoff, batch).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }
}
