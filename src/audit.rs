//! Audit rows written off the hot path: duplicates answered by a cache tier,
//! rejections decided before the store, and effect `Begin`s answered with a
//! completed record by any tier (the store's read answers them without a
//! write of its own). (Processed submissions and duplicates decided by the
//! database are audited inside the claim transaction; an effect's lease
//! transitions inside the effect's.) A bounded queue, flushed in batches on
//! an interval and on shutdown; anything that does not fit is counted, never
//! blocks a request. With a spool ([`spool`], `ONCEGATE_AUDIT_SPOOL_DIR`)
//! every queued row is also appended to a local file first, so a process
//! kill loses none of them: the next start writes them.

pub mod spool;

use crate::error::StoreError;
use crate::shutdown::Stop;
use crate::store::{AuditEntry, ClaimStore};
use spool::{Replayed, Spool};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Audit queue settings.
#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Rows the queue holds at most; past it rows are dropped (counted).
    pub queue: usize,
    /// Rows per write.
    pub batch: usize,
    pub flush_interval: Duration,
    /// Where queued rows are spooled to survive a process kill (none: in
    /// memory only).
    pub spool_dir: Option<std::path::PathBuf>,
}

/// The request side: never blocks ([`record`](AuditQueue::record)), or
/// waits for the store only when the spool cannot keep a row
/// ([`keep`](AuditQueue::keep)).
#[derive(Clone)]
pub struct AuditQueue {
    tx: mpsc::Sender<Numbered>,
    spool: Option<Arc<Spool>>,
    store: Arc<dyn ClaimStore>,
}

/// A row and its spool number (0 without a spool).
type Numbered = (u64, AuditEntry);

impl AuditQueue {
    /// A queue holding at most `capacity` rows, and its flusher.
    pub fn new(
        capacity: usize,
        store: Arc<dyn ClaimStore>,
        batch: usize,
        interval: Duration,
    ) -> (Self, AuditFlusher) {
        Self::spooled(capacity, store, batch, interval, None)
    }

    /// [`Self::new`] with a spool and the rows it held at start, written
    /// before anything new.
    pub fn spooled(
        capacity: usize,
        store: Arc<dyn ClaimStore>,
        batch: usize,
        interval: Duration,
        spool: Option<(Arc<Spool>, Replayed)>,
    ) -> (Self, AuditFlusher) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        // Exported from the start (the spool alert and dashboard read them).
        metrics::counter!("oncegate_audit_spool_errors_total").increment(0);
        metrics::counter!("oncegate_audit_spool_write_through_total").increment(0);
        let (spool, pending) = match spool {
            Some((spool, replayed)) => (Some(spool), replayed),
            None => (None, Vec::new()),
        };
        if !pending.is_empty() {
            metrics::counter!("oncegate_audit_spool_replayed_total").increment(pending.len() as u64);
            tracing::info!(
                rows = pending.len(),
                "audit rows left in the spool by the last run will be written"
            );
        }
        let flusher = AuditFlusher {
            rx,
            store: store.clone(),
            batch: batch.max(1),
            interval,
            pending,
            spool: spool.clone(),
        };
        (Self { tx, spool, store }, flusher)
    }

    /// Queues a row (spooling it first, when a spool is set); counts it as
    /// dropped when the queue is full or closed. A row the spool cannot
    /// take (a full disk) is queued in memory only: a kill before the next
    /// flush loses it. Where an answer waits on its row, use
    /// [`keep`](Self::keep).
    pub fn record(&self, entry: AuditEntry) {
        let Ok(permit) = self.tx.try_reserve() else {
            metrics::counter!("oncegate_audit_dropped_total").increment(1);
            return;
        };
        match &self.spool {
            Some(spool) => spool.append(entry, |n, entry, failed| {
                if let Some(e) = failed {
                    spool_failed(
                        e,
                        "appending an audit row to the spool failed; it is kept in memory only",
                    );
                }
                permit.send((n, entry));
            }),
            None => permit.send((0, entry)),
        }
    }

    /// Keeps a row through a process kill before its decision is
    /// answered: spooled and queued as [`record`](Self::record) does; when
    /// the spool cannot take it (a full disk), written through to the
    /// store now instead (counted in `oncegate_audit_spool_write_through_total`),
    /// and when the store cannot either, an error: the caller answers
    /// UNAVAILABLE rather than a decision whose row a kill would lose.
    /// Without a spool, rows are in memory only whatever happens
    /// (`ONCEGATE_AUDIT_SPOOL_DIR` unset), as [`record`](Self::record).
    pub async fn keep(&self, entry: AuditEntry) -> Result<(), StoreError> {
        let Some(spool) = &self.spool else {
            self.record(entry);
            return Ok(());
        };
        let Ok(permit) = self.tx.try_reserve() else {
            metrics::counter!("oncegate_audit_dropped_total").increment(1);
            return Ok(());
        };
        let unspooled = spool.append(entry, |n, entry, failed| match failed {
            None => {
                permit.send((n, entry));
                None
            }
            Some(e) => {
                spool_failed(e, "appending an audit row to the spool failed; it is written to the database before the answer");
                Some(entry)
            }
        });
        let Some(entry) = unspooled else { return Ok(()) };
        metrics::counter!("oncegate_audit_spool_write_through_total").increment(1);
        self.store.append_audit(std::slice::from_ref(&entry)).await?;
        metrics::counter!("oncegate_audit_written_total").increment(1);
        Ok(())
    }
}

/// A spool write that failed: counted by the spool, logged once per cause
/// and interval.
fn spool_failed(e: &std::io::Error, what: &str) {
    if crate::log_fold::AUDIT_SPOOL.first(&e.to_string()) {
        tracing::warn!(error = %e, "{what}");
    }
}

/// The writer side, run as a background task.
pub struct AuditFlusher {
    rx: mpsc::Receiver<Numbered>,
    store: Arc<dyn ClaimStore>,
    batch: usize,
    interval: Duration,
    /// Rows taken from the queue but not yet written (kept across a failed
    /// write, so a store outage delays rows rather than losing them).
    pending: Vec<Numbered>,
    spool: Option<Arc<Spool>>,
}

/// Rows kept across failed writes before the oldest are dropped (counted).
const MAX_PENDING: usize = 100_000;

impl AuditFlusher {
    /// Takes what is queued (up to a batch) and writes it. Returns rows written.
    pub async fn step(&mut self) -> usize {
        while self.pending.len() < self.batch {
            match self.rx.try_recv() {
                Ok(e) => self.pending.push(e),
                Err(_) => break,
            }
        }
        self.write_pending().await
    }

    async fn write_pending(&mut self) -> usize {
        if self.pending.is_empty() {
            return 0;
        }
        let n = self.pending.len().min(self.batch);
        let rows: Vec<AuditEntry> = self.pending[..n].iter().map(|(_, e)| e.clone()).collect();
        match self.store.append_audit(&rows).await {
            Ok(()) => {
                let through = self.pending[n - 1].0;
                self.pending.drain(..n);
                metrics::counter!("oncegate_audit_written_total").increment(n as u64);
                self.spool_flushed(through).await;
                n
            }
            Err(e) => {
                if crate::log_fold::AUDIT_FLUSHER.first(&e.to_string()) {
                    tracing::warn!(error = %e, rows = self.pending.len(), "audit write failed; will retry");
                }
                if self.pending.len() > MAX_PENDING {
                    let excess = self.pending.len() - MAX_PENDING;
                    self.pending.drain(..excess);
                    metrics::counter!("oncegate_audit_dropped_total").increment(excess as u64);
                }
                0
            }
        }
    }

    /// Records in the spool that rows up to `through` are in the database.
    async fn spool_flushed(&self, through: u64) {
        let Some(spool) = self.spool.clone() else { return };
        let done = tokio::task::spawn_blocking(move || spool.flushed(through)).await;
        if let Err(e) = done.map_err(std::io::Error::other).and_then(|r| r) {
            metrics::counter!("oncegate_audit_spool_errors_total").increment(1);
            spool_failed(&e, "recording written rows in the audit spool failed");
        }
    }

    /// Syncs the spool's current segment to disk (each flush interval).
    async fn spool_sync(&self) {
        let Some(spool) = self.spool.clone() else { return };
        match tokio::task::spawn_blocking(move || spool.sync())
            .await
            .map_err(std::io::Error::other)
        {
            Ok(Ok(rows)) => metrics::gauge!("oncegate_audit_spool_unsynced_rows").set(rows as f64),
            Ok(Err(e)) | Err(e) => {
                metrics::counter!("oncegate_audit_spool_errors_total").increment(1);
                spool_failed(&e, "syncing the audit spool failed");
            }
        }
    }

    /// Flushes on every interval until shutdown, then drains the queue.
    pub async fn run(mut self, mut stop: Stop) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.requested() => break,
                _ = tick.tick() => {
                    self.spool_sync().await;
                    while self.step().await == self.batch {}
                    metrics::gauge!("oncegate_audit_queue_depth").set(self.rx.len() as f64);
                }
            }
        }
        self.drain().await;
    }

    /// Writes everything queued; bounded retries, so shutdown cannot hang on
    /// a dead store.
    pub async fn drain(&mut self) {
        self.rx.close();
        let mut failures = 0;
        loop {
            let written = self.step().await;
            if self.pending.is_empty() && self.rx.is_empty() {
                break;
            }
            if written == 0 {
                failures += 1;
                if failures >= 3 {
                    let left = self.pending.len() + self.rx.len();
                    if self.spool.is_some() {
                        self.spool_sync().await;
                        tracing::warn!(
                            rows = left,
                            "audit rows could not be written before shutdown; the spool keeps them for the next start"
                        );
                    } else {
                        metrics::counter!("oncegate_audit_dropped_total").increment(left as u64);
                        tracing::error!(rows = left, "audit rows could not be written before shutdown");
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tracing::info!("audit queue flushed");
    }
}
