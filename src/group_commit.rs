//! Group commit: concurrent claims coalesced into one database transaction,
//! so one commit's fsync serves many deliveries.
//!
//! A few workers share one queue. Each takes what is waiting (up to
//! `max_batch`, optionally lingering `max_wait` for more), runs it as one
//! batch through [`claim_batch`], and answers every item. Outcomes are
//! exactly those of one transaction per item: repeated keys are decided in
//! order, and if the batch fails for a reason other than the store being
//! unreachable, each item is retried in its own transaction so one bad item
//! cannot fail the others. A transaction that certainly aborted
//! (serialization failure, deadlock) is retried here, a few times.

use crate::error::StoreError;
use crate::store::{ClaimContext, ClaimOutcome, Store};
use crate::submission::Submission;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinSet;

/// Group commit settings.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitSettings {
    /// Most items per transaction; 1 disables coalescing.
    pub max_batch: usize,
    /// How long a worker lingers for more items once it has one.
    pub max_wait: Duration,
    /// Concurrent batch transactions.
    pub workers: usize,
}

type Reply = oneshot::Sender<Result<ClaimOutcome, StoreError>>;

/// The claim path to the store.
pub struct Committer {
    store: Arc<dyn Store>,
    ctx: ClaimContext,
    queue: Option<mpsc::Sender<(Submission, Reply)>>,
}

impl Committer {
    /// Starts the workers (none when `max_batch` is 1). They stop once every
    /// `Committer` clone is dropped and the queue is drained; join them with
    /// the returned set.
    pub fn start(
        store: Arc<dyn Store>,
        ctx: ClaimContext,
        settings: GroupCommitSettings,
    ) -> (Self, JoinSet<()>) {
        let mut workers = JoinSet::new();
        if settings.max_batch <= 1 {
            return (
                Self {
                    store,
                    ctx,
                    queue: None,
                },
                workers,
            );
        }
        let (tx, rx) = mpsc::channel(settings.max_batch * settings.workers.max(1) * 4);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..settings.workers.max(1) {
            workers.spawn(worker(rx.clone(), store.clone(), ctx.clone(), settings));
        }
        (
            Self {
                store,
                ctx,
                queue: Some(tx),
            },
            workers,
        )
    }

    /// Claims one submission, possibly sharing a transaction with others.
    pub async fn claim(&self, item: Submission) -> Result<ClaimOutcome, StoreError> {
        let Some(queue) = &self.queue else {
            let mut outcomes = claim_batch(&*self.store, std::slice::from_ref(&item), &self.ctx).await?;
            return Ok(outcomes.remove(0));
        };
        let (reply, answer) = oneshot::channel();
        queue
            .send((item, reply))
            .await
            .map_err(|_| StoreError::Unavailable("shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Other("group commit worker ended".into()))?
    }
}

async fn worker(
    rx: Arc<Mutex<mpsc::Receiver<(Submission, Reply)>>>,
    store: Arc<dyn Store>,
    ctx: ClaimContext,
    settings: GroupCommitSettings,
) {
    loop {
        let Some(jobs) = next_batch(&rx, settings).await else {
            return;
        };
        metrics::histogram!("oncegate_group_commit_batch_size").record(jobs.len() as f64);
        run_batch(&*store, &ctx, jobs).await;
    }
}

/// Waits for one job, then takes what else is queued. `None` once the queue
/// is closed and empty.
async fn next_batch(
    rx: &Mutex<mpsc::Receiver<(Submission, Reply)>>,
    settings: GroupCommitSettings,
) -> Option<Vec<(Submission, Reply)>> {
    let mut rx = rx.lock().await;
    let mut jobs = vec![rx.recv().await?];
    while jobs.len() < settings.max_batch {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
    if jobs.len() < settings.max_batch && !settings.max_wait.is_zero() {
        let deadline = tokio::time::Instant::now() + settings.max_wait;
        while jobs.len() < settings.max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) => jobs.push(job),
                _ => break,
            }
        }
    }
    Some(jobs)
}

async fn run_batch(store: &dyn Store, ctx: &ClaimContext, jobs: Vec<(Submission, Reply)>) {
    let (items, replies): (Vec<Submission>, Vec<Reply>) = jobs.into_iter().unzip();
    match claim_batch(store, &items, ctx).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(err) if items.len() > 1 && !matches!(err, StoreError::Unavailable(_)) => {
            tracing::warn!(error = %err, items = items.len(), "batch transaction failed; retrying items one by one");
            metrics::counter!("oncegate_group_commit_fallbacks_total").increment(1);
            for (item, reply) in items.into_iter().zip(replies) {
                let outcome = claim_batch(store, std::slice::from_ref(&item), ctx)
                    .await
                    .map(|mut o| o.remove(0));
                let _ = reply.send(outcome);
            }
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
        }
    }
}

/// How many times a certainly-aborted transaction is retried.
const MAX_RETRIES: u32 = 4;

/// Claims a batch that may repeat keys: per-item outcomes exactly as if each
/// item had run alone, in order. The first of repeated keys is decided by the
/// store; the others are duplicates of it (or key reuse, by fingerprint).
pub async fn claim_batch(
    store: &dyn Store,
    items: &[Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let mut first_index: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    let mut unique: Vec<&Submission> = Vec::with_capacity(items.len());
    let mut slot = Vec::with_capacity(items.len());
    for item in items {
        let idx = *first_index.entry(item.key.as_str()).or_insert_with(|| {
            unique.push(item);
            unique.len() - 1
        });
        slot.push(idx);
    }
    let decided = claim_unique_with_retry(store, &unique, ctx).await?;
    let mut seen = vec![false; unique.len()];
    Ok(items
        .iter()
        .zip(slot)
        .map(|(item, idx)| {
            if !seen[idx] {
                seen[idx] = true;
                return decided[idx].clone();
            }
            let stored = match &decided[idx] {
                ClaimOutcome::Claimed(r) | ClaimOutcome::Duplicate(r) | ClaimOutcome::KeyReused(r) => r,
            };
            stored.clone().outcome_for(item)
        })
        .collect())
}

async fn claim_unique_with_retry(
    store: &dyn Store,
    unique: &[&Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let mut attempt = 0;
    loop {
        match store.claim_unique(unique, ctx).await {
            Err(StoreError::Retryable(msg)) if attempt < MAX_RETRIES => {
                attempt += 1;
                metrics::counter!("oncegate_db_transactions_total", "result" => "retry").increment(1);
                tracing::debug!(attempt, error = %msg, "claim transaction aborted, retrying");
                tokio::time::sleep(Duration::from_millis(2u64 << attempt)).await;
            }
            Err(StoreError::LateRedelivery(keys)) if attempt < MAX_RETRIES => {
                attempt += 1;
                metrics::counter!("oncegate_late_redeliveries_total").increment(keys.len() as u64);
                tracing::warn!(
                    count = keys.len(),
                    "redelivery of purged claims; restoring them from the ledger"
                );
                store.restore_claims(&keys).await?;
            }
            Err(err) => {
                metrics::counter!("oncegate_db_transactions_total", "result" => "abort").increment(1);
                return Err(err);
            }
            Ok(outcomes) => {
                metrics::counter!("oncegate_db_transactions_total", "result" => "commit").increment(1);
                return Ok(outcomes);
            }
        }
    }
}
