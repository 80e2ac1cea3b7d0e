//! The relay's slots on SQLite: the same tables and the same conditions as
//! on Postgres (`store/postgres/slots`). One writer at a time: every write
//! is an `IMMEDIATE` transaction, so nothing interleaves with the generation
//! check of the statement that writes. Times are microseconds.

use super::SqliteStore;
use crate::error::StoreError;
use crate::store::OutboxEvent;
use crate::store::rows::outbox_event;
use crate::store::slots::{MemberRow, RelayMember, RelayView, SlotLease, SlotRow, SlotTable, award_hash};
use crate::store::{OutboxStats, PublishStore, SlotStore};
use crate::time_fmt::to_micros;
use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqlitePool, Transaction};
use std::time::Duration;
use time::OffsetDateTime;
use uuid::Uuid;

fn now() -> i64 {
    to_micros(OffsetDateTime::now_utc())
}

fn us(d: Duration) -> i64 {
    d.as_micros().min(i64::MAX as u128) as i64
}

async fn begin(writer: &SqlitePool) -> Result<Transaction<'static, Sqlite>, StoreError> {
    Ok(writer.begin_with("BEGIN IMMEDIATE").await?)
}

async fn in_use(tx: &mut Transaction<'_, Sqlite>) -> Result<i32, StoreError> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM relay_slots WHERE in_use")
        .fetch_one(&mut **tx)
        .await?;
    Ok(n as i32)
}

/// Gives every outbox row written without its award hash (before the slots
/// existed) the hash, so that it has a slot.
pub async fn backfill_award_hashes(writer: &SqlitePool) -> Result<u64, StoreError> {
    let mut filled = 0;
    loop {
        let mut tx = begin(writer).await?;
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT event_id, award_id FROM outbox WHERE award_hash IS NULL LIMIT 1000")
                .fetch_all(&mut *tx)
                .await?;
        for (id, award) in &rows {
            sqlx::query("UPDATE outbox SET award_hash = ?2 WHERE event_id = ?1")
                .bind(id)
                .bind(award_hash(award))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        filled += rows.len() as u64;
        if rows.len() < 1000 {
            return Ok(filled);
        }
    }
}

#[async_trait]
impl SlotStore for SqliteStore {
    /// Creates `count` slots when there are none; the count in force.
    async fn relay_slots_init(&self, count: i32) -> Result<i32, StoreError> {
        let mut tx = begin(&self.writer).await?;
        let existing = in_use(&mut tx).await?;
        if existing > 0 {
            tx.commit().await?;
            return Ok(existing);
        }
        for slot in 0..count {
            sqlx::query(
                "INSERT INTO relay_slots (slot, in_use, generation, changed_at) VALUES (?1, 1, 0, ?2) \
                 ON CONFLICT (slot) DO UPDATE SET in_use = 1, owner = NULL, leased_until = NULL, \
                   generation = generation + 1",
            )
            .bind(slot)
            .bind(now())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(count)
    }

    async fn relay_heartbeat(
        &self,
        member: &RelayMember<'_>,
        ttl: Duration,
    ) -> Result<RelayView, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        sqlx::query(
            "INSERT INTO relay_members (member, instance, sink, seen_until, joined_at) VALUES (?1, ?2, ?3, ?4, ?5) \
             ON CONFLICT (member) DO UPDATE SET seen_until = excluded.seen_until, sink = excluded.sink",
        )
        .bind(member.id)
        .bind(member.instance)
        .bind(member.sink)
        .bind(now + us(ttl))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM relay_members WHERE seen_until < ?1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let members: Vec<String> = sqlx::query_scalar("SELECT member FROM relay_members ORDER BY member")
            .fetch_all(&mut *tx)
            .await?;
        let slots = in_use(&mut tx).await?;
        tx.commit().await?;
        Ok(RelayView { members, slots })
    }

    async fn relay_leave(&self, member: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM relay_members WHERE member = ?1")
            .bind(member)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn take_slots(
        &self,
        member: &str,
        limit: i32,
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        let slots = in_use(&mut tx).await?;
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "UPDATE relay_slots SET owner = ?1, generation = generation + 1, leased_until = ?3, changed_at = ?4 \
             WHERE slot IN (SELECT slot FROM relay_slots \
               WHERE in_use AND (owner IS NULL OR leased_until IS NULL OR leased_until < ?4) \
               ORDER BY slot LIMIT ?2) \
             RETURNING slot, generation",
        )
        .bind(member)
        .bind(limit)
        .bind(now + us(lease))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows
            .into_iter()
            .map(|(slot, generation)| SlotLease {
                slot,
                slots,
                generation,
            })
            .collect())
    }

    async fn renew_slots(
        &self,
        member: &str,
        held: &[SlotLease],
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        let slots = in_use(&mut tx).await?;
        let mut kept = Vec::new();
        for l in held {
            let renewed = sqlx::query(
                "UPDATE relay_slots SET leased_until = ?4 WHERE slot = ?2 AND generation = ?3 AND owner = ?1 AND in_use",
            )
            .bind(member)
            .bind(l.slot)
            .bind(l.generation)
            .bind(now + us(lease))
            .execute(&mut *tx)
            .await?;
            if renewed.rows_affected() == 1 {
                kept.push(SlotLease { slots, ..*l });
            }
        }
        tx.commit().await?;
        Ok(kept)
    }

    async fn release_slot(&self, member: &str, lease: &SlotLease) -> Result<(), StoreError> {
        release(&self.writer, member, lease).await?;
        self.outbox_written.notify_one();
        Ok(())
    }

    async fn relay_slot_table(&self) -> Result<SlotTable, StoreError> {
        let now = now();
        let rows = sqlx::query(
            "WITH n AS (SELECT count(*) AS n FROM relay_slots WHERE in_use), \
             p AS (SELECT o.award_hash % (SELECT n FROM n) AS slot, count(*) AS pending FROM outbox o \
                   WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND (SELECT n FROM n) > 0 GROUP BY 1) \
             SELECT s.slot, s.owner, s.generation, \
               CASE WHEN s.leased_until > ?1 THEN s.leased_until - ?1 END, coalesce(p.pending, 0) \
             FROM relay_slots s LEFT JOIN p ON p.slot = s.slot WHERE s.in_use ORDER BY s.slot",
        )
        .bind(now)
        .fetch_all(&self.reader)
        .await?;
        let slots = rows
            .iter()
            .map(|r| {
                Ok(SlotRow {
                    slot: r.try_get(0)?,
                    owner: r.try_get(1)?,
                    generation: r.try_get(2)?,
                    lease_left: r
                        .try_get::<Option<i64>, _>(3)?
                        .map(|us| Duration::from_micros(us.max(0) as u64)),
                    pending: r.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        let members = sqlx::query(
            "SELECT member, instance, sink FROM relay_members WHERE seen_until >= ?1 ORDER BY member",
        )
        .bind(now)
        .fetch_all(&self.reader)
        .await?
        .iter()
        .map(|r| {
            Ok(MemberRow {
                member: r.try_get(0)?,
                instance: r.try_get(1)?,
                sink: r.try_get(2)?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        Ok(SlotTable { slots, members })
    }

    async fn seize_slots(&self, member: &str, lease: Duration) -> Result<Vec<SlotLease>, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        let slots = in_use(&mut tx).await?;
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "UPDATE relay_slots SET owner = ?1, generation = generation + 1, leased_until = ?2, changed_at = ?3 \
             WHERE in_use RETURNING slot, generation",
        )
        .bind(member)
        .bind(now + us(lease))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows
            .into_iter()
            .map(|(slot, generation)| SlotLease {
                slot,
                slots,
                generation,
            })
            .collect())
    }

    async fn finish_resize(
        &self,
        member: &str,
        seized: &[SlotLease],
        count: i32,
    ) -> Result<bool, StoreError> {
        let done = finish_resize(&self.writer, member, seized, count).await?;
        self.outbox_written.notify_one();
        Ok(done)
    }
}

#[async_trait]
impl PublishStore for SqliteStore {
    async fn slot_pending(&self, lease: &SlotLease, limit: i64) -> Result<Vec<OutboxEvent>, StoreError> {
        let rows = sqlx::query(
            "SELECT o.event_id, o.event_type, o.award_id, o.sequence, o.payload, o.attempts, o.traceparent \
             FROM outbox o \
             WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND o.award_hash % ?3 = ?1 \
               AND (o.leased_until IS NULL OR o.leased_until <= ?5) \
               AND NOT EXISTS (SELECT 1 FROM outbox e \
                 WHERE e.award_id = o.award_id AND e.published_at IS NULL AND e.quarantined_at IS NULL \
                   AND e.leased_until IS NOT NULL AND e.leased_until > ?5 \
                   AND (e.created_at, e.sequence) < (o.created_at, o.sequence)) \
               AND EXISTS (SELECT 1 FROM relay_slots s WHERE s.slot = ?1 AND s.generation = ?2 AND s.leased_until > ?5) \
             ORDER BY o.created_at, o.sequence LIMIT ?4",
        )
        .bind(lease.slot)
        .bind(lease.generation)
        .bind(i64::from(lease.slots))
        .bind(limit)
        .bind(now())
        .fetch_all(&self.reader)
        .await?;
        Ok(rows.iter().map(outbox_event).collect::<Result<_, _>>()?)
    }

    async fn mark_published(&self, lease: &SlotLease, ids: &[Uuid]) -> Result<bool, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        if !held(&mut tx, lease).await? {
            return Ok(false);
        }
        for id in ids {
            sqlx::query(
                "UPDATE outbox SET published_at = ?2, leased_until = NULL WHERE event_id = ?1 AND published_at IS NULL",
            )
            .bind(id.to_string())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn record_publish_failure(
        &self,
        lease: &SlotLease,
        id: Uuid,
        error: &str,
        max_attempts: i32,
        retry_after: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let now = now();
        let mut tx = begin(&self.writer).await?;
        if !held(&mut tx, lease).await? {
            return Ok(None);
        }
        let quarantined: Option<bool> = sqlx::query_scalar(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?2, leased_until = ?5, \
               quarantined_at = CASE WHEN attempts + 1 >= ?3 THEN ?4 END \
             WHERE event_id = ?1 AND published_at IS NULL RETURNING quarantined_at IS NOT NULL",
        )
        .bind(id.to_string())
        .bind(error)
        .bind(max_attempts)
        .bind(now)
        .bind(now + us(retry_after))
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(quarantined.unwrap_or(false)))
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE quarantined_at IS NULL), \
               min(created_at) FILTER (WHERE quarantined_at IS NULL), \
               count(*) FILTER (WHERE quarantined_at IS NOT NULL) \
             FROM outbox WHERE published_at IS NULL",
        )
        .fetch_one(&self.reader)
        .await?;
        let oldest: Option<i64> = row.try_get(1)?;
        let now = to_micros(OffsetDateTime::now_utc());
        Ok(OutboxStats {
            backlog: row.try_get(0)?,
            oldest_age: oldest
                .map(|t| Duration::from_micros((now - t).max(0) as u64))
                .unwrap_or_default(),
            quarantined: row.try_get(2)?,
        })
    }

    async fn wait_for_outbox(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.outbox_written.notified()).await;
    }
}

pub async fn release(writer: &SqlitePool, member: &str, lease: &SlotLease) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE relay_slots SET owner = NULL, leased_until = NULL, changed_at = ?4 \
         WHERE slot = ?2 AND generation = ?3 AND owner = ?1",
    )
    .bind(member)
    .bind(lease.slot)
    .bind(lease.generation)
    .bind(now())
    .execute(writer)
    .await?;
    Ok(())
}

async fn held(tx: &mut Transaction<'_, Sqlite>, lease: &SlotLease) -> Result<bool, StoreError> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM relay_slots WHERE slot = ?1 AND generation = ?2")
        .bind(lease.slot)
        .bind(lease.generation)
        .fetch_one(&mut **tx)
        .await?;
    Ok(n == 1)
}

pub async fn finish_resize(
    writer: &SqlitePool,
    member: &str,
    seized: &[SlotLease],
    count: i32,
) -> Result<bool, StoreError> {
    let now = now();
    let mut tx = begin(writer).await?;
    let mut still = 0;
    for l in seized {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM relay_slots WHERE slot = ?1 AND generation = ?2 AND owner = ?3 AND in_use",
        )
        .bind(l.slot)
        .bind(l.generation)
        .bind(member)
        .fetch_one(&mut *tx)
        .await?;
        still += n;
    }
    if still != i64::from(in_use(&mut tx).await?) || still != seized.len() as i64 {
        return Ok(false);
    }
    for slot in 0..count {
        sqlx::query("INSERT INTO relay_slots (slot, in_use, generation, changed_at) VALUES (?1, 0, 0, ?2) ON CONFLICT (slot) DO NOTHING")
            .bind(slot)
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "UPDATE relay_slots SET in_use = slot < ?1, owner = NULL, leased_until = NULL, \
           generation = generation + 1, changed_at = ?2",
    )
    .bind(count)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
