//! One way to read a row: each decoder is written once, over either
//! backend's row ([`ReadRow`]), and each column list both backends select
//! alike is written once.
//!
//! The two schemas hold two kinds of column differently: a time (Postgres
//! `timestamptz`, SQLite microseconds since the epoch) and a uuid (Postgres
//! `uuid`, SQLite its text). Every other column decodes to the same Rust
//! type on both ([`Plain`]).

use super::effect::{COMPLETED, CompletedEffect, EffectRecord, Fence, FencedOutcome, IN_PROGRESS, Taken};
use super::ops::{AwardTotals, Balance, ClaimRow, EventRecord, LedgerAggregate, LedgerRow};
use super::{AuditPurge, AuditRecord, AuditSeal, Disbursement, OutboxEvent, StoredResult};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{Postgres, Row, Sqlite};
use time::OffsetDateTime;
use uuid::Uuid;

/// A column type that decodes the same on both backends.
pub(crate) trait Plain:
    for<'r> sqlx::Decode<'r, Postgres>
    + sqlx::Type<Postgres>
    + for<'r> sqlx::Decode<'r, Sqlite>
    + sqlx::Type<Sqlite>
{
}

impl<T> Plain for T where
    T: for<'r> sqlx::Decode<'r, Postgres>
        + sqlx::Type<Postgres>
        + for<'r> sqlx::Decode<'r, Sqlite>
        + sqlx::Type<Sqlite>
{
}

/// A row of either backend, read by column name.
pub(crate) trait ReadRow {
    /// A column that decodes alike on both backends.
    fn get<T: Plain>(&self, column: &str) -> Result<T, sqlx::Error>;
    fn time(&self, column: &str) -> Result<OffsetDateTime, sqlx::Error>;
    fn time_opt(&self, column: &str) -> Result<Option<OffsetDateTime>, sqlx::Error>;
    fn uuid(&self, column: &str) -> Result<Uuid, sqlx::Error>;
    fn uuid_opt(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error>;
}

impl ReadRow for PgRow {
    fn get<T: Plain>(&self, column: &str) -> Result<T, sqlx::Error> {
        self.try_get(column)
    }
    fn time(&self, column: &str) -> Result<OffsetDateTime, sqlx::Error> {
        self.try_get(column)
    }
    fn time_opt(&self, column: &str) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        self.try_get(column)
    }
    fn uuid(&self, column: &str) -> Result<Uuid, sqlx::Error> {
        self.try_get(column)
    }
    fn uuid_opt(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
        self.try_get(column)
    }
}

impl ReadRow for SqliteRow {
    fn get<T: Plain>(&self, column: &str) -> Result<T, sqlx::Error> {
        self.try_get(column)
    }
    fn time(&self, column: &str) -> Result<OffsetDateTime, sqlx::Error> {
        Ok(crate::time_fmt::from_micros(self.try_get(column)?))
    }
    fn time_opt(&self, column: &str) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        Ok(self
            .try_get::<Option<i64>, _>(column)?
            .map(crate::time_fmt::from_micros))
    }
    fn uuid(&self, column: &str) -> Result<Uuid, sqlx::Error> {
        self.uuid_opt(column)?.ok_or_else(|| sqlx::Error::ColumnDecode {
            index: column.to_string(),
            source: "a uuid column is NULL".into(),
        })
    }
    fn uuid_opt(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
        let Some(text) = self.try_get::<Option<String>, _>(column)? else {
            return Ok(None);
        };
        uuid_from_text(&text)
            .map(Some)
            .map_err(|why| sqlx::Error::ColumnDecode {
                index: column.to_string(),
                source: why.into(),
            })
    }
}

/// A uuid SQLite holds as text; the error names the text.
pub(crate) fn uuid_from_text(text: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text).map_err(|e| format!("bad uuid {text:?} in the store: {e}"))
}

/// The ledger row's columns, prefixed `d_` (joined with claims and events).
pub(crate) const LEDGER_COLS: &str = "d.id AS d_id, d.idempotency_key AS d_key, d.award_id AS d_award_id, \
     d.amount_cents AS d_amount_cents, d.sequence AS d_sequence, d.submission_timestamp AS d_ts, \
     d.payload_digest AS d_digest, d.fingerprint AS d_fingerprint, d.recorded_at AS d_recorded_at";
/// The claim's columns, prefixed `c_`.
pub(crate) const CLAIM_COLS: &str = "c.idempotency_key AS c_key, c.award_id AS c_award_id, c.fingerprint AS c_fingerprint, \
     c.disbursement_id AS c_disbursement_id, c.claimed_at AS c_claimed_at";
/// An audit row's columns, as [`audit_record`] reads them.
pub(crate) const AUDIT_COLS: &str =
    "id, at, decision, tier, key_prefix, award_id, instance, payload_changed, detail";
/// A seal's columns, as [`audit_seal`] reads them.
pub(crate) const SEAL_COLS: &str = "seq, first_id, last_id, row_count, absent_ids, min_at, max_at, sealed_at, \
     sealed_by, prev_digest, digest, row_tags, signature, key_id";

/// A claim's stored result, from its ledger row (`idempotency_key`,
/// `fingerprint`, `id`, `award_id`, `amount_cents`, `recorded_at`, `sequence`).
pub(crate) fn stored_result(r: &impl ReadRow) -> Result<StoredResult, sqlx::Error> {
    Ok(StoredResult {
        key: r.get("idempotency_key")?,
        fingerprint: r.get("fingerprint")?,
        disbursement: Disbursement {
            id: r.uuid("id")?,
            award_id: r.get("award_id")?,
            amount_cents: r.get("amount_cents")?,
            recorded_at: r.time("recorded_at")?,
            sequence: r.get("sequence")?,
        },
    })
}

/// The ledger row of a [`LEDGER_COLS`] join; `None` where it has none.
pub(crate) fn ledger(r: &impl ReadRow) -> Result<Option<LedgerRow>, sqlx::Error> {
    let Some(id) = r.uuid_opt("d_id")? else {
        return Ok(None);
    };
    Ok(Some(LedgerRow {
        id,
        idempotency_key: r.get("d_key")?,
        award_id: r.get("d_award_id")?,
        amount_cents: r.get("d_amount_cents")?,
        sequence: r.get("d_sequence")?,
        submission_timestamp: r.get("d_ts")?,
        payload_digest: r.get("d_digest")?,
        fingerprint: r.get("d_fingerprint")?,
        recorded_at: r.time("d_recorded_at")?,
    }))
}

/// The claim of a [`CLAIM_COLS`] join; `None` where it has none.
pub(crate) fn claim(r: &impl ReadRow) -> Result<Option<ClaimRow>, sqlx::Error> {
    let Some(key) = r.get::<Option<String>>("c_key")? else {
        return Ok(None);
    };
    Ok(Some(ClaimRow {
        idempotency_key: key,
        award_id: r.get("c_award_id")?,
        fingerprint: r.get("c_fingerprint")?,
        disbursement_id: r.uuid("c_disbursement_id")?,
        claimed_at: r.time("c_claimed_at")?,
    }))
}

/// An outbox event as the operator commands show it (columns `o_…`).
pub(crate) fn event_record(r: &impl ReadRow) -> Result<EventRecord, sqlx::Error> {
    Ok(EventRecord {
        event_id: r.uuid("o_event_id")?,
        event_type: r.get("o_event_type")?,
        award_id: r.get("o_award_id")?,
        sequence: r.get("o_sequence")?,
        payload: r.get("o_payload")?,
        created_at: r.time("o_created_at")?,
        published_at: r.time_opt("o_published_at")?,
        attempts: r.get("o_attempts")?,
        leased_until: r.time_opt("o_leased_until")?,
        last_error: r.get("o_last_error")?,
        quarantined_at: r.time_opt("o_quarantined_at")?,
    })
}

/// An outbox event as the relay publishes it.
pub(crate) fn outbox_event(r: &impl ReadRow) -> Result<OutboxEvent, sqlx::Error> {
    Ok(OutboxEvent {
        event_id: r.uuid("event_id")?,
        event_type: r.get("event_type")?,
        award_id: r.get("award_id")?,
        sequence: r.get("sequence")?,
        payload: r.get("payload")?,
        attempts: r.get("attempts")?,
        traceparent: r.get("traceparent")?,
    })
}

/// An award's running total (columns `b_award_id`, `total_cents`, …);
/// `None` where the award has none.
pub(crate) fn balance(r: &impl ReadRow) -> Result<Option<Balance>, sqlx::Error> {
    let Some(award_id) = r.get::<Option<String>>("b_award_id")? else {
        return Ok(None);
    };
    Ok(Some(Balance {
        award_id,
        total_cents: r.get("total_cents")?,
        disbursement_count: r.get("disbursement_count")?,
        last_sequence: r.get("last_sequence")?,
        updated_at: r.time("updated_at")?,
    }))
}

/// An award's running total beside its ledger rows' aggregates (the sum
/// as text: it may outgrow a 64-bit integer).
pub(crate) fn award_totals(r: &impl ReadRow) -> Result<AwardTotals, sqlx::Error> {
    let ledger = match r.get::<Option<String>>("s")? {
        Some(s) => Some(LedgerAggregate {
            sum_cents: s.parse().map_err(|e| sqlx::Error::ColumnDecode {
                index: "s".into(),
                source: format!("ledger sum {s:?} is not an integer: {e}").into(),
            })?,
            rows: r.get("n")?,
            distinct_sequences: r.get("nd")?,
            min_sequence: r.get("mn")?,
            max_sequence: r.get("mx")?,
        }),
        None => None,
    };
    Ok(AwardTotals {
        award_id: r.get("award")?,
        balance: balance(r)?,
        ledger,
    })
}

/// One audit row ([`AUDIT_COLS`]), verbatim.
pub(crate) fn audit_record(r: &impl ReadRow) -> Result<AuditRecord, sqlx::Error> {
    Ok(AuditRecord {
        id: r.get("id")?,
        at: r.time("at")?,
        decision: r.get("decision")?,
        tier: r.get("tier")?,
        key_prefix: r.get("key_prefix")?,
        award_id: r.get("award_id")?,
        instance: r.get("instance")?,
        payload_changed: r.get("payload_changed")?,
        detail: r.get("detail")?,
    })
}

/// One seal ([`SEAL_COLS`]).
pub(crate) fn audit_seal(r: &impl ReadRow) -> Result<AuditSeal, sqlx::Error> {
    Ok(AuditSeal {
        seq: r.get("seq")?,
        first_id: r.get("first_id")?,
        last_id: r.get("last_id")?,
        row_count: r.get("row_count")?,
        absent_ids: r.get("absent_ids")?,
        min_at: r.time("min_at")?,
        max_at: r.time("max_at")?,
        sealed_at: r.time("sealed_at")?,
        sealed_by: r.get("sealed_by")?,
        prev_digest: r.get("prev_digest")?,
        digest: r.get("digest")?,
        row_tags: r.get("row_tags")?,
        signature: r.get("signature")?,
        key_id: r.get("key_id")?,
    })
}

/// One lawful-purge record.
pub(crate) fn audit_purge(r: &impl ReadRow) -> Result<AuditPurge, sqlx::Error> {
    Ok(AuditPurge {
        purged_at: r.time("purged_at")?,
        cutoff: r.time("cutoff")?,
        method: r.get("method")?,
        seal_seq: r.get("seal_seq")?,
        seal_digest: r.get("seal_digest")?,
        row_count: r.get("row_count")?,
        ids: r.get("ids")?,
    })
}

/// An effect's completion; `None` while it is not completed.
pub(crate) fn completed_effect(r: &impl ReadRow) -> Result<Option<CompletedEffect>, sqlx::Error> {
    if r.get::<String>("state")? != COMPLETED {
        return Ok(None);
    }
    Ok(Some(CompletedEffect {
        namespace: r.get("namespace")?,
        key: r.get("idempotency_key")?,
        fingerprint: r.get("fingerprint")?,
        response: r.get("response")?,
        completed_at: r.time("completed_at")?,
        attempt: r.get("attempt")?,
    }))
}

/// An effect's record as stored (its lease's expiry only while in progress).
pub(crate) fn effect_record(r: &impl ReadRow) -> Result<EffectRecord, sqlx::Error> {
    let state: String = r.get("state")?;
    Ok(EffectRecord {
        lease_expires_at: r.time_opt("lease_expires_at")?.filter(|_| state == IN_PROGRESS),
        state,
        attempt: r.get("attempt")?,
        completed: completed_effect(r)?,
        updated_at: r.time("updated_at")?,
    })
}

/// The lease a `TAKE_LEASE` statement took: its attempt, and what it was
/// taken from (`taken_over_from`: none, a release, an expired lease).
pub(crate) fn taken_lease(r: &impl ReadRow) -> Result<(i32, Taken), sqlx::Error> {
    let taken = match r.get::<Option<String>>("taken_over_from")?.as_deref() {
        None => Taken::First,
        Some("released") => Taken::AfterRelease,
        Some(_) => Taken::AfterExpiry,
    };
    Ok((r.get("attempt")?, taken))
}

/// What a `Complete` whose fenced update changed nothing answers, from the
/// record as it stands: the same call again (same token, same response)
/// answers the first completion; another response conflicts; anything else
/// (no record, another token, released under this one) lost the lease.
pub(crate) fn repeated_completion(
    record: Option<&impl ReadRow>,
    f: &Fence<'_>,
    response: &[u8],
) -> Result<FencedOutcome<CompletedEffect>, sqlx::Error> {
    let Some(r) = record else {
        return Ok(FencedOutcome::LeaseLost);
    };
    if r.get::<String>("lease_token")? != f.token {
        return Ok(FencedOutcome::LeaseLost);
    }
    Ok(match completed_effect(r)? {
        Some(done) if done.response == response => FencedOutcome::Done(done),
        Some(_) => FencedOutcome::Conflict,
        None => FencedOutcome::LeaseLost,
    })
}
