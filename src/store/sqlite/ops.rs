//! The operator commands' statements on SQLite (DESIGN §10). Reads go to
//! the read-only pool, each batch one statement (one WAL snapshot: the
//! writer is never blocked, and no read holds a checkpoint back for long);
//! a redrive is one `IMMEDIATE` write transaction.

use super::SqliteStore;
use crate::error::StoreError;
use crate::store::AuditEntry;
use crate::store::OpsStore;
use crate::store::ops::*;
use crate::store::rows::{
    AUDIT_COLS, CLAIM_COLS, LEDGER_COLS, audit_record, award_totals, balance, claim, event_record, ledger,
    uuid_from_text,
};
use crate::time_fmt::{from_micros, to_micros};
use async_trait::async_trait;
use sqlx::{Row, Sqlite, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

const EVENT_COLS: &str = "o.event_id AS o_event_id, o.event_type AS o_event_type, o.award_id AS o_award_id, \
     o.sequence AS o_sequence, o.payload AS o_payload, o.created_at AS o_created_at, \
     o.published_at AS o_published_at, o.attempts AS o_attempts, o.leased_until AS o_leased_until, \
     o.last_error AS o_last_error, o.quarantined_at AS o_quarantined_at";

/// Awards' running totals full-joined with their ledger rows' aggregates,
/// for the awards `range` selects (in both tables). The sum as text:
/// SQLite's sum() of integers raises on overflow, and decimal() keeps it
/// exact.
fn award_totals_sql(range: &str) -> String {
    format!(
        "SELECT coalesce(b.award_id, d.award_id) AS award, b.award_id AS b_award_id, b.total_cents, \
           b.disbursement_count, b.last_sequence, b.updated_at, d.s, d.n, d.nd, d.mn, d.mx \
         FROM (SELECT * FROM award_balances WHERE {range}) b \
         FULL JOIN (SELECT award_id, CAST(sum(amount_cents) AS TEXT) AS s, count(*) AS n, \
             count(DISTINCT sequence) AS nd, min(sequence) AS mn, max(sequence) AS mx \
           FROM disbursements WHERE {range} GROUP BY award_id) d ON d.award_id = b.award_id \
         ORDER BY 1"
    )
}

/// The first row of award `?1` whose sequence is not its position.
const FIRST_GAP_SQL: &str = "SELECT expected, sequence, idempotency_key FROM ( \
       SELECT sequence, idempotency_key, row_number() OVER (ORDER BY sequence, idempotency_key) AS expected \
       FROM disbursements WHERE award_id = ?1) s \
     WHERE sequence <> expected ORDER BY expected LIMIT 1";

#[async_trait]
impl OpsStore for SqliteStore {
    async fn reconcile_start(&self) -> Result<ReconcileStart, StoreError> {
        let row = sqlx::query(
            "SELECT (SELECT min(claimed_at) FROM processed_messages), \
               (SELECT min(published_at) FROM outbox WHERE published_at IS NOT NULL)",
        )
        .fetch_one(&self.reader)
        .await?;
        Ok(ReconcileStart {
            // The relay and the purge of a SQLite store use this process's clock.
            now: crate::time_fmt::now_micros(),
            oldest_claim: row.try_get::<Option<i64>, _>(0)?.map(from_micros),
            oldest_published_event: row.try_get::<Option<i64>, _>(1)?.map(from_micros),
        })
    }

    /// One file, one pod: nothing to share the run with.
    async fn try_reconcile_lock(&self) -> Result<Option<crate::store::ops::RunLock>, StoreError> {
        Ok(Some(crate::store::ops::RunLock(Box::new(()))))
    }

    async fn key_batch_end(&self, after: &str, limit: i64) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements WHERE idempotency_key > ?1 \
             ORDER BY idempotency_key LIMIT 1 OFFSET ?2",
        )
        .bind(after)
        .bind(limit.max(1) - 1)
        .fetch_optional(&self.reader)
        .await?)
    }

    async fn reconcile_keys(
        &self,
        after: &str,
        until: Option<&str>,
        events_since: OffsetDateTime,
    ) -> Result<Vec<KeyPair>, StoreError> {
        let range = match until {
            Some(_) => "idempotency_key > ?1 AND idempotency_key <= ?2",
            None => "idempotency_key > ?1 AND ?2 IS NULL",
        };
        // Not a FULL JOIN: SQLite runs one as nested scans of both ranges. The
        // ledger rows with their claims (by primary key), then the claims
        // without a ledger row, in one statement and so one snapshot.
        let sql = format!(
            "SELECT d.idempotency_key AS key, {LEDGER_COLS}, {CLAIM_COLS}, \
               CASE WHEN d.recorded_at >= ?3 THEN (SELECT count(*) FROM outbox o \
                 WHERE o.award_id = d.award_id AND o.sequence = d.sequence \
                   AND o.event_type = '{LEDGER_EVENT_TYPE}') END AS events \
             FROM (SELECT * FROM disbursements WHERE {range}) d \
             LEFT JOIN processed_messages c ON c.idempotency_key = d.idempotency_key \
             UNION ALL \
             SELECT c.idempotency_key, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
               {CLAIM_COLS}, NULL \
             FROM (SELECT * FROM processed_messages WHERE {range}) c \
             WHERE NOT EXISTS (SELECT 1 FROM disbursements x WHERE x.idempotency_key = c.idempotency_key) \
             ORDER BY 1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(until)
            .bind(to_micros(events_since))
            .fetch_all(&self.reader)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(KeyPair {
                    key: r.try_get("key")?,
                    ledger: ledger(r)?,
                    claim: claim(r)?,
                    events: r.try_get("events")?,
                })
            })
            .collect()
    }

    async fn reconcile_events(&self, after: Uuid, limit: i64) -> Result<Vec<EventPair>, StoreError> {
        let sql = format!(
            "SELECT {EVENT_COLS}, {LEDGER_COLS} FROM outbox o \
             LEFT JOIN disbursements d ON d.award_id = o.award_id AND d.sequence = o.sequence \
             WHERE o.event_id > ?1 ORDER BY o.event_id LIMIT ?2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after.to_string())
            .bind(limit)
            .fetch_all(&self.reader)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(EventPair {
                    event: event_record(r)?,
                    ledger: ledger(r)?,
                })
            })
            .collect()
    }

    async fn award_batch_end(&self, after: &str, max_rows: i64) -> Result<Option<String>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT award_id, sum(disbursement_count) OVER (ORDER BY award_id) \
             FROM award_balances WHERE award_id > ?1 ORDER BY award_id LIMIT ?2",
        )
        .bind(after)
        .bind(AWARD_LOOKAHEAD)
        .fetch_all(&self.reader)
        .await?;
        Ok(batch_end(&rows, max_rows, AWARD_LOOKAHEAD))
    }

    async fn reconcile_awards(
        &self,
        after: &str,
        until: Option<&str>,
    ) -> Result<Vec<AwardTotals>, StoreError> {
        let range = match until {
            Some(_) => "award_id > ?1 AND award_id <= ?2",
            None => "award_id > ?1 AND ?2 IS NULL",
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(award_totals_sql(range)))
            .bind(after)
            .bind(until)
            .fetch_all(&self.reader)
            .await?;
        Ok(rows.iter().map(award_totals).collect::<Result<_, _>>()?)
    }

    async fn award_totals(&self, award_id: &str) -> Result<AwardTotals, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(award_totals_sql("award_id = ?1")))
            .bind(award_id)
            .fetch_optional(&self.reader)
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
        // BINARY collation: every key starting with the prefix sorts between
        // it and the prefix followed by the last code point; the key's
        // unique index serves the range.
        Ok(sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements \
             WHERE idempotency_key >= ?1 AND idempotency_key < ?2 AND substr(idempotency_key, 1, length(?1)) = ?1 \
             ORDER BY idempotency_key LIMIT ?3",
        )
        .bind(prefix)
        .bind(format!("{prefix}\u{10FFFF}"))
        .bind(limit)
        .fetch_all(&self.reader)
        .await?)
    }

    async fn disbursement_key(&self, id: Uuid) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT idempotency_key FROM disbursements WHERE id = ?1")
                .bind(id.to_string())
                .fetch_optional(&self.reader)
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
            "SELECT {LEDGER_COLS} FROM disbursements d WHERE d.award_id = ?1 AND d.sequence > ?2 \
             ORDER BY d.sequence LIMIT ?3"
        )))
        .bind(award_id)
        .bind(after_sequence)
        .bind(limit)
        .fetch_all(&self.reader)
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
            .fetch_optional(&self.reader)
            .await?;
        Ok(row.map(|(expected, found, key)| SequenceGap {
            expected,
            found,
            idempotency_key: key,
        }))
    }

    async fn ledger_matches(&self, keys: &[String]) -> Result<Vec<LedgerMatch>, StoreError> {
        let sql = format!(
            "SELECT {LEDGER_COLS}, (SELECT group_concat(o.event_id, ',') FROM outbox o \
               WHERE o.award_id = d.award_id AND o.sequence = d.sequence \
                 AND o.event_type = '{LEDGER_EVENT_TYPE}') AS event_ids \
             FROM disbursements d WHERE d.idempotency_key IN (SELECT value FROM json_each(?1))"
        );
        let keys = serde_json::to_string(keys).map_err(|e| StoreError::Other(e.to_string()))?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(keys)
            .fetch_all(&self.reader)
            .await?;
        let mut found = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(row) = ledger(r)? else { continue };
            let ids: Option<String> = r.try_get("event_ids")?;
            let event_ids = ids
                .iter()
                .flat_map(|s| s.split(','))
                .map(|id| uuid_from_text(id).map_err(StoreError::Other))
                .collect::<Result<_, _>>()?;
            found.push(LedgerMatch {
                ledger: row,
                event_ids,
            });
        }
        Ok(found)
    }

    /// Claim, ledger row, events and audit rows of a key, in one read
    /// transaction (one WAL snapshot).
    async fn inspect_key(&self, key: &str) -> Result<KeyInspection, StoreError> {
        let mut tx = self.reader.begin().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {LEDGER_COLS}, {CLAIM_COLS} FROM (SELECT ?1 AS k) q \
             LEFT JOIN disbursements d ON d.idempotency_key = q.k \
             LEFT JOIN processed_messages c ON c.idempotency_key = q.k"
        )))
        .bind(key)
        .fetch_one(&mut *tx)
        .await?;
        let ledger_row = ledger(&row)?;
        let mut events = Vec::new();
        if let Some(d) = &ledger_row {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.award_id = ?1 AND o.sequence = ?2 ORDER BY o.created_at"
            )))
            .bind(&d.award_id)
            .bind(d.sequence)
            .fetch_all(&mut *tx)
            .await?;
            events = rows.iter().map(event_record).collect::<Result<_, _>>()?;
        }
        let audit_rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {AUDIT_COLS} FROM audit_log WHERE key_prefix = ?1 ORDER BY at, id"
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
             FROM award_balances WHERE award_id = ?1",
        )
        .bind(award_id)
        .fetch_optional(&self.reader)
        .await?;
        let keys = sqlx::query_scalar(
            "SELECT idempotency_key FROM disbursements WHERE award_id = ?1 ORDER BY sequence DESC LIMIT ?2",
        )
        .bind(award_id)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        let balance = match &row {
            Some(r) => balance(r)?,
            None => None,
        };
        Ok((balance, keys))
    }

    async fn list_outbox(&self, filter: &OutboxFilter) -> Result<Vec<EventRecord>, StoreError> {
        let state = if filter.quarantined_only {
            "o.quarantined_at IS NOT NULL"
        } else {
            "1"
        };
        let sql = format!(
            "SELECT {EVENT_COLS} FROM outbox o WHERE o.published_at IS NULL AND {state} \
               AND (?2 IS NULL OR o.award_id = ?2) \
             ORDER BY o.created_at, o.sequence LIMIT ?1"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(filter.limit)
            .bind(filter.award_id.as_deref())
            .fetch_all(&self.reader)
            .await?;
        Ok(rows.iter().map(event_record).collect::<Result<_, _>>()?)
    }

    async fn redrive_outbox(
        &self,
        target: &crate::store::ops::RedriveTarget,
        limit: i64,
        by: &crate::store::ops::RedriveBy,
    ) -> Result<Vec<crate::store::ops::RedriveOutcome>, StoreError> {
        let (outcomes, redriven) = redrive_outbox(self.begin().await?, target, limit, by).await?;
        if redriven {
            self.outbox_written.notify_one();
        }
        Ok(outcomes)
    }
}

pub(super) async fn redrive_outbox(
    mut tx: Transaction<'static, Sqlite>,
    target: &RedriveTarget,
    limit: i64,
    by: &RedriveBy,
) -> Result<(Vec<RedriveOutcome>, bool), StoreError> {
    let rows = match target {
        RedriveTarget::Events(ids) => {
            let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
            let ids = serde_json::to_string(&ids).map_err(|e| StoreError::Other(e.to_string()))?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.event_id IN (SELECT value FROM json_each(?1)) \
                 ORDER BY o.created_at, o.sequence"
            )))
            .bind(ids)
            .fetch_all(&mut *tx)
            .await?
        }
        RedriveTarget::AllQuarantined { award_id } => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {EVENT_COLS} FROM outbox o WHERE o.quarantined_at IS NOT NULL \
                   AND o.published_at IS NULL AND (?2 IS NULL OR o.award_id = ?2) \
                 ORDER BY o.created_at, o.sequence LIMIT ?1"
            )))
            .bind(limit)
            .bind(award_id.as_deref())
            .fetch_all(&mut *tx)
            .await?
        }
    };
    let events: Vec<EventRecord> = rows.iter().map(event_record).collect::<Result<_, _>>()?;
    let outcomes = redrive_outcomes(target, events);
    let at = crate::time_fmt::now_micros();
    let mut any = false;
    for outcome in &outcomes {
        let RedriveOutcome::Redriven(e) = outcome else {
            continue;
        };
        sqlx::query(
            "UPDATE outbox SET quarantined_at = NULL, attempts = 0, last_error = NULL, \
               leased_until = NULL WHERE event_id = ?1",
        )
        .bind(e.event_id.to_string())
        .execute(&mut *tx)
        .await?;
        insert_audit(&mut tx, &redrive_audit(e, by, at)).await?;
        any = true;
    }
    tx.commit().await?;
    Ok((outcomes, any))
}

async fn insert_audit(tx: &mut Transaction<'static, Sqlite>, row: &AuditEntry) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
         VALUES (?1, ?2, NULL, ?3, ?4, ?5, 0, ?6)",
    )
    .bind(to_micros(row.at))
    .bind(row.decision.as_str())
    .bind(&row.key_prefix)
    .bind(&row.award_id)
    .bind(&*row.instance)
    .bind(row.detail.as_deref())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
