//! The relay's slots on Postgres: `relay_slots` (owner, generation, lease),
//! `relay_members` (live relays), and the outbox reads and writes a relay
//! makes for a slot, each conditional on the generation it holds.
//!
//! A write for a slot locks the slot's row `FOR SHARE` in the same
//! statement: a concurrent take (an `UPDATE` of that row) waits for it, or
//! it waits for the take and then finds another generation and changes
//! nothing. Taking the count (initialising and resizing) holds an advisory
//! lock, so two relays never create slots at once.

use super::{OUTBOX_CHANNEL, PostgresStore};
use crate::error::StoreError;
use crate::store::OutboxEvent;
use crate::store::rows::outbox_event;
use crate::store::slots::{MemberRow, RelayMember, RelayView, SlotLease, SlotRow, SlotTable};
use crate::store::{OutboxStats, PublishStore, SlotStore};
use async_trait::async_trait;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// Advisory lock key held while the slot count is set ("oncegate-slots").
const SLOTS_LOCK: i64 = 0x6f6e_6365_736c_6f74;

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

#[async_trait]
impl SlotStore for PostgresStore {
    /// Creates `count` slots when there are none; the count in force.
    async fn relay_slots_init(&self, count: i32) -> Result<i32, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SLOTS_LOCK)
            .execute(&mut *tx)
            .await?;
        let existing: i64 = sqlx::query_scalar("SELECT count(*) FROM relay_slots WHERE in_use")
            .fetch_one(&mut *tx)
            .await?;
        if existing > 0 {
            tx.commit().await?;
            return Ok(existing as i32);
        }
        sqlx::query(
            "INSERT INTO relay_slots (slot, in_use) SELECT g, true FROM generate_series(0, $1 - 1) AS g \
             ON CONFLICT (slot) DO UPDATE SET in_use = true, owner = NULL, leased_until = NULL, \
               generation = relay_slots.generation + 1",
        )
        .bind(count)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(count)
    }

    /// Says `member` is alive for `ttl`, forgets members whose time ran out;
    /// the live members' ids, sorted, and the slot count in force.
    async fn relay_heartbeat(
        &self,
        member: &RelayMember<'_>,
        ttl: Duration,
    ) -> Result<RelayView, StoreError> {
        let members: Vec<String> = sqlx::query_scalar(
            "WITH up AS ( \
               INSERT INTO relay_members (member, instance, sink, seen_until) \
               VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond') \
               ON CONFLICT (member) DO UPDATE SET seen_until = excluded.seen_until, sink = excluded.sink \
               RETURNING member), \
             gone AS (DELETE FROM relay_members WHERE seen_until < now() AND member <> $1) \
             SELECT member FROM relay_members WHERE seen_until >= now() AND member <> $1 \
             UNION SELECT member FROM up ORDER BY 1",
        )
        .bind(member.id)
        .bind(member.instance)
        .bind(member.sink)
        .bind(ms(ttl))
        .fetch_all(&self.pool)
        .await?;
        let slots: i64 = sqlx::query_scalar("SELECT count(*) FROM relay_slots WHERE in_use")
            .fetch_one(&self.pool)
            .await?;
        Ok(RelayView {
            members,
            slots: slots as i32,
        })
    }

    async fn relay_leave(&self, member: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM relay_members WHERE member = $1")
            .bind(member)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Takes up to `limit` slots that are free or whose lease ran out.
    async fn take_slots(
        &self,
        member: &str,
        limit: i32,
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError> {
        let rows = sqlx::query(
            "UPDATE relay_slots s SET owner = $1, generation = s.generation + 1, \
               leased_until = now() + $3 * interval '1 millisecond', changed_at = now() \
             WHERE s.slot IN (SELECT slot FROM relay_slots \
               WHERE in_use AND (owner IS NULL OR leased_until IS NULL OR leased_until < now()) \
               ORDER BY slot LIMIT $2 FOR UPDATE SKIP LOCKED) \
             RETURNING s.slot, s.generation, (SELECT count(*) FROM relay_slots WHERE in_use)::int4",
        )
        .bind(member)
        .bind(limit)
        .bind(ms(lease))
        .fetch_all(&self.pool)
        .await?;
        sorted(&rows)
    }

    /// Extends the leases `member` still holds; returns those (the rest are lost).
    async fn renew_slots(
        &self,
        member: &str,
        held: &[SlotLease],
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError> {
        let slots: Vec<i32> = held.iter().map(|l| l.slot).collect();
        let generations: Vec<i64> = held.iter().map(|l| l.generation).collect();
        let rows = sqlx::query(
            "UPDATE relay_slots s SET leased_until = now() + $4 * interval '1 millisecond' \
             FROM unnest($2::int4[], $3::int8[]) AS h(slot, generation) \
             WHERE s.slot = h.slot AND s.generation = h.generation AND s.owner = $1 AND s.in_use \
             RETURNING s.slot, s.generation, (SELECT count(*) FROM relay_slots WHERE in_use)::int4",
        )
        .bind(member)
        .bind(&slots)
        .bind(&generations)
        .bind(ms(lease))
        .fetch_all(&self.pool)
        .await?;
        sorted(&rows)
    }

    async fn release_slot(&self, member: &str, lease: &SlotLease) -> Result<(), StoreError> {
        release(&self.pool, member, lease).await?;
        // Other processes' relays take it at once rather than at their next poll.
        self.notifier.poke(&self.pool);
        Ok(())
    }

    /// The slots in use with their owners and pending events, and the live relays.
    async fn relay_slot_table(&self) -> Result<SlotTable, StoreError> {
        let rows = sqlx::query(
            "WITH n AS (SELECT count(*) AS n FROM relay_slots WHERE in_use), \
             p AS (SELECT (q.award_hash % (SELECT n FROM n))::int4 AS slot, count(*) AS pending \
                   FROM outbox_queue q WHERE (SELECT n FROM n) > 0 GROUP BY 1) \
             SELECT s.slot, s.owner, s.generation, \
               CASE WHEN s.leased_until > now() THEN extract(epoch FROM s.leased_until - now())::float8 END, \
               coalesce(p.pending, 0) \
             FROM relay_slots s LEFT JOIN p ON p.slot = s.slot WHERE s.in_use ORDER BY s.slot",
        )
        .fetch_all(&self.pool)
        .await?;
        let slots = rows
            .iter()
            .map(|r| {
                Ok(SlotRow {
                    slot: r.try_get(0)?,
                    owner: r.try_get(1)?,
                    generation: r.try_get(2)?,
                    lease_left: r
                        .try_get::<Option<f64>, _>(3)?
                        .map(|s| Duration::from_secs_f64(s.max(0.0))),
                    pending: r.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        let members = sqlx::query(
            "SELECT member, instance, sink FROM relay_members WHERE seen_until >= now() ORDER BY member",
        )
        .fetch_all(&self.pool)
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

    /// Takes every slot for `member`, whoever holds it (the start of a
    /// resize): every holder is fenced, its generation gone.
    async fn seize_slots(&self, member: &str, lease: Duration) -> Result<Vec<SlotLease>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SLOTS_LOCK)
            .execute(&mut *tx)
            .await?;
        let rows = sqlx::query(
            "UPDATE relay_slots SET owner = $1, generation = generation + 1, \
               leased_until = now() + $2 * interval '1 millisecond', changed_at = now() \
             WHERE in_use \
             RETURNING slot, generation, (SELECT count(*) FROM relay_slots WHERE in_use)::int4",
        )
        .bind(member)
        .bind(ms(lease))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        sorted(&rows)
    }

    async fn finish_resize(
        &self,
        member: &str,
        seized: &[SlotLease],
        count: i32,
    ) -> Result<bool, StoreError> {
        let done = finish_resize(&self.pool, member, seized, count).await?;
        self.notifier.poke(&self.pool);
        Ok(done)
    }
}

#[async_trait]
impl PublishStore for PostgresStore {
    /// The slot's pending events in per-award order: nothing once the slot is
    /// no longer held with `lease`'s generation, nothing behind an earlier
    /// event of its award that waits for a retry. The statement is
    /// `oncegate_slot_pending` (migrations 0015 and 0016), which walks the
    /// queue of unpublished events in order and stops at `limit`.
    async fn slot_pending(&self, lease: &SlotLease, limit: i64) -> Result<Vec<OutboxEvent>, StoreError> {
        let rows = sqlx::query("SELECT * FROM oncegate_slot_pending($1, $2, $3, $4)")
            .bind(lease.slot)
            .bind(lease.generation)
            .bind(i64::from(lease.slots))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(outbox_event)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Marks `ids` published if the slot is still held with `lease`'s
    /// generation; false when it is not (nothing changed).
    async fn mark_published(&self, lease: &SlotLease, ids: &[Uuid]) -> Result<bool, StoreError> {
        let held: bool = sqlx::query_scalar(
            "WITH s AS (SELECT slot FROM relay_slots WHERE slot = $1 AND generation = $2 FOR SHARE), \
             q AS (DELETE FROM outbox_queue WHERE event_id = ANY($3) AND EXISTS (SELECT 1 FROM s) RETURNING 1), \
             m AS (UPDATE outbox SET published_at = now(), leased_until = NULL \
               WHERE event_id = ANY($3) AND published_at IS NULL AND EXISTS (SELECT 1 FROM s) RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM s)",
        )
        .bind(lease.slot)
        .bind(lease.generation)
        .bind(ids)
        .fetch_one(&self.pool)
        .await?;
        Ok(held)
    }

    /// Records a rejection of `id` (an attempt; quarantined at `max_attempts`,
    /// else retried after `retry_after`) if the slot is still held with
    /// `lease`'s generation: `None` when it is not, else whether quarantined.
    async fn record_publish_failure(
        &self,
        lease: &SlotLease,
        id: Uuid,
        error: &str,
        max_attempts: i32,
        retry_after: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let row = sqlx::query(
            "WITH s AS (SELECT slot FROM relay_slots WHERE slot = $1 AND generation = $2 FOR SHARE), \
             u AS (UPDATE outbox SET attempts = attempts + 1, last_error = $4, \
                 leased_until = now() + $6 * interval '1 millisecond', \
                 quarantined_at = CASE WHEN attempts + 1 >= $5 THEN now() END \
               WHERE event_id = $3 AND published_at IS NULL AND EXISTS (SELECT 1 FROM s) \
               RETURNING event_id, leased_until, quarantined_at IS NOT NULL AS q), \
             w AS (UPDATE outbox_queue SET leased_until = u.leased_until FROM u \
               WHERE outbox_queue.event_id = u.event_id AND NOT u.q RETURNING 1), \
             d AS (DELETE FROM outbox_queue USING u \
               WHERE outbox_queue.event_id = u.event_id AND u.q RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM s), coalesce((SELECT q FROM u), false)",
        )
        .bind(lease.slot)
        .bind(lease.generation)
        .bind(id)
        .bind(error)
        .bind(max_attempts)
        .bind(ms(retry_after))
        .fetch_one(&self.pool)
        .await?;
        let held: bool = row.try_get(0)?;
        Ok(held.then_some(row.try_get(1)?))
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(
            "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8, \
               (SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL AND published_at IS NULL) \
             FROM outbox_queue",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(OutboxStats {
            backlog: row.try_get(0)?,
            oldest_age: Duration::from_secs_f64(row.try_get::<f64, _>(1)?.max(0.0)),
            quarantined: row.try_get(2)?,
        })
    }

    /// Wakes on this instance's own commits (in-process), on another
    /// process's `pg_notify`, or after `timeout` (polling).
    async fn wait_for_outbox(&self, timeout: Duration) {
        let own = self.outbox_written.notified();
        tokio::pin!(own);
        own.as_mut().enable();
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            match PgListener::connect_with(&self.pool).await {
                Ok(mut l) => match l.listen(OUTBOX_CHANNEL).await {
                    Ok(()) => *guard = Some(l),
                    Err(e) => tracing::debug!(error = %e, "outbox listen failed; polling"),
                },
                Err(e) => tracing::debug!(error = %e, "outbox listener connect failed; polling"),
            }
        }
        let Some(listener) = guard.as_mut() else {
            drop(guard);
            let _ = tokio::time::timeout(timeout, own).await;
            return;
        };
        tokio::select! {
            _ = &mut own => {}
            _ = tokio::time::sleep(timeout) => {}
            received = listener.recv() => if let Err(e) = received {
                tracing::debug!(error = %e, "outbox listener lost; polling");
                *guard = None;
            },
        }
    }
}

/// The leases in `RETURNING` rows, by slot (`RETURNING` keeps no order).
fn sorted(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<SlotLease>, StoreError> {
    let mut leases = rows.iter().map(lease_of).collect::<Result<Vec<_>, _>>()?;
    leases.sort();
    Ok(leases)
}

fn lease_of(r: &sqlx::postgres::PgRow) -> Result<SlotLease, sqlx::Error> {
    Ok(SlotLease {
        slot: r.try_get(0)?,
        generation: r.try_get(1)?,
        slots: r.try_get(2)?,
    })
}

/// Gives a slot back (free at once for another relay).
pub async fn release(pool: &PgPool, member: &str, lease: &SlotLease) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE relay_slots SET owner = NULL, leased_until = NULL, changed_at = now() \
         WHERE slot = $2 AND generation = $3 AND owner = $1",
    )
    .bind(member)
    .bind(lease.slot)
    .bind(lease.generation)
    .execute(pool)
    .await?;
    Ok(())
}

/// Ends a resize: if `member` still holds every slot it seized, sets the
/// count to `count` (slots past it out of use, missing ones created) and
/// frees every slot with a new generation. False when a seized slot was
/// lost meanwhile (nothing changed).
pub async fn finish_resize(
    pool: &PgPool,
    member: &str,
    seized: &[SlotLease],
    count: i32,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SLOTS_LOCK)
        .execute(&mut *tx)
        .await?;
    let slots: Vec<i32> = seized.iter().map(|l| l.slot).collect();
    let generations: Vec<i64> = seized.iter().map(|l| l.generation).collect();
    let still: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM relay_slots s JOIN unnest($2::int4[], $3::int8[]) AS h(slot, generation) \
           ON s.slot = h.slot AND s.generation = h.generation WHERE s.owner = $1 AND s.in_use",
    )
    .bind(member)
    .bind(&slots)
    .bind(&generations)
    .fetch_one(&mut *tx)
    .await?;
    let in_use: i64 = sqlx::query_scalar("SELECT count(*) FROM relay_slots WHERE in_use")
        .fetch_one(&mut *tx)
        .await?;
    if still != in_use || still != seized.len() as i64 {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO relay_slots (slot, in_use) SELECT g, false FROM generate_series(0, $1 - 1) AS g \
         ON CONFLICT (slot) DO NOTHING",
    )
    .bind(count)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE relay_slots SET in_use = slot < $1, owner = NULL, leased_until = NULL, \
           generation = generation + 1, changed_at = now()",
    )
    .bind(count)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
