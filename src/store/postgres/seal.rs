//! The sealed audit trail on Postgres: the sealing lock (a session-level
//! advisory lock, which the purge functions also take), the seal horizon
//! (`oncegate_audit_seal_horizon`, migration 0005, explains why it is
//! safe), and plain reads and appends of rows, seals and purge records.

use super::PostgresStore;
use crate::error::StoreError;
use crate::store::AuditStore;
use crate::store::rows::{AUDIT_COLS, SEAL_COLS, audit_purge, audit_record, audit_seal};
use crate::store::{
    AuditPurge, AuditRecord, AuditSeal, HeldLock, RowCursor, RowSpan, SealHorizon, SealSpan, TimeRange,
};
use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use std::time::Duration;

/// Advisory lock key held by the instance that seals ("onceseal"); the
/// purge functions take it too (`oncegate_seal_lock_key()`).
pub(super) const SEAL_LOCK: i64 = 0x6f6e_6365_7365_616c;

/// A session-level advisory lock on a connection of its own: released
/// explicitly, or by the database when the connection closes.
struct SessionLock {
    conn: PgConnection,
    key: i64,
}

#[async_trait]
impl HeldLock for SessionLock {
    async fn release(mut self: Box<Self>) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(&mut self.conn)
            .await?;
        let _ = sqlx::Connection::close(self.conn).await;
        Ok(())
    }
}

#[async_trait]
impl AuditStore for PostgresStore {
    async fn lock_sealing(&self) -> Result<Option<Box<dyn HeldLock>>, StoreError> {
        // Detached: the lock can never leak back into the self.pool.
        let mut conn = self.pool.acquire().await?.detach();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(SEAL_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if !locked {
            let _ = sqlx::Connection::close(conn).await;
            return Ok(None);
        }
        Ok(Some(Box::new(SessionLock { conn, key: SEAL_LOCK })))
    }

    /// The horizon and the writers that may still add a row below it
    /// (migration 0005), then short polls until those writers have ended.
    async fn audit_seal_horizon(&self, wait: Duration) -> Result<SealHorizon, StoreError> {
        let row = sqlx::query("SELECT horizon, writers FROM oncegate_audit_seal_horizon()")
            .fetch_one(&self.pool)
            .await?;
        let through: i64 = row.try_get("horizon")?;
        let mut writers: Vec<String> = row.try_get("writers")?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(10);
        while !writers.is_empty() {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(SealHorizon::Blocked {
                    through,
                    writers: writers.len(),
                });
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(200));
            // Still running: still holding its lock on the sequence.
            writers = sqlx::query_scalar(
                "SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks \
                 WHERE locktype = 'relation' AND virtualtransaction = ANY($1) \
                   AND relation = pg_get_serial_sequence('public.audit_log', 'id')::regclass",
            )
            .bind(&writers)
            .fetch_one(&self.pool)
            .await?;
        }
        Ok(SealHorizon::Through(through))
    }

    async fn audit_rows(
        &self,
        after: RowCursor,
        through_id: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {AUDIT_COLS} FROM audit_log \
             WHERE id >= $1 AND id <= $3 AND (id > $1 OR at > $2) \
             ORDER BY id, at LIMIT $4"
        )))
        .bind(after.id)
        .bind(after.at)
        .bind(through_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(audit_record).collect::<Result<_, _>>()?)
    }

    async fn audit_rows_after(&self, after_id: i64, range: &TimeRange) -> Result<RowSpan, StoreError> {
        let row = sqlx::query(
            "SELECT count(*), min(id), max(id) FROM audit_log \
             WHERE id > $1 AND at >= coalesce($2, '-infinity') AND at < coalesce($3, 'infinity')",
        )
        .bind(after_id)
        .bind(range.from)
        .bind(range.to)
        .fetch_one(&self.pool)
        .await?;
        Ok(RowSpan {
            count: row.try_get(0)?,
            first_id: row.try_get(1)?,
            last_id: row.try_get(2)?,
        })
    }

    async fn seal_covering(&self, id: i64) -> Result<Option<AuditSeal>, StoreError> {
        // The newest seal starting at or before the row (first_id's unique
        // index, read backwards), if its range reaches the row.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SEAL_COLS} FROM audit_seals WHERE first_id <= $1 ORDER BY first_id DESC LIMIT 1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .as_ref()
            .map(audit_seal)
            .transpose()?
            .filter(|s| s.last_id >= id))
    }

    async fn audit_seals(&self, from_seq: i64, limit: i64) -> Result<Vec<AuditSeal>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SEAL_COLS} FROM audit_seals WHERE seq >= $1 ORDER BY seq LIMIT $2"
        )))
        .bind(from_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(audit_seal).collect::<Result<_, _>>()?)
    }

    async fn last_audit_seal(&self) -> Result<Option<AuditSeal>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SEAL_COLS} FROM audit_seals ORDER BY seq DESC LIMIT 1"
        )))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(audit_seal).transpose()?)
    }

    async fn audit_seal_span(&self, range: &TimeRange) -> Result<Option<SealSpan>, StoreError> {
        let row = sqlx::query(
            "WITH s AS (SELECT min(seq) AS lo, max(seq) AS hi FROM audit_seals \
                        WHERE max_at >= coalesce($1, '-infinity') AND min_at < coalesce($2, 'infinity')) \
             SELECT s.lo, s.hi, (SELECT CAST(coalesce(sum(row_count), 0) AS BIGINT) FROM audit_seals \
                                 WHERE seq BETWEEN s.lo AND s.hi) FROM s",
        )
        .bind(range.from)
        .bind(range.to)
        .fetch_one(&self.pool)
        .await?;
        let (lo, hi): (Option<i64>, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
        Ok(lo.zip(hi).map(|(first_seq, last_seq)| SealSpan {
            first_seq,
            last_seq,
            rows: row.try_get(2).unwrap_or(0),
        }))
    }

    /// Appends the seal in one transaction, after checking that its range still
    /// holds exactly its rows. The chain trigger refuses a seal that does not
    /// follow the newest one; the primary key the second of two racing sealers.
    async fn insert_audit_seal(&self, seal: &AuditSeal) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let present: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE id BETWEEN $1 AND $2")
            .bind(seal.first_id)
            .bind(seal.last_id)
            .fetch_one(&mut *tx)
            .await?;
        if present != seal.row_count {
            return Ok(false);
        }
        let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO audit_seals ({SEAL_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        )))
        .bind(seal.seq)
        .bind(seal.first_id)
        .bind(seal.last_id)
        .bind(seal.row_count)
        .bind(&seal.absent_ids)
        .bind(seal.min_at)
        .bind(seal.max_at)
        .bind(seal.sealed_at)
        .bind(&seal.sealed_by)
        .bind(&seal.prev_digest)
        .bind(&seal.digest)
        .bind(&seal.row_tags)
        .bind(&seal.signature)
        .bind(&seal.key_id)
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {
                let (event_id, body) = crate::store::shared::audit_sealed_event(seal);
                sqlx::query(
                    "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, award_hash) \
                     VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)",
                )
                .bind(event_id)
                .bind(crate::store::shared::AUDIT_SEALED_EVENT)
                .bind(crate::store::shared::AUDIT_EVENT_AWARD)
                .bind(seal.seq)
                .bind(body)
                .bind(seal.sealed_at)
                .bind(crate::store::slots::award_hash(crate::store::shared::AUDIT_EVENT_AWARD))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(true)
            }
            // unique_violation (a racing sealer took the number), check_violation
            // (the chain moved on: the trigger refused it)
            Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("23505" | "23514")) => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn audit_purges(&self, seqs: Option<(i64, i64)>) -> Result<Vec<AuditPurge>, StoreError> {
        let (lo, hi) = seqs.unzip();
        let rows = sqlx::query(
            "SELECT purged_at, cutoff, method, seal_seq, seal_digest, row_count, ids FROM audit_purges \
             WHERE CASE WHEN $1::bigint IS NULL THEN seal_seq IS NULL ELSE seal_seq BETWEEN $1 AND $2 END \
             ORDER BY id",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(audit_purge)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}
