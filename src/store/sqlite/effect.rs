//! Effect records on the embedded store (DESIGN §9): the same statements as
//! Postgres, each call one `IMMEDIATE` transaction on the one writer, so the
//! statement that takes, completes or releases a lease runs alone. Lease
//! times are this process's clock (one file, one machine).

use super::SqliteStore;
use crate::error::StoreError;
use crate::key::key_prefix;
use crate::store::EffectStore;
use crate::store::effect::{
    BeginOutcome, CompletedEffect, EffectBegin, EffectRecord, Fence, FencedOutcome, REQUEST_MISMATCH,
    acquired_audit, completed_event_json,
};
use crate::store::rows::{completed_effect, effect_record, repeated_completion, taken_lease};
use crate::store::{AuditDecision, Tier};
use crate::time_fmt::{now_micros, to_micros};
use async_trait::async_trait;
use sqlx::{Row, Sqlite, Transaction};
use std::time::Duration;
use uuid::Uuid;

/// New record, or a released or expired lease taken over: one statement.
const TAKE_LEASE: &str = "INSERT INTO effects \
       (namespace, idempotency_key, fingerprint, state, lease_token, lease_expires_at, attempt, \
        created_at, updated_at) \
     VALUES (?1, ?2, ?3, 'in_progress', ?4, ?5, 1, ?6, ?6) \
     ON CONFLICT (namespace, idempotency_key) DO UPDATE \
       SET state = 'in_progress', lease_token = excluded.lease_token, \
           lease_expires_at = excluded.lease_expires_at, attempt = effects.attempt + 1, \
           updated_at = excluded.updated_at, \
           taken_over_from = CASE WHEN effects.state = 'released' THEN 'released' ELSE 'expired' END \
       WHERE effects.fingerprint = excluded.fingerprint \
         AND (effects.state = 'released' OR (effects.state = 'in_progress' AND effects.lease_expires_at <= ?6)) \
     RETURNING attempt, taken_over_from";

const SELECT_RECORD: &str = "SELECT namespace, idempotency_key, fingerprint, state, attempt, response, \
       completed_at, lease_token, lease_expires_at, updated_at \
     FROM effects WHERE namespace = ?1 AND idempotency_key = ?2";

#[async_trait]
impl EffectStore for SqliteStore {
    async fn effect_begin(&self, b: &EffectBegin) -> Result<BeginOutcome, StoreError> {
        let now = to_micros(now_micros());
        let mut tx = self.begin().await?;
        let taken = sqlx::query(TAKE_LEASE)
            .bind(&b.namespace)
            .bind(&b.key)
            .bind(&b.fingerprint)
            .bind(&b.token)
            .bind(now.saturating_add(b.lease_ttl.as_micros() as i64))
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match taken {
            Some(row) => {
                let (attempt, taken) = taken_lease(&row)?;
                let (decision, detail) = acquired_audit(taken, attempt);
                let row = AuditRow::new(decision, &b.key, &b.namespace, &b.instance);
                row.detail(Some(&detail)).insert(&mut tx).await?;
                BeginOutcome::Acquired { attempt, taken }
            }
            None => existing(&mut tx, b, now).await?,
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn effect_complete(
        &self,
        f: &Fence<'_>,
        response: &[u8],
    ) -> Result<FencedOutcome<CompletedEffect>, StoreError> {
        let now = to_micros(now_micros());
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE effects SET state = 'completed', response = ?4, completed_at = ?5, \
               lease_expires_at = NULL, updated_at = ?5 \
             WHERE namespace = ?1 AND idempotency_key = ?2 AND lease_token = ?3 AND state = 'in_progress' \
             RETURNING namespace, idempotency_key, fingerprint, state, attempt, response, completed_at",
        )
        .bind(f.namespace)
        .bind(f.key)
        .bind(f.token)
        .bind(response)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(done) = done.as_ref().map(completed_effect).transpose()?.flatten() else {
            let outcome = repeat_or_lost(&mut tx, f, response).await?;
            tx.commit().await?;
            return Ok(outcome);
        };
        let event_id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, award_hash) \
             VALUES (?1, 'effect.completed', ?2, ?3, ?4, ?5, ?6)",
        )
        .bind(event_id.to_string())
        .bind(&done.namespace)
        .bind(i64::from(done.attempt))
        .bind(completed_event_json(event_id, &done))
        .bind(now)
        .bind(crate::store::slots::award_hash(&done.namespace))
        .execute(&mut *tx)
        .await?;
        let detail = format!("attempt {}", done.attempt);
        let row = AuditRow::new(AuditDecision::EffectCompleted, f.key, f.namespace, f.instance);
        row.detail(Some(&detail)).insert(&mut tx).await?;
        tx.commit().await?;
        self.outbox_written.notify_one();
        Ok(FencedOutcome::Done(done))
    }

    async fn effect_release(&self, f: &Fence<'_>, reason: &str) -> Result<FencedOutcome<()>, StoreError> {
        let now = to_micros(now_micros());
        let mut tx = self.begin().await?;
        let released = sqlx::query(
            "UPDATE effects SET state = 'released', lease_expires_at = NULL, updated_at = ?4 \
             WHERE namespace = ?1 AND idempotency_key = ?2 AND lease_token = ?3 AND state = 'in_progress'",
        )
        .bind(f.namespace)
        .bind(f.key)
        .bind(f.token)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !released {
            let repeat: Option<bool> = sqlx::query_scalar(
                "SELECT state = 'released' FROM effects \
                 WHERE namespace = ?1 AND idempotency_key = ?2 AND lease_token = ?3",
            )
            .bind(f.namespace)
            .bind(f.key)
            .bind(f.token)
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(match repeat {
                Some(true) => FencedOutcome::Done(()),
                _ => FencedOutcome::LeaseLost,
            });
        }
        let row = AuditRow::new(AuditDecision::EffectReleased, f.key, f.namespace, f.instance);
        row.detail(Some(reason)).insert(&mut tx).await?;
        tx.commit().await?;
        Ok(FencedOutcome::Done(()))
    }

    async fn effect_get(&self, namespace: &str, key: &str) -> Result<Option<EffectRecord>, StoreError> {
        let row = sqlx::query(SELECT_RECORD)
            .bind(namespace)
            .bind(key)
            .fetch_optional(&self.reader)
            .await?;
        Ok(row.as_ref().map(effect_record).transpose()?)
    }
}

/// What holds a record whose lease could not be taken.
async fn existing(
    tx: &mut Transaction<'_, Sqlite>,
    b: &EffectBegin,
    now: i64,
) -> Result<BeginOutcome, StoreError> {
    let Some(row) = sqlx::query(SELECT_RECORD)
        .bind(&b.namespace)
        .bind(&b.key)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(BeginOutcome::Held {
            expires_in: Duration::ZERO,
        });
    };
    if row.try_get::<String, _>("fingerprint")? != b.fingerprint {
        let audit = AuditRow::new(AuditDecision::EffectRejected, &b.key, &b.namespace, &b.instance);
        let audit = AuditRow {
            tier: Some(Tier::Database),
            ..audit
        };
        audit.detail(Some(REQUEST_MISMATCH)).insert(tx).await?;
        return Ok(BeginOutcome::Mismatch);
    }
    if let Some(done) = completed_effect(&row)? {
        return Ok(BeginOutcome::Completed(done));
    }
    let expires: Option<i64> = row.try_get("lease_expires_at")?;
    let left = expires.map_or(0, |e| e.saturating_sub(now).max(0));
    Ok(BeginOutcome::Held {
        expires_in: Duration::from_micros(left as u64),
    })
}

/// A `Complete` whose fenced update changed nothing: the same call again
/// (same token, same response) answers the first completion.
async fn repeat_or_lost(
    tx: &mut Transaction<'_, Sqlite>,
    f: &Fence<'_>,
    response: &[u8],
) -> Result<FencedOutcome<CompletedEffect>, StoreError> {
    let row = sqlx::query(SELECT_RECORD)
        .bind(f.namespace)
        .bind(f.key)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(repeated_completion(row.as_ref(), f, response)?)
}

/// One audit row in the effect's transaction: key prefix, and the
/// namespace in the `award_id` column.
struct AuditRow<'a> {
    decision: AuditDecision,
    tier: Option<Tier>,
    key: &'a str,
    namespace: &'a str,
    instance: &'a str,
    detail: Option<&'a str>,
}

impl<'a> AuditRow<'a> {
    fn new(decision: AuditDecision, key: &'a str, namespace: &'a str, instance: &'a str) -> Self {
        Self {
            decision,
            tier: None,
            key,
            namespace,
            instance,
            detail: None,
        }
    }

    fn detail(self, detail: Option<&'a str>) -> Self {
        Self { detail, ..self }
    }

    async fn insert(&self, tx: &mut Transaction<'_, Sqlite>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7)",
        )
        .bind(to_micros(now_micros()))
        .bind(self.decision.as_str())
        .bind(self.tier.map(Tier::as_str))
        .bind(key_prefix(self.key))
        .bind(self.namespace)
        .bind(self.instance)
        .bind(self.detail)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

/// Effect records whose last change is older than `cutoff`, in batches.
pub(super) const PURGE_SQL: &str = "DELETE FROM effects WHERE (namespace, idempotency_key) IN ( \
       SELECT namespace, idempotency_key FROM effects WHERE updated_at < ?1 \
       ORDER BY updated_at LIMIT ?2)";
