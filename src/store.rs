//! The authoritative store: two backends (Postgres, embedded SQLite), chosen
//! by URL scheme, behind one seam split by capability — claims, the relay's
//! slots and publishing, effects, reconcile and inspect, the sealed audit
//! trail, administration — each a trait small enough to fake. A component
//! takes the capability it uses; [`Store`] is their sum. Each backend
//! implements a capability in its own file (`postgres/slots.rs`, …), and
//! reads rows with the decoders in `rows` written once for both. Both pass
//! one conformance suite (`on_both_stores!` in `tests/it`).
//!
//! A claim is one transaction: claim row (`INSERT … ON CONFLICT DO NOTHING`,
//! row count decides), ledger row, running total with the per-award sequence,
//! outbox event and audit row. Commit, then answer.

pub mod effect;

pub mod ops;
pub mod postgres;
mod rows;
pub mod shared;
pub mod slots;
pub mod sqlite;

use crate::error::StoreError;
pub use crate::primary::{Epoch, PrimaryWatch, ServerIdentity};
use crate::submission::Submission;
use async_trait::async_trait;
pub use effect::{BeginOutcome, CompletedEffect, EffectBegin, EffectRecord, FencedOutcome, Taken};
use slots::{RelayMember, RelayView, SlotLease, SlotTable};
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use uuid::Uuid;

/// The ledger row written by a claim: returned, identical, on every duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disbursement {
    pub id: Uuid,
    pub award_id: String,
    pub amount_cents: i64,
    /// Microsecond precision, UTC.
    pub recorded_at: OffsetDateTime,
    /// Per-award sequence number, from 1.
    pub sequence: i64,
}

/// The stored result of a committed claim: what every tier caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub key: String,
    pub fingerprint: String,
    pub disbursement: Disbursement,
}

impl StoredResult {
    /// Approximate heap size, for the L1 byte budget.
    pub fn weight(&self) -> u32 {
        (self.key.len() + self.fingerprint.len() + self.disbursement.award_id.len() + 96) as u32
    }

    /// The fingerprint rule, at every tier: a stored result answers a
    /// submission with its key only when award id, amount and payload match;
    /// otherwise the key was reused for another submission.
    pub fn matches(&self, s: &Submission) -> bool {
        self.fingerprint == s.fingerprint
    }

    /// What this stored result means for `s`, which did not claim the key:
    /// its duplicate, or a refused key reuse.
    pub fn outcome_for(self, s: &Submission) -> ClaimOutcome {
        if self.matches(s) {
            ClaimOutcome::Duplicate(self)
        } else {
            ClaimOutcome::KeyReused(self)
        }
    }
}

/// Which tier decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    LocalCache,
    Redis,
    Database,
}

impl Tier {
    /// The name in audit rows, metrics and logs (the proto enum's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LocalCache => "LOCAL_CACHE",
            Self::Redis => "REDIS",
            Self::Database => "DATABASE",
        }
    }
}

/// Per-item result of a claim batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This call committed the claim and its side effects.
    Claimed(StoredResult),
    /// Already committed, with the same fingerprint: the stored result.
    Duplicate(StoredResult),
    /// Already committed with a different fingerprint: refused.
    KeyReused(StoredResult),
}

impl ClaimOutcome {
    /// The committed result behind the outcome.
    pub fn stored(&self) -> &StoredResult {
        match self {
            Self::Claimed(r) | Self::Duplicate(r) | Self::KeyReused(r) => r,
        }
    }

    /// The audit decision and deciding tier of this outcome in the store.
    pub fn audit(&self) -> (AuditDecision, Option<Tier>) {
        match self {
            Self::Claimed(_) => (AuditDecision::Processed, None),
            Self::Duplicate(_) => (AuditDecision::Duplicate, Some(Tier::Database)),
            Self::KeyReused(_) => (AuditDecision::Rejected, Some(Tier::Database)),
        }
    }
}

/// A batch of submissions for one claim transaction. The first item with a
/// key is decided by the store; a later item with the same key (two
/// deliveries coalesced into one batch) is a repeat, decided by the rule of
/// [`StoredResult::outcome_for`] against the first one's stored result.
#[derive(Debug)]
pub struct ClaimBatch<'a> {
    items: &'a [Submission],
    unique: Vec<&'a Submission>,
    /// For each item, its key's index in `unique`.
    slot: Vec<usize>,
}

impl<'a> ClaimBatch<'a> {
    pub fn new(items: &'a [Submission]) -> Self {
        let mut first: std::collections::HashMap<&str, usize> = Default::default();
        let mut unique = Vec::with_capacity(items.len());
        let slot = items
            .iter()
            .map(|item| {
                *first.entry(item.key.as_str()).or_insert_with(|| {
                    unique.push(item);
                    unique.len() - 1
                })
            })
            .collect();
        Self { items, unique, slot }
    }

    /// Every item, in order.
    pub fn items(&self) -> &'a [Submission] {
        self.items
    }

    /// The first item of each key, in order: what the store decides.
    pub fn unique(&self) -> &[&'a Submission] {
        &self.unique
    }

    /// Whether item `i` repeats an earlier item's key.
    pub fn is_repeat(&self, i: usize) -> bool {
        !std::ptr::eq(self.unique[self.slot[i]], &self.items[i])
    }

    /// Every item's outcome, given the outcomes of [`ClaimBatch::unique`].
    pub fn expand(&self, decided: &[ClaimOutcome]) -> Vec<ClaimOutcome> {
        self.items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let first = &decided[self.slot[i]];
                if !self.is_repeat(i) {
                    return first.clone();
                }
                first.stored().clone().outcome_for(item)
            })
            .collect()
    }
}

/// Who is claiming, for the audit rows written in the claim transaction.
#[derive(Debug, Clone)]
pub struct ClaimContext {
    pub instance: Arc<str>,
}

/// One audit row.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub at: OffsetDateTime,
    pub decision: AuditDecision,
    /// The deciding tier (none for a processed submission).
    pub tier: Option<Tier>,
    pub key_prefix: String,
    pub award_id: String,
    pub instance: Arc<str>,
    /// A new key for an award id and timestamp already in the ledger under
    /// another key: the payload changed. Processed, but flagged.
    pub payload_changed: bool,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditDecision {
    Processed,
    Duplicate,
    Rejected,
    /// An effect's lease taken: the first time, or after a release.
    EffectAcquired,
    /// An effect's response committed.
    EffectCompleted,
    /// An effect's lease given back (the reason in `detail`).
    EffectReleased,
    /// An effect's lease taken after the previous one expired.
    EffectRetaken,
    /// An effect's key reused with a different request.
    EffectRejected,
    /// A `Begin` answered with an effect's completed record (the tier in
    /// `tier`): the effect is not performed again.
    EffectAnswered,
    /// A quarantined outbox event put back to pending by an operator.
    Redriven,
}

impl AuditDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Duplicate => "duplicate",
            Self::Rejected => "rejected",
            Self::EffectAcquired => "effect_acquired",
            Self::EffectCompleted => "effect_completed",
            Self::EffectReleased => "effect_released",
            Self::EffectRetaken => "effect_retaken",
            Self::EffectRejected => "effect_rejected",
            Self::EffectAnswered => "effect_answered",
            Self::Redriven => "redriven",
        }
    }
}

/// An outbox event leased by a relay.
#[derive(Debug, Clone)]
pub struct OutboxEvent {
    pub event_id: Uuid,
    pub event_type: String,
    pub award_id: String,
    pub sequence: i64,
    /// JSON: event id, type, award id, amount, key, sequence, recorded time.
    pub payload: String,
    pub attempts: i32,
    /// The W3C trace context it was recorded under, sent by every sink.
    pub traceparent: Option<String>,
}

/// Outbox health, for metrics.
#[derive(Debug, Clone, Default)]
pub struct OutboxStats {
    pub backlog: i64,
    pub oldest_age: Duration,
    pub quarantined: i64,
}

/// What a retention run removes.
#[derive(Debug, Clone)]
pub struct RetentionPolicy {
    /// Claims and audit rows older than this go.
    pub retention: Duration,
    /// Published outbox rows older than this go.
    pub outbox_retention: Duration,
    /// Rows per delete transaction.
    pub batch_size: i64,
}

/// What a retention run removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// False when another instance held the purge lock.
    pub ran: bool,
    pub claims_deleted: u64,
    pub audit_deleted: u64,
    pub outbox_deleted: u64,
    /// Effect records (DESIGN §9) whose last change is older than retention.
    pub effects_deleted: u64,
    /// Age of the oldest claim left, for the purge-lag metric.
    pub oldest_claim_age: Option<Duration>,
}

/// Ledger-wide figures, for checks after a benchmark or a chaos run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerSummary {
    pub claims: i64,
    pub disbursements: i64,
    pub total_cents: i64,
    /// Awards whose running total or count differs from their ledger rows.
    pub mismatched_awards: i64,
    /// Awards whose sequences are not exactly 1..=count.
    pub sequence_gaps: i64,
    pub outbox_events: i64,
    pub outbox_unpublished: i64,
    pub audit_processed: i64,
    pub audit_duplicates: i64,
}

/// Where the store is and how many connections to it.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// `postgres://…` or `sqlite://path`.
    pub url: String,
    pub pool_size: u32,
    /// Postgres: longest wait for a row lock before the statement fails.
    pub lock_timeout: Duration,
    /// Postgres: longest a statement may run.
    pub statement_timeout: Duration,
    /// Postgres: a session idle inside a transaction this long is ended.
    pub idle_in_transaction_timeout: Duration,
    /// Postgres: idle time before the server probes a silent client.
    pub tcp_keepalive: Duration,
    /// Postgres: what `url` reaches — the server (or a session pooler), or
    /// a transaction pooler ([`Pooler`]).
    pub pooler: Pooler,
    /// Postgres: claims and effect completions only when a synchronous
    /// standby confirms their commit (`ONCEGATE_REQUIRE_SYNC_REPLICA`,
    /// [`crate::primary::guard`]).
    pub require_sync_standby: bool,
}

impl StoreSettings {
    /// Settings with the defaults for everything but the URL and pool.
    pub fn new(url: impl Into<String>, pool_size: u32) -> Self {
        Self {
            url: url.into(),
            pool_size,
            lock_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(10),
            tcp_keepalive: Duration::from_secs(10),
            require_sync_standby: false,
            pooler: Pooler::None,
        }
    }
}

/// What a Postgres URL reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// The server itself, or a pooler that keeps a server connection per
    /// client connection (PgBouncer `pool_mode = session`).
    #[default]
    None,
    /// A pooler that hands each transaction to any server connection
    /// (PgBouncer `pool_mode = transaction`): nothing of a session
    /// survives a transaction.
    Transaction,
}

/// Which backend a store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
        }
    }
}

/// One audit row as stored: what a seal covers, verification checks and an
/// export carries. Values are read verbatim (a changed row must show).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    pub id: i64,
    /// Microsecond precision, UTC.
    #[serde(serialize_with = "crate::time_fmt::serde_rfc3339::serialize")]
    pub at: OffsetDateTime,
    pub decision: String,
    pub tier: Option<String>,
    pub key_prefix: String,
    pub award_id: String,
    pub instance: String,
    pub payload_changed: bool,
    pub detail: Option<String>,
}

/// A position in `(id, at)` order, for paging through audit rows (on
/// Postgres two rows may share an id when one was inserted by hand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCursor {
    pub id: i64,
    /// `None`: after every row with this id.
    pub at: Option<OffsetDateTime>,
}

impl RowCursor {
    /// After every row whose id is `id` or lower.
    pub fn after_id(id: i64) -> Self {
        Self { id, at: None }
    }

    /// Right after `row`.
    pub fn after(row: &AuditRecord) -> Self {
        Self {
            id: row.id,
            at: Some(row.at),
        }
    }
}

/// One link of the audit chain: the rows with ids `first_id..=last_id`,
/// digested together with the previous seal's digest (the encoding is in
/// `crate::seal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSeal {
    pub seq: i64,
    pub first_id: i64,
    pub last_id: i64,
    pub row_count: i64,
    /// Ids in the range that held no row when sealed, as `a..b,c`.
    pub absent_ids: String,
    pub min_at: OffsetDateTime,
    pub max_at: OffsetDateTime,
    pub sealed_at: OffsetDateTime,
    pub sealed_by: String,
    pub prev_digest: String,
    pub digest: String,
    /// The first 4 bytes of each covered row's hash, in id order.
    pub row_tags: Vec<u8>,
    /// Ed25519 signature (hex) over the digest, and the signing key's id
    /// (`crate::seal::signing`); both absent on an unsigned seal.
    pub signature: Option<String>,
    pub key_id: Option<String>,
}

/// A lawful-purge record: audit rows of one seal (or rows no seal covered
/// yet) that the retention purge removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditPurge {
    pub purged_at: OffsetDateTime,
    /// The effective cutoff: every removed row, and its whole seal, was older.
    pub cutoff: OffsetDateTime,
    pub method: String,
    pub seal_seq: Option<i64>,
    pub seal_digest: Option<String>,
    pub row_count: i64,
    /// The removed ids, as `a..b,c`.
    pub ids: String,
}

/// How far a seal may reach now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealHorizon {
    /// Every row that will ever hold an id up to this one is committed and
    /// visible.
    Through(i64),
    /// `writers` transactions that may still add a row with an id up to
    /// `through` outlived the wait.
    Blocked { through: i64, writers: usize },
}

/// A half-open time range `[from, to)`; `None` is unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeRange {
    pub from: Option<OffsetDateTime>,
    pub to: Option<OffsetDateTime>,
}

impl TimeRange {
    pub fn is_unbounded(&self) -> bool {
        self.from.is_none() && self.to.is_none()
    }

    /// The bounds as microseconds, unbounded ends as the extremes.
    pub fn micros(&self) -> (i64, i64) {
        (
            self.from.map(crate::time_fmt::to_micros).unwrap_or(i64::MIN),
            self.to.map(crate::time_fmt::to_micros).unwrap_or(i64::MAX),
        )
    }
}

/// Some audit rows: how many, and their lowest and highest id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowSpan {
    pub count: i64,
    pub first_id: Option<i64>,
    pub last_id: Option<i64>,
}

/// The seals whose rows' times overlap a range: first and last number and
/// how many rows they cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealSpan {
    pub first_seq: i64,
    pub last_seq: i64,
    pub rows: i64,
}

/// A database lock held until released (or until its connection closes).
#[async_trait]
pub trait HeldLock: Send {
    async fn release(self: Box<Self>) -> Result<(), StoreError>;
}

/// A claim transaction begun by [`ClaimStore::begin_claim`]: the backend's
/// own transaction, one variant per backend that begins early (SQLite does
/// not), so a store takes back only its own. Dropped unused, it rolls back.
pub enum OpenClaim {
    Postgres(postgres::ClaimTx),
}

/// The connection of a claim transaction that committed, handed back to its
/// group-commit runner to begin its next batch on
/// ([`ClaimStore::begin_claim`]): a runner keeps it only while batches
/// follow each other closely, and at most one at a time (the connections
/// [`crate::group_commit::GroupCommitSettings::fit`] counts for it), so
/// the pool is never the poorer for it.
pub enum KeptConnection {
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

pub use crate::primary::guard::{CommitSetting, Replication, Shortfall};

/// The authoritative store: every capability, for whoever opens it
/// ([`open`]). A component takes the capability it uses.
pub trait Store: ClaimStore + RelayStore + EffectStore + OpsStore + AuditStore + AdminStore {}

impl<T: ClaimStore + RelayStore + EffectStore + OpsStore + AuditStore + AdminStore> Store for T {}

/// What every capability of a store knows: its backend, and the server its
/// connections reach (DESIGN §7.2).
pub trait StoreBase: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// Who this store's connections reach (DESIGN §7.2): the watch every new
    /// connection and [`AdminStore::probe_primary`] report to, and
    /// that tells the caches whether, and in which epoch, they may answer.
    /// An embedded store has no failover: always trusted.
    fn primary(&self) -> Arc<PrimaryWatch> {
        Arc::new(PrimaryWatch::embedded())
    }
}

/// Claims and lookups: what group commit and the gate use.
#[async_trait]
pub trait ClaimStore: StoreBase {
    /// Claims a batch in one transaction: one outcome per item, in order,
    /// exactly as if each item had run alone (see [`ClaimBatch`]), and one
    /// audit row per item, repeats included. On `Err` nothing was written.
    async fn claim_batch(
        &self,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<Vec<ClaimOutcome>, StoreError>;

    /// Begins a claim transaction before its batch is known, so that group
    /// commit can take the `BEGIN` round trip while it waits for its turn.
    /// `None` where that gains nothing (the default). Begun on `kept` when
    /// given.
    async fn begin_claim(&self, kept: Option<KeptConnection>) -> Result<Option<OpenClaim>, StoreError> {
        drop(kept);
        Ok(None)
    }

    /// [`claim_batch`](Self::claim_batch) in a transaction from
    /// [`begin_claim`](Self::begin_claim); with the outcomes, the
    /// transaction's connection for the next one, where the backend keeps
    /// one.
    async fn claim_batch_in(
        &self,
        open: OpenClaim,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<(Vec<ClaimOutcome>, Option<KeptConnection>), StoreError> {
        drop(open);
        Ok((self.claim_batch(batch, ctx).await?, None))
    }

    /// Re-creates purged claim rows from the ledger (late redeliveries).
    async fn restore_claims(&self, keys: &[String]) -> Result<(), StoreError>;

    /// The stored result for a key: from the claim, or from the ledger when
    /// the claim was purged.
    async fn lookup(&self, key: &str) -> Result<Option<StoredResult>, StoreError>;

    /// Appends audit rows (duplicates answered by a cache tier, rejections).
    async fn append_audit(&self, rows: &[AuditEntry]) -> Result<(), StoreError>;
}

/// The relay's slots and their holders (DESIGN §4.2;
/// `store::slots`): who is alive, who holds which slot with which
/// generation, and the resize.
#[async_trait]
pub trait SlotStore: StoreBase {
    /// Creates `count` slots when the outbox has none yet; the count in force.
    async fn relay_slots_init(&self, count: i32) -> Result<i32, StoreError>;

    /// Says `member` is alive for `ttl` and forgets relays whose time ran
    /// out; the live relays and the slot count in force.
    async fn relay_heartbeat(&self, member: &RelayMember<'_>, ttl: Duration)
    -> Result<RelayView, StoreError>;

    /// `member` stops (its slots were given back).
    async fn relay_leave(&self, member: &str) -> Result<(), StoreError>;

    /// Takes up to `limit` slots that are free or whose lease ran out, each
    /// with a new generation, for `lease`.
    async fn take_slots(
        &self,
        member: &str,
        limit: i32,
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError>;

    /// Extends the leases `member` still holds with their generation; the
    /// ones extended (any other was lost).
    async fn renew_slots(
        &self,
        member: &str,
        held: &[SlotLease],
        lease: Duration,
    ) -> Result<Vec<SlotLease>, StoreError>;

    /// Gives a slot back: free at once.
    async fn release_slot(&self, member: &str, lease: &SlotLease) -> Result<(), StoreError>;

    /// The slots in use (owner, generation, lease, pending events) and the
    /// live relays.
    async fn relay_slot_table(&self) -> Result<SlotTable, StoreError>;

    /// Takes every slot for `member` whoever holds it (a resize begins):
    /// each with a new generation.
    async fn seize_slots(&self, member: &str, lease: Duration) -> Result<Vec<SlotLease>, StoreError>;

    /// Ends a resize: when `member` still holds every slot it seized, sets
    /// the count and frees every slot with a new generation; false (nothing
    /// changed) when one was taken meanwhile.
    async fn finish_resize(&self, member: &str, seized: &[SlotLease], count: i32)
    -> Result<bool, StoreError>;
}

/// The outbox as a relay publishes it: a held slot's events, and the marks
/// and rejections it records, each only while the slot is still held with
/// its generation.
#[async_trait]
pub trait PublishStore: StoreBase {
    /// The slot's unpublished, unquarantined events in per-award order (at
    /// most `limit`): none once the slot is not held with `lease`'s
    /// generation, none behind an earlier event of its award that waits for
    /// a retry.
    async fn slot_pending(&self, lease: &SlotLease, limit: i64) -> Result<Vec<OutboxEvent>, StoreError>;

    /// Marks events published if the slot is still held with `lease`'s
    /// generation; false when it is not (nothing changed).
    async fn mark_published(&self, lease: &SlotLease, ids: &[Uuid]) -> Result<bool, StoreError>;

    /// Records a rejected publish if the slot is still held with `lease`'s
    /// generation: the event is retried after `retry_after`, or quarantined
    /// once `attempts` reaches `max_attempts`. `None` when the slot is
    /// another's (nothing recorded), else whether quarantined.
    async fn record_publish_failure(
        &self,
        lease: &SlotLease,
        id: Uuid,
        error: &str,
        max_attempts: i32,
        retry_after: Duration,
    ) -> Result<Option<bool>, StoreError>;

    async fn outbox_stats(&self) -> Result<OutboxStats, StoreError>;

    /// Waits until an outbox insert is signalled or `timeout` passes.
    /// Backends without notifications just sleep (polling).
    async fn wait_for_outbox(&self, timeout: Duration);
}

/// Everything a relay does with the store: its slots and their events.
pub trait RelayStore: SlotStore + PublishStore {}

impl<T: SlotStore + PublishStore> RelayStore for T {}

/// Effects outside the ledger (DESIGN §9): one record per namespace and
/// key, its lease authoritative here. Each call is one transaction with its
/// audit row (and, for Complete, its outbox event).
#[async_trait]
pub trait EffectStore: StoreBase {
    /// Takes the record's lease when it is new, released or expired (a
    /// re-take bumps `attempt` and installs `begin.token` in one statement,
    /// so two callers never both hold it); otherwise reports what holds it.
    async fn effect_begin(&self, begin: &EffectBegin) -> Result<BeginOutcome, StoreError>;

    /// Commits `response` if `fence.token` is the current lease's token, in
    /// the statement that checks it, with the audit row and the
    /// `effect.completed` outbox event. A repeat with the same token and
    /// response answers the first completion.
    async fn effect_complete(
        &self,
        fence: &effect::Fence<'_>,
        response: &[u8],
    ) -> Result<FencedOutcome<CompletedEffect>, StoreError>;

    /// Releases the lease if `fence.token` is the current one (a repeat of
    /// the same release is `Done`), audited with `reason`.
    async fn effect_release(
        &self,
        fence: &effect::Fence<'_>,
        reason: &str,
    ) -> Result<FencedOutcome<()>, StoreError>;

    /// The record as stored (read-only).
    async fn effect_get(&self, namespace: &str, key: &str) -> Result<Option<EffectRecord>, StoreError>;
}

/// Operations (DESIGN §10): reconcile, inspect, outbox list and redrive.
/// Every read is one short statement: nothing locks the ledger or holds a
/// snapshot for longer than one batch.
#[async_trait]
pub trait OpsStore: StoreBase {
    /// The store's clock and the oldest claim and published event left.
    async fn reconcile_start(&self) -> Result<ops::ReconcileStart, StoreError>;

    /// The scheduled reconcile's lock: `None` while another instance holds it.
    async fn try_reconcile_lock(&self) -> Result<Option<ops::RunLock>, StoreError>;

    /// Where a key batch starting after `after` should end to hold `limit`
    /// ledger rows: `None` when fewer are left (the batch is the last).
    async fn key_batch_end(&self, after: &str, limit: i64) -> Result<Option<String>, StoreError>;

    /// The ledger rows with keys in (`after`, `until`] (`None`: no upper
    /// bound) full-joined with the claims of the same keys, in key order
    /// and one snapshot. Ledger rows recorded at or after `events_since`
    /// carry the number of ledger events the outbox holds for them.
    async fn reconcile_keys(
        &self,
        after: &str,
        until: Option<&str>,
        events_since: OffsetDateTime,
    ) -> Result<Vec<ops::KeyPair>, StoreError>;

    /// The outbox events with ids after `after`, at most `limit` in id
    /// order, each with the ledger row of its award and sequence.
    async fn reconcile_events(&self, after: Uuid, limit: i64) -> Result<Vec<ops::EventPair>, StoreError>;

    /// Where an award batch starting after `after` should end so that it
    /// covers about `max_rows` ledger rows (at least one award): `None` when
    /// the rest fits (the batch is the last).
    async fn award_batch_end(&self, after: &str, max_rows: i64) -> Result<Option<String>, StoreError>;

    /// The running totals of the awards in (`after`, `until`] (`None`: no
    /// upper bound) full-joined with their ledger rows' aggregates, in one
    /// snapshot.
    async fn reconcile_awards(
        &self,
        after: &str,
        until: Option<&str>,
    ) -> Result<Vec<ops::AwardTotals>, StoreError>;

    /// The first row of `award_id` whose sequence is not its predecessor's plus one.
    async fn first_sequence_gap(&self, award_id: &str) -> Result<Option<ops::SequenceGap>, StoreError>;

    /// The ledger rows of these keys (those that exist), with their events' ids.
    async fn ledger_matches(&self, keys: &[String]) -> Result<Vec<ops::LedgerMatch>, StoreError>;

    /// Claim, ledger row, events and audit history of one key.
    async fn inspect_key(&self, key: &str) -> Result<ops::KeyInspection, StoreError>;

    /// An award's running total and its `limit` most recent keys (ledger
    /// rows by sequence, newest first).
    async fn award_keys(
        &self,
        award_id: &str,
        limit: i64,
    ) -> Result<(Option<ops::Balance>, Vec<String>), StoreError>;

    /// The ledger's keys that start with `prefix` (as logs and audit rows
    /// print a key: its first 12 characters), at most `limit`, in key order.
    async fn find_keys(&self, prefix: &str, limit: i64) -> Result<Vec<String>, StoreError>;

    /// The key of the ledger row with this disbursement id.
    async fn disbursement_key(&self, id: Uuid) -> Result<Option<String>, StoreError>;

    /// Up to `limit` ledger rows of `award_id` with a sequence after
    /// `after_sequence`, in sequence order (the console's pages).
    async fn award_ledger(
        &self,
        award_id: &str,
        after_sequence: i64,
        limit: i64,
    ) -> Result<Vec<ops::LedgerRow>, StoreError>;

    /// One award's running total joined with its ledger rows' aggregate,
    /// as [`OpsStore::reconcile_awards`] reads a batch of them.
    async fn award_totals(&self, award_id: &str) -> Result<ops::AwardTotals, StoreError>;

    /// Unpublished outbox events, oldest first.
    async fn list_outbox(&self, filter: &ops::OutboxFilter) -> Result<Vec<ops::EventRecord>, StoreError>;

    /// Puts quarantined events back to pending (attempts reset, lease
    /// cleared, `created_at` kept, so the relay takes them in per-award
    /// order) with one `redriven` audit row each, in one transaction; at
    /// most `limit` events for [`ops::RedriveTarget::AllQuarantined`], oldest
    /// first. Wakes the relays.
    async fn redrive_outbox(
        &self,
        target: &ops::RedriveTarget,
        limit: i64,
        by: &ops::RedriveBy,
    ) -> Result<Vec<ops::RedriveOutcome>, StoreError>;
}

/// The sealed audit trail (DESIGN §10.3). The store reads and writes rows;
/// `crate::seal` decides what a seal covers, digests and verifies.
#[async_trait]
pub trait AuditStore: StoreBase {
    /// Takes the sealing lock: one sealer at a time across instances, and
    /// no audit rows purged meanwhile. `None` when another instance holds it.
    async fn lock_sealing(&self) -> Result<Option<Box<dyn HeldLock>>, StoreError>;

    /// The highest audit id a seal may cover now: every row that will ever
    /// hold an id up to it is committed and visible (or will never exist).
    /// Waits up to `wait` for the writers that could still add one.
    async fn audit_seal_horizon(&self, wait: Duration) -> Result<SealHorizon, StoreError>;

    /// Up to `limit` audit rows after `after` whose ids are at most
    /// `through_id`, in `(id, at)` order.
    async fn audit_rows(
        &self,
        after: RowCursor,
        through_id: i64,
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError>;

    /// The audit rows with ids above `after_id` and `at` in `range`.
    async fn audit_rows_after(&self, after_id: i64, range: &TimeRange) -> Result<RowSpan, StoreError>;

    /// Up to `limit` seals from number `from_seq` on, in order.
    async fn audit_seals(&self, from_seq: i64, limit: i64) -> Result<Vec<AuditSeal>, StoreError>;

    /// The seal whose id range holds audit row `id`, if one does.
    async fn seal_covering(&self, id: i64) -> Result<Option<AuditSeal>, StoreError>;

    /// The newest seal.
    async fn last_audit_seal(&self) -> Result<Option<AuditSeal>, StoreError>;

    /// The seals whose rows' times overlap `range` (all of them when it is
    /// unbounded); `None` when there are none.
    async fn audit_seal_span(&self, range: &TimeRange) -> Result<Option<SealSpan>, StoreError>;

    /// Appends `seal` if it follows the newest seal and its id range still
    /// holds exactly `row_count` rows; false (nothing written) when another
    /// sealer or a purge got there first.
    async fn insert_audit_seal(&self, seal: &AuditSeal) -> Result<bool, StoreError>;

    /// The lawful-purge records of the seals numbered `seqs` (inclusive), or
    /// with `None` those of rows purged before a seal covered them.
    async fn audit_purges(&self, seqs: Option<(i64, i64)>) -> Result<Vec<AuditPurge>, StoreError>;
}

/// Administration: migrations, privileges, retention, and the server's
/// health (reachability, replication, the pool).
#[async_trait]
pub trait AdminStore: StoreBase {
    /// Applies this backend's migrations.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Cheap reachability check.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether a commit this store acknowledges is also on a standby
    /// (DESIGN §7.3): `None` where the store has no replication (SQLite).
    async fn replication(&self) -> Result<Option<Replication>, StoreError> {
        Ok(None)
    }

    /// Reads the server's identity on a connection of the probe's own (kept
    /// open between probes) and reports it to [`StoreBase::primary`];
    /// an error (or no answer within `timeout`) means no connection
    /// confirmed it. Nothing to do without a
    /// server.
    async fn probe_primary(&self, timeout: Duration) -> Result<(), StoreError> {
        let _ = timeout;
        Ok(())
    }

    /// Connections open and idle, for the pool gauges.
    fn pool_usage(&self) -> Option<(u32, usize)> {
        None
    }

    /// Every connection to the server this process holds now: the pool's,
    /// the identity probe's and the relay's `LISTEN` session
    /// (`oncegate_db_connections_held`; `None` without a server).
    fn connections_held(&self) -> Option<u32> {
        None
    }

    /// What the connected role may do beyond least privilege (DESIGN §3):
    /// empty when it is the application role, `None` where the store has
    /// no roles (SQLite: whoever opens the file can do anything).
    async fn privilege_excess(&self) -> Result<Option<Vec<String>>, StoreError>;

    /// Grants `role` exactly the application role's privileges (run as the
    /// owner, after migrating). Postgres only.
    async fn grant_app_role(&self, role: &str) -> Result<(), StoreError>;

    /// What the connected role may do beyond reading (the console's role,
    /// migrations/GRANTS.md): empty when it can only read, `None` where the
    /// store has no roles (SQLite).
    async fn read_only_excess(&self) -> Result<Option<Vec<String>>, StoreError>;

    /// Grants `role` exactly the console role's privileges: SELECT on the
    /// tables the console reads, nothing else. Postgres only.
    async fn grant_console_role(&self, role: &str) -> Result<(), StoreError>;

    /// The shortest retention the database itself enforces, if it holds one
    /// (Postgres: the owner's `oncegate_retention_floor`).
    async fn retention_floor(&self) -> Result<Option<Duration>, StoreError>;

    /// One retention run; returns `ran: false` if another instance holds the lock.
    async fn purge(&self, policy: &RetentionPolicy) -> Result<PurgeReport, StoreError>;

    async fn ledger_summary(&self) -> Result<LedgerSummary, StoreError>;
}

/// Opens the store for its URL: `postgres://…` or `sqlite://path`.
pub async fn open(settings: &StoreSettings) -> Result<Arc<dyn Store>, StoreError> {
    let url = settings.url.as_str();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PostgresStore::connect(settings).await?))
    } else if let Some(path) = url.strip_prefix("sqlite://") {
        Ok(Arc::new(sqlite::SqliteStore::open(path).await?))
    } else {
        Err(StoreError::Other(format!(
            "unsupported database URL scheme in {:?}: use postgres:// or sqlite://",
            crate::secret::mask_url(url)
        )))
    }
}
