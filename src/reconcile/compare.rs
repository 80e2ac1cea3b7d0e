//! The comparisons themselves, on rows already read: pure functions, one
//! per thing compared, each returning the mismatch it finds.

use super::report::{Check, Mismatch, Tally};
use crate::broker::BrokerEntry;
use crate::store::ops::*;
use crate::time_fmt::rfc3339;
use serde_json::Value;
use std::collections::HashMap;
use time::OffsetDateTime;
use uuid::Uuid;

/// What retention may have removed, so that its absence is no mismatch.
#[derive(Debug, Clone)]
pub(super) struct Windows {
    /// A ledger row recorded at or after this must still have its claim.
    pub claims_since: OffsetDateTime,
    /// … and its outbox event.
    pub events_since: OffsetDateTime,
    pub oldest_claim: Option<OffsetDateTime>,
    pub retention: std::time::Duration,
}

fn mismatch(
    kind: &'static str,
    key: Option<&str>,
    award: Option<&str>,
    event: Option<Uuid>,
    detail: String,
) -> Mismatch {
    Mismatch {
        kind,
        idempotency_key: key.map(str::to_string),
        award_id: award.map(str::to_string),
        event_id: event,
        detail,
    }
}

/// Claims ↔ ledger for one key, and whether its ledger row has its event.
pub(super) fn check_key(p: &KeyPair, w: &Windows, t: &mut Tally) {
    t.checked(Check::Claims, 1);
    match (&p.ledger, &p.claim) {
        (None, Some(c)) => t.mismatch(Check::Claims, claim_without_ledger_row(c)),
        (Some(d), None) if d.recorded_at >= w.claims_since => {
            t.mismatch(Check::Claims, ledger_row_without_claim(d, w))
        }
        (Some(_), None) => t.note(
            Check::Claims,
            "ledger_rows_older_than_the_retention_(claims_purged)",
            1,
        ),
        (Some(d), Some(c)) => {
            if let Some(m) = claim_differs(d, c) {
                t.mismatch(Check::Claims, m);
            }
        }
        (None, None) => {}
    }
    let Some(d) = &p.ledger else { return };
    if p.claim.is_none() && !amount_matches(d) {
        t.mismatch(Check::Claims, amount_differs(d));
    }
    match p.events {
        None => t.note(Check::Outbox, "ledger_rows_older_than_the_outbox_retention", 1),
        Some(1) => t.note(Check::Outbox, "ledger_rows_with_their_event", 1),
        Some(0) => t.mismatch(
            Check::Outbox,
            mismatch(
                "missing_event",
                Some(&d.idempotency_key),
                Some(&d.award_id),
                None,
                format!(
                    "ledger row {} (sequence {}, recorded {}) has no outbox event",
                    d.id,
                    d.sequence,
                    rfc3339(d.recorded_at)
                ),
            ),
        ),
        Some(n) => t.mismatch(
            Check::Outbox,
            mismatch(
                "duplicate_events",
                Some(&d.idempotency_key),
                Some(&d.award_id),
                None,
                format!(
                    "ledger row {} (sequence {}) has {n} outbox events",
                    d.id, d.sequence
                ),
            ),
        ),
    }
}

/// The ledger row's amount is the one its submission was claimed with: the
/// fingerprint commits to award, amount and payload digest.
fn amount_matches(d: &LedgerRow) -> bool {
    crate::key::fingerprint(&d.award_id, d.amount_cents, &d.payload_digest) == d.fingerprint
}

fn amount_differs(d: &LedgerRow) -> Mismatch {
    mismatch(
        "amount_differs",
        Some(&d.idempotency_key),
        Some(&d.award_id),
        None,
        format!(
            "ledger row {} holds amount_cents {}, which is not the amount its submission was claimed with \
             (the fingerprint does not match)",
            d.id, d.amount_cents
        ),
    )
}

fn claim_without_ledger_row(c: &ClaimRow) -> Mismatch {
    mismatch(
        "claim_without_ledger_row",
        Some(&c.idempotency_key),
        Some(&c.award_id),
        None,
        format!(
            "claimed {} (disbursement {}) but the ledger has no row for the key",
            rfc3339(c.claimed_at),
            c.disbursement_id
        ),
    )
}

fn ledger_row_without_claim(d: &LedgerRow, w: &Windows) -> Mismatch {
    let mut detail = format!(
        "ledger row {} (sequence {}, recorded {}) has no claim, and is younger than the {} retention",
        d.id,
        d.sequence,
        rfc3339(d.recorded_at),
        humantime::format_duration(w.retention)
    );
    if w.oldest_claim.is_some_and(|oldest| d.recorded_at < oldest) {
        detail.push_str(
            "; it is older than every claim left: if the sidecar's ONCEGATE_RETENTION is shorter, \
             the purge removed the claim",
        );
    }
    mismatch(
        "ledger_row_without_claim",
        Some(&d.idempotency_key),
        Some(&d.award_id),
        None,
        detail,
    )
}

fn claim_differs(d: &LedgerRow, c: &ClaimRow) -> Option<Mismatch> {
    let mut diffs = Vec::new();
    if c.award_id != d.award_id {
        diffs.push(format!(
            "award_id (claim {:?}, ledger {:?})",
            c.award_id, d.award_id
        ));
    }
    if c.fingerprint != d.fingerprint {
        diffs.push("fingerprint (award, amount or payload differ)".to_string());
    }
    if c.disbursement_id != d.id {
        diffs.push(format!(
            "disbursement id (claim {}, ledger {})",
            c.disbursement_id, d.id
        ));
    }
    if !amount_matches(d) {
        if diffs.is_empty() {
            return Some(amount_differs(d));
        }
        diffs.push(format!(
            "amount_cents {} does not match the fingerprint",
            d.amount_cents
        ));
    }
    (!diffs.is_empty()).then(|| {
        mismatch(
            "claim_differs",
            Some(&d.idempotency_key),
            Some(&d.award_id),
            None,
            format!("claim and ledger row disagree: {}", diffs.join("; ")),
        )
    })
}

/// Where an event body (or a broker entry's) and its ledger row disagree.
pub(super) fn body_differences(body: &Value, d: &LedgerRow) -> Vec<String> {
    let text = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_string);
    let int = |name: &str| body.get(name).and_then(Value::as_i64).map(|n| n.to_string());
    let fields = [
        ("award_id", text("award_id"), d.award_id.clone()),
        (
            "idempotency_key",
            text("idempotency_key"),
            d.idempotency_key.clone(),
        ),
        ("amount_cents", int("amount_cents"), d.amount_cents.to_string()),
        ("sequence", int("sequence"), d.sequence.to_string()),
        ("disbursement_id", text("disbursement_id"), d.id.to_string()),
        ("recorded_at", text("recorded_at"), rfc3339(d.recorded_at)),
    ];
    fields
        .into_iter()
        .filter(|(_, found, want)| found.as_deref() != Some(want.as_str()))
        .map(|(name, found, want)| {
            format!(
                "{name} ({} in the event, {want} in the ledger)",
                found.as_deref().unwrap_or("none")
            )
        })
        .collect()
}

/// One outbox event against the ledger row of its award and sequence.
pub(super) fn check_event(p: &EventPair, t: &mut Tally) {
    t.checked(Check::Outbox, 1);
    let e = &p.event;
    if e.event_type != LEDGER_EVENT_TYPE {
        t.note(Check::Outbox, "events_of_other_types_(no_ledger_row)", 1);
        return;
    }
    let body: Option<Value> = serde_json::from_str(&e.payload).ok();
    let key = body
        .as_ref()
        .and_then(|b| b.get("idempotency_key"))
        .and_then(Value::as_str);
    let Some(d) = &p.ledger else {
        let detail = format!(
            "event {} (award {}, sequence {}, {}) has no ledger row",
            e.event_id,
            e.award_id,
            e.sequence,
            if e.published_at.is_some() {
                "published"
            } else {
                "unpublished"
            }
        );
        t.mismatch(
            Check::Outbox,
            mismatch(
                "event_without_ledger_row",
                key,
                Some(&e.award_id),
                Some(e.event_id),
                detail,
            ),
        );
        return;
    };
    let diffs = event_differences(e, body.as_ref(), d);
    if !diffs.is_empty() {
        let detail = format!("event differs from ledger row {}: {}", d.id, diffs.join("; "));
        t.mismatch(
            Check::Outbox,
            mismatch(
                "event_differs",
                Some(&d.idempotency_key),
                Some(&d.award_id),
                Some(e.event_id),
                detail,
            ),
        );
    }
}

/// How a ledger event's body (`None`: not JSON) differs from its ledger row
/// and from the event's own id and type.
fn event_differences(e: &EventRecord, body: Option<&Value>, d: &LedgerRow) -> Vec<String> {
    let mut diffs = match body {
        Some(b) => body_differences(b, d),
        None => vec!["the body is not JSON".to_string()],
    };
    let body_id = body.and_then(|b| b.get("event_id")).and_then(Value::as_str);
    if body_id != Some(e.event_id.to_string().as_str()) {
        diffs.push(format!("event_id in the body ({})", body_id.unwrap_or("none")));
    }
    let body_type = body.and_then(|b| b.get("type")).and_then(Value::as_str);
    if body_type != Some(e.event_type.as_str()) {
        diffs.push(format!("type in the body ({})", body_type.unwrap_or("none")));
    }
    diffs
}

/// An award's running total row against its ledger rows.
pub(super) fn check_totals(a: &AwardTotals) -> Option<Mismatch> {
    let award = Some(a.award_id.as_str());
    match (&a.balance, &a.ledger) {
        (None, Some(l)) => Some(mismatch(
            "award_without_running_total",
            None,
            award,
            None,
            format!(
                "{} ledger rows ({} cents) but no running total",
                l.rows, l.sum_cents
            ),
        )),
        (Some(b), None) => Some(mismatch(
            "running_total_without_ledger_rows",
            None,
            award,
            None,
            format!(
                "running total {} cents over {} rows, but the ledger has no row of the award",
                b.total_cents, b.disbursement_count
            ),
        )),
        (Some(b), Some(l))
            if i128::from(b.total_cents) != l.sum_cents
                || b.disbursement_count != l.rows
                || b.last_sequence != l.max_sequence =>
        {
            Some(mismatch(
                "total_differs",
                None,
                award,
                None,
                format!(
                    "running total {} cents, {} rows, last sequence {}; ledger {} cents, {} rows, \
                     last sequence {} ({:+} cents, {:+} rows)",
                    b.total_cents,
                    b.disbursement_count,
                    b.last_sequence,
                    l.sum_cents,
                    l.rows,
                    l.max_sequence,
                    i128::from(b.total_cents) - l.sum_cents,
                    b.disbursement_count - l.rows
                ),
            ))
        }
        _ => None,
    }
}

/// True when the award's ledger sequences are exactly 1..n.
pub(super) fn sequences_dense(l: &LedgerAggregate) -> bool {
    l.min_sequence == 1 && l.max_sequence == l.rows && l.distinct_sequences == l.rows
}

/// The mismatch of an award whose sequences are not 1..n.
pub(super) fn sequence_mismatch(award: &str, l: &LedgerAggregate, gap: Option<SequenceGap>) -> Mismatch {
    let summary = format!(
        "{} rows, sequences {}..{} ({} distinct)",
        l.rows, l.min_sequence, l.max_sequence, l.distinct_sequences
    );
    match gap {
        Some(g) if g.found > g.expected => mismatch(
            "sequence_gap",
            Some(&g.idempotency_key),
            Some(award),
            None,
            format!(
                "sequence {} is missing: the next row (this key) has {}; {summary}",
                g.expected, g.found
            ),
        ),
        Some(g) => mismatch(
            "sequence_repeated",
            Some(&g.idempotency_key),
            Some(award),
            None,
            format!(
                "row {} of the award (this key) repeats sequence {}; {summary}",
                g.expected, g.found
            ),
        ),
        None => mismatch("sequence_gap", None, Some(award), None, summary),
    }
}

/// What a broker entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EntryVerdict {
    /// A ledger event, agreeing with its ledger row.
    Ledger(Uuid),
    /// An event of another type (not reconciled with the ledger).
    Other(Uuid),
    /// Not what the ledger knows; the event id, when the entry has one.
    Mismatch(Option<Uuid>, Mismatch),
}

/// The ledger key a broker entry's body names, if any.
pub(super) fn entry_key(entry: &BrokerEntry) -> Option<String> {
    let body: Value = serde_json::from_str(entry.body.as_deref()?).ok()?;
    body.get("idempotency_key")?.as_str().map(str::to_string)
}

/// A broker entry against the ledger rows of the keys its batch names.
pub(super) fn check_entry(entry: &BrokerEntry, ledger: &HashMap<String, LedgerMatch>) -> EntryVerdict {
    let header_id = entry.event_id.as_deref().and_then(|s| Uuid::parse_str(s).ok());
    let body: Option<Value> = entry.body.as_deref().and_then(|b| serde_json::from_str(b).ok());
    let text = |name: &str| body.as_ref()?.get(name)?.as_str().map(str::to_string);
    let Some(id) = text("event_id").and_then(|s| Uuid::parse_str(&s).ok()) else {
        let detail = format!(
            "entry {} is not an oncegate event (no JSON body with an event_id)",
            entry.position
        );
        return EntryVerdict::Mismatch(
            header_id,
            mismatch("unknown_entry", None, None, header_id, detail),
        );
    };
    let body = body.as_ref().expect("an event id came from the body");
    let (key, award) = (text("idempotency_key"), text("award_id"));
    let mut diffs = entry_header_differences(entry, body);
    let wrong = |kind, detail: String| {
        EntryVerdict::Mismatch(
            Some(id),
            mismatch(kind, key.as_deref(), award.as_deref(), Some(id), detail),
        )
    };
    if text("type").as_deref() != Some(LEDGER_EVENT_TYPE) && diffs.is_empty() {
        return EntryVerdict::Other(id);
    }
    let Some(m) = key.as_ref().and_then(|k| ledger.get(k)) else {
        let detail = format!("entry {} names a key the ledger does not have", entry.position);
        return wrong("entry_without_ledger_row", detail);
    };
    diffs.extend(body_differences(body, &m.ledger));
    if !m.event_ids.is_empty() && !m.event_ids.contains(&id) {
        diffs.push(format!(
            "event id (the outbox's event for the row is {})",
            m.event_ids[0]
        ));
    }
    if diffs.is_empty() {
        return EntryVerdict::Ledger(id);
    }
    wrong(
        "entry_differs",
        format!("entry {} differs: {}", entry.position, diffs.join("; ")),
    )
}

/// Where a broker entry's own fields (stream fields, message headers)
/// disagree with its body.
fn entry_header_differences(entry: &BrokerEntry, body: &Value) -> Vec<String> {
    let text = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_string);
    let sequence = body
        .get("sequence")
        .and_then(Value::as_i64)
        .map(|n| n.to_string());
    [
        ("event_id", &entry.event_id, text("event_id")),
        ("award_id", &entry.award_id, text("award_id")),
        ("sequence", &entry.sequence, sequence),
        ("type", &entry.event_type, text("type")),
    ]
    .into_iter()
    .filter(|(_, header, body)| header.is_some() && *header != body)
    .map(|(name, header, body)| {
        format!(
            "{name} ({} on the entry, {} in its body)",
            header.as_deref().unwrap_or("none"),
            body.as_deref().unwrap_or("none")
        )
    })
    .collect()
}
