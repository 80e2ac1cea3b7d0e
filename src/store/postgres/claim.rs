//! The claim transaction on Postgres: a batch of distinct keys costs two
//! set-based statements (`unnest` arrays), not five per delivery:
//!
//! 1. claim rows, `INSERT … ON CONFLICT DO NOTHING RETURNING key` (the keys
//!    returned are the ones this transaction claimed), and in the same
//!    statement the running totals of the claimed items' awards, one upsert
//!    that returns each award's last sequence number (and locks its row);
//! 2. `claim.sql`: audit rows, ledger rows and outbox events together.
//!
//! Keys not claimed load their stored result (a duplicate, or a key reuse).
//!
//! With the synchronous-standby guard on, statement 2 also reads the
//! primary's synchronous standbys, as the last thing before COMMIT
//! ([`crate::primary::guard`]).

use super::tx::named;
use crate::error::StoreError;
use crate::key::key_prefix;
use crate::store::shared::event_json;
use crate::store::{ClaimBatch, ClaimContext, ClaimOutcome, Disbursement, Replication, StoredResult};
use crate::submission::Submission;
use sqlx::PgConnection;
use std::collections::{BTreeMap, HashMap, HashSet};
use time::OffsetDateTime;
use uuid::Uuid;

const CLAIM_EFFECTS_SQL: &str = include_str!("claim.sql");

/// Claims `batch` inside `tx`; one outcome per item, in order, and one
/// audit row per item. With `read_standbys`, also the primary's synchronous
/// standbys as the transaction's last statement saw them (its
/// `synchronous_commit` is the transaction's own, so `commit` is `None`).
pub(super) async fn claim_in_tx(
    tx: &mut PgConnection,
    batch: &ClaimBatch<'_>,
    ctx: &ClaimContext,
    read_standbys: bool,
) -> Result<(Vec<ClaimOutcome>, Option<Replication>), StoreError> {
    let items = batch.unique();
    let now = crate::time_fmt::now_micros();
    let ids: Vec<Uuid> = items.iter().map(|_| Uuid::now_v7()).collect();
    let first = claim_and_bump(tx, items, &ids, now).await?;
    let (claimed, others): (Vec<&Submission>, Vec<&Submission>) =
        items.iter().copied().partition(|s| first.keys.contains(&s.key));
    let mut stored = if others.is_empty() {
        HashMap::new()
    } else {
        let keys: Vec<&str> = others.iter().map(|s| s.key.as_str()).collect();
        super::load_stored(tx, &keys).await?
    };
    let id_of: HashMap<&str, Uuid> = items.iter().map(|s| s.key.as_str()).zip(ids).collect();
    let rows = if claimed.is_empty() {
        Vec::new()
    } else {
        ledger_rows(&claimed, &id_of, &first.bumped)?
    };
    let mut fresh: HashMap<&str, &Disbursement> = claimed.iter().map(|s| s.key.as_str()).zip(&rows).collect();
    let outcomes = items
        .iter()
        .map(|s| match fresh.remove(s.key.as_str()) {
            Some(d) => Ok(ClaimOutcome::Claimed(StoredResult {
                key: s.key.clone(),
                fingerprint: s.fingerprint.clone(),
                disbursement: d.clone(),
            })),
            None => stored
                .remove(&s.key)
                .map(|r| r.outcome_for(s))
                .ok_or_else(|| StoreError::Other(format!("claim {} has no ledger row", key_prefix(&s.key)))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let outcomes = batch.expand(&outcomes);
    let columns = ClaimColumns::new(batch.items(), &outcomes, &claimed, &rows, ctx, now);
    let (flagged, standbys) = columns.execute(tx, read_standbys).await?;
    if flagged > 0 {
        metrics::counter!("oncegate_payload_changed_resubmissions_total").increment(flagged as u64);
    }
    Ok((outcomes, standbys))
}

/// What the first statement of a claim transaction returns.
struct Claimed {
    /// The keys this transaction claimed.
    keys: HashSet<String>,
    /// Per award of a claimed item: its `last_sequence` after the increment
    /// and the time its row was locked, the award's `recorded_at` (taken
    /// after any wait for another transaction's lock, so within an award a
    /// higher sequence never has an earlier time).
    bumped: HashMap<String, (i64, OffsetDateTime)>,
}

/// The claim rows and the running totals, in one statement (one round
/// trip, not two): each item's claim row, `INSERT … ON CONFLICT DO NOTHING`
/// in key order; then, for the items claimed, their awards' running totals
/// bumped in award order (a stable lock order across concurrent
/// transactions avoids deadlocks). A total that would overflow is not
/// updated (the guard), and its award is missing from
/// [`Claimed::bumped`]: the caller rolls back ([`ledger_rows`]).
///
/// The totals read the claims' `RETURNING` rows, so every claim row is in
/// (its key locked) before the first award row is locked, as when they were
/// two statements.
const CLAIM_AND_BUMP_SQL: &str = "\
WITH item AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[], $6::bigint[]) AS t(k, a, f, d, c)
), claimed AS (
    INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
    SELECT k, a, f, d, $5 FROM item ORDER BY k
    ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key
), totals AS (
    SELECT i.a, sum(i.c) AS t, count(*) AS n FROM claimed JOIN item i ON i.k = claimed.idempotency_key
    GROUP BY i.a
), bumped AS (
    INSERT INTO award_balances AS b (award_id, total_cents, disbursement_count, last_sequence, updated_at)
    SELECT a, t::bigint, n, n, $5 FROM totals WHERE t <= 9223372036854775807 ORDER BY a
    ON CONFLICT (award_id) DO UPDATE SET
        total_cents = b.total_cents + excluded.total_cents,
        disbursement_count = b.disbursement_count + excluded.disbursement_count,
        last_sequence = b.last_sequence + excluded.disbursement_count,
        updated_at = excluded.updated_at
    WHERE b.total_cents <= 9223372036854775807 - excluded.total_cents
    RETURNING award_id, last_sequence, clock_timestamp() AS locked_at
)
SELECT (SELECT coalesce(array_agg(idempotency_key), '{}') FROM claimed),
       coalesce(array_agg(award_id), '{}'), coalesce(array_agg(last_sequence), '{}'),
       coalesce(array_agg(locked_at), '{}')
FROM bumped";

/// Inserts the claim rows and bumps the running totals of the awards of
/// the items claimed ([`CLAIM_AND_BUMP_SQL`]).
async fn claim_and_bump(
    tx: &mut PgConnection,
    items: &[&Submission],
    ids: &[Uuid],
    now: OffsetDateTime,
) -> Result<Claimed, StoreError> {
    let keys: Vec<&str> = items.iter().map(|s| s.key.as_str()).collect();
    let awards: Vec<&str> = items.iter().map(|s| s.award_id.as_str()).collect();
    let prints: Vec<&str> = items.iter().map(|s| s.fingerprint.as_str()).collect();
    let amounts: Vec<i64> = items.iter().map(|s| s.amount_cents).collect();
    type Row = (Vec<String>, Vec<String>, Vec<i64>, Vec<OffsetDateTime>);
    let (claimed, bumped, last, locked_at): Row = sqlx::query_as(CLAIM_AND_BUMP_SQL)
        .bind(&keys)
        .bind(&awards)
        .bind(&prints)
        .bind(ids)
        .bind(now)
        .bind(&amounts)
        .persistent(named())
        .fetch_one(&mut *tx)
        .await?;
    let bumped = bumped.into_iter().zip(last.into_iter().zip(locked_at)).collect();
    Ok(Claimed {
        keys: claimed.into_iter().collect(),
        bumped,
    })
}

/// The ledger rows of the claimed items, each numbered within its award
/// from the running totals [`claim_and_bump`] returned; an award missing
/// there is one whose total would overflow ([`CLAIM_AND_BUMP_SQL`] sums
/// and checks the amounts): the caller's [`StoreError::TotalOverflow`].
fn ledger_rows(
    claimed: &[&Submission],
    id_of: &HashMap<&str, Uuid>,
    bumped: &HashMap<String, (i64, OffsetDateTime)>,
) -> Result<Vec<Disbursement>, StoreError> {
    let counts = counts_by_award(claimed);
    if let Some(award) = counts.keys().find(|a| !bumped.contains_key(**a)) {
        return Err(StoreError::TotalOverflow(award.to_string()));
    }
    let seqs = assign_sequences(claimed, bumped, &counts);
    Ok(claimed
        .iter()
        .zip(seqs)
        .map(|(s, sequence)| Disbursement {
            id: id_of[s.key.as_str()],
            award_id: s.award_id.clone(),
            amount_cents: s.amount_cents,
            recorded_at: bumped[&s.award_id].1,
            sequence,
        })
        .collect())
}

/// Assigns per-award sequence numbers to claimed items, given each award's
/// `last_sequence` after the increment. Items of one award get consecutive
/// numbers in batch order.
fn assign_sequences(
    claimed: &[&Submission],
    bumped: &HashMap<String, (i64, OffsetDateTime)>,
    count_by_award: &BTreeMap<&str, i64>,
) -> Vec<i64> {
    let mut next: HashMap<&str, i64> = HashMap::with_capacity(count_by_award.len());
    claimed
        .iter()
        .map(|s| {
            let award = s.award_id.as_str();
            let n = next
                .entry(award)
                .or_insert_with(|| bumped[award].0 - count_by_award[award] + 1);
            let seq = *n;
            *n += 1;
            seq
        })
        .collect()
}

/// Per award, the number of claimed items, in award order.
fn counts_by_award<'a>(claimed: &[&'a Submission]) -> BTreeMap<&'a str, i64> {
    let mut counts = BTreeMap::new();
    for s in claimed {
        *counts.entry(s.award_id.as_str()).or_default() += 1;
    }
    counts
}

/// Items claimed in this batch whose award id and timestamp already appear
/// under another key in the same batch (the changed-payload rule).
fn changed_within_batch(claimed: &[&Submission]) -> HashSet<String> {
    let mut first: HashMap<(&str, &str), &str> = HashMap::new();
    claimed
        .iter()
        .filter(|s| {
            let k = first
                .entry((s.award_id.as_str(), s.submission_timestamp.as_str()))
                .or_insert(s.key.as_str());
            *k != s.key.as_str()
        })
        .map(|s| s.key.clone())
        .collect()
}

/// The parameters of `claim.sql`, as its column arrays (named there).
struct ClaimColumns<'a> {
    at: OffsetDateTime,
    instance: &'a str,
    decision: Vec<&'static str>,
    tier: Vec<Option<&'static str>>,
    key_prefix: Vec<&'a str>,
    audit_award_id: Vec<&'a str>,
    submitted_at: Vec<&'a str>,
    audit_key: Vec<&'a str>,
    changed_in_batch: Vec<bool>,
    id: Vec<Uuid>,
    key: Vec<&'a str>,
    award_id: Vec<&'a str>,
    amount_cents: Vec<i64>,
    sequence: Vec<i64>,
    submission_ts: Vec<&'a str>,
    payload_digest: Vec<&'a str>,
    fingerprint: Vec<&'a str>,
    recorded_at: Vec<OffsetDateTime>,
    event_id: Vec<Uuid>,
    event_body: Vec<String>,
    traceparent: Vec<Option<&'a str>>,
    award_hash: Vec<i64>,
}

impl<'a> ClaimColumns<'a> {
    fn new(
        items: &'a [Submission],
        outcomes: &[ClaimOutcome],
        claimed: &[&'a Submission],
        rows: &[Disbursement],
        ctx: &'a ClaimContext,
        at: OffsetDateTime,
    ) -> Self {
        let changed = changed_within_batch(claimed);
        let (decision, tier): (Vec<_>, Vec<_>) = outcomes
            .iter()
            .map(|o| {
                let (decision, tier) = o.audit();
                (decision.as_str(), tier.map(|t| t.as_str()))
            })
            .unzip();
        let event_id: Vec<Uuid> = rows.iter().map(|_| Uuid::now_v7()).collect();
        Self {
            at,
            instance: &ctx.instance,
            decision,
            tier,
            key_prefix: items.iter().map(|s| key_prefix(&s.key)).collect(),
            audit_award_id: items.iter().map(|s| s.award_id.as_str()).collect(),
            submitted_at: items.iter().map(|s| s.submission_timestamp.as_str()).collect(),
            audit_key: items.iter().map(|s| s.key.as_str()).collect(),
            // Only a processed row is flagged; a repeat is a duplicate.
            changed_in_batch: items.iter().map(|s| changed.contains(&s.key)).collect(),
            id: rows.iter().map(|d| d.id).collect(),
            key: claimed.iter().map(|s| s.key.as_str()).collect(),
            award_id: claimed.iter().map(|s| s.award_id.as_str()).collect(),
            amount_cents: claimed.iter().map(|s| s.amount_cents).collect(),
            sequence: rows.iter().map(|d| d.sequence).collect(),
            submission_ts: claimed.iter().map(|s| s.submission_timestamp.as_str()).collect(),
            payload_digest: claimed.iter().map(|s| s.payload_digest.as_str()).collect(),
            fingerprint: claimed.iter().map(|s| s.fingerprint.as_str()).collect(),
            recorded_at: rows.iter().map(|d| d.recorded_at).collect(),
            event_body: claimed
                .iter()
                .zip(rows)
                .zip(&event_id)
                .map(|((s, d), id)| event_json(*id, s, d))
                .collect(),
            event_id,
            traceparent: claimed.iter().map(|s| s.traceparent.as_deref()).collect(),
            award_hash: claimed
                .iter()
                .map(|s| crate::store::slots::award_hash(&s.award_id))
                .collect(),
        }
    }

    /// Runs `claim.sql`; returns the count flagged `payload_changed` (and
    /// the standbys, when asked), or [`StoreError::LateRedelivery`] for
    /// claimed keys already in the ledger.
    async fn execute(
        &self,
        tx: &mut PgConnection,
        read_standbys: bool,
    ) -> Result<(i64, Option<Replication>), StoreError> {
        type Row = (i64, Vec<String>, Option<String>, Option<i32>, Option<i32>);
        let (flagged, inserted, names, required, streaming): Row = sqlx::query_as(CLAIM_EFFECTS_SQL)
            .bind(self.at)
            .bind(self.instance)
            .bind(&self.decision)
            .bind(&self.tier)
            .bind(&self.key_prefix)
            .bind(&self.audit_award_id)
            .bind(&self.submitted_at)
            .bind(&self.audit_key)
            .bind(&self.changed_in_batch)
            .bind(&self.id)
            .bind(&self.key)
            .bind(&self.award_id)
            .bind(&self.amount_cents)
            .bind(&self.sequence)
            .bind(&self.submission_ts)
            .bind(&self.payload_digest)
            .bind(&self.fingerprint)
            .bind(&self.recorded_at)
            .bind(&self.event_id)
            .bind(&self.event_body)
            .bind(&self.traceparent)
            .bind(read_standbys)
            .bind(&self.award_hash)
            .persistent(named())
            .fetch_one(&mut *tx)
            .await?;
        if inserted.len() < self.key.len() {
            let inserted: HashSet<&str> = inserted.iter().map(String::as_str).collect();
            let late = self.key.iter().filter(|k| !inserted.contains(**k));
            return Err(StoreError::LateRedelivery(late.map(|k| k.to_string()).collect()));
        }
        let standbys = names.map(|standby_names| Replication {
            standby_names,
            required: required.unwrap_or(0),
            streaming,
            commit: None,
        });
        Ok((flagged, standbys))
    }
}
