//! Each page: its read (through the store's capabilities and the code the
//! CLI runs) and its HTML (maud: checked when the crate compiles, every
//! value escaped). No page shows a payload or a secret.

use super::state::{SealStatus, State, TOKEN_COOKIE, Trigger, Verified};
use crate::error::StoreError;
use crate::relay::state::{RelayState, relay_state};
use crate::seal::export::{self, Target};
use crate::store::ops::{EventRecord, EventState, KeyInspection, LedgerRow, OutboxFilter};
use crate::store::slots::{SlotTable, slot_of};
use crate::store::{AuditRecord, AuditSeal, TimeRange};
use crate::time_fmt::rfc3339;
use axum::body::Body;
use axum::extract::{Form, Query, State as Shared};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Deserialize;
use std::sync::Arc;
use time::OffsetDateTime;
use uuid::Uuid;

type Page = Result<Markup, PageError>;

/// Why a page could not be shown.
pub enum PageError {
    /// The store failed: logged in full, the page says only that.
    Store(StoreError),
    BadRequest(String),
    NotFound(String),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, title, text) = match self {
            Self::Store(e) => {
                tracing::warn!(error = %e, "console: reading the store failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Store unavailable",
                    "The store could not be read; the console's log has the error. Try again.".to_string(),
                )
            }
            Self::BadRequest(text) => (StatusCode::BAD_REQUEST, "Bad request", text),
            Self::NotFound(text) => (StatusCode::NOT_FOUND, "Not found", text),
        };
        (status, layout(title, html! { p.problem { (text) } })).into_response()
    }
}

/// A value for a query string.
fn enc(s: &str) -> String {
    utf8_percent_encode(s, NON_ALPHANUMERIC).to_string()
}

fn when(t: OffsetDateTime) -> String {
    rfc3339(t)
}

fn cents(c: i64) -> String {
    let sign = if c < 0 { "-" } else { "" };
    format!(
        "{sign}{}.{:02}",
        (c / 100).unsigned_abs(),
        (c % 100).unsigned_abs()
    )
}

fn age(d: std::time::Duration) -> String {
    humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string()
}

fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · oncegate console" }
                link rel="stylesheet" href="/console.css";
            }
            body {
                header {
                    nav {
                        a.brand href="/" { "oncegate console" }
                        a href="/relay" { "Relay" }
                        a href="/trail" { "Trail" }
                        form.find action="/find" method="get" role="search" {
                            input type="search" name="q" aria-label="Find"
                                placeholder="award id, key or its 12-character prefix, disbursement id";
                            button type="submit" { "Find" }
                        }
                    }
                }
                main { h1 { (title) } (body) }
                footer { "read-only · nothing here changes the ledger" }
            }
        }
    }
}

/// The 401 page: says what the console needs, and takes the token.
pub fn unauthorized(wrong: bool) -> Markup {
    layout(
        "Token required",
        html! {
            p.problem {
                @if wrong { "That token is not this console's. " }
                "Every page of this console needs its bearer token: the contents of the file "
                code { "ONCEGATE_CONSOLE_TOKEN_FILE" } " names, sent as "
                code { "Authorization: Bearer <token>" } ", or entered here once (kept in a cookie for this site only)."
            }
            form.login action="/login" method="post" {
                label { "Token " input type="password" name="token" autocomplete="off"; }
                button type="submit" { "Enter" }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

pub async fn login(Shared(state): Shared<Arc<State>>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    if !state.token_matches(token) {
        return (StatusCode::UNAUTHORIZED, unauthorized(true)).into_response();
    }
    let cookie = format!("{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

pub async fn not_found() -> Response {
    PageError::NotFound("No such page.".into()).into_response()
}

pub async fn home() -> Markup {
    layout(
        "Find",
        html! {
            p { "One box for everything: an award id, an idempotency key (or the 12 characters the logs print), or a disbursement id." }
            form.find.big action="/find" method="get" role="search" {
                input type="search" name="q" aria-label="Find" autofocus
                    placeholder="AWD-2026-0142, 3f9c2a7b1e0d…, or a disbursement id";
                button type="submit" { "Find" }
            }
            ul {
                li { a href="/relay" { "The relay" } ": backlog per slot, breaker, quarantined events" }
                li { a href="/trail" { "The trail" } ": latest seals, verification, export" }
            }
        },
    )
}

#[derive(Deserialize)]
pub struct FindQuery {
    #[serde(default)]
    q: String,
}

/// Keys shown when a prefix matches several.
const FIND_LIMIT: i64 = 20;

pub async fn find(
    Shared(state): Shared<Arc<State>>,
    Query(query): Query<FindQuery>,
) -> Result<Response, PageError> {
    let q = query.q.trim();
    if q.is_empty() {
        return Ok(Redirect::to("/").into_response());
    }
    if q.len() > 512 {
        return Err(PageError::BadRequest(
            "That is longer than any key or award id (512 bytes at most).".into(),
        ));
    }
    let store = &state.store;
    if let Ok(id) = Uuid::parse_str(q)
        && let Some(key) = store.disbursement_key(id).await?
    {
        return Ok(Redirect::to(&format!("/delivery?key={}", enc(&key))).into_response());
    }
    if store.award_keys(q, 0).await?.0.is_some() {
        return Ok(Redirect::to(&format!("/award?id={}", enc(q))).into_response());
    }
    let keys = store.find_keys(q, FIND_LIMIT + 1).await?;
    if keys.len() == 1 || keys.iter().any(|k| k == q) {
        let key = if keys.len() == 1 { &keys[0] } else { q };
        return Ok(Redirect::to(&format!("/delivery?key={}", enc(key))).into_response());
    }
    if keys.is_empty() {
        // A delivery refused before it reached the ledger has audit rows only.
        if !store.inspect_key(q).await?.audit.is_empty() {
            return Ok(Redirect::to(&format!("/delivery?key={}", enc(q))).into_response());
        }
        return Err(PageError::NotFound(format!(
            "Nothing matches {q:?}: no award, no ledger key starting with it, no disbursement with that id, no audit row with that key prefix."
        )));
    }
    Ok(layout(
        "Several keys match",
        html! {
            p { "Keys in the ledger that start with " code { (q) } ":" }
            ul.keys { @for k in keys.iter().take(FIND_LIMIT as usize) {
                li { a href={ "/delivery?key=" (enc(k)) } { code { (k) } } }
            } }
            @if keys.len() as i64 > FIND_LIMIT { p { "…and more: type more of the key." } }
        },
    )
    .into_response())
}

#[derive(Deserialize)]
pub struct KeyQuery {
    key: String,
}

pub async fn delivery(Shared(state): Shared<Arc<State>>, Query(query): Query<KeyQuery>) -> Page {
    let k = state.store.inspect_key(&query.key).await?;
    if k.is_empty() {
        return Err(PageError::NotFound(format!(
            "Nothing is recorded for the key {:?}.",
            query.key
        )));
    }
    let mut seals: Vec<AuditSeal> = Vec::new();
    for row in &k.audit {
        if !seals.iter().any(|s| (s.first_id..=s.last_id).contains(&row.id))
            && let Some(seal) = state.store.seal_covering(row.id).await?
        {
            seals.push(seal);
        }
    }
    let waiting = k
        .events
        .iter()
        .any(|e| e.published_at.is_none() && e.quarantined_at.is_none());
    let slots = match waiting {
        true => Some(state.store.relay_slot_table().await?),
        false => None,
    };
    let (_, verified) = state.verification();
    Ok(layout(
        "Delivery",
        html! {
            p.key { "Idempotency key " code { (k.idempotency_key) } }
            (claim_section(&k))
            (decisions_section(&k, &seals, verified.as_ref()))
            (events_section(&k.events, slots.as_ref()))
        },
    ))
}

fn claim_section(k: &KeyInspection) -> Markup {
    html! {
        h2 { "Claim" }
        @match &k.claim {
            Some(c) => table.fields {
                tr { th { "Award" } td { a href={ "/award?id=" (enc(&c.award_id)) } { (c.award_id) } } }
                tr { th { "Claimed at" } td { (when(c.claimed_at)) } }
                tr { th { "Disbursement id" } td { code { (c.disbursement_id) } } }
                tr { th { "Fingerprint" } td { code { (c.fingerprint) } } }
            },
            None => p { "No claim row: purged after its retention window, or never made." },
        }
        h2 { "Stored result" }
        @match &k.ledger {
            Some(d) => (ledger_fields(d)),
            None => p { "No ledger row for this key." },
        }
    }
}

fn ledger_fields(d: &LedgerRow) -> Markup {
    html! {
        table.fields {
            tr { th { "Disbursement id" } td { code { (d.id) } } }
            tr { th { "Award" } td { a href={ "/award?id=" (enc(&d.award_id)) } { (d.award_id) } } }
            tr { th { "Amount" } td { (cents(d.amount_cents)) } }
            tr { th { "Sequence" } td { (d.sequence) } }
            tr { th { "Submission timestamp" } td { (d.submission_timestamp) } }
            tr { th { "Recorded at" } td { (when(d.recorded_at)) } }
            tr { th { "Payload digest" } td { code { (d.payload_digest) } " (SHA-256; the payload itself is never stored)" } }
        }
    }
}

fn seal_cell(row: &AuditRecord, seals: &[AuditSeal], verified: Option<&Verified>) -> Markup {
    let Some(seal) = seals.iter().find(|s| (s.first_id..=s.last_id).contains(&row.id)) else {
        return html! { span.muted { "not sealed yet" } };
    };
    let status = verified.map_or(SealStatus::NotVerified, |v| v.seal_status(seal.seq));
    html! {
        "seal " (seal.seq) " · "
        @match status {
            SealStatus::Verified => span.ok { "verified " (when(verified.expect("status from it").finished)) },
            SealStatus::Failed => span.bad { "FAILED verification " (when(verified.expect("status from it").finished)) },
            SealStatus::InFailedRun => span.ok { "its seal verified (the run found problems elsewhere)" },
            SealStatus::NotVerified => span.muted { "not verified since it was sealed" },
        }
    }
}

fn decisions_section(k: &KeyInspection, seals: &[AuditSeal], verified: Option<&Verified>) -> Markup {
    let award = k.ledger.as_ref().map(|d| d.award_id.as_str());
    html! {
        h2 { "Decisions" }
        p.muted { "Audit rows hold the key's first 12 characters; a row of another award is another key with that prefix, or a reuse." }
        @if k.audit.is_empty() { p { "No audit rows (purged under the retention policy, or written before auditing)." } }
        @else {
            table.rows id="decisions" {
                thead { tr { th { "Time" } th { "Decision" } th { "Tier" } th { "Instance" } th { "Payload changed" } th { "Award" } th { "Seal" } } }
                tbody { @for row in &k.audit {
                    tr.{ "decision-" (row.decision) } {
                        td { (when(row.at)) }
                        td { (row.decision) }
                        td { (row.tier.as_deref().unwrap_or("—")) }
                        td { (row.instance) }
                        td { @if row.payload_changed { span.bad { "yes" } } @else { "no" } }
                        td { (row.award_id) @if award.is_some_and(|a| a != row.award_id) { " " span.bad { "(another award)" } } }
                        td { (seal_cell(row, seals, verified)) }
                    }
                } }
            }
        }
    }
}

fn events_section(events: &[EventRecord], slots: Option<&SlotTable>) -> Markup {
    let now = OffsetDateTime::now_utc();
    html! {
        h2 { "Outbox event" }
        @if events.is_empty() { p { "No event in the outbox (published and cleaned up after its window, or none was written)." } }
        @for e in events {
            table.fields.event {
                tr { th { "Event id" } td { code { (e.event_id) } } }
                tr { th { "Type" } td { (e.event_type) } }
                tr { th { "State" } td.{ "state-" (e.state(now).as_str()) } { (event_state(e, now, slots)) } }
                tr { th { "Attempts" } td { (e.attempts) } }
                tr { th { "Created" } td { (when(e.created_at)) } }
            }
        }
    }
}

fn event_state(e: &EventRecord, now: OffsetDateTime, slots: Option<&SlotTable>) -> Markup {
    match e.state(now) {
        EventState::Published => html! { "published " (e.published_at.map(when).unwrap_or_default()) },
        EventState::Quarantined => html! {
            span.bad { "quarantined " (e.quarantined_at.map(when).unwrap_or_default()) }
            br; "last error: " code { (e.last_error.as_deref().unwrap_or("—")) }
            br; "redrive (CLI): " code { "oncegate outbox retry " (e.event_id) " --reason \"…\"" }
        },
        EventState::Retrying => html! {
            "rejected, retrying after " (e.leased_until.map(when).unwrap_or_default())
            @if let Some(err) = &e.last_error { br; "last error: " code { (err) } }
        },
        EventState::Pending => html! { "waiting " (waiting_slot(&e.award_id, slots)) },
    }
}

fn waiting_slot(award: &str, slots: Option<&SlotTable>) -> Markup {
    let Some(table) = slots.filter(|t| !t.slots.is_empty()) else {
        return html! { "(no slot is set up yet: no relay has taken one)" };
    };
    let slot = slot_of(award, table.slots.len() as i32);
    let owner = table
        .slots
        .iter()
        .find(|s| s.slot == slot)
        .and_then(|s| s.owner.clone());
    html! {
        "in slot " (slot) ", "
        @match owner { Some(o) => { "held by " code { (o) } }, None => span.bad { "held by no relay" } }
    }
}

#[derive(Deserialize)]
pub struct AwardQuery {
    id: String,
    #[serde(default)]
    after: i64,
}

pub async fn award(Shared(state): Shared<Arc<State>>, Query(query): Query<AwardQuery>) -> Page {
    let store = &state.store;
    let (balance, _) = store.award_keys(&query.id, 0).await?;
    let rows = store
        .award_ledger(&query.id, query.after, state.page_size)
        .await?;
    if balance.is_none() && rows.is_empty() {
        return Err(PageError::NotFound(format!(
            "No award {:?} in the ledger.",
            query.id
        )));
    }
    let mismatches = crate::reconcile::check_award(&**store, &query.id).await?;
    let next = rows
        .last()
        .filter(|_| rows.len() as i64 == state.page_size)
        .map(|d| d.sequence);
    let id = enc(&query.id);
    Ok(layout(
        &format!("Award {}", query.id),
        html! {
            @if let Some(b) = &balance {
                table.fields id="balance" {
                    tr { th { "Running total" } td { (cents(b.total_cents)) } }
                    tr { th { "Disbursements" } td { (b.disbursement_count) } }
                    tr { th { "Last sequence" } td { (b.last_sequence) } }
                    tr { th { "Updated" } td { (when(b.updated_at)) } }
                }
            } @else { p.bad { "No running total row for this award." } }
            h2 { "Reconcile" }
            @if mismatches.is_empty() {
                p.ok id="reconcile" { "Agrees: the running total and count match its ledger rows, and its sequences run 1, 2, 3, … without a gap." }
            } @else {
                ul.bad id="reconcile" { @for m in &mismatches { li { code { (m.kind) } ": " (m.detail) } } }
            }
            h2 { "Disbursements" }
            table.rows id="disbursements" {
                thead { tr { th { "Sequence" } th { "Amount" } th { "Submission timestamp" } th { "Recorded at" } th { "Key" } } }
                tbody { @for d in &rows {
                    tr {
                        td { (d.sequence) }
                        td { (cents(d.amount_cents)) }
                        td { (d.submission_timestamp) }
                        td { (when(d.recorded_at)) }
                        td { a href={ "/delivery?key=" (enc(&d.idempotency_key)) } { code { (crate::key::key_prefix(&d.idempotency_key)) "…" } } }
                    }
                } }
            }
            nav.pages {
                @if query.after > 0 { a href={ "/award?id=" (id) } { "« first" } }
                @if let Some(n) = next { a rel="next" href={ "/award?id=" (id) "&after=" (n) } { "next »" } }
            }
        },
    ))
}

/// Quarantined events listed on the relay page.
const QUARANTINED_SHOWN: i64 = 100;

pub async fn relay(Shared(state): Shared<Arc<State>>) -> Page {
    let store = &state.store;
    let table = store.relay_slot_table().await?;
    let stats = store.outbox_stats().await?;
    let quarantined = store
        .list_outbox(&OutboxFilter {
            quarantined_only: true,
            award_id: None,
            limit: QUARANTINED_SHOWN,
        })
        .await?;
    let breakers = futures::future::join_all(
        state
            .relay_metrics
            .iter()
            .map(|a| async move { (*a, relay_state(*a).await) }),
    )
    .await;
    Ok(layout(
        "Relay",
        html! {
            table.fields id="backlog" {
                tr { th { "Waiting events" } td { (stats.backlog) } }
                tr { th { "Oldest waiting" } td { @if stats.backlog > 0 { (age(stats.oldest_age)) } @else { "—" } } }
                tr { th { "Quarantined" } td { (stats.quarantined) } }
            }
            h2 { "Breaker" }
            @if breakers.is_empty() {
                p.muted { "Set ONCEGATE_CONSOLE_RELAY_METRICS to the relays' metrics listeners to see their breakers here." }
            }
            ul id="breakers" { @for (addr, s) in &breakers {
                li.{ "breaker-" (breaker_class(s)) } { code { (addr) } ": " (s) }
            } }
            (slots_section(&table))
            (quarantined_section(&quarantined, stats.quarantined))
        },
    ))
}

fn breaker_class(s: &RelayState) -> &'static str {
    match s {
        RelayState::Publishing { .. } => "closed",
        RelayState::Paused { .. } => "open",
        RelayState::NoRelay => "none",
        RelayState::Unknown { .. } => "unknown",
    }
}

fn slots_section(table: &SlotTable) -> Markup {
    html! {
        h2 { "Slots" }
        @if table.slots.is_empty() { p { "No slots yet: no relay has taken one (a relay paused before its first publish takes none)." } }
        @else {
            table.rows id="slots" {
                thead { tr { th { "Slot" } th { "Held by" } th { "Generation" } th { "Lease left" } th { "Waiting" } } }
                tbody { @for s in &table.slots {
                    tr {
                        td { (s.slot) }
                        td { @match &s.owner { Some(o) => code { (o) }, None => span.bad { "nobody" } } }
                        td { (s.generation) }
                        td { (s.lease_left.map(age).unwrap_or_else(|| "—".into())) }
                        td { (s.pending) }
                    }
                } }
            }
        }
        h2 { "Live relays" }
        ul { @for m in &table.members { li { code { (m.member) } " on " (m.instance) " → " (m.sink) } } }
    }
}

fn quarantined_section(events: &[EventRecord], total: i64) -> Markup {
    html! {
        h2 { "Quarantined events" }
        @if events.is_empty() { p.ok { "None." } }
        @else {
            p { "Redrive stays in the CLI: " code { "oncegate outbox retry EVENT_ID… --reason \"…\"" }
                ", or every one: " code { "oncegate outbox retry --all-quarantined --reason \"…\"" } "." }
            @if total > events.len() as i64 { p { "The oldest " (events.len()) " of " (total) ":" } }
            table.rows id="quarantined" {
                thead { tr { th { "Event" } th { "Award" } th { "Sequence" } th { "Attempts" } th { "Quarantined" } th { "Last error" } } }
                tbody { @for e in events {
                    tr {
                        td { @match e.key() {
                            Some(k) => a href={ "/delivery?key=" (enc(&k)) } { code { (e.event_id) } },
                            None => code { (e.event_id) },
                        } }
                        td { a href={ "/award?id=" (enc(&e.award_id)) } { (e.award_id) } }
                        td { (e.sequence) }
                        td { (e.attempts) }
                        td { (e.quarantined_at.map(when).unwrap_or_default()) }
                        td { code { (e.last_error.as_deref().unwrap_or("—")) } }
                    }
                } }
            }
        }
    }
}

/// Seals listed on the trail page.
const SEALS_SHOWN: i64 = 20;

pub async fn trail(Shared(state): Shared<Arc<State>>) -> Page {
    let head = state.store.last_audit_seal().await?;
    let mut seals = match &head {
        Some(h) => {
            state
                .store
                .audit_seals((h.seq - SEALS_SHOWN + 1).max(1), SEALS_SHOWN)
                .await?
        }
        None => Vec::new(),
    };
    seals.reverse();
    let (running, last) = state.verification();
    Ok(layout(
        "Audit trail",
        html! {
            h2 { "Verification" }
            (verification_section(running, last.as_ref(), state.checks.keys.is_some()))
            form action="/trail/verify" method="post" { button id="verify" type="submit" { "Verify now" } }
            h2 { "Export" }
            form.export action="/trail/export" method="get" {
                label { "From " input type="date" name="from"; }
                label { "To " input type="date" name="to"; }
                button type="submit" { "Export" }
            }
            p.muted { "The file " code { "oncegate audit export" } " writes: the seals whose rows fall in the range, each with its rows and purge records; check it offline with " code { "oncegate audit verify --export FILE" } "." }
            h2 { "Latest seals" }
            (seals_table(&seals))
        },
    ))
}

fn verification_section(running: Option<OffsetDateTime>, last: Option<&Verified>, signed: bool) -> Markup {
    let holds = match signed {
        true => "every seal's rows, digest and link to the one before, and its signature, hold",
        false => {
            "every seal's rows, digest and link to the one before hold (no public key given: signatures not checked)"
        }
    };
    html! {
        @if let Some(since) = running {
            // Reloads itself until the verification ends: no script needed.
            meta http-equiv="refresh" content="2";
            p id="running" { "Verifying since " (when(since)) "…" }
        }
        @match last {
            None => p.muted id="verdict" { "Not verified since the console started." },
            Some(v) => {
                @match &v.report {
                    Ok(r) if r.is_clean() => p.ok id="verdict" { "VERIFIED: " (holds) " (" (v.trigger.as_str()) ", " (when(v.finished)) ")." },
                    Ok(_) => p.bad id="verdict" { "FAILED: the trail does not match its seals (" (v.trigger.as_str()) ", " (when(v.finished)) ")." },
                    Err(e) => p.bad id="verdict" { "Could not verify (" (when(v.finished)) "): " (e) },
                }
                @if let Ok(r) = &v.report { pre id="report" { (r) } }
            }
        }
    }
}

fn seals_table(seals: &[AuditSeal]) -> Markup {
    html! {
        @if seals.is_empty() { p { "No seals yet." } }
        @else {
            table.rows id="seals" {
                thead { tr { th { "Seal" } th { "Audit ids" } th { "Rows" } th { "Rows' times" } th { "Sealed" } th { "By" } th { "Signed" } th { "Digest" } } }
                tbody { @for s in seals {
                    tr {
                        td { (s.seq) }
                        td { (s.first_id) "…" (s.last_id) }
                        td { (s.row_count) }
                        td { (when(s.min_at)) " – " (when(s.max_at)) }
                        td { (when(s.sealed_at)) }
                        td { (s.sealed_by) }
                        td { (s.key_id.as_deref().map_or("no".to_string(), |k| format!("key {k}"))) }
                        td { code { (s.digest.get(..16).unwrap_or(&s.digest)) "…" } }
                    }
                } }
            }
        }
    }
}

/// Starts a verification (unless one runs) and goes back to the trail,
/// which reloads until it ends.
pub async fn verify(Shared(state): Shared<Arc<State>>) -> Redirect {
    // One bounded run, not a loop; a second request while it runs is a no-op.
    tokio::spawn(async move { state.verify(Trigger::OnDemand).await });
    Redirect::to("/trail")
}

#[derive(Deserialize)]
pub struct ExportQuery {
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
}

fn parse_day(name: &str, text: &str) -> Result<Option<OffsetDateTime>, PageError> {
    if text.is_empty() {
        return Ok(None);
    }
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(text, &format)
        .map(|d| Some(d.midnight().assume_utc()))
        .map_err(|_| PageError::BadRequest(format!("{name}: {text:?} is not a date (YYYY-MM-DD)")))
}

/// The export `audit export` writes for the range (`to`'s whole day
/// included), as a download.
pub async fn export(
    Shared(state): Shared<Arc<State>>,
    Query(query): Query<ExportQuery>,
) -> Result<Response, PageError> {
    let from = parse_day("from", &query.from)?;
    let to = parse_day("to", &query.to)?.map(|t| t + time::Duration::days(1));
    if let (Some(f), Some(t)) = (from, to)
        && f >= t
    {
        return Err(PageError::BadRequest("from must be before to".into()));
    }
    let path = std::env::temp_dir().join(format!("oncegate-console-export-{}.jsonl", Uuid::now_v7()));
    let written = export::export(
        &*state.store,
        &TimeRange { from, to },
        &Target::File(path.clone()),
        &mut |_, _| {},
    )
    .await;
    let summary = written.map_err(|e| {
        tracing::warn!(error = %e, "console: exporting the audit trail failed");
        PageError::Store(StoreError::Other("export failed".into()))
    })?;
    if summary.seals == 0 {
        return Err(PageError::NotFound(
            "Nothing to export: no seals in the range.".into(),
        ));
    }
    let file = tokio::fs::File::open(&path).await;
    // Unlinked once open: the download holds the only reference.
    let _ = tokio::fs::remove_file(&path).await;
    let file = file.map_err(|e| PageError::Store(StoreError::Other(format!("reading the export: {e}"))))?;
    let body = futures::stream::unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), file))
            }
            Err(e) => Some((Err(e), file)),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"oncegate-audit-export.jsonl\"",
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}
