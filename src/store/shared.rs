//! What both backends build the same way: the outbox event body and the
//! ledger-wide summary statement.

use super::{Disbursement, LedgerSummary};
use crate::submission::Submission;
use uuid::Uuid;

/// The outbox event body: everything a downstream consumer needs, no payload.
#[derive(serde::Serialize)]
struct EventBody<'a> {
    event_id: Uuid,
    #[serde(rename = "type")]
    event_type: &'static str,
    disbursement_id: Uuid,
    award_id: &'a str,
    amount_cents: i64,
    idempotency_key: &'a str,
    sequence: i64,
    recorded_at: String,
}

/// The outbox event body as JSON (a struct, not a `Value`: no map to build).
pub(crate) fn event_json(event_id: Uuid, s: &Submission, d: &Disbursement) -> String {
    serde_json::to_string(&EventBody {
        event_id,
        event_type: "disbursement.recorded",
        disbursement_id: d.id,
        award_id: &d.award_id,
        amount_cents: d.amount_cents,
        idempotency_key: &s.key,
        sequence: d.sequence,
        recorded_at: crate::time_fmt::rfc3339(d.recorded_at),
    })
    .expect("an event body always serialises")
}

/// Ledger-wide figures in one statement, valid on both backends.
pub(crate) const LEDGER_SUMMARY_SQL: &str = "SELECT \
       (SELECT count(*) FROM processed_messages), \
       (SELECT count(*) FROM disbursements), \
       (SELECT CAST(coalesce(sum(amount_cents), 0) AS BIGINT) FROM disbursements), \
       (SELECT count(*) FROM award_balances b FULL JOIN ( \
          SELECT award_id, CAST(sum(amount_cents) AS BIGINT) AS s, count(*) AS n, max(sequence) AS m \
          FROM disbursements GROUP BY award_id) d USING (award_id) \
        WHERE b.total_cents IS DISTINCT FROM d.s OR b.disbursement_count IS DISTINCT FROM d.n \
           OR b.last_sequence IS DISTINCT FROM d.m), \
       (SELECT count(*) FROM (SELECT award_id FROM disbursements GROUP BY award_id \
          HAVING max(sequence) <> count(*) OR min(sequence) <> 1) g), \
       (SELECT count(*) FROM outbox), \
       (SELECT count(*) FROM outbox WHERE published_at IS NULL), \
       (SELECT count(*) FROM audit_log WHERE decision = 'processed'), \
       (SELECT count(*) FROM audit_log WHERE decision = 'duplicate')";

/// Reads a [`LEDGER_SUMMARY_SQL`] row.
pub(crate) fn ledger_summary_from_row<'r, R>(r: &'r R) -> Result<LedgerSummary, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(LedgerSummary {
        claims: r.try_get(0)?,
        disbursements: r.try_get(1)?,
        total_cents: r.try_get(2)?,
        mismatched_awards: r.try_get(3)?,
        sequence_gaps: r.try_get(4)?,
        outbox_events: r.try_get(5)?,
        outbox_unpublished: r.try_get(6)?,
        audit_processed: r.try_get(7)?,
        audit_duplicates: r.try_get(8)?,
    })
}
