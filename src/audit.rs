//! Audit rows written off the hot path: duplicates answered by a cache tier,
//! rejections decided before the store, and effect `Begin`s answered with a
//! completed record by any tier (the store's read answers them without a
//! write of its own). (Processed submissions and duplicates decided by the
//! database are audited inside the claim transaction; an effect's lease
//! transitions inside the effect's.) A bounded queue, flushed in batches on
//! an interval and on shutdown; anything that does not fit is counted, never
//! blocks a request.

use crate::shutdown::Stop;
use crate::store::{AuditEntry, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Audit queue settings.
#[derive(Debug, Clone, Copy)]
pub struct AuditSettings {
    /// Rows the queue holds at most; past it rows are dropped (counted).
    pub queue: usize,
    /// Rows per write.
    pub batch: usize,
    pub flush_interval: Duration,
}

/// The request side: never blocks.
#[derive(Clone)]
pub struct AuditQueue {
    tx: mpsc::Sender<AuditEntry>,
}

impl AuditQueue {
    /// A queue holding at most `capacity` rows, and its flusher.
    pub fn new(
        capacity: usize,
        store: Arc<dyn Store>,
        batch: usize,
        interval: Duration,
    ) -> (Self, AuditFlusher) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Self { tx },
            AuditFlusher {
                rx,
                store,
                batch: batch.max(1),
                interval,
                pending: Vec::new(),
            },
        )
    }

    /// Queues a row; counts it as dropped when the queue is full or closed.
    pub fn record(&self, entry: AuditEntry) {
        if self.tx.try_send(entry).is_err() {
            metrics::counter!("oncegate_audit_dropped_total").increment(1);
        }
    }
}

/// The writer side, run as a background task.
pub struct AuditFlusher {
    rx: mpsc::Receiver<AuditEntry>,
    store: Arc<dyn Store>,
    batch: usize,
    interval: Duration,
    /// Rows taken from the queue but not yet written (kept across a failed
    /// write, so a store outage delays rows rather than losing them).
    pending: Vec<AuditEntry>,
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
        match self.store.append_audit(&self.pending[..n]).await {
            Ok(()) => {
                self.pending.drain(..n);
                metrics::counter!("oncegate_audit_written_total").increment(n as u64);
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = self.pending.len(), "audit write failed; will retry");
                if self.pending.len() > MAX_PENDING {
                    let excess = self.pending.len() - MAX_PENDING;
                    self.pending.drain(..excess);
                    metrics::counter!("oncegate_audit_dropped_total").increment(excess as u64);
                }
                0
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
                    let lost = self.pending.len() + self.rx.len();
                    metrics::counter!("oncegate_audit_dropped_total").increment(lost as u64);
                    tracing::error!(rows = lost, "audit rows could not be written before shutdown");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tracing::info!("audit queue flushed");
    }
}
