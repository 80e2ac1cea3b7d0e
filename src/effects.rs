//! Effects outside the ledger (DESIGN §9): idempotency records for the
//! payment instruction, the notice, the call to another service, behind the
//! same tiers as claims: L1 (moka) → L2 (Redis) → the authoritative store.
//!
//! # The invariant
//! A cache answers `Begin` only with a *completed* record: L1 and L2 are
//! filled with a record returned by a committed `Complete` or read completed
//! from the store, never with an in-progress one. Every cached answer is
//! checked against the request's fingerprint and is keyed by namespace and
//! key, so one namespace never reads another's response. As for claims
//! ([`crate::gate`]), the caches answer only in the epoch of the primary
//! the store confirms ([`crate::primary`]): a record completed on a primary
//! lost in a failover is not answered from L1 or L2.
//!
//! # Leases, fencing, waiting
//! The lease is the store's: a `Begin` takes it only when the record is new,
//! released or expired, bumping `attempt` and writing a fresh token in one
//! statement; `Complete` and `Release` name the token in the statement that
//! changes the record, so a token whose lease was taken over changes
//! nothing (`FAILED_PRECONDITION`, "lease lost"). A `Begin` that finds a
//! live lease waits — woken at once when this instance completes or
//! releases the record, and otherwise re-reading the record every `poll`
//! (the floor for holders on other instances) or when the lease expires —
//! until the caller's deadline (`DEADLINE_EXCEEDED`); never an "in progress"
//! error. The wait ends when the caller goes away (the handler is dropped),
//! so no lease is taken for a caller that is no longer there; each store
//! transaction runs in a task of its own and is never cut short. When the
//! drain begins, waiting Begins end with `UNAVAILABLE`.

mod cache;
mod request;

pub use cache::EffectCache;
pub use request::{DEFAULT_LEASE_TTL, MAX_BYTES, MAX_LEASE_TTL, validate_namespace};

use crate::audit::AuditQueue;
use crate::error::GateError;
use crate::key::key_prefix;
use crate::pb;
use crate::primary::{Epoch, PrimaryWatch};
use crate::redis_tier::RedisTier;
use crate::store::{
    AuditDecision, AuditEntry, BeginOutcome, CompletedEffect, EffectStore, FencedOutcome, Tier,
};
use request::{BeginRequest, Fenced};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Effects settings: the caches' dedup window, per namespace if set, and
/// the polling floor of a waiting `Begin`.
#[derive(Debug, Clone)]
pub struct EffectsSettings {
    /// How long a completed record stays in L2 (and, capped by the L1 TTL,
    /// in L1) unless its namespace has its own window.
    pub cache_ttl: Duration,
    pub namespace_ttl: HashMap<String, Duration>,
    /// The L1 TTL: the cap on a record's time in L1.
    pub l1_ttl: Duration,
    /// How often a waiting `Begin` re-reads a record held on another instance.
    pub poll: Duration,
    /// The effects L1's byte budget (its own, beside the claims' L1).
    pub l1_capacity_bytes: u64,
}

impl EffectsSettings {
    /// The caches' window for `namespace`.
    pub fn ttl_for(&self, namespace: &str) -> Duration {
        self.namespace_ttl
            .get(namespace)
            .copied()
            .unwrap_or(self.cache_ttl)
    }
}

/// How `Begin` was answered.
#[derive(Debug, Clone)]
pub enum Begun {
    Acquired {
        token: String,
        attempt: i32,
    },
    Completed {
        record: Arc<CompletedEffect>,
        tier: Tier,
    },
}

pub struct Effects {
    store: Arc<dyn EffectStore>,
    l1: EffectCache,
    l2: Option<Arc<RedisTier>>,
    audit: AuditQueue,
    settings: EffectsSettings,
    waiters: Waiters,
    /// True from the start of the drain: waiting Begins give up.
    draining: tokio::sync::watch::Sender<bool>,
    instance: Arc<str>,
    primary: Arc<PrimaryWatch>,
    /// The generation L1 was last used in: on a change L1 is emptied.
    l1_generation: std::sync::atomic::AtomicU64,
}

impl Effects {
    pub fn new(
        store: Arc<dyn EffectStore>,
        l1: EffectCache,
        l2: Option<Arc<RedisTier>>,
        audit: AuditQueue,
        settings: EffectsSettings,
        instance: Arc<str>,
    ) -> Self {
        Self {
            primary: store.primary(),
            l1_generation: Default::default(),
            store,
            l1,
            l2,
            audit,
            settings,
            waiters: Waiters::default(),
            draining: tokio::sync::watch::Sender::new(false),
            instance,
        }
    }

    /// Ends every waiting `Begin` with `UNAVAILABLE` (the drain has begun;
    /// another instance, or this one after its restart, will answer).
    pub fn stop_waiting(&self) {
        self.draining.send_replace(true);
    }

    /// `Begin`: the stored response, or the lease; waits for a live lease
    /// held by another caller until `deadline`.
    pub async fn begin(&self, raw: &pb::BeginRequest, deadline: Option<Instant>) -> Result<Begun, GateError> {
        let req = BeginRequest::validate(raw)?;
        let started = Instant::now();
        let result = self.begin_valid(&req, deadline).await;
        let outcome = match &result {
            Ok(Begun::Acquired { attempt: 1, .. }) => "acquired",
            Ok(Begun::Acquired { .. }) => "retaken",
            Ok(Begun::Completed { .. }) => "answered",
            Err(e) => e.label(),
        };
        count(&req.namespace, outcome);
        metrics::histogram!("oncegate_effect_begin_duration_seconds", "namespace" => req.namespace.clone())
            .record(started.elapsed().as_secs_f64());
        let key = key_prefix(&req.key);
        match &result {
            Ok(Begun::Acquired { attempt, .. }) => {
                tracing::info!(key, namespace = %req.namespace, attempt, "effect lease acquired")
            }
            Ok(Begun::Completed { tier, .. }) => {
                tracing::info!(key, namespace = %req.namespace, tier = tier.as_str(), "effect already completed")
            }
            Err(e) => tracing::info!(key, namespace = %req.namespace, error = %e, "effect begin refused"),
        }
        result
    }

    async fn begin_valid(&self, req: &BeginRequest, deadline: Option<Instant>) -> Result<Begun, GateError> {
        if let Some(answer) = self.cached(req).await? {
            return Ok(answer);
        }
        let mut first = true;
        let mut draining = self.draining.subscribe();
        loop {
            let subscription = self.waiters.subscribe(&req.id);
            let woken = subscription.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let held = if first {
                self.begin_in_store(req).await?
            } else {
                self.recheck(req).await?
            };
            let expires_in = match held {
                Held::Answer(answer) => return Ok(answer),
                Held::For(expires_in) => expires_in,
            };
            first = false;
            // Past its expiry the next round takes the lease; until then the
            // holder's Complete/Release on this instance wakes us at once.
            let nap = self.settings.poll.min(expires_in + Duration::from_millis(1));
            let timeout = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep(nap) => {}
                _ = timeout => return Err(GateError::DeadlineExceeded),
                _ = draining.wait_for(|d| *d) => return Err(GateError::Unavailable(
                    "the sidecar is shutting down; retry (another holder's lease was still live)".into(),
                )),
            }
        }
    }

    /// The epoch the caches may answer in (emptying L1 when it moved), or
    /// `None` while the primary's identity is unconfirmed.
    fn epoch(&self) -> Option<Epoch> {
        let epoch = self.primary.trusted()?;
        let seen = self
            .l1_generation
            .swap(epoch.generation, std::sync::atomic::Ordering::Relaxed);
        if seen != epoch.generation {
            self.l1.clear();
        }
        Some(epoch)
    }

    /// L1, then L2: a completed record of this namespace and key, cached in
    /// the current epoch, only; nothing while suspended.
    async fn cached(&self, req: &BeginRequest) -> Result<Option<Begun>, GateError> {
        let Some(epoch) = self.epoch() else {
            return Ok(None);
        };
        if let Some(r) = self.l1.get(&req.id, epoch.generation).await {
            return self.cached_answer(req, r, Tier::LocalCache).map(Some);
        }
        let Some(l2) = &self.l2 else { return Ok(None) };
        let Some((tag, r)) = l2.get_value(&redis_key(&req.id)).await.and_then(|v| decode(&v)) else {
            return Ok(None);
        };
        if r.namespace != req.namespace || r.key != req.key || tag != *epoch.tag {
            return Ok(None);
        }
        let r = Arc::new(r);
        self.l1
            .insert(&req.id, r.clone(), self.l1_ttl(&req.namespace), epoch.generation)
            .await;
        self.cached_answer(req, r, Tier::Redis).map(Some)
    }

    /// A cached completed record for `req`: its answer if the fingerprint
    /// matches, else a refused key reuse (audited off the hot path).
    fn cached_answer(
        &self,
        req: &BeginRequest,
        record: Arc<CompletedEffect>,
        tier: Tier,
    ) -> Result<Begun, GateError> {
        if record.fingerprint == req.fingerprint {
            return Ok(self.answered(req, record, tier));
        }
        self.audit_later(
            req,
            AuditDecision::EffectRejected,
            tier,
            crate::store::effect::REQUEST_MISMATCH.to_string(),
        );
        Err(GateError::RequestMismatch)
    }

    /// `req` answered with its completed record by `tier`: counted, and
    /// audited off the hot path (as a cached duplicate submission is).
    fn answered(&self, req: &BeginRequest, record: Arc<CompletedEffect>, tier: Tier) -> Begun {
        metrics::counter!("oncegate_effect_answers_total", "namespace" => req.namespace.clone(), "tier" => tier.as_str())
            .increment(1);
        let detail = format!("attempt {}", record.attempt);
        self.audit_later(req, AuditDecision::EffectAnswered, tier, detail);
        Begun::Completed { record, tier }
    }

    /// One audit row for `req`, queued: the key prefix, and the namespace
    /// in the `award_id` column, as the store's effect rows.
    fn audit_later(&self, req: &BeginRequest, decision: AuditDecision, tier: Tier, detail: String) {
        self.audit.record(AuditEntry {
            at: crate::time_fmt::now_micros(),
            decision,
            tier: Some(tier),
            key_prefix: key_prefix(&req.key).to_string(),
            award_id: req.namespace.clone(),
            instance: self.instance.clone(),
            payload_changed: false,
            detail: Some(detail),
        });
    }

    /// Refused while no synchronous standby confirms commits (the guard,
    /// [`crate::primary::guard`]): a lease taken or a record completed then
    /// could be lost in a failover. Caches still answer completed records.
    fn refused(&self, what: &'static str) -> Result<(), GateError> {
        match self.primary.guard().refusal() {
            Some(refused) => {
                metrics::counter!("oncegate_sync_guard_refusals_total", "what" => what).increment(1);
                Err(GateError::Unavailable(refused))
            }
            None => Ok(()),
        }
    }

    /// One `Begin` transaction in the store.
    async fn begin_in_store(&self, req: &BeginRequest) -> Result<Held, GateError> {
        self.refused("effect_begin")?;
        let begin = req.to_store(self.instance.clone());
        let epoch = self.epoch();
        // Its own task: a caller that goes away mid-transaction ends the
        // wait, never the transaction.
        let store = self.store.clone();
        let attempt = begin.clone();
        let found = tokio::spawn(async move { store.effect_begin(&attempt).await })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "effect begin task failed");
                GateError::Internal
            })?;
        match found? {
            BeginOutcome::Acquired { attempt, .. } => Ok(Held::Answer(Begun::Acquired {
                token: begin.token,
                attempt,
            })),
            BeginOutcome::Completed(record) => {
                let record = Arc::new(record);
                self.fill(&req.id, record.clone(), epoch.as_ref()).await;
                Ok(Held::Answer(self.answered(req, record, Tier::Database)))
            }
            BeginOutcome::Held { expires_in } => Ok(Held::For(expires_in)),
            BeginOutcome::Mismatch => Err(GateError::RequestMismatch),
        }
    }

    /// A waiting round: the caches, then a read of the record; the lease is
    /// tried again only when the read shows it free (no write while held).
    async fn recheck(&self, req: &BeginRequest) -> Result<Held, GateError> {
        if let Some(answer) = self.cached(req).await? {
            return Ok(Held::Answer(answer));
        }
        let record = self.store.effect_get(&req.namespace, &req.key).await?;
        let now = time::OffsetDateTime::now_utc();
        match record.and_then(|r| r.lease_expires_at) {
            // Still held: wait on, whatever its request (the Begin that
            // follows decides, and audits, a mismatch).
            Some(until) if until > now => {
                let left = (until - now).try_into().unwrap_or(Duration::ZERO);
                Ok(Held::For(left))
            }
            _ => self.begin_in_store(req).await,
        }
    }

    /// `Complete`: commits the response under the lease; fills the caches
    /// and wakes this instance's waiters.
    pub async fn complete(&self, raw: &pb::CompleteRequest) -> Result<Arc<CompletedEffect>, GateError> {
        request::check_size("response", &raw.response)?;
        let f = Fenced::validate(&raw.namespace, &raw.idempotency_key, &raw.lease_token)?;
        self.refused("effect_complete")?;
        let epoch = self.epoch();
        let outcome = self
            .store
            .effect_complete(&f.fence(&self.instance), &raw.response)
            .await;
        let result = match outcome? {
            FencedOutcome::Done(record) => {
                let record = Arc::new(record);
                self.fill(&f.id, record.clone(), epoch.as_ref()).await;
                self.waiters.wake(&f.id);
                Ok(record)
            }
            FencedOutcome::LeaseLost => Err(GateError::LeaseLost),
            FencedOutcome::Conflict => Err(GateError::ResponseConflict),
        };
        count(
            &f.namespace,
            if result.is_ok() {
                "completed"
            } else {
                "complete_refused"
            },
        );
        log_fenced("complete", &f, result.as_ref().map(|_| ()));
        result
    }

    /// `Release`: gives the lease back; the next `Begin` acquires at once.
    pub async fn release(&self, raw: &pb::ReleaseRequest) -> Result<(), GateError> {
        let reason = request::validate_reason(&raw.reason)?;
        let f = Fenced::validate(&raw.namespace, &raw.idempotency_key, &raw.lease_token)?;
        let result = match self
            .store
            .effect_release(&f.fence(&self.instance), reason)
            .await?
        {
            FencedOutcome::Done(()) => {
                self.waiters.wake(&f.id);
                Ok(())
            }
            FencedOutcome::LeaseLost | FencedOutcome::Conflict => Err(GateError::LeaseLost),
        };
        count(
            &f.namespace,
            if result.is_ok() {
                "released"
            } else {
                "release_refused"
            },
        );
        log_fenced("release", &f, result.as_ref().map(|_| ()));
        result
    }

    /// Fills the caches with a completed record the store returned, tagged
    /// with the epoch read before the store was asked; nothing while suspended.
    async fn fill(&self, id: &str, record: Arc<CompletedEffect>, epoch: Option<&Epoch>) {
        let Some(epoch) = epoch else { return };
        let ttl = self.settings.ttl_for(&record.namespace);
        if let Some(l2) = &self.l2 {
            l2.store_value(&redis_key(id), encode(&record, &epoch.tag), ttl)
                .await;
        }
        self.l1
            .insert(
                id,
                record.clone(),
                self.l1_ttl(&record.namespace),
                epoch.generation,
            )
            .await;
    }

    fn l1_ttl(&self, namespace: &str) -> Duration {
        self.settings.ttl_for(namespace).min(self.settings.l1_ttl)
    }
}

/// What a round of `Begin` found.
enum Held {
    Answer(Begun),
    /// A live lease, expiring in this much unless completed or released.
    For(Duration),
}

fn count(namespace: &str, outcome: &'static str) {
    metrics::counter!("oncegate_effects_total", "namespace" => namespace.to_string(), "outcome" => outcome)
        .increment(1);
}

fn log_fenced(op: &'static str, f: &Fenced, result: Result<(), &GateError>) {
    let key = key_prefix(&f.key);
    match result {
        Ok(()) => tracing::info!(key, namespace = %f.namespace, op, "effect lease ended"),
        Err(e) => tracing::info!(key, namespace = %f.namespace, op, error = %e, "effect call refused"),
    }
}

/// Who waits on which record, so a `Complete` or `Release` on this
/// instance wakes exactly that record's waiters.
#[derive(Default)]
struct Waiters {
    by_record: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.by_record.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A handle on `id`'s wake-up; the entry goes when no waiter is left.
    fn subscribe<'a>(&'a self, id: &'a str) -> Subscription<'a> {
        let notify = self.lock().entry(id.to_string()).or_default().clone();
        Subscription {
            waiters: self,
            id,
            notify,
        }
    }

    fn wake(&self, id: &str) {
        if let Some(n) = self.lock().remove(id) {
            n.notify_waiters();
        }
    }
}

struct Subscription<'a> {
    waiters: &'a Waiters,
    id: &'a str,
    notify: Arc<Notify>,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        // Ours and the map's: no other waiter holds it.
        if map
            .get(self.id)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify) && Arc::strong_count(n) == 2)
        {
            map.remove(self.id);
        }
    }
}

/// The L2 key of a record: `fx|{namespace}|{key}`. No claim key contains
/// `|`, so effect records and claims never share a Redis key.
fn redis_key(id: &str) -> String {
    format!("fx|{id}")
}

const RECORD_TAG: &str = "e2|";

/// `e2|epoch|fingerprint|attempt|completed µs|namespace|key|base64 response`
/// (neither namespace nor key contains '|'); the epoch tag names the
/// primary that holds the record ([`crate::primary`]).
pub fn encode(r: &CompletedEffect, tag: &str) -> String {
    use base64::Engine;
    format!(
        "{RECORD_TAG}{tag}|{}|{}|{}|{}|{}|{}",
        r.fingerprint,
        r.attempt,
        crate::time_fmt::to_micros(r.completed_at),
        r.namespace,
        r.key,
        base64::engine::general_purpose::STANDARD.encode(&r.response)
    )
}

/// The inverse of [`encode`]: the epoch tag and the record; `None` for
/// anything malformed.
pub fn decode(v: &str) -> Option<(String, CompletedEffect)> {
    use base64::Engine;
    let mut parts = v.strip_prefix(RECORD_TAG)?.splitn(7, '|');
    let tag = parts.next()?.to_string();
    let fingerprint = parts.next()?.to_string();
    let attempt = parts.next()?.parse().ok()?;
    let completed_at = crate::time_fmt::from_micros(parts.next()?.parse().ok()?);
    let namespace = parts.next()?.to_string();
    let key = parts.next()?.to_string();
    let response = base64::engine::general_purpose::STANDARD
        .decode(parts.next()?)
        .ok()?;
    Some((
        tag,
        CompletedEffect {
            namespace,
            key,
            fingerprint,
            response,
            completed_at,
            attempt,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_l2() {
        let r = CompletedEffect {
            namespace: "payments.v1".into(),
            key: "k:1".into(),
            fingerprint: "f".repeat(64),
            response: vec![0, 1, b'|', 255],
            completed_at: crate::time_fmt::now_micros(),
            attempt: 2,
        };
        assert_eq!(decode(&encode(&r, "6a.3")), Some(("6a.3".to_string(), r)));
        assert_eq!(decode("r1|whatever"), None);
    }
}
