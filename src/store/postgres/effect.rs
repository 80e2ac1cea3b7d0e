//! Effect records on Postgres (DESIGN §9). Lease times are the database's
//! clock, so every instance judges expiry alike. Each call is one short
//! transaction; the statement that takes, completes or releases a lease is
//! the one that checks it (under READ COMMITTED a concurrent caller waits
//! for the row lock and re-checks the condition on the new row version).

use super::PostgresStore;
use super::tx::{Transactions, named};
use crate::error::StoreError;
use crate::key::key_prefix;
use crate::store::EffectStore;
use crate::store::effect::{
    BeginOutcome, CompletedEffect, EffectBegin, EffectRecord, Fence, FencedOutcome, REQUEST_MISMATCH,
    acquired_audit, completed_event_json,
};
use crate::store::rows::{completed_effect, effect_record, repeated_completion, taken_lease};
use crate::store::{AuditDecision, Tier};
use async_trait::async_trait;
use sqlx::{Postgres, Row, Transaction};
use std::time::Duration;
use time::OffsetDateTime;
use uuid::Uuid;

/// New record, or a released or expired lease taken over: one statement.
const TAKE_LEASE: &str = "INSERT INTO effects AS e \
       (namespace, idempotency_key, fingerprint, state, lease_token, lease_expires_at, attempt) \
     VALUES ($1, $2, $3, 'in_progress', $4, now() + $5 * interval '1 millisecond', 1) \
     ON CONFLICT (namespace, idempotency_key) DO UPDATE \
       SET state = 'in_progress', lease_token = EXCLUDED.lease_token, \
           lease_expires_at = EXCLUDED.lease_expires_at, attempt = e.attempt + 1, updated_at = now(), \
           taken_over_from = CASE WHEN e.state = 'released' THEN 'released' ELSE 'expired' END \
       WHERE e.fingerprint = EXCLUDED.fingerprint \
         AND (e.state = 'released' OR (e.state = 'in_progress' AND e.lease_expires_at <= now())) \
     RETURNING attempt, taken_over_from";

const SELECT_RECORD: &str = "SELECT namespace, idempotency_key, fingerprint, state, attempt, response, \
       completed_at, lease_token, lease_expires_at, updated_at, \
       greatest(extract(epoch FROM lease_expires_at - now()), 0)::float8 AS expires_in \
     FROM effects WHERE namespace = $1 AND idempotency_key = $2";

#[async_trait]
impl EffectStore for PostgresStore {
    /// Under the guard the lease is confirmed on a synchronous standby before
    /// it is answered: a lease lost in a failover would let a second holder
    /// begin as attempt 1.
    async fn effect_begin(&self, b: &EffectBegin) -> Result<BeginOutcome, StoreError> {
        let mut tx = self.tx.begin().await?;
        let taken = sqlx::query(TAKE_LEASE)
            .bind(&b.namespace)
            .bind(&b.key)
            .bind(&b.fingerprint)
            .bind(&b.token)
            .bind(b.lease_ttl.as_millis() as f64)
            .persistent(named())
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match taken {
            Some(row) => {
                let (attempt, taken) = taken_lease(&row)?;
                let (decision, detail) = acquired_audit(taken, attempt);
                audit(
                    &mut tx,
                    (decision, None),
                    b.key.as_str(),
                    &b.namespace,
                    &b.instance,
                    Some(&detail),
                )
                .await?;
                BeginOutcome::Acquired { attempt, taken }
            }
            None => existing(&mut tx, b).await?,
        };
        self.tx.commit(tx).await?;
        Ok(outcome)
    }

    async fn effect_complete(
        &self,
        fence: &crate::store::effect::Fence<'_>,
        response: &[u8],
    ) -> Result<FencedOutcome<CompletedEffect>, StoreError> {
        let outcome = complete(&self.tx, fence, response).await?;
        if matches!(outcome, FencedOutcome::Done(_)) {
            // An `effect.completed` event was written (or already was):
            // wake the relays as a claim's commit does.
            self.outbox_written.notify_one();
            self.notifier.poke(&self.pool);
        }
        Ok(outcome)
    }

    async fn effect_release(&self, f: &Fence<'_>, reason: &str) -> Result<FencedOutcome<()>, StoreError> {
        let mut tx = self.tx.begin().await?;
        let released = sqlx::query(
            "UPDATE effects SET state = 'released', lease_expires_at = NULL, updated_at = now() \
             WHERE namespace = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress'",
        )
        .bind(f.namespace)
        .bind(f.key)
        .bind(f.token)
        .persistent(named())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !released {
            let repeat: Option<bool> = sqlx::query_scalar(
                "SELECT state = 'released' FROM effects \
                 WHERE namespace = $1 AND idempotency_key = $2 AND lease_token = $3",
            )
            .bind(f.namespace)
            .bind(f.key)
            .bind(f.token)
            .persistent(named())
            .fetch_optional(&mut *tx)
            .await?;
            tx.commit().await?;
            return Ok(match repeat {
                Some(true) => FencedOutcome::Done(()),
                _ => FencedOutcome::LeaseLost,
            });
        }
        let decision = (AuditDecision::EffectReleased, None);
        audit(&mut tx, decision, f.key, f.namespace, f.instance, Some(reason)).await?;
        tx.commit().await?;
        Ok(FencedOutcome::Done(()))
    }

    async fn effect_get(&self, namespace: &str, key: &str) -> Result<Option<EffectRecord>, StoreError> {
        let mut session = self.tx.session().await?;
        let row = sqlx::query(SELECT_RECORD)
            .bind(namespace)
            .bind(key)
            .persistent(named())
            .fetch_optional(&mut *session)
            .await?;
        session.finish().await?;
        Ok(row.as_ref().map(effect_record).transpose()?)
    }
}

/// What holds a record whose lease could not be taken.
async fn existing(tx: &mut Transaction<'_, Postgres>, b: &EffectBegin) -> Result<BeginOutcome, StoreError> {
    let Some(row) = sqlx::query(SELECT_RECORD)
        .bind(&b.namespace)
        .bind(&b.key)
        .persistent(named())
        .fetch_optional(&mut **tx)
        .await?
    else {
        // Purged between the statements: try again.
        return Ok(BeginOutcome::Held {
            expires_in: Duration::ZERO,
        });
    };
    if row.try_get::<String, _>("fingerprint")? != b.fingerprint {
        let tier = (AuditDecision::EffectRejected, Some(Tier::Database));
        audit(
            tx,
            tier,
            &b.key,
            &b.namespace,
            &b.instance,
            Some(REQUEST_MISMATCH),
        )
        .await?;
        return Ok(BeginOutcome::Mismatch);
    }
    if let Some(done) = completed_effect(&row)? {
        return Ok(BeginOutcome::Completed(done));
    }
    let expires_in: Option<f64> = row.try_get("expires_in")?;
    Ok(BeginOutcome::Held {
        expires_in: Duration::from_secs_f64(expires_in.unwrap_or(0.0).max(0.0)),
    })
}

/// Under the guard the completion is confirmed on a synchronous standby
/// before it is answered, like a claim.
pub(super) async fn complete(
    txs: &Transactions,
    f: &Fence<'_>,
    response: &[u8],
) -> Result<FencedOutcome<CompletedEffect>, StoreError> {
    let mut tx = txs.begin().await?;
    let done = sqlx::query(
        "UPDATE effects SET state = 'completed', response = $4, completed_at = date_trunc('microseconds', now()), \
           lease_expires_at = NULL, updated_at = now() \
         WHERE namespace = $1 AND idempotency_key = $2 AND lease_token = $3 AND state = 'in_progress' \
         RETURNING namespace, idempotency_key, fingerprint, state, attempt, response, completed_at",
    )
    .bind(f.namespace)
    .bind(f.key)
    .bind(f.token)
    .bind(response)
    .persistent(named())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(done) = done.as_ref().map(completed_effect).transpose()?.flatten() else {
        let outcome = repeat_or_lost(&mut tx, f, response).await?;
        txs.commit(tx).await?;
        return Ok(outcome);
    };
    let event_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, award_hash) \
         VALUES ($1, 'effect.completed', $2, $3, $4::jsonb, $5, $6)",
    )
    .bind(event_id)
    .bind(&done.namespace)
    .bind(i64::from(done.attempt))
    .bind(completed_event_json(event_id, &done))
    .bind(done.completed_at)
    .bind(crate::store::slots::award_hash(&done.namespace))
    .persistent(named())
    .execute(&mut *tx)
    .await?;
    let detail = format!("attempt {}", done.attempt);
    let decision = (AuditDecision::EffectCompleted, None);
    audit(&mut tx, decision, f.key, f.namespace, f.instance, Some(&detail)).await?;
    txs.commit(tx).await?;
    Ok(FencedOutcome::Done(done))
}

/// A `Complete` whose fenced update changed nothing: the same call again
/// (same token, same response) answers the first completion.
async fn repeat_or_lost(
    tx: &mut Transaction<'_, Postgres>,
    f: &Fence<'_>,
    response: &[u8],
) -> Result<FencedOutcome<CompletedEffect>, StoreError> {
    let row = sqlx::query(SELECT_RECORD)
        .bind(f.namespace)
        .bind(f.key)
        .persistent(named())
        .fetch_optional(&mut **tx)
        .await?;
    Ok(repeated_completion(row.as_ref(), f, response)?)
}

/// One audit row in the effect's transaction: key prefix, and the
/// namespace in the `award_id` column.
async fn audit(
    tx: &mut Transaction<'_, Postgres>,
    (decision, tier): (AuditDecision, Option<Tier>),
    key: &str,
    namespace: &str,
    instance: &str,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(OffsetDateTime::now_utc())
    .bind(decision.as_str())
    .bind(tier.map(Tier::as_str))
    .bind(key_prefix(key))
    .bind(namespace)
    .bind(instance)
    .bind(detail)
    .persistent(named())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Effect records whose last change is older than `cutoff`, in batches.
pub(super) const PURGE_SQL: &str = "DELETE FROM effects WHERE (namespace, idempotency_key) IN ( \
       SELECT namespace, idempotency_key FROM effects WHERE updated_at < $1 \
       ORDER BY updated_at LIMIT $2)";
