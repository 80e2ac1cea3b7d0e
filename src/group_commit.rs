//! Group commit: concurrent claims coalesced into one database transaction,
//! so one commit's fsync serves many deliveries.
//!
//! Claims are routed by a hash of their award to one of a few **lanes**
//! (`workers`), each with its own queue. Lanes never share an award, so
//! their batch transactions never wait on each other's award rows and
//! several commit at once (Postgres flushes their WAL together); within a
//! lane, claims of one award stay in arrival order. Across instances
//! awards still meet only in row locks.
//!
//! In a lane two runners take turns. The runner whose turn it is takes what
//! is waiting (up to `max_batch`; a small batch may linger up to `max_wait`
//! for more, while lingering on this lane gathers claims: [`Linger`]),
//! runs it as one batch through [`claim_batch`], and passes the turn on when
//! the batch's transaction has ended; the other runner meanwhile holds the
//! lane's next job and begins its transaction, and its batch takes
//! everything that arrived. Taking turns keeps a lane's batches large (one
//! batch in flight per lane holds its awards' rows until its commit, so a
//! second would mostly wait on them; docs/BENCHMARKS.md). A turn is waited
//! for at most [`TURN_WAIT`], so a batch stuck behind a row lock (until the
//! lock timeout) holds its lane up only that long: the next batch runs
//! beside it, and claims of the stuck batch's awards queue behind the same
//! row locks in the database, in order. A runner keeps the connection of
//! the transaction it committed for its next batch while batches follow
//! each other closely, and gives it back when its lane goes idle: each
//! runner holds one connection at most, as [`GroupCommitSettings::fit`]
//! counts. Every item is answered. Outcomes are exactly
//! those of one transaction per item: repeated keys are decided in order,
//! and if the batch fails for a reason other than the store being
//! unreachable, each item is retried in its own transaction so one bad item
//! cannot fail the others. A transaction that certainly aborted
//! (serialization failure, deadlock) is retried here, a few times.

use crate::error::StoreError;
use crate::store::{Backend, ClaimBatch, ClaimContext, ClaimOutcome, ClaimStore, KeptConnection, OpenClaim};
use crate::submission::Submission;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::Instrument;

/// Group commit settings.
#[derive(Debug, Clone, Copy)]
pub struct GroupCommitSettings {
    /// Most items per transaction; 1 disables coalescing.
    pub max_batch: usize,
    /// How long a small batch lingers for more items ([`Linger`]); zero
    /// never lingers.
    pub max_wait: Duration,
    /// Award lanes: batch transactions in flight at once (each lane also
    /// has a second runner, for a batch stuck behind a row lock).
    pub workers: usize,
}

impl GroupCommitSettings {
    /// The lanes that fit the store: one on SQLite (one writer: more lanes
    /// would only make smaller batches), and on Postgres at most
    /// `(pool_size - 1) / 2` (each lane holds up to two connections; the
    /// rest serve lookups, the relay and the audit writer). Logged when
    /// fewer than asked.
    pub fn fit(self, backend: Backend, pool_size: u32) -> Self {
        let most = match backend {
            Backend::Sqlite => 1,
            Backend::Postgres => (pool_size.saturating_sub(1) / 2).max(1) as usize,
        };
        if self.workers > most && self.max_batch > 1 {
            tracing::warn!(
                asked = self.workers,
                running = most,
                pool_size,
                backend = backend.as_str(),
                "fewer group-commit lanes than ONCEGATE_GROUP_COMMIT_WORKERS asks: each holds up to two of the pool's connections"
            );
        }
        Self {
            workers: self.workers.min(most),
            ..self
        }
    }
}

type Reply = oneshot::Sender<Result<ClaimOutcome, StoreError>>;

/// The claim path to the store.
pub struct Committer {
    store: Arc<dyn ClaimStore>,
    ctx: ClaimContext,
    /// One queue per lane; none when group commit is off.
    lanes: Vec<mpsc::Sender<(Submission, Reply)>>,
}

/// Runners per lane: the one whose batch is in flight, and the next, which
/// holds the lane's next job and runs beside a batch stuck past
/// [`TURN_WAIT`].
const RUNNERS_PER_LANE: usize = 2;

impl Committer {
    /// Starts the lanes' runners (none when `max_batch` is 1). They stop
    /// once every `Committer` clone is dropped and the queues are drained;
    /// join them with the returned set.
    pub fn start(
        store: Arc<dyn ClaimStore>,
        ctx: ClaimContext,
        settings: GroupCommitSettings,
    ) -> (Self, JoinSet<()>) {
        let mut runners = JoinSet::new();
        let mut lanes = Vec::new();
        if settings.max_batch > 1 {
            for _ in 0..settings.workers.max(1) {
                let (tx, rx) = mpsc::channel(settings.max_batch * RUNNERS_PER_LANE * 4);
                let rx = Arc::new(Mutex::new(Lane {
                    rx,
                    linger: Linger::default(),
                }));
                let turn = Turn::new();
                for _ in 0..RUNNERS_PER_LANE {
                    runners.spawn(supervise(
                        rx.clone(),
                        turn.clone(),
                        store.clone(),
                        ctx.clone(),
                        settings,
                    ));
                }
                lanes.push(tx);
            }
        }
        (Self { store, ctx, lanes }, runners)
    }

    /// Claims one submission, possibly sharing a transaction with others.
    pub async fn claim(&self, item: Submission) -> Result<ClaimOutcome, StoreError> {
        if self.lanes.is_empty() {
            let mut outcomes = claim_batch(&*self.store, std::slice::from_ref(&item), &self.ctx).await?;
            return Ok(outcomes.remove(0));
        }
        let lane = &self.lanes[lane_of(&item.award_id, self.lanes.len())];
        let (reply, answer) = oneshot::channel();
        lane.send((item, reply))
            .await
            .map_err(|_| StoreError::Unavailable("shutting down".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Other("group commit worker ended".into()))?
    }
}

/// The lane of an award: the same for every claim of it in this process.
fn lane_of(award_id: &str, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    award_id.hash(&mut hasher);
    (hasher.finish() % lanes as u64) as usize
}

type Receiver = mpsc::Receiver<(Submission, Reply)>;
type Queue = Arc<Mutex<Lane>>;

/// A lane's queue, and what its runners learned about lingering on it; the
/// runner holding it takes the next batch.
struct Lane {
    rx: Receiver,
    linger: Linger,
}

/// The longest a worker waits for the batch before its own to end (a normal
/// batch takes a few milliseconds; one behind a row lock waits for the lock
/// timeout).
pub const TURN_WAIT: Duration = Duration::from_millis(20);

/// Whose turn it is in a lane to take a batch: one permit.
#[derive(Clone)]
struct Turn(Arc<Semaphore>);

impl Turn {
    fn new() -> Self {
        Self(Arc::new(Semaphore::new(1)))
    }

    /// Ours, or `None` if the batch before has not let go within [`TURN_WAIT`].
    async fn wait(&self) -> Option<OwnedSemaphorePermit> {
        match tokio::time::timeout(TURN_WAIT, self.0.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => {
                metrics::counter!("oncegate_group_commit_turn_timeouts_total").increment(1);
                None
            }
        }
    }
}

/// Runs a worker, and a new one whenever it dies (a bug must not silently
/// take a worker away for the life of the process); counted and logged.
/// The dead worker's callers get an error and retry; nothing was committed
/// for them unless their transaction had committed.
async fn supervise(
    rx: Queue,
    turn: Turn,
    store: Arc<dyn ClaimStore>,
    ctx: ClaimContext,
    settings: GroupCommitSettings,
) {
    loop {
        let run = tokio::spawn(worker(
            rx.clone(),
            turn.clone(),
            store.clone(),
            ctx.clone(),
            settings,
        ));
        match run.await {
            Ok(()) => return,
            Err(e) => {
                metrics::counter!("oncegate_group_commit_worker_restarts_total").increment(1);
                tracing::error!(error = %e, "group commit worker died; starting a new one");
            }
        }
    }
}

/// How long a runner keeps the connection of its last batch transaction
/// for the next batch ([`KeptConnection`]); a lane idle longer gives it back
/// to the pool. Well below the second after which the Postgres pool tests
/// an idle connection before handing it out: a kept connection is used, as
/// such a pooled one would be, without a test.
const KEEP_CONNECTION_FOR: Duration = Duration::from_millis(100);

async fn worker(
    rx: Queue,
    turn: Turn,
    store: Arc<dyn ClaimStore>,
    ctx: ClaimContext,
    settings: GroupCommitSettings,
) {
    let mut kept: Option<KeptConnection> = None;
    loop {
        // Next in line (holding the queue) with a first job, keeping the
        // last batch's connection only while the next comes soon; then our
        // turn, beginning the transaction meanwhile; then the rest of the
        // batch.
        let next = match kept.take() {
            Some(conn) => match tokio::time::timeout(KEEP_CONNECTION_FOR, first_job(&rx)).await {
                Ok(next) => {
                    kept = Some(conn);
                    next
                }
                Err(_) => {
                    drop(conn);
                    first_job(&rx).await
                }
            },
            None => first_job(&rx).await,
        };
        let Some((mut queue, first)) = next else {
            return;
        };
        let (open, ours) = tokio::join!(store.begin_claim(kept.take()), turn.wait());
        let jobs = next_batch(first, &mut queue, settings).await;
        drop(queue);
        metrics::histogram!("oncegate_group_commit_batch_size").record(jobs.len() as f64);
        // The early BEGIN is the first attempt's: if it failed, that is the
        // first attempt's error (retried if retryable, like any other).
        kept = run_batch(&*store, &ctx, jobs, ours, open).await;
    }
}

/// The lane's queue, held, with the first job that came; `None` once the
/// queue is closed and drained. Cancel-safe: cut short, nothing is taken.
async fn first_job(rx: &Queue) -> Option<(tokio::sync::MutexGuard<'_, Lane>, (Submission, Reply))> {
    let mut queue = rx.lock().await;
    let first = queue.rx.recv().await?;
    Some((queue, first))
}

/// After the first job, takes what else is queued, lingering up to
/// `max_wait` for more while the batch is small and lingering has been
/// gathering claims ([`Linger`]).
async fn next_batch(
    first: (Submission, Reply),
    lane: &mut Lane,
    settings: GroupCommitSettings,
) -> Vec<(Submission, Reply)> {
    let mut jobs = vec![first];
    take_queued(&mut jobs, &mut lane.rx, settings.max_batch);
    let small = settings.max_batch.min(LINGER_BELOW);
    if jobs.len() < small && !settings.max_wait.is_zero() && lane.linger.now() {
        let before = jobs.len();
        let deadline = tokio::time::Instant::now() + settings.max_wait;
        while jobs.len() < small {
            match tokio::time::timeout_at(deadline, lane.rx.recv()).await {
                Ok(Some(job)) => jobs.push(job),
                _ => break,
            }
        }
        lane.linger.gathered(jobs.len() - before);
        take_queued(&mut jobs, &mut lane.rx, settings.max_batch);
    }
    jobs
}

/// Adds what is queued now to `jobs`, up to `max_batch`.
fn take_queued(jobs: &mut Vec<(Submission, Reply)>, rx: &mut Receiver, max_batch: usize) {
    while jobs.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// A batch this large when taken does not linger: under load the claims
/// that queued while the batch before ran already make a batch, and waiting
/// would only lengthen every client's round (docs/BENCHMARKS.md).
const LINGER_BELOW: usize = 8;

/// Whether a lane's next small batch lingers, learned from what its
/// lingering gathered. Lingering pays while claims arrive on their own, as
/// at a steady rate of deliveries; it does not when the only claims to
/// come are the answers' next ones (a few consumers, each waiting for its
/// answer before it sends again), and there a linger mostly waits out
/// `max_wait`. So a lane lingers while its lingers gather, on average, at
/// least [`Linger::PAYS`] claims each; otherwise it tries again every
/// [`Linger::RETRY_AFTER`] batches. (A linger can still gather the claims
/// the lane's other runner has just answered, so such consumers still pay
/// part of the wait: docs/BENCHMARKS.md.)
#[derive(Debug)]
struct Linger {
    /// Claims gathered per linger, an exponentially weighted mean (the
    /// last linger weighs [`Linger::WEIGHT`]).
    mean: f64,
    /// Small batches since the last linger.
    skipped: u32,
}

/// A new lane lingers, and learns from its first lingers.
impl Default for Linger {
    fn default() -> Self {
        Self {
            mean: Self::PAYS,
            skipped: 0,
        }
    }
}

impl Linger {
    const PAYS: f64 = 0.5;
    const WEIGHT: f64 = 0.25;
    const RETRY_AFTER: u32 = 32;

    /// Whether this small batch lingers (counted as skipped if not).
    fn now(&mut self) -> bool {
        if self.mean >= Self::PAYS || self.skipped >= Self::RETRY_AFTER {
            return true;
        }
        self.skipped += 1;
        false
    }

    /// A linger gathered `n` claims.
    fn gathered(&mut self, n: usize) {
        self.mean += Self::WEIGHT * (n as f64 - self.mean);
        self.skipped = 0;
    }
}

/// Runs one batch, passing the turn on once its transaction has ended
/// (committed, or failed: before its items are retried one by one).
/// Returns the connection of the transaction that committed the batch,
/// where the store keeps one.
async fn run_batch(
    store: &dyn ClaimStore,
    ctx: &ClaimContext,
    jobs: Vec<(Submission, Reply)>,
    turn: Option<OwnedSemaphorePermit>,
    open: Result<Option<OpenClaim>, StoreError>,
) -> Option<KeptConnection> {
    let (items, replies): (Vec<Submission>, Vec<Reply>) = jobs.into_iter().unzip();
    let batch = ClaimBatch::new(&items);
    let span = batch_span(store, &items);
    let result = claim_with_retry(store, &batch, ctx, open).instrument(span).await;
    drop(turn);
    match result {
        Ok((outcomes, kept)) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
            kept
        }
        // Unreachable, without a synchronous standby or refused by the
        // server (a grant missing, read-only): every item alone would fail
        // the same way.
        Err(err)
            if items.len() > 1
                && !matches!(
                    err,
                    StoreError::Unavailable(_) | StoreError::NoSyncStandby(_) | StoreError::Refused(_)
                ) =>
        {
            if crate::log_fold::GROUP_COMMIT.first(&err.to_string()) {
                tracing::warn!(error = %err, items = items.len(), "batch transaction failed; retrying items one by one");
            }
            metrics::counter!("oncegate_group_commit_fallbacks_total").increment(1);
            run_one_by_one(store, ctx, items, replies).await;
            None
        }
        Err(err) => {
            for reply in replies {
                let _ = reply.send(Err(err.clone()));
            }
            None
        }
    }
}

/// Each item in its own transaction, so one item (an overflowing total, an
/// award whose row is locked) fails alone. Items of one award run in order,
/// awards side by side: an award stuck behind a lock does not hold up the
/// others.
async fn run_one_by_one(
    store: &dyn ClaimStore,
    ctx: &ClaimContext,
    items: Vec<Submission>,
    replies: Vec<Reply>,
) {
    let mut by_award: HashMap<String, Vec<(Submission, Reply)>> = HashMap::new();
    for (item, reply) in items.into_iter().zip(replies) {
        by_award
            .entry(item.award_id.clone())
            .or_default()
            .push((item, reply));
    }
    let chains = by_award.into_values().map(|chain| async move {
        for (item, reply) in chain {
            let outcome = claim_batch(store, std::slice::from_ref(&item), ctx)
                .await
                .map(|mut o| o.remove(0));
            let _ = reply.send(outcome);
        }
    });
    futures::future::join_all(chains).await;
}

/// How many times a certainly-aborted transaction is retried.
const MAX_RETRIES: u32 = 4;

/// Claims a batch that may repeat keys in one transaction, retrying a
/// transaction that certainly aborted and restoring purged claims of late
/// redeliveries. Per-item outcomes exactly as if each item had run alone.
pub async fn claim_batch(
    store: &dyn ClaimStore,
    items: &[Submission],
    ctx: &ClaimContext,
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let batch = ClaimBatch::new(items);
    let (outcomes, _) = claim_with_retry(store, &batch, ctx, Ok(None))
        .instrument(batch_span(store, items))
        .await?;
    Ok(outcomes)
}

/// The span of one batch transaction (its retries included): a child of
/// the first item's trace, linked to every other item's.
fn batch_span(store: &dyn ClaimStore, items: &[Submission]) -> tracing::Span {
    let span = crate::trace_span!(
        "claim_batch",
        db.system = store.backend().as_str(),
        oncegate.batch_size = items.len()
    );
    if !span.is_disabled() {
        let mut traces = items.iter().filter_map(|s| s.traceparent.as_deref());
        crate::telemetry::set_parent(&span, traces.next());
        for linked in traces {
            crate::telemetry::add_link(&span, linked);
        }
    }
    span
}

/// The first attempt in the transaction `begun` early if there is one (or
/// with its `BEGIN`'s error); any retry in a new transaction. With the
/// outcomes, the connection of the first attempt's transaction, where the
/// store keeps one ([`ClaimStore::claim_batch_in`]).
async fn claim_with_retry(
    store: &dyn ClaimStore,
    batch: &ClaimBatch<'_>,
    ctx: &ClaimContext,
    begun: Result<Option<OpenClaim>, StoreError>,
) -> Result<(Vec<ClaimOutcome>, Option<KeptConnection>), StoreError> {
    let mut attempt = 0;
    let mut begun = Some(begun);
    loop {
        let tried = match begun.take() {
            Some(Ok(Some(open))) => store.claim_batch_in(open, batch, ctx).await,
            Some(Err(e)) => Err(e),
            Some(Ok(None)) | None => store.claim_batch(batch, ctx).await.map(|o| (o, None)),
        };
        match tried {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::*;
    use async_trait::async_trait;
    use uuid::Uuid;

    /// A store whose claim panics for award `PANIC` (a bug, injected) and
    /// claims anything else after `delay`, recording every batch's awards
    /// and the most batch transactions at once; nothing else is used here.
    #[derive(Default)]
    struct FakeStore {
        delay: Duration,
        batches: std::sync::Mutex<Vec<Vec<String>>>,
        in_flight: std::sync::atomic::AtomicUsize,
        most_in_flight: std::sync::atomic::AtomicUsize,
    }

    impl FakeStore {
        fn enter(&self, awards: Vec<String>) {
            use std::sync::atomic::Ordering::SeqCst;
            self.batches.lock().unwrap().push(awards);
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most_in_flight.fetch_max(now, SeqCst);
        }

        fn leave(&self) {
            self.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl StoreBase for FakeStore {
        fn backend(&self) -> Backend {
            Backend::Sqlite
        }
    }

    /// Nothing is ever stored apart from what a batch claims: no purged
    /// claim to restore, nothing to look up, audit rows dropped.
    #[async_trait]
    impl ClaimStore for FakeStore {
        async fn claim_batch(
            &self,
            batch: &ClaimBatch<'_>,
            _: &ClaimContext,
        ) -> Result<Vec<ClaimOutcome>, StoreError> {
            assert!(
                batch.items().iter().all(|s| s.award_id != "PANIC"),
                "injected bug"
            );
            let awards: Vec<String> = batch.items().iter().map(|s| s.award_id.clone()).collect();
            self.enter(awards);
            tokio::time::sleep(self.delay).await;
            self.leave();
            Ok(batch
                .items()
                .iter()
                .map(|s| {
                    ClaimOutcome::Claimed(StoredResult {
                        key: s.key.clone(),
                        fingerprint: s.fingerprint.clone(),
                        disbursement: Disbursement {
                            id: Uuid::now_v7(),
                            award_id: s.award_id.clone(),
                            amount_cents: s.amount_cents,
                            recorded_at: crate::time_fmt::now_micros(),
                            sequence: 1,
                        },
                    })
                })
                .collect())
        }
        async fn restore_claims(&self, _: &[String]) -> Result<(), StoreError> {
            Ok(())
        }
        async fn lookup(&self, _: &str) -> Result<Option<StoredResult>, StoreError> {
            Ok(None)
        }
        async fn append_audit(&self, _: &[AuditEntry]) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn item(award: &str) -> Submission {
        let raw = crate::pb::Submission {
            award_id: award.into(),
            submission_timestamp: "2026-11-29T10:00:00Z".into(),
            payload: vec![],
            amount_cents: 1,
            idempotency_key: None,
        };
        Submission::validate(&raw, Default::default()).unwrap()
    }

    #[tokio::test]
    async fn a_worker_that_dies_is_replaced() {
        let settings = GroupCommitSettings {
            max_batch: 8,
            max_wait: Duration::ZERO,
            workers: 1,
        };
        let ctx = ClaimContext { instance: "t".into() };
        let (committer, _workers) = Committer::start(Arc::new(FakeStore::default()), ctx, settings);
        let died = committer.claim(item("PANIC")).await;
        assert!(matches!(died, Err(StoreError::Other(_))), "{died:?}");
        let after = committer.claim(item("AWD-1")).await;
        assert!(
            matches!(after, Ok(ClaimOutcome::Claimed(_))),
            "the only worker was replaced: {after:?}"
        );
    }

    /// Claims of 24 awards through `lanes` lanes, 3 ms per batch
    /// transaction: the most batches in flight at once, and every batch's
    /// awards.
    async fn batches_with(lanes: usize) -> (usize, Vec<Vec<String>>) {
        use std::sync::atomic::Ordering::SeqCst;
        let store = Arc::new(FakeStore {
            delay: Duration::from_millis(3),
            ..Default::default()
        });
        let settings = GroupCommitSettings {
            max_batch: 16,
            max_wait: Duration::ZERO,
            workers: lanes,
        };
        let ctx = ClaimContext { instance: "t".into() };
        let (committer, _runners) = Committer::start(store.clone(), ctx, settings);
        let committer = Arc::new(committer);
        let claims = (0..256).map(|i| {
            let committer = committer.clone();
            tokio::spawn(async move { committer.claim(item(&format!("AWD-{}", i % 24))).await })
        });
        for claim in futures::future::join_all(claims).await {
            assert!(matches!(claim.unwrap(), Ok(ClaimOutcome::Claimed(_))));
        }
        let batches = std::mem::take(&mut *store.batches.lock().unwrap());
        (store.most_in_flight.load(SeqCst), batches)
    }

    /// (A batch past [`TURN_WAIT`] lets its lane's second runner start
    /// beside it, so a loaded machine may show two batches of one lane at
    /// once: bounded by the runners, never more.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lanes_commit_side_by_side_and_a_batch_holds_one_lanes_awards() {
        let (most, _) = batches_with(1).await;
        assert!(most <= RUNNERS_PER_LANE, "one lane: {most} batches at once");
        let (most, batches) = batches_with(4).await;
        assert!(
            most >= 2,
            "four lanes: batches side by side (at most {most} at once)"
        );
        assert!(
            most <= 4 * RUNNERS_PER_LANE,
            "at most two runners per lane: {most}"
        );
        for batch in &batches {
            let lane = lane_of(&batch[0], 4);
            assert!(
                batch.iter().all(|a| lane_of(a, 4) == lane),
                "a batch mixed lanes: {batch:?}"
            );
        }
        let lanes_used: std::collections::HashSet<usize> =
            batches.iter().map(|b| lane_of(&b[0], 4)).collect();
        assert_eq!(lanes_used.len(), 4, "24 awards reach every lane");
    }

    /// A lane of its own, with `queued` claims waiting behind the first.
    fn lane_with(queued: usize) -> (Lane, mpsc::Sender<(Submission, Reply)>, (Submission, Reply)) {
        let (tx, rx) = mpsc::channel(64);
        for i in 0..queued {
            tx.try_send((item(&format!("AWD-{i}")), oneshot::channel().0))
                .unwrap();
        }
        let lane = Lane {
            rx,
            linger: Linger::default(),
        };
        (lane, tx, (item("AWD-first"), oneshot::channel().0))
    }

    const LINGERING: GroupCommitSettings = GroupCommitSettings {
        max_batch: 128,
        max_wait: Duration::from_millis(10),
        workers: 1,
    };

    /// Lingering that gathers nothing (one consumer waiting for each
    /// answer) stops: a small batch then goes at once, and lingers again
    /// only every `RETRY_AFTER` batches.
    #[tokio::test(start_paused = true)]
    async fn a_lane_stops_lingering_when_lingering_gathers_nothing() {
        let (mut lane, _tx, _) = lane_with(0);
        let mut lingered = Vec::new();
        for _ in 0..(2 * Linger::RETRY_AFTER + 4) {
            let start = tokio::time::Instant::now();
            let jobs = next_batch((item("AWD-1"), oneshot::channel().0), &mut lane, LINGERING).await;
            assert_eq!(jobs.len(), 1);
            lingered.push(start.elapsed() == LINGERING.max_wait);
        }
        let lingers: Vec<usize> = lingered
            .iter()
            .enumerate()
            .filter(|(_, l)| **l)
            .map(|(i, _)| i)
            .collect();
        let retry = Linger::RETRY_AFTER as usize;
        assert_eq!(lingers, vec![0, retry + 1, 2 * retry + 2], "{lingered:?}");
    }

    /// Lingering that gathers claims (deliveries at a steady rate) goes on.
    #[tokio::test(start_paused = true)]
    async fn a_lane_lingers_while_lingering_gathers_claims() {
        let (mut lane, tx, _) = lane_with(0);
        for round in 0..8 {
            let feed = tx.clone();
            let arrivals = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(3)).await;
                feed.send((item("AWD-2"), oneshot::channel().0)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(3)).await;
                feed.send((item("AWD-3"), oneshot::channel().0)).await.unwrap();
            });
            let start = tokio::time::Instant::now();
            let jobs = next_batch((item("AWD-1"), oneshot::channel().0), &mut lane, LINGERING).await;
            arrivals.await.unwrap();
            assert_eq!(jobs.len(), 3, "round {round}: both arrivals gathered");
            assert_eq!(start.elapsed(), LINGERING.max_wait, "round {round}");
        }
    }

    /// A batch that is large when taken (under load) does not linger, and
    /// a linger ends once the batch is no longer small.
    #[tokio::test(start_paused = true)]
    async fn a_large_batch_does_not_linger() {
        let (mut lane, _tx, first) = lane_with(LINGER_BELOW + 2);
        let start = tokio::time::Instant::now();
        let jobs = next_batch(first, &mut lane, LINGERING).await;
        assert_eq!(jobs.len(), LINGER_BELOW + 3);
        assert_eq!(start.elapsed(), Duration::ZERO);

        let (mut lane, tx, first) = lane_with(LINGER_BELOW - 2);
        let feed = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            tx.send((item("AWD-late"), oneshot::channel().0)).await.unwrap();
            tx
        });
        let start = tokio::time::Instant::now();
        let jobs = next_batch(first, &mut lane, LINGERING).await;
        assert_eq!(jobs.len(), LINGER_BELOW);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(3),
            "ended as the batch filled"
        );
        drop(feed.await.unwrap());
    }

    /// Without `max_wait` nothing lingers, whatever the batch.
    #[tokio::test(start_paused = true)]
    async fn no_max_wait_no_linger() {
        let (mut lane, _tx, first) = lane_with(1);
        let settings = GroupCommitSettings {
            max_wait: Duration::ZERO,
            ..LINGERING
        };
        let start = tokio::time::Instant::now();
        assert_eq!(next_batch(first, &mut lane, settings).await.len(), 2);
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[test]
    fn an_award_keeps_its_lane() {
        for lanes in 1..8 {
            for award in ["AWD-1", "AWD-2", "NSF-2231-0001", ""] {
                let lane = lane_of(award, lanes);
                assert!(lane < lanes);
                assert_eq!(lane, lane_of(award, lanes));
            }
        }
        let used: std::collections::HashSet<usize> =
            (0..64).map(|i| lane_of(&format!("AWD-{i}"), 4)).collect();
        assert_eq!(used.len(), 4, "64 awards spread over every lane");
    }
}
