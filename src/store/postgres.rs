//! The production store. A batch of claims costs a handful of set-based
//! statements (`unnest` arrays) in one transaction, not five per delivery.

use super::*;
use crate::error::StoreError;
use crate::key::key_prefix;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Postgres, Row, Transaction};
use std::collections::HashSet;
use std::str::FromStr;
use tokio::sync::Mutex;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Advisory lock key held by the instance that runs retention ("oncegate").
const PURGE_LOCK: i64 = 0x6f6e_6365_6761_7465;
const OUTBOX_CHANNEL: &str = "oncegate_outbox";

pub struct PostgresStore {
    pool: PgPool,
    listener: Mutex<Option<PgListener>>,
}

impl PostgresStore {
    /// A lazily connecting pool: the sidecar starts (and answers cached
    /// duplicates) even while Postgres is down.
    pub async fn connect(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Other(format!("invalid DATABASE_URL: {e}")))?
            .application_name("oncegate");
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(1))
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options);
        Ok(Self {
            pool,
            listener: Mutex::new(None),
        })
    }

    /// The pool, for tests and pool metrics.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn stored_from_row(row: &sqlx::postgres::PgRow) -> Result<StoredResult, sqlx::Error> {
    Ok(StoredResult {
        key: row.try_get("idempotency_key")?,
        fingerprint: row.try_get("fingerprint")?,
        disbursement: Disbursement {
            id: row.try_get("id")?,
            award_id: row.try_get("award_id")?,
            amount_cents: row.try_get("amount_cents")?,
            recorded_at: row.try_get("recorded_at")?,
            sequence: row.try_get("sequence")?,
        },
    })
}

const SELECT_STORED_ANY: &str = "SELECT idempotency_key, fingerprint, id, award_id, amount_cents, \
     recorded_at, sequence FROM disbursements WHERE idempotency_key = ANY($1)";
const SELECT_STORED_ONE: &str = "SELECT idempotency_key, fingerprint, id, award_id, amount_cents, \
     recorded_at, sequence FROM disbursements WHERE idempotency_key = $1";

async fn load_stored(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[&str],
) -> Result<HashMap<String, StoredResult>, StoreError> {
    let rows = sqlx::query(SELECT_STORED_ANY)
        .bind(keys)
        .fetch_all(&mut **tx)
        .await?;
    rows.iter()
        .map(|r| stored_from_row(r).map(|s| (s.key.clone(), s)))
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
}

/// Inserts the claim rows; returns the keys this transaction claimed.
async fn insert_claims(
    tx: &mut Transaction<'_, Postgres>,
    items: &[&Submission],
    ids: &[Uuid],
    now: OffsetDateTime,
) -> Result<HashSet<String>, StoreError> {
    let keys: Vec<&str> = items.iter().map(|s| s.key.as_str()).collect();
    let awards: Vec<&str> = items.iter().map(|s| s.award_id.as_str()).collect();
    let prints: Vec<&str> = items.iter().map(|s| s.fingerprint.as_str()).collect();
    let claimed: Vec<String> = sqlx::query_scalar(
        "INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at) \
         SELECT k, a, f, d, $5 FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[]) AS t(k, a, f, d) \
         ORDER BY k \
         ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key",
    )
    .bind(&keys)
    .bind(&awards)
    .bind(&prints)
    .bind(ids)
    .bind(now)
    .fetch_all(&mut **tx)
    .await?;
    Ok(claimed.into_iter().collect())
}

/// Adds the claimed amounts to the running totals; returns each award's
/// `last_sequence` after the increment.
async fn bump_balances(
    tx: &mut Transaction<'_, Postgres>,
    claimed: &[&Submission],
    now: OffsetDateTime,
) -> Result<(HashMap<String, i64>, Vec<(String, i64)>), StoreError> {
    let totals = totals_by_award(claimed);
    let awards: Vec<&str> = totals.iter().map(|t| t.0).collect();
    let sums: Vec<i64> = totals.iter().map(|t| t.1).collect();
    let counts: Vec<i64> = totals.iter().map(|t| t.2).collect();
    let rows = sqlx::query(
        "INSERT INTO award_balances AS b (award_id, total_cents, disbursement_count, last_sequence, updated_at) \
         SELECT a, t, n, n, $4 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS x(a, t, n) ORDER BY a \
         ON CONFLICT (award_id) DO UPDATE SET \
           total_cents = b.total_cents + excluded.total_cents, \
           disbursement_count = b.disbursement_count + excluded.disbursement_count, \
           last_sequence = b.last_sequence + excluded.disbursement_count, \
           updated_at = excluded.updated_at \
         RETURNING award_id, last_sequence",
    )
    .bind(&awards)
    .bind(&sums)
    .bind(&counts)
    .bind(now)
    .fetch_all(&mut **tx)
    .await?;
    let last = rows
        .iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<HashMap<_, _>, sqlx::Error>>()?;
    let counts = totals.iter().map(|t| (t.0.to_string(), t.2)).collect();
    Ok((last, counts))
}

/// The audit rows of one transaction: one per item decided in it.
struct AuditRows<'a> {
    decision: Vec<&'static str>,
    tier: Vec<Option<&'static str>>,
    prefix: Vec<&'a str>,
    award: Vec<&'a str>,
    ts: Vec<&'a str>,
    key: Vec<&'a str>,
    in_batch: Vec<bool>,
}

impl<'a> AuditRows<'a> {
    fn new(
        items: &[&'a Submission],
        outcomes: &[ClaimOutcome],
        in_batch_changed: &HashMap<&str, bool>,
    ) -> Self {
        let n = items.len();
        let mut rows = Self {
            decision: Vec::with_capacity(n),
            tier: Vec::with_capacity(n),
            prefix: Vec::with_capacity(n),
            award: Vec::with_capacity(n),
            ts: Vec::with_capacity(n),
            key: Vec::with_capacity(n),
            in_batch: Vec::with_capacity(n),
        };
        for (s, o) in items.iter().zip(outcomes) {
            let (d, t) = match o {
                ClaimOutcome::Claimed(_) => ("processed", None),
                ClaimOutcome::Duplicate(_) => ("duplicate", Some("DATABASE")),
                ClaimOutcome::KeyReused(_) => ("rejected", Some("DATABASE")),
            };
            rows.decision.push(d);
            rows.tier.push(t);
            rows.prefix.push(key_prefix(&s.key));
            rows.award.push(s.award_id.as_str());
            rows.ts.push(s.submission_timestamp.as_str());
            rows.key.push(s.key.as_str());
            rows.in_batch
                .push(in_batch_changed.get(s.key.as_str()).copied().unwrap_or(false));
        }
        rows
    }
}

/// The audit insert, as a `concat!` piece ($1 = at, $2 = instance, $3..$9 = the rows). A processed
/// item is flagged `payload_changed` when the ledger already holds its award
/// id and timestamp under another key; the probe sees the ledger as it was
/// before this batch's rows (they go in later, or in the same statement,
/// whose snapshot does not include them), so within-batch repeats come from
/// the `b` column.
macro_rules! audit_insert {
    () => {
        "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
       SELECT $1, x.d, x.t, x.p, x.a, $2, \
         x.d = 'processed' AND (x.b OR EXISTS (SELECT 1 FROM disbursements o \
           WHERE o.award_id = x.a AND o.submission_timestamp = x.ts AND o.idempotency_key <> x.k)), \
         CASE WHEN x.d = 'rejected' THEN 'idempotency key reused with a different submission' END \
       FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bool[]) \
         AS x(d, t, p, a, ts, k, b) \
       RETURNING payload_changed"
    };
}

/// Writes the audit rows alone (a transaction that claimed nothing).
/// Returns how many were flagged `payload_changed`.
async fn insert_audit(
    tx: &mut Transaction<'_, Postgres>,
    audit: &AuditRows<'_>,
    ctx: &ClaimContext,
    now: OffsetDateTime,
) -> Result<i64, StoreError> {
    const SQL: &str = concat!(
        "WITH ins AS (",
        audit_insert!(),
        ") SELECT count(*) FILTER (WHERE payload_changed) FROM ins"
    );
    let flagged: i64 = sqlx::query_scalar(SQL)
        .bind(now)
        .bind(&*ctx.instance)
        .bind(&audit.decision)
        .bind(&audit.tier)
        .bind(&audit.prefix)
        .bind(&audit.award)
        .bind(&audit.ts)
        .bind(&audit.key)
        .bind(&audit.in_batch)
        .fetch_one(&mut **tx)
        .await?;
    Ok(flagged)
}

/// The audit rows, the ledger rows and the outbox events of a transaction
/// that claimed something, in one statement (one round trip instead of
/// three). A key already in the ledger (its claim purged) is a late
/// redelivery: the statement reports it and the batch aborts, so neither its
/// ledger rows nor its events are committed. Returns the flagged count.
async fn insert_effects(
    tx: &mut Transaction<'_, Postgres>,
    audit: &AuditRows<'_>,
    claimed: &[&Submission],
    rows: &[Disbursement],
    ctx: &ClaimContext,
    now: OffsetDateTime,
) -> Result<i64, StoreError> {
    let ids: Vec<Uuid> = rows.iter().map(|d| d.id).collect();
    let keys: Vec<&str> = claimed.iter().map(|s| s.key.as_str()).collect();
    let awards: Vec<&str> = claimed.iter().map(|s| s.award_id.as_str()).collect();
    let amounts: Vec<i64> = claimed.iter().map(|s| s.amount_cents).collect();
    let seqs: Vec<i64> = rows.iter().map(|d| d.sequence).collect();
    let ts: Vec<&str> = claimed.iter().map(|s| s.submission_timestamp.as_str()).collect();
    let digests: Vec<&str> = claimed.iter().map(|s| s.payload_digest.as_str()).collect();
    let prints: Vec<&str> = claimed.iter().map(|s| s.fingerprint.as_str()).collect();
    let recorded: Vec<OffsetDateTime> = rows.iter().map(|d| d.recorded_at).collect();
    let event_ids: Vec<Uuid> = rows.iter().map(|_| Uuid::now_v7()).collect();
    let bodies: Vec<String> = claimed
        .iter()
        .zip(rows)
        .zip(&event_ids)
        .map(|((s, d), id)| event_json(*id, s, d))
        .collect();
    // Outbox: clock_timestamp() is taken after the awards' balance rows are
    // locked (earlier in the transaction), so per award created_at order is
    // sequence order.
    const SQL: &str = concat!(
        "WITH aud AS (",
        audit_insert!(),
        "), \
         led AS ( \
           INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence, \
             submission_timestamp, payload_digest, fingerprint, recorded_at) \
           SELECT * FROM unnest($10::uuid[], $11::text[], $12::text[], $13::bigint[], $14::bigint[], \
             $15::text[], $16::text[], $17::text[], $18::timestamptz[]) \
           ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key), \
         ob AS ( \
           INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at) \
           SELECT e, 'disbursement.recorded', a, s, p::jsonb, clock_timestamp() \
           FROM unnest($19::uuid[], $12::text[], $14::bigint[], $20::text[]) AS x(e, a, s, p) \
           ORDER BY a, s) \
         SELECT (SELECT count(*) FILTER (WHERE payload_changed) FROM aud), \
           (SELECT coalesce(array_agg(idempotency_key), '{}') FROM led)"
    );
    let (flagged, inserted): (i64, Vec<String>) = sqlx::query_as(SQL)
        .bind(now)
        .bind(&*ctx.instance)
        .bind(&audit.decision)
        .bind(&audit.tier)
        .bind(&audit.prefix)
        .bind(&audit.award)
        .bind(&audit.ts)
        .bind(&audit.key)
        .bind(&audit.in_batch)
        .bind(&ids)
        .bind(&keys)
        .bind(&awards)
        .bind(&amounts)
        .bind(&seqs)
        .bind(&ts)
        .bind(&digests)
        .bind(&prints)
        .bind(&recorded)
        .bind(&event_ids)
        .bind(&bodies)
        .fetch_one(&mut **tx)
        .await?;
    if inserted.len() < claimed.len() {
        let inserted: HashSet<&str> = inserted.iter().map(String::as_str).collect();
        let late = keys
            .iter()
            .filter(|k| !inserted.contains(**k))
            .map(|k| k.to_string())
            .collect();
        return Err(StoreError::LateRedelivery(late));
    }
    Ok(flagged)
}

async fn claim_in_tx(
    tx: &mut Transaction<'_, Postgres>,
    items: &[&Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let now = now_micros();
    let ids: Vec<Uuid> = items.iter().map(|_| Uuid::now_v7()).collect();
    let claimed_keys = insert_claims(tx, items, &ids, now).await?;

    let others: Vec<&str> = items
        .iter()
        .filter(|s| !claimed_keys.contains(&s.key))
        .map(|s| s.key.as_str())
        .collect();
    let mut stored = if others.is_empty() {
        HashMap::new()
    } else {
        load_stored(tx, &others).await?
    };

    let claimed: Vec<&Submission> = items
        .iter()
        .copied()
        .filter(|s| claimed_keys.contains(&s.key))
        .collect();
    let mut rows = Vec::with_capacity(claimed.len());
    if !claimed.is_empty() {
        let (last, counts) = bump_balances(tx, &claimed, now).await?;
        let counts: HashMap<&str, i64> = counts.iter().map(|(a, n)| (a.as_str(), *n)).collect();
        let seqs = assign_sequences(&claimed, &last, &counts);
        let id_of: HashMap<&str, Uuid> = items
            .iter()
            .zip(&ids)
            .map(|(s, id)| (s.key.as_str(), *id))
            .collect();
        for (s, seq) in claimed.iter().zip(seqs) {
            rows.push(Disbursement {
                id: id_of[s.key.as_str()],
                award_id: s.award_id.clone(),
                amount_cents: s.amount_cents,
                recorded_at: now,
                sequence: seq,
            });
        }
    }
    let mut fresh: HashMap<&str, Disbursement> = claimed
        .iter()
        .map(|s| s.key.as_str())
        .zip(rows.iter().cloned())
        .collect();
    let outcomes = items
        .iter()
        .map(|s| match fresh.remove(s.key.as_str()) {
            Some(d) => Ok(ClaimOutcome::Claimed(StoredResult {
                key: s.key.clone(),
                fingerprint: s.fingerprint.clone(),
                disbursement: d,
            })),
            None => stored
                .remove(&s.key)
                .map(|r| outcome_for(s, r))
                .ok_or_else(|| StoreError::Other(format!("claim {} has no ledger row", key_prefix(&s.key)))),
        })
        .collect::<Result<Vec<_>, _>>()?;

    let in_batch: HashMap<&str, bool> = claimed
        .iter()
        .zip(changed_within_batch(&claimed))
        .map(|(s, c)| (s.key.as_str(), c))
        .collect();
    let audit = AuditRows::new(items, &outcomes, &in_batch);
    let flagged = if claimed.is_empty() {
        insert_audit(tx, &audit, ctx, now).await?
    } else {
        insert_effects(tx, &audit, &claimed, &rows, ctx, now).await?
    };
    if flagged > 0 {
        metrics::counter!("oncegate_payload_changed_resubmissions_total").increment(flagged as u64);
    }
    Ok(outcomes)
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(err) => StoreError::from_sqlx(err),
            other => StoreError::Other(format!("migration failed: {other}")),
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn claim_unique(
        &self,
        items: &[&Submission],
        ctx: &ClaimContext,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let outcomes = claim_in_tx(&mut tx, items, ctx).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn restore_claims(&self, keys: &[String]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at) \
             SELECT idempotency_key, award_id, fingerprint, id, now() FROM disbursements \
             WHERE idempotency_key = ANY($1) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(keys)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lookup(&self, key: &str) -> Result<Option<StoredResult>, StoreError> {
        let row = sqlx::query(SELECT_STORED_ONE)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(stored_from_row).transpose()?)
    }

    async fn append_audit(&self, rows: &[AuditEntry]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let at: Vec<OffsetDateTime> = rows.iter().map(|r| r.at).collect();
        let decision: Vec<&str> = rows.iter().map(|r| r.decision.as_str()).collect();
        let tier: Vec<Option<&str>> = rows.iter().map(|r| r.tier).collect();
        let prefix: Vec<&str> = rows.iter().map(|r| r.key_prefix.as_str()).collect();
        let award: Vec<&str> = rows.iter().map(|r| r.award_id.as_str()).collect();
        let instance: Vec<&str> = rows.iter().map(|r| &*r.instance).collect();
        let changed: Vec<bool> = rows.iter().map(|r| r.payload_changed).collect();
        let detail: Vec<Option<&str>> = rows.iter().map(|r| r.detail.as_deref()).collect();
        sqlx::query(
            "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
             SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], \
               $6::text[], $7::bool[], $8::text[])",
        )
        .bind(&at)
        .bind(&decision)
        .bind(&tier)
        .bind(&prefix)
        .bind(&award)
        .bind(&instance)
        .bind(&changed)
        .bind(&detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lease_outbox(
        &self,
        limit: i64,
        lease: Duration,
        owner: &str,
    ) -> Result<Vec<OutboxEvent>, StoreError> {
        let rows = sqlx::query(
            "UPDATE outbox SET leased_until = now() + $2 * interval '1 millisecond', lease_owner = $3 \
             WHERE event_id IN ( \
               SELECT o.event_id FROM outbox o \
               WHERE o.published_at IS NULL AND o.quarantined_at IS NULL \
                 AND (o.leased_until IS NULL OR o.leased_until < now()) \
                 AND NOT EXISTS (SELECT 1 FROM outbox e \
                   WHERE e.award_id = o.award_id AND e.published_at IS NULL AND e.quarantined_at IS NULL \
                     AND (e.created_at < o.created_at \
                       OR (e.created_at = o.created_at AND e.sequence < o.sequence)) \
                     AND e.leased_until >= now()) \
               ORDER BY o.created_at, o.sequence LIMIT $1 FOR UPDATE OF o SKIP LOCKED) \
             RETURNING event_id, event_type, award_id, sequence, payload::text AS payload, attempts, created_at",
        )
        .bind(limit)
        .bind(lease.as_millis() as f64)
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        let mut events = rows
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<OffsetDateTime, _>("created_at")?,
                    OutboxEvent {
                        event_id: r.try_get("event_id")?,
                        event_type: r.try_get("event_type")?,
                        award_id: r.try_get("award_id")?,
                        sequence: r.try_get("sequence")?,
                        payload: r.try_get("payload")?,
                        attempts: r.try_get("attempts")?,
                    },
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.sequence.cmp(&b.1.sequence)));
        Ok(events.into_iter().map(|(_, e)| e).collect())
    }

    async fn mark_published(&self, ids: &[Uuid]) -> Result<(), StoreError> {
        sqlx::query("UPDATE outbox SET published_at = now(), leased_until = NULL WHERE event_id = ANY($1)")
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn record_publish_failure(
        &self,
        id: Uuid,
        error: &str,
        max_attempts: i32,
        retry_after: Duration,
    ) -> Result<bool, StoreError> {
        let quarantined: Option<bool> = sqlx::query_scalar(
            "UPDATE outbox SET attempts = attempts + 1, last_error = $2, \
               leased_until = now() + $4 * interval '1 millisecond', \
               quarantined_at = CASE WHEN attempts + 1 >= $3 THEN now() END \
             WHERE event_id = $1 RETURNING quarantined_at IS NOT NULL",
        )
        .bind(id)
        .bind(error)
        .bind(max_attempts)
        .bind(retry_after.as_millis() as f64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(quarantined.unwrap_or(false))
    }

    async fn postpone_outbox(&self, ids: &[Uuid], retry_after: Duration) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE outbox SET leased_until = now() + $2 * interval '1 millisecond' \
             WHERE event_id = ANY($1) AND published_at IS NULL",
        )
        .bind(ids)
        .bind(retry_after.as_millis() as f64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL), \
               coalesce(extract(epoch FROM now() - min(created_at) \
                 FILTER (WHERE published_at IS NULL AND quarantined_at IS NULL)), 0)::float8, \
               count(*) FILTER (WHERE quarantined_at IS NOT NULL) \
             FROM outbox WHERE published_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(OutboxStats {
            backlog: row.try_get(0)?,
            oldest_age: Duration::from_secs_f64(row.try_get::<f64, _>(1)?.max(0.0)),
            quarantined: row.try_get(2)?,
        })
    }

    async fn purge(&self, policy: &RetentionPolicy) -> Result<PurgeReport, StoreError> {
        // A connection of its own, closed at the end: the session-level lock
        // can never leak back into the pool.
        let mut conn = self.pool.acquire().await?.detach();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(PURGE_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if !locked {
            return Ok(PurgeReport::default());
        }
        let cutoff = OffsetDateTime::now_utc() - policy.retention;
        let outbox_cutoff = OffsetDateTime::now_utc() - policy.outbox_retention;
        let mut report = PurgeReport {
            ran: true,
            ..Default::default()
        };
        report.claims_deleted = delete_in_batches(
            &mut conn,
            "DELETE FROM processed_messages WHERE idempotency_key IN ( \
               SELECT idempotency_key FROM processed_messages WHERE claimed_at < $1 \
               ORDER BY claimed_at LIMIT $2)",
            cutoff,
            policy.batch_size,
        )
        .await?;
        sqlx::query("SELECT oncegate_ensure_audit_partitions((now() AT TIME ZONE 'UTC')::date, 3)")
            .execute(&mut conn)
            .await?;
        let dropped: i64 = sqlx::query_scalar("SELECT oncegate_drop_audit_partitions($1)")
            .bind(cutoff)
            .fetch_one(&mut conn)
            .await?;
        report.audit_deleted = dropped as u64
            + delete_in_batches(
                &mut conn,
                "SELECT oncegate_purge_audit_rows($1, $2::int)",
                cutoff,
                policy.batch_size,
            )
            .await?;
        report.outbox_deleted = delete_in_batches(
            &mut conn,
            "DELETE FROM outbox WHERE event_id IN ( \
               SELECT event_id FROM outbox WHERE published_at < $1 LIMIT $2)",
            outbox_cutoff,
            policy.batch_size,
        )
        .await?;
        let age: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - min(claimed_at))::float8 FROM processed_messages",
        )
        .fetch_one(&mut conn)
        .await?;
        report.oldest_claim_age = age.map(|a| Duration::from_secs_f64(a.max(0.0)));
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(PURGE_LOCK)
            .execute(&mut conn)
            .await?;
        Ok(report)
    }

    async fn ledger_summary(&self) -> Result<LedgerSummary, StoreError> {
        let row = sqlx::query(LEDGER_SUMMARY_SQL).fetch_one(&self.pool).await?;
        Ok(ledger_summary_from_row(&row)?)
    }

    fn pool_usage(&self) -> Option<(u32, usize)> {
        Some((self.pool.size(), self.pool.num_idle()))
    }

    async fn wait_for_outbox(&self, timeout: Duration) {
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
        match guard.as_mut() {
            Some(l) => match tokio::time::timeout(timeout, l.recv()).await {
                Ok(Ok(_)) | Err(_) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "outbox listener lost; polling");
                    *guard = None;
                    drop(guard);
                    tokio::time::sleep(timeout).await;
                }
            },
            None => {
                drop(guard);
                tokio::time::sleep(timeout).await;
            }
        }
    }
}

/// Runs a `(cutoff, batch)` delete (or a function returning a count) until a
/// batch comes back short; each batch is its own short transaction.
async fn delete_in_batches(
    conn: &mut sqlx::PgConnection,
    sql: &'static str,
    cutoff: OffsetDateTime,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut total = 0u64;
    loop {
        let n = if sql.starts_with("SELECT") {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(cutoff)
                .bind(batch)
                .fetch_one(&mut *conn)
                .await? as u64
        } else {
            sqlx::query(sql)
                .bind(cutoff)
                .bind(batch)
                .execute(&mut *conn)
                .await?
                .rows_affected()
        };
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
    }
}
