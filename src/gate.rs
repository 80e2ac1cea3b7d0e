//! The tier decision: L1 (moka) → L2 (Redis) → the authoritative store.
//!
//! # The invariant (DESIGN §2)
//! A tier may answer `DUPLICATE` only when it holds the stored result of a
//! committed claim. L1 and L2 hold nothing else: L1 is filled only with
//! results returned by a commit or by another tier's duplicate answer, and L2
//! holds either a committed result or an in-flight token, and a token is
//! never read as a duplicate. Every cached answer is checked against the
//! submission's fingerprint, so a reused producer key is refused at every
//! tier. Everything not answered from a cache goes to the store, whose unique
//! claim decides.
//!
//! # Across a failover (DESIGN §7.2)
//! Each decision first asks the store's [`PrimaryWatch`] for the epoch the
//! caches may answer in. None (the primary's identity is unconfirmed: a
//! probe failed or nothing has connected yet): no cache is read or filled,
//! the store decides or the caller gets `UNAVAILABLE`. Otherwise L1 answers
//! only entries filled in that epoch's generation and L2 only results
//! tagged with it; results are filled with the epoch read *before* the
//! store was asked, so a result committed on an old primary is never
//! tagged with a new one.
//!
//! While the synchronous-standby guard refuses claims (no standby confirms
//! commits, [`crate::primary::guard`]) L1 and L2 still answer what they
//! hold — only confirmed results are ever filled — and everything else gets
//! `UNAVAILABLE` naming what is missing, without a transaction.

use crate::audit::AuditQueue;
use crate::cache::LocalCache;
use crate::error::{GateError, StoreError};
use crate::group_commit::Committer;
use crate::key::key_prefix;
use crate::pb;
use crate::primary::{Epoch, PrimaryWatch};
use crate::redis_tier::{Lease, RedisTier};
pub use crate::store::Tier;
use crate::store::{AuditDecision, AuditEntry, ClaimOutcome, ClaimStore, StoredResult};
use crate::submission::{Limits, Submission};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::Instrument;

/// A decision: the outcome, the stored result and who decided.
#[derive(Debug, Clone)]
pub struct Decided {
    pub claimed: bool,
    pub result: Arc<StoredResult>,
    pub tier: Tier,
}

pub struct Gate {
    store: Arc<dyn ClaimStore>,
    l1: LocalCache,
    l2: Option<Arc<RedisTier>>,
    committer: Committer,
    audit: AuditQueue,
    limits: Limits,
    instance: Arc<str>,
    primary: Arc<PrimaryWatch>,
    /// The generation L1 was last used in: on a change L1 is emptied.
    l1_generation: AtomicU64,
}

impl Gate {
    pub fn new(
        store: Arc<dyn ClaimStore>,
        l1: LocalCache,
        l2: Option<Arc<RedisTier>>,
        committer: Committer,
        audit: AuditQueue,
        limits: Limits,
        instance: Arc<str>,
    ) -> Self {
        Self {
            primary: store.primary(),
            l1_generation: AtomicU64::new(0),
            store,
            l1,
            l2,
            committer,
            audit,
            limits,
            instance,
        }
    }

    /// Decides one delivery. `caller_traceparent` is the caller's W3C
    /// trace context as received: the outbox event carries it when traces
    /// are not exported (else the current span's).
    pub async fn submit(
        &self,
        raw: &pb::Submission,
        caller_traceparent: Option<&str>,
    ) -> Result<Decided, GateError> {
        let mut submission = self.validate(raw)?;
        submission.traceparent = caller_traceparent.map(str::to_owned);
        let decided = self.decide(&submission).await.and_then(Answer::into_result);
        log_decision(&submission, &decided);
        decided
    }

    /// Decides many deliveries: per-item results in order. Repeated keys are
    /// decided once; the first is `CLAIMED` (if fresh), each later one is
    /// answered by the rule of [`StoredResult::matches`] against the first's
    /// stored result — a duplicate, or a refused key reuse — and audited.
    pub async fn submit_batch(
        &self,
        raws: &[pb::Submission],
        caller_traceparent: Option<&str>,
    ) -> Vec<Result<Decided, GateError>> {
        let validated: Vec<Result<Submission, GateError>> = raws
            .iter()
            .map(|r| {
                self.validate(r).map(|mut s| {
                    s.traceparent = caller_traceparent.map(str::to_owned);
                    s
                })
            })
            .collect();
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut unique: Vec<&Submission> = Vec::new();
        for s in validated.iter().flatten() {
            first.entry(s.key.as_str()).or_insert_with(|| {
                unique.push(s);
                unique.len() - 1
            });
        }
        let answers = futures::future::join_all(unique.iter().map(|s| self.decide(s))).await;
        let mut answered = vec![false; answers.len()];
        let mut results = Vec::with_capacity(validated.len());
        for v in &validated {
            let s = match v {
                Ok(s) => s,
                Err(e) => {
                    results.push(Err(clone_error(e)));
                    continue;
                }
            };
            let idx = first[s.key.as_str()];
            let result = if std::mem::replace(&mut answered[idx], true) {
                self.repeat_in_batch(s, &answers[idx]).await
            } else {
                clone_answer(&answers[idx]).and_then(Answer::into_result)
            };
            log_decision(s, &result);
            results.push(result);
        }
        results
    }

    /// The stored result for a key, from the nearest tier that has it.
    pub async fn lookup(&self, key: &str) -> Result<Option<Decided>, GateError> {
        crate::submission::validate_lookup_key(key)?;
        if let Some(epoch) = self.epoch() {
            return Box::pin(self.lookup_cached(key, &epoch)).await;
        }
        self.lookup_in_store(key).await
    }

    async fn lookup_cached(&self, key: &str, epoch: &Epoch) -> Result<Option<Decided>, GateError> {
        if let Some(r) = self.l1.get(key, epoch.generation).await {
            return Ok(Some(Decided {
                claimed: false,
                result: r,
                tier: Tier::LocalCache,
            }));
        }
        if let Some(r) = match &self.l2 {
            Some(l2) => l2.get(key, &epoch.tag).await,
            None => None,
        } {
            return Ok(Some(Decided {
                claimed: false,
                result: Arc::new(r),
                tier: Tier::Redis,
            }));
        }
        self.lookup_in_store(key).await
    }

    async fn lookup_in_store(&self, key: &str) -> Result<Option<Decided>, GateError> {
        Ok(self.store.lookup(key).await?.map(|r| Decided {
            claimed: false,
            result: Arc::new(r),
            tier: Tier::Database,
        }))
    }

    fn validate(&self, raw: &pb::Submission) -> Result<Submission, GateError> {
        Submission::validate(raw, self.limits).inspect_err(|e| {
            metrics::counter!("oncegate_rejections_total", "reason" => e.label()).increment(1);
            // Invalid input is not audited: nothing is written for it.
            tracing::info!(award_id = %printable(&raw.award_id), error = %e, "submission rejected");
        })
    }

    /// The epoch the caches may answer in (emptying L1 when it moved), or
    /// `None` while the primary's identity is unconfirmed (counted).
    fn epoch(&self) -> Option<Epoch> {
        let Some(epoch) = self.primary.trusted() else {
            metrics::counter!("oncegate_tier_lookups_total", "tier" => "LOCAL_CACHE", "result" => "suspended")
                .increment(1);
            return None;
        };
        if self.l1_generation.swap(epoch.generation, Ordering::Relaxed) != epoch.generation {
            self.l1.clear();
        }
        Some(epoch)
    }

    async fn decide(&self, s: &Submission) -> Result<Answer, GateError> {
        let Some(epoch) = self.epoch() else {
            return Box::pin(self.decide_below_l1(s, None)).await;
        };
        let span = crate::trace_span!("l1.get", oncegate.hit = tracing::field::Empty);
        let hit = self
            .l1
            .get(&s.key, epoch.generation)
            .instrument(span.clone())
            .await;
        span.record("oncegate.hit", hit.is_some());
        drop(span);
        if let Some(r) = hit {
            metrics::counter!("oncegate_tier_lookups_total", "tier" => "LOCAL_CACHE", "result" => "hit")
                .increment(1);
            return self.cached_answer(s, r, Tier::LocalCache).await;
        }
        metrics::counter!("oncegate_tier_lookups_total", "tier" => "LOCAL_CACHE", "result" => "miss")
            .increment(1);
        // Boxed: the L2 and store round trips make a future of several KiB,
        // which every layer above (the deadline task, the gRPC handler)
        // would otherwise carry and copy even for an L1 hit.
        Box::pin(self.decide_below_l1(s, Some(epoch))).await
    }

    /// L2 (unless suspended: `epoch` is `None`), then the store.
    async fn decide_below_l1(&self, s: &Submission, epoch: Option<Epoch>) -> Result<Answer, GateError> {
        if let Some(refused) = self.primary.guard().refusal() {
            return self.refused_unless_cached(s, epoch, refused).await;
        }
        let lease = match (&self.l2, &epoch) {
            (Some(l2), Some(epoch)) => match leased(l2, &s.key, &epoch.tag).await {
                Lease::Found(r) => {
                    let r = Arc::new(r);
                    self.l1.insert(r.clone(), epoch.generation).await;
                    return self.cached_answer(s, r, Tier::Redis).await;
                }
                Lease::Held(token) => Some(token),
                Lease::Foreign | Lease::Skipped => None,
            },
            _ => None,
        };
        let mut item = s.clone();
        item.traceparent = crate::telemetry::for_outbox(s.traceparent.as_deref());
        let wait = crate::trace_span!("group_commit.wait");
        let (claimed, result) = match self.committer.claim(item).instrument(wait).await {
            Ok(ClaimOutcome::Claimed(r)) => (true, Arc::new(r)),
            Ok(ClaimOutcome::Duplicate(r)) => (false, Arc::new(r)),
            Ok(ClaimOutcome::KeyReused(r)) => {
                // Audited by the store. Still a committed result: worth
                // caching for the real owner.
                self.release(s, lease).await;
                let stored = Arc::new(r);
                self.fill(stored.clone(), epoch.as_ref()).await;
                return Ok(Answer::Refused {
                    stored,
                    tier: Tier::Database,
                });
            }
            Err(e) => {
                self.claim_failed(s, &e);
                self.release(s, lease).await;
                return Err(e.into());
            }
        };
        self.primary.claims_taken();
        self.fill(result.clone(), epoch.as_ref()).await;
        Ok(Answer::Decided(Decided {
            claimed,
            result,
            tier: Tier::Database,
        }))
    }

    /// A claim the store failed: logged (folded, one line per cause and
    /// interval), and what it says of the store. A refusal from a server
    /// that answered (a grant missing, read-only) is an outage the health
    /// shows, not a lost connection: the caches go on answering what is
    /// confirmed. A lost connection may be a failover: no cache answers
    /// until a connection confirms who the primary is.
    fn claim_failed(&self, s: &Submission, e: &StoreError) {
        if crate::log_fold::CLAIMS.first(&e.to_string()) {
            tracing::warn!(key = key_prefix(&s.key), error = %e, "claim failed");
        }
        match e {
            StoreError::Refused(refusal) => self.primary.refused(refusal),
            StoreError::Unavailable(_) => self
                .primary
                .connection_lost("a claim lost its connection to the store"),
            _ => {}
        }
    }

    /// No synchronous standby confirms commits (the guard, DESIGN §7.3): no
    /// claim transaction is begun, and only a result L2 already holds — a
    /// claim committed and confirmed before — is answered.
    async fn refused_unless_cached(
        &self,
        s: &Submission,
        epoch: Option<Epoch>,
        refused: String,
    ) -> Result<Answer, GateError> {
        if let (Some(l2), Some(epoch)) = (&self.l2, &epoch)
            && let Some(r) = l2.get(&s.key, &epoch.tag).await
        {
            let r = Arc::new(r);
            self.l1.insert(r.clone(), epoch.generation).await;
            return self.cached_answer(s, r, Tier::Redis).await;
        }
        metrics::counter!("oncegate_sync_guard_refusals_total", "what" => "claim").increment(1);
        Err(GateError::Unavailable(refused))
    }

    /// Fills the caches with a result the store returned, tagged with the
    /// epoch read before the store was asked; nothing while suspended.
    async fn fill(&self, result: Arc<StoredResult>, epoch: Option<&Epoch>) {
        let Some(epoch) = epoch else { return };
        if let Some(l2) = &self.l2 {
            let span = crate::trace_span!("l2.fill", db.system = "redis");
            l2.store_result(&result, &epoch.tag).instrument(span).await;
        }
        self.l1.insert(result, epoch.generation).await;
    }

    async fn release(&self, s: &Submission, lease: Option<String>) {
        if let (Some(l2), Some(token)) = (&self.l2, lease) {
            l2.release(&s.key, &token).await;
        }
    }

    /// A committed result found for `s` at `tier` without a transaction of
    /// its own (a cache hit, or an earlier item of the same batch): a
    /// duplicate if the fingerprint matches, else a refused key reuse.
    /// Audited either way, and answered only once its audit row is kept
    /// ([`AuditQueue::keep`]: spooled, or written through when the spool
    /// cannot take it); else `UNAVAILABLE`.
    async fn cached_answer(
        &self,
        s: &Submission,
        stored: Arc<StoredResult>,
        tier: Tier,
    ) -> Result<Answer, GateError> {
        let answer = if stored.matches(s) {
            Answer::Decided(Decided {
                claimed: false,
                result: stored,
                tier,
            })
        } else {
            Answer::Refused { stored, tier }
        };
        let decision = match answer {
            Answer::Decided(_) => AuditDecision::Duplicate,
            Answer::Refused { .. } => AuditDecision::Rejected,
        };
        self.audit_kept(s, decision, tier).await?;
        Ok(answer)
    }

    /// A later item of a batch with the key of an earlier one.
    async fn repeat_in_batch(
        &self,
        s: &Submission,
        first: &Result<Answer, GateError>,
    ) -> Result<Decided, GateError> {
        let (stored, tier) = match first {
            Ok(Answer::Decided(d)) => (d.result.clone(), d.tier),
            Ok(Answer::Refused { stored, tier }) => (stored.clone(), *tier),
            Err(e) => return Err(clone_error(e)),
        };
        self.cached_answer(s, stored, tier).await?.into_result()
    }

    async fn audit_kept(&self, s: &Submission, decision: AuditDecision, tier: Tier) -> Result<(), GateError> {
        let kept = self.audit.keep(AuditEntry {
            at: crate::time_fmt::now_micros(),
            decision,
            tier: Some(tier),
            key_prefix: key_prefix(&s.key).to_string(),
            award_id: s.award_id.clone(),
            instance: self.instance.clone(),
            payload_changed: false,
            detail: (decision == AuditDecision::Rejected)
                .then(|| "idempotency key reused with a different submission".to_string()),
        });
        kept.await.map_err(|e| {
            if crate::log_fold::CLAIMS.first(&e.to_string()) {
                tracing::warn!(key = key_prefix(&s.key), error = %e, "an answer's audit row could not be kept: neither the spool nor the store took it");
            }
            GateError::Unavailable(
                "the decision's audit row cannot be kept (the audit spool is full and the store did not take it); retry"
                    .into(),
            )
        })
    }
}

/// An L2 lease (`SET NX`) in its span, with its answer as an attribute.
async fn leased(l2: &RedisTier, key: &str, tag: &str) -> Lease {
    let span = crate::trace_span!(
        "l2.lease",
        db.system = "redis",
        oncegate.lease = tracing::field::Empty
    );
    let lease = l2.lease(key, tag).instrument(span.clone()).await;
    span.record(
        "oncegate.lease",
        match &lease {
            Lease::Found(_) => "found",
            Lease::Held(_) => "held",
            Lease::Foreign => "foreign",
            Lease::Skipped => "skipped",
        },
    );
    lease
}

/// How the tiers answered one submission.
#[derive(Debug, Clone)]
enum Answer {
    Decided(Decided),
    /// The key is committed for another submission: refused, with the
    /// stored result (a later item of the batch may be its true duplicate).
    Refused {
        stored: Arc<StoredResult>,
        tier: Tier,
    },
}

impl Answer {
    fn into_result(self) -> Result<Decided, GateError> {
        match self {
            Self::Decided(d) => Ok(d),
            Self::Refused { .. } => Err(GateError::KeyReused),
        }
    }
}

fn clone_answer(a: &Result<Answer, GateError>) -> Result<Answer, GateError> {
    match a {
        Ok(a) => Ok(a.clone()),
        Err(e) => Err(clone_error(e)),
    }
}

fn clone_error(e: &GateError) -> GateError {
    match e {
        GateError::InvalidArgument(m) => GateError::InvalidArgument(m.clone()),
        GateError::KeyReused => GateError::KeyReused,
        GateError::RequestMismatch => GateError::RequestMismatch,
        GateError::LeaseLost => GateError::LeaseLost,
        GateError::ResponseConflict => GateError::ResponseConflict,
        GateError::Unavailable(m) => GateError::Unavailable(m.clone()),
        GateError::Overloaded(m) => GateError::Overloaded(m.clone()),
        GateError::TooLarge(m) => GateError::TooLarge(m.clone()),
        GateError::DeadlineExceeded => GateError::DeadlineExceeded,
        GateError::Internal => GateError::Internal,
    }
}

/// One INFO line per decision: key prefix and award id, never the payload.
fn log_decision(s: &Submission, decided: &Result<Decided, GateError>) {
    match decided {
        Ok(d) => {
            let outcome = if d.claimed { "CLAIMED" } else { "DUPLICATE" };
            metrics::counter!("oncegate_decisions_total", "outcome" => outcome, "tier" => d.tier.as_str())
                .increment(1);
            // Display (`%`), not Debug: hex and enum names need no quoting,
            // and escaping them char by char was a fifth of the line's cost.
            tracing::info!(key = %key_prefix(&s.key), award_id = %s.award_id, outcome = %outcome, tier = %d.tier.as_str(), sequence = d.result.disbursement.sequence, "decision");
        }
        Err(e) => {
            metrics::counter!("oncegate_rejections_total", "reason" => e.label()).increment(1);
            tracing::info!(key = key_prefix(&s.key), award_id = %s.award_id, error = %e, "submission not decided");
        }
    }
}

/// An award id made safe for a log line (it is unvalidated here).
fn printable(s: &str) -> String {
    s.chars().take(128).filter(|c| !c.is_control()).collect()
}
