//! The sealed audit trail on SQLite, and the retention purge of audit rows.
//!
//! One writer at a time commits, and audit ids come from AUTOINCREMENT, so
//! the committed rows are always exactly the ids up to the highest one
//! committed: a seal up to it skips none, and no lock is needed for the
//! boundary. A seal is appended in a write transaction that first checks it
//! still follows the newest seal and that its range still holds its rows
//! (another process sealing, or the purge removing a row, in between: the
//! seal is dropped and made again next round).

use super::SqliteStore;
use crate::error::StoreError;
use crate::store::AuditStore;
use crate::store::rows::{SEAL_COLS, audit_purge, audit_record, audit_seal};
use crate::store::shared::IdRanges;
use crate::store::{
    AuditPurge, AuditRecord, AuditSeal, HeldLock, RowCursor, RowSpan, SealHorizon, SealSpan, TimeRange,
};
use crate::time_fmt::to_micros;
use async_trait::async_trait;
use sqlx::{Row, Sqlite, Transaction};
use time::OffsetDateTime;

/// Nothing to hold: appends check the chain instead (module docs).
struct NoLock;

#[async_trait]
impl HeldLock for NoLock {
    async fn release(self: Box<Self>) -> Result<(), StoreError> {
        Ok(())
    }
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn lock_sealing(&self) -> Result<Option<Box<dyn HeldLock>>, StoreError> {
        Ok(Some(Box::new(NoLock)))
    }

    /// The highest id ever committed (AUTOINCREMENT's counter).
    async fn audit_seal_horizon(&self, _wait: std::time::Duration) -> Result<SealHorizon, StoreError> {
        let through: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'")
                .fetch_optional(&self.reader)
                .await?;
        Ok(SealHorizon::Through(through.unwrap_or(0)))
    }

    /// Ids are unique here, so the cursor's time never matters.
    async fn audit_rows(
        &self,
        after: RowCursor,
        through_id: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at, decision, tier, key_prefix, award_id, instance, payload_changed, detail \
             FROM audit_log WHERE id > ?1 AND id <= ?2 ORDER BY id LIMIT ?3",
        )
        .bind(after.id)
        .bind(through_id)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.iter().map(audit_record).collect::<Result<_, _>>()?)
    }

    async fn audit_rows_after(&self, after_id: i64, range: &TimeRange) -> Result<RowSpan, StoreError> {
        let (from, to) = range.micros();
        let row = sqlx::query(
            "SELECT count(*), min(id), max(id) FROM audit_log WHERE id > ?1 AND at >= ?2 AND at < ?3",
        )
        .bind(after_id)
        .bind(from)
        .bind(to)
        .fetch_one(&self.reader)
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
            "SELECT {SEAL_COLS} FROM audit_seals WHERE first_id <= ?1 ORDER BY first_id DESC LIMIT 1"
        )))
        .bind(id)
        .fetch_optional(&self.reader)
        .await?;
        Ok(row
            .as_ref()
            .map(audit_seal)
            .transpose()?
            .filter(|s| s.last_id >= id))
    }

    async fn audit_seals(&self, from_seq: i64, limit: i64) -> Result<Vec<AuditSeal>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SEAL_COLS} FROM audit_seals WHERE seq >= ?1 ORDER BY seq LIMIT ?2"
        )))
        .bind(from_seq)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.iter().map(audit_seal).collect::<Result<_, _>>()?)
    }

    async fn last_audit_seal(&self) -> Result<Option<AuditSeal>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SEAL_COLS} FROM audit_seals ORDER BY seq DESC LIMIT 1"
        )))
        .fetch_optional(&self.reader)
        .await?;
        Ok(row.as_ref().map(audit_seal).transpose()?)
    }

    async fn audit_seal_span(&self, range: &TimeRange) -> Result<Option<SealSpan>, StoreError> {
        let (from, to) = range.micros();
        let row = sqlx::query(
            "WITH s AS (SELECT min(seq) AS lo, max(seq) AS hi FROM audit_seals WHERE max_at >= ?1 AND min_at < ?2) \
             SELECT s.lo, s.hi, (SELECT coalesce(sum(row_count), 0) FROM audit_seals WHERE seq BETWEEN s.lo AND s.hi) \
             FROM s",
        )
        .bind(from)
        .bind(to)
        .fetch_one(&self.reader)
        .await?;
        let (lo, hi): (Option<i64>, Option<i64>) = (row.try_get(0)?, row.try_get(1)?);
        Ok(lo.zip(hi).map(|(first_seq, last_seq)| SealSpan {
            first_seq,
            last_seq,
            rows: row.try_get(2).unwrap_or(0),
        }))
    }

    async fn insert_audit_seal(&self, seal: &AuditSeal) -> Result<bool, StoreError> {
        let mut tx = self.begin().await?;
        let newest: Option<(i64, i64, String)> =
            sqlx::query_as("SELECT seq, last_id, digest FROM audit_seals ORDER BY seq DESC LIMIT 1")
                .fetch_optional(&mut *tx)
                .await?;
        let (seq, last_id, digest) =
            newest.unwrap_or((0, 0, crate::store::shared::GENESIS_DIGEST.to_string()));
        let present: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE id BETWEEN ?1 AND ?2")
            .bind(seal.first_id)
            .bind(seal.last_id)
            .fetch_one(&mut *tx)
            .await?;
        if seal.seq != seq + 1
            || seal.first_id != last_id + 1
            || seal.prev_digest != digest
            || present != seal.row_count
        {
            return Ok(false);
        }
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO audit_seals ({SEAL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
        )))
        .bind(seal.seq)
        .bind(seal.first_id)
        .bind(seal.last_id)
        .bind(seal.row_count)
        .bind(&seal.absent_ids)
        .bind(to_micros(seal.min_at))
        .bind(to_micros(seal.max_at))
        .bind(to_micros(seal.sealed_at))
        .bind(&seal.sealed_by)
        .bind(&seal.prev_digest)
        .bind(&seal.digest)
        .bind(&seal.row_tags)
        .bind(&seal.signature)
        .bind(&seal.key_id)
        .execute(&mut *tx)
        .await?;
        let (event_id, body) = crate::store::shared::audit_sealed_event(seal);
        sqlx::query(
            "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, award_hash) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(event_id.to_string())
        .bind(crate::store::shared::AUDIT_SEALED_EVENT)
        .bind(crate::store::shared::AUDIT_EVENT_AWARD)
        .bind(seal.seq)
        .bind(body)
        .bind(to_micros(seal.sealed_at))
        .bind(crate::store::slots::award_hash(
            crate::store::shared::AUDIT_EVENT_AWARD,
        ))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.outbox_written.notify_one();
        Ok(true)
    }

    async fn audit_purges(&self, seqs: Option<(i64, i64)>) -> Result<Vec<AuditPurge>, StoreError> {
        let (lo, hi) = seqs.unzip();
        let rows = sqlx::query(
            "SELECT purged_at, cutoff, method, seal_seq, seal_digest, row_count, ids FROM audit_purges \
             WHERE CASE WHEN ?1 IS NULL THEN seal_seq IS NULL ELSE seal_seq BETWEEN ?1 AND ?2 END ORDER BY id",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(audit_purge)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}

/// One purge batch of audit rows, in its own write transaction: up to
/// `batch` of the rows the purge may remove under `cutoff` (a sealed row
/// only with its whole seal, once every seal up to it is older than the
/// cutoff; a row no seal covers yet when it is older), oldest ids first,
/// recorded per seal in the same transaction. Returns rows deleted.
pub(super) async fn purge_audit_batch(
    store: &SqliteStore,
    cutoff: i64,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut tx = store.begin().await?;
    let (head_last, expired_through): (i64, i64) = sqlx::query_as(
        "SELECT coalesce((SELECT max(last_id) FROM audit_seals), 0), \
                coalesce((SELECT max(last_id) FROM audit_seals WHERE seq < \
                  coalesce((SELECT min(seq) FROM audit_seals WHERE max_at >= ?1), 9223372036854775807)), 0)",
    )
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM audit_log WHERE at < ?1 AND (id <= ?2 OR id > ?3) ORDER BY id LIMIT ?4",
    )
    .bind(cutoff)
    .bind(expired_through)
    .bind(head_last)
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
        return Ok(0);
    };
    record_purge(&mut tx, cutoff, &ids).await?;
    sqlx::query("INSERT INTO oncegate_purge_gate (open) VALUES (1)")
        .execute(&mut *tx)
        .await?;
    // The same rows as selected: nothing else writes in this transaction.
    let deleted =
        sqlx::query("DELETE FROM audit_log WHERE id BETWEEN ?1 AND ?2 AND at < ?3 AND (id <= ?4 OR id > ?5)")
            .bind(first)
            .bind(last)
            .bind(cutoff)
            .bind(expired_through)
            .bind(head_last)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    sqlx::query("DELETE FROM oncegate_purge_gate")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(deleted)
}

/// The removed ids of one seal (or of no seal), for its purge record.
struct PurgeGroup {
    seal: Option<(i64, String)>,
    ids: IdRanges,
    rows: i64,
}

/// One audit_purges row per seal the ascending `ids` belong to, and one for
/// those no seal covers.
async fn record_purge(tx: &mut Transaction<'_, Sqlite>, cutoff: i64, ids: &[i64]) -> Result<(), StoreError> {
    let seals: Vec<(i64, i64, i64, String)> = sqlx::query_as(
        "SELECT seq, first_id, last_id, digest FROM audit_seals \
         WHERE last_id >= ?1 AND first_id <= ?2 ORDER BY seq",
    )
    .bind(ids[0])
    .bind(ids[ids.len() - 1])
    .fetch_all(&mut **tx)
    .await?;
    let mut groups: Vec<PurgeGroup> = Vec::new();
    for &id in ids {
        let seal = seals
            .iter()
            .find(|(_, lo, hi, _)| (*lo..=*hi).contains(&id))
            .map(|(seq, _, _, digest)| (*seq, digest.clone()));
        let i = match groups.iter().position(|g| g.seal == seal) {
            Some(i) => i,
            None => {
                groups.push(PurgeGroup {
                    seal,
                    ids: IdRanges::default(),
                    rows: 0,
                });
                groups.len() - 1
            }
        };
        groups[i].ids.push(id);
        groups[i].rows += 1;
    }
    let now = to_micros(OffsetDateTime::now_utc());
    for g in groups {
        let (seq, digest) = g.seal.unzip();
        sqlx::query(
            "INSERT INTO audit_purges (purged_at, cutoff, method, seal_seq, seal_digest, row_count, ids) \
             VALUES (?1, ?2, 'deleted rows', ?3, ?4, ?5, ?6)",
        )
        .bind(now)
        .bind(cutoff)
        .bind(seq)
        .bind(digest)
        .bind(g.rows)
        .bind(g.ids.to_string())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
