//! The operator commands' statements on Postgres (DESIGN §10). Reconcile
//! reads in key-range batches, each one statement (one snapshot, no locks
//! beyond the ordinary `ACCESS SHARE`); a redrive is one short transaction.

use super::PostgresStore;
use crate::error::StoreError;
use crate::store::AuditEntry;
use crate::store::OpsStore;
use crate::store::ops::*;
use crate::store::rows::{
    AUDIT_COLS, CLAIM_COLS, LEDGER_COLS, audit_record, award_totals, balance, claim, event_record, ledger,
};
use async_trait::async_trait;
use sqlx::{Postgres, Row, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

/// Advisory lock key held by the instance running the scheduled reconcile
/// ("oncegaterecn" would not fit; "ogrecncl").
const RECONCILE_LOCK: i64 = 0x6f67_7265_636e_636c;

const EVENT_COLS: &str = "o.event_id AS o_event_id, o.event_type AS o_event_type, o.award_id AS o_award_id, \
     o.sequence AS o_sequence, o.payload::text AS o_payload, o.created_at AS o_created_at, \
     o.published_at AS o_published_at, o.attempts AS o_attempts, o.leased_until AS o_leased_until, \
     o.last_error AS o_last_error, o.quarantined_at AS o_quarantined_at";

#[async_trait]
impl OpsStore for PostgresStore {
    async fn reconcile_start(&self) -> Result<ReconcileStart, StoreError> {
        let row = sqlx::query(
            "SELECT now(), (SELECT min(claimed_at) FROM processed_messages), \
               (SELECT min(published_at) FROM outbox WHERE published_at IS NOT NULL)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(ReconcileStart {
            now: row.try_get(0)?,
            oldest_claim: row.try_get(1)?,
            oldest_published_event: row.try_get(2)?,
        })
    }

    /// A session advisory lock on a connection of its own (never returned to
    /// the pool, so the lock cannot leak into it): dropping the guard closes
    /// the connection and so releases the lock.
    async fn try_reconcile_lock(&self) -> Result<Option<RunLock>, StoreError> {
        let mut conn = self.pool.acquire().await?.detach();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(RECONCILE_LOCK)
            .fetch_one(&mut conn)
            .await?;
        Ok(locked.then(|| RunLock(Box::new(conn))))
    }

    async fn key_batch_end(&self, after: &str, limit: i64) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements WHERE idempotency_key > $1 \
             ORDER BY idempotency_key OFFSET $2 LIMIT 1",
        )
        .bind(after)
        .bind(limit.max(1) - 1)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn reconcile_keys(
        &self,
        after: &str,
        until: Option<&str>,
        events_since: OffsetDateTime,
    ) -> Result<Vec<KeyPair>, StoreError> {
        // Two texts rather than `$2 IS NULL OR key <= $2`: a generic plan of
        // the latter could not bound the index scan.
        let range = match until {
            Some(_) => "idempotency_key > $1 AND idempotency_key <= $2",
            None => "idempotency_key > $1 AND $2::text IS NULL",
        };
        let sql = format!(
            "SELECT coalesce(d.idempotency_key, c.idempotency_key) AS key, {LEDGER_COLS}, {CLAIM_COLS}, \
               CASE WHEN d.recorded_at >= $3 THEN (SELECT count(*) FROM outbox o \
                 WHERE o.award_id = d.award_id AND o.sequence = d.sequence \
                   AND o.event_type = '{LEDGER_EVENT_TYPE}') END AS events \
             FROM (SELECT * FROM disbursements WHERE {range}) d \
             FULL JOIN (SELECT * FROM processed_messages WHERE {range}) c USING (idempotency_key) \
             ORDER BY 1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(until)
            .bind(events_since)
            .fetch_all(&self.pool)
            .await?;
        let pairs = rows
            .iter()
            .map(|r| {
                Ok(KeyPair {
                    key: r.try_get("key")?,
                    ledger: ledger(r)?,
                    claim: claim(r)?,
                    events: r.try_get("events")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(pairs)
    }

    async fn reconcile_events(&self, after: Uuid, limit: i64) -> Result<Vec<EventPair>, StoreError> {
        let sql = format!(
            "SELECT {EVENT_COLS}, {LEDGER_COLS} FROM outbox o \
             LEFT JOIN disbursements d ON d.award_id = o.award_id AND d.sequence = o.sequence \
             WHERE o.event_id > $1 ORDER BY o.event_id LIMIT $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let pairs = rows
            .iter()
            .map(|r| {
                Ok(EventPair {
                    event: event_record(r)?,
                    ledger: ledger(r)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(pairs)
    }

    async fn award_batch_end(&self, after: &str, max_rows: i64) -> Result<Option<String>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT award_id, CAST(sum(disbursement_count) OVER (ORDER BY award_id) AS BIGINT) \
             FROM award_balances WHERE award_id > $1 ORDER BY award_id LIMIT $2",
        )
        .bind(after)
        .bind(AWARD_LOOKAHEAD)
        .fetch_all(&self.pool)
        .await?;
        Ok(batch_end(&rows, max_rows, AWARD_LOOKAHEAD))
    }

    async fn reconcile_awards(
        &self,
        after: &str,
        until: Option<&str>,
    ) -> Result<Vec<AwardTotals>, StoreError> {
        let range = match until {
            Some(_) => "award_id > $1 AND award_id <= $2",
            None => "award_id > $1 AND $2::text IS NULL",
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(award_totals_sql(range)))
            .bind(after)
            .bind(until)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(award_totals).collect::<Result<_, _>>()?)
    }

    async fn award_totals(&self, award_id: &str) -> Result<AwardTotals, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(award_totals_sql("award_id = $1")))
            .bind(award_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => award_totals(&r)?,
            None => AwardTotals {
                award_id: award_id.to_string(),
                balance: None,
                ledger: None,
            },
        })
    }

    async fn find_keys(&self, prefix: &str, limit: i64) -> Result<Vec<String>, StoreError> {
        // Byte-wise bounds (text_pattern_ops, migration 0017): the index
        // serves them whatever the plan; LIKE with a parameter it would not.
        Ok(sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements \
             WHERE idempotency_key ~>=~ $1 AND idempotency_key ~<~ ($1 || chr(1114111)) \
               AND starts_with(idempotency_key, $1) \
             ORDER BY idempotency_key COLLATE \"C\" LIMIT $2",
        )
        .bind(prefix)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn disbursement_key(&self, id: Uuid) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT idempotency_key FROM disbursements WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn award_ledger(
        &self,
        award_id: &str,
        after_sequence: i64,
        limit: i64,
    ) -> Result<Vec<LedgerRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {LEDGER_COLS} FROM disbursements d WHERE d.award_id = $1 AND d.sequence > $2 \
             ORDER BY d.sequence LIMIT $3"
        )))
        .bind(award_id)
        .bind(after_sequence)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.extend(ledger(r)?);
        }
        Ok(out)
    }

    async fn first_sequence_gap(&self, award_id: &str) -> Result<Option<SequenceGap>, StoreError> {
        let row: Option<(i64, i64, String)> = sqlx::query_as(FIRST_GAP_SQL)
            .bind(award_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(expected, found, key)| SequenceGap {
            expected,
            found,
            idempotency_key: key,
        }))
    }

    async fn ledger_matches(&self, keys: &[String]) -> Result<Vec<LedgerMatch>, StoreError> {
        let sql = format!(
            "SELECT {LEDGER_COLS}, coalesce((SELECT array_agg(o.event_id ORDER BY o.event_id) FROM outbox o \
               WHERE o.award_id = d.award_id AND o.sequence = d.sequence \
                 AND o.event_type = '{LEDGER_EVENT_TYPE}'), '{{}}') AS event_ids \
             FROM disbursements d WHERE d.idempotency_key = ANY($1)"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(keys)
            .fetch_all(&self.pool)
            .await?;
        let mut found = Vec::with_capacity(rows.len());
        for r in &rows {
            if let Some(row) = ledger(r)? {
                found.push(LedgerMatch {
                    ledger: row,
                    event_ids: r.try_get("event_ids")?,
                });
            }
        }
        Ok(found)
    }

    /// Claim, ledger row, events and audit rows of a key, in one read-only
    /// snapshot.
    async fn inspect_key(&self, key: &str) -> Result<KeyInspection, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {LEDGER_COLS}, {CLAIM_COLS} FROM (SELECT $1::text AS k) q \
             LEFT JOIN disbursements d ON d.idempotency_key = q.k \
             LEFT JOIN processed_messages c ON c.idempotency_key = q.k"
        )))
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        let ledger_row = ledger(&row)?;
        let events = match &ledger_row {
            Some(d) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.award_id = $1 AND o.sequence = $2 ORDER BY o.created_at"
            )))
            .bind(&d.award_id)
            .bind(d.sequence)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(event_record)
            .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let audit_rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {AUDIT_COLS} FROM audit_log WHERE key_prefix = $1 ORDER BY at, id"
        )))
        .bind(crate::key::key_prefix(key))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(audit_record)
        .collect::<Result<_, _>>()?;
        tx.commit().await?;
        Ok(KeyInspection {
            idempotency_key: key.to_string(),
            claim: claim(&row)?,
            ledger: ledger_row,
            events,
            audit: audit_rows,
        })
    }

    async fn award_keys(
        &self,
        award_id: &str,
        limit: i64,
    ) -> Result<(Option<Balance>, Vec<String>), StoreError> {
        let row = sqlx::query(
            "SELECT award_id AS b_award_id, total_cents, disbursement_count, last_sequence, updated_at \
             FROM award_balances WHERE award_id = $1",
        )
        .bind(award_id)
        .fetch_optional(&self.pool)
        .await?;
        let keys = sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements WHERE award_id = $1 ORDER BY sequence DESC LIMIT $2",
        )
        .bind(award_id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok((row.as_ref().map(balance).transpose()?.flatten(), keys))
    }

    async fn list_outbox(&self, filter: &OutboxFilter) -> Result<Vec<EventRecord>, StoreError> {
        // Pending rows come from the queue, quarantined ones from their own
        // partial index.
        let award = "($2::text IS NULL OR o.award_id = $2)";
        let quarantined = format!(
            "SELECT {EVENT_COLS} FROM outbox o WHERE o.quarantined_at IS NOT NULL AND o.published_at IS NULL \
             AND {award} ORDER BY o.created_at, o.sequence LIMIT $1"
        );
        let sql = if filter.quarantined_only {
            quarantined
        } else {
            format!(
                "SELECT * FROM (({quarantined}) UNION ALL (SELECT {EVENT_COLS} FROM outbox_queue q \
                   JOIN outbox o ON o.event_id = q.event_id \
                   WHERE o.published_at IS NULL AND o.quarantined_at IS NULL AND {award} \
                   ORDER BY q.created_at, q.sequence LIMIT $1)) u \
                 ORDER BY o_created_at, o_sequence LIMIT $1"
            )
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.limit)
            .bind(filter.award_id.as_deref())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(event_record).collect::<Result<_, _>>()?)
    }

    async fn redrive_outbox(
        &self,
        target: &RedriveTarget,
        limit: i64,
        by: &RedriveBy,
    ) -> Result<Vec<RedriveOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let events = redrive_candidates(&mut tx, target, limit).await?;
        let outcomes = redrive_outcomes(target, events);
        let redriven: Vec<&EventRecord> = outcomes
            .iter()
            .filter_map(|o| match o {
                RedriveOutcome::Redriven(e) => Some(e),
                _ => None,
            })
            .collect();
        if !redriven.is_empty() {
            let ids: Vec<Uuid> = redriven.iter().map(|e| e.event_id).collect();
            sqlx::query(
                "WITH r AS (UPDATE outbox SET quarantined_at = NULL, attempts = 0, last_error = NULL, \
                   leased_until = NULL WHERE event_id = ANY($1) \
                   RETURNING event_id, award_id, award_hash, created_at, sequence) \
                 INSERT INTO outbox_queue (event_id, award_id, award_hash, created_at, sequence) \
                 SELECT event_id, award_id, coalesce(award_hash, oncegate_award_hash(award_id)), created_at, sequence \
                 FROM r ON CONFLICT (event_id) DO UPDATE SET leased_until = NULL",
            )
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
            let at = crate::time_fmt::now_micros();
            let audit: Vec<AuditEntry> = redriven.iter().map(|e| redrive_audit(e, by, at)).collect();
            insert_audit(&mut tx, &audit).await?;
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(super::OUTBOX_CHANNEL)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(outcomes)
    }
}

/// The events a redrive names, locked in `tx`, oldest first.
async fn redrive_candidates(
    tx: &mut Transaction<'_, Postgres>,
    target: &RedriveTarget,
    limit: i64,
) -> Result<Vec<EventRecord>, StoreError> {
    let rows = match target {
        RedriveTarget::Events(ids) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.event_id = ANY($1) \
                 ORDER BY o.created_at, o.sequence FOR UPDATE"
            )))
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?
        }
        RedriveTarget::AllQuarantined { award_id } => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.quarantined_at IS NOT NULL \
                   AND o.published_at IS NULL AND ($2::text IS NULL OR o.award_id = $2) \
                 ORDER BY o.created_at, o.sequence LIMIT $1 FOR UPDATE"
            )))
            .bind(limit)
            .bind(award_id.as_deref())
            .fetch_all(&mut **tx)
            .await?
        }
    };
    Ok(rows.iter().map(event_record).collect::<Result<_, _>>()?)
}

/// The audit rows of a redrive, inside its transaction.
async fn insert_audit(tx: &mut Transaction<'_, Postgres>, rows: &[AuditEntry]) -> Result<(), StoreError> {
    let at: Vec<OffsetDateTime> = rows.iter().map(|r| r.at).collect();
    let decision: Vec<&str> = rows.iter().map(|r| r.decision.as_str()).collect();
    let prefix: Vec<&str> = rows.iter().map(|r| r.key_prefix.as_str()).collect();
    let award: Vec<&str> = rows.iter().map(|r| r.award_id.as_str()).collect();
    let instance: Vec<&str> = rows.iter().map(|r| &*r.instance).collect();
    let detail: Vec<Option<&str>> = rows.iter().map(|r| r.detail.as_deref()).collect();
    sqlx::query(
        "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
         SELECT a, d, NULL, p, w, i, false, x \
         FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) \
           AS t(a, d, p, w, i, x)",
    )
    .bind(&at)
    .bind(&decision)
    .bind(&prefix)
    .bind(&award)
    .bind(&instance)
    .bind(&detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Awards' running totals full-joined with their ledger rows' aggregates,
/// for the awards `range` selects (in both tables).
fn award_totals_sql(range: &str) -> String {
    format!(
        "SELECT coalesce(b.award_id, d.award_id) AS award, b.award_id AS b_award_id, b.total_cents, \
           b.disbursement_count, b.last_sequence, b.updated_at, d.s, d.n, d.nd, d.mn, d.mx \
         FROM (SELECT * FROM award_balances WHERE {range}) b \
         FULL JOIN (SELECT award_id, sum(amount_cents)::text AS s, count(*) AS n, \
             count(DISTINCT sequence) AS nd, min(sequence) AS mn, max(sequence) AS mx \
           FROM disbursements WHERE {range} GROUP BY award_id) d ON d.award_id = b.award_id \
         ORDER BY 1"
    )
}

/// The first row of award `$1` whose sequence is not its position.
const FIRST_GAP_SQL: &str = "SELECT expected, sequence, idempotency_key FROM ( \
       SELECT sequence, idempotency_key, row_number() OVER (ORDER BY sequence, idempotency_key) AS expected \
       FROM disbursements WHERE award_id = $1) s \
     WHERE sequence <> expected ORDER BY expected LIMIT 1";
