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

/// Sets of audit ids written as ascending, disjoint ranges: `1..4,7,9..12`
/// (a single id alone, a run as `first..last`, inclusive). Seals list the
/// ids they found no row for this way, purge records the ids they removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdRanges(Vec<(i64, i64)>);

impl IdRanges {
    /// Adds `id`, which must not be below the last one added.
    pub fn push(&mut self, id: i64) {
        self.push_range(id, id);
    }

    /// Adds `lo..=hi`, which must not start below the last range.
    pub fn push_range(&mut self, lo: i64, hi: i64) {
        if lo > hi {
            return;
        }
        match self.0.last_mut() {
            Some((_, last)) if lo <= last.saturating_add(1) => *last = (*last).max(hi),
            _ => self.0.push((lo, hi)),
        }
    }

    /// Reads the text form; an error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = part.split_once("..").unwrap_or((part, part));
            let (lo, hi): (i64, i64) = match (lo.parse(), hi.parse()) {
                (Ok(lo), Ok(hi)) if lo <= hi => (lo, hi),
                _ => return Err(format!("{part:?} is not an id or a range a..b")),
            };
            if out.0.last().is_some_and(|&(_, last)| lo <= last) {
                return Err(format!("{part:?} is not above the range before it"));
            }
            out.0.push((lo, hi));
        }
        Ok(out)
    }

    pub fn contains(&self, id: i64) -> bool {
        let i = self.0.partition_point(|&(_, hi)| hi < id);
        self.0.get(i).is_some_and(|&(lo, _)| lo <= id)
    }

    /// How many ids of `lo..=hi` the set holds.
    pub fn count_in(&self, lo: i64, hi: i64) -> i64 {
        self.0
            .iter()
            .map(|&(a, b)| (b.min(hi) as i128 - a.max(lo) as i128 + 1).max(0) as i64)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ranges, ascending.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }
}

impl std::fmt::Display for IdRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}..{hi}")?;
            }
        }
        Ok(())
    }
}

/// The previous digest of the first seal: 64 zeros.
/// The outbox pseudo-award of `audit.sealed` events: a submission's award
/// id never contains `|`, so no award can share it. Its sequence is the
/// seal's number.
pub const AUDIT_EVENT_AWARD: &str = "|audit";
/// The event type announcing a seal (its anchor, for the broker to keep).
pub const AUDIT_SEALED_EVENT: &str = "audit.sealed";

/// The `audit.sealed` event of `seal`: its id and JSON body (the anchor's
/// fields, `crate::seal::anchor`).
pub fn audit_sealed_event(seal: &super::AuditSeal) -> (Uuid, String) {
    let event_id = Uuid::now_v7();
    let body = serde_json::json!({
        "event_id": event_id.to_string(),
        "type": AUDIT_SEALED_EVENT,
        "award_id": AUDIT_EVENT_AWARD,
        "sequence": seal.seq,
        "seq": seal.seq,
        "first_id": seal.first_id,
        "last_id": seal.last_id,
        "sealed_at": crate::time_fmt::rfc3339(seal.sealed_at),
        "digest": seal.digest,
        "signature": seal.signature,
        "key_id": seal.key_id,
    });
    (event_id, body.to_string())
}

pub const GENESIS_DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";
