//! The outbox relay (DESIGN §4): publishes every outbox event, in per-award
//! order, from any number of pods.
//!
//! **Slots own the work.** The outbox is divided into a fixed number of
//! slots by a stable hash of the award (`store::slots::award_hash`). A relay
//! holds whole slots in the store, each with a generation bumped on every
//! change of owner and a lease it renews; live relays share the slots
//! fairly (`relay/share`) and rebalance as pods come and go: a relay over
//! its share gives slots back after the batch in hand, one under it takes
//! free slots or slots whose lease ran out (a pod killed or cut off), and
//! on SIGTERM a relay gives back all of its slots at once. One slot, one
//! owner: an award is published by one pod at a time, in sequence order,
//! whatever the sink; and every write a relay makes for a slot (mark
//! published, attempts, quarantine) is conditional on its generation, so a
//! pod that lost a slot changes nothing (`relay/slot`).
//!
//! Each held slot publishes on its own (a task per slot in [`Relay::run`]):
//! read the slot's pending events, publish them as one batch (a broker
//! transaction for Kafka, whose identity is the slot's: `broker/kafka`),
//! mark them. After a batch that was not full it waits for new events (an
//! in-process wake-up, Postgres `LISTEN/NOTIFY`, or the poll interval) and
//! then `ONCEGATE_RELAY_LINGER` more, so batches (and Kafka transactions)
//! are not one event each.
//!
//! Two kinds of failure, told apart by the sink ([`PublishError`]):
//! - the broker **rejects** an event: an attempt is spent and the event is
//!   retried after a backoff (`ONCEGATE_RELAY_RETRY_BACKOFF`, doubling, at
//!   most the lease); no later event of its award is read meanwhile, so an
//!   award's events go out in sequence order; after `max_attempts`
//!   rejections the event is quarantined and the award's events flow again;
//! - the broker is **unusable** — unreachable, timing out, or answering
//!   that the topic is missing or denied: an outage, not the event's fault.
//!   No attempt is spent, the relay pauses with a growing backoff (breaker
//!   state, one log line per transition naming the cause) and resumes by
//!   itself, in per-award order, when the broker answers again.
//!
//! A broker that is down when the sidecar starts is the same outage: the
//! sink connects inside the relay loop, with the relay paused and claims
//! served meanwhile, and again after any connection it had is lost.

mod outage;
pub mod resize;
mod share;
mod slot;
pub mod state;

pub use outage::MAX_OUTAGE_BACKOFF;
pub use resize::{ResizeError, Resized, resize};
pub use share::fair_share;
pub use slot::StepReport;

use crate::broker::{Sink, SinkSettings};
use crate::error::StoreError;
use crate::shutdown::Stop;
use crate::store::slots::{RelayMember, SlotLease};
use crate::store::{OutboxEvent, PublishStore, RelayStore};
use outage::Breaker;
use slot::{Held, Publishing};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Events read per slot and step (one batch, one Kafka transaction).
    pub batch: i64,
    /// A slot's lease: a relay that stops renewing loses its slots after it.
    pub lease: Duration,
    pub poll: Duration,
    pub max_attempts: i32,
    /// The instance (pod) the relay runs in; its member id adds a part of
    /// its own, so a restarted pod is a new member.
    pub owner: String,
    /// Delay before the first retry of a rejected event; doubles per attempt.
    pub retry_backoff: Duration,
    /// Slots the outbox is divided into when it has none yet
    /// (`ONCEGATE_RELAY_SLOTS`; changed later with `oncegate outbox slots --set`).
    pub slots: i32,
    /// How long a slot waits for more events after a batch that was not full.
    pub linger: Duration,
}

pub struct Relay {
    store: Arc<dyn RelayStore>,
    sink: Arc<dyn Sink>,
    settings: RelaySettings,
    member: String,
    breaker: Breaker,
    held: std::sync::Mutex<BTreeMap<i32, Arc<Held>>>,
    /// The slot count in force, 0 until the slot table was read.
    slots: AtomicI32,
}

impl Relay {
    pub fn new(store: Arc<dyn RelayStore>, sink: Arc<dyn Sink>, settings: RelaySettings) -> Self {
        let member = format!(
            "{}/{}",
            settings.owner,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let breaker = Breaker::new(sink.name(), settings.retry_backoff);
        Self {
            store,
            sink,
            settings,
            member,
            breaker,
            held: Default::default(),
            slots: AtomicI32::new(0),
        }
    }

    /// The relay for the configured sink (`None` when it is `none`). The
    /// broker is not reached here: the relay connects in its loop, so a
    /// broker that is down at start-up pauses the relay and nothing else.
    pub async fn connect(
        sink: &SinkSettings,
        settings: RelaySettings,
        store: Arc<dyn RelayStore>,
    ) -> anyhow::Result<Option<Self>> {
        use anyhow::Context;
        let sink = sink.build().context("configuring ONCEGATE_RELAY_SINK")?;
        Ok(sink.map(|sink| Self::new(store, sink, settings)))
    }

    /// This process's member id (the instance and a part of its own).
    pub fn member(&self) -> &str {
        &self.member
    }

    /// True while the broker is considered unusable.
    pub fn is_paused(&self) -> bool {
        self.breaker.is_open()
    }

    /// The slots this relay holds.
    pub fn held_slots(&self) -> Vec<SlotLease> {
        self.held().iter().map(|h| h.lease).collect()
    }

    fn held(&self) -> Vec<Arc<Held>> {
        self.lock_held().values().cloned().collect()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Arc<Held>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publishing(&self) -> Publishing<'_> {
        Publishing {
            store: &*self.store,
            sink: &*self.sink,
            breaker: &self.breaker,
            batch: self.settings.batch,
            max_attempts: self.settings.max_attempts,
            retry_backoff: self.settings.retry_backoff,
            lease: self.settings.lease,
        }
    }

    /// Connects the sink if it is not; false while the broker is unusable.
    async fn connected(&self) -> bool {
        let started = Instant::now();
        match self.sink.connect().await {
            Ok(fresh) => {
                if fresh {
                    self.breaker.answered(started);
                }
                true
            }
            Err(e) => {
                self.breaker.failed(&e, started);
                false
            }
        }
    }

    /// One full step: rebalance, then one batch of every held slot.
    /// (`run` steps the slots concurrently; this is the step tests drive.)
    pub async fn step(&self) -> Result<StepReport, StoreError> {
        if !self.connected().await {
            return Ok(StepReport {
                unconnected: true,
                ..Default::default()
            });
        }
        self.rebalance().await?;
        let mut report = StepReport::default();
        for held in self.held() {
            report += self.publishing().step(&held).await?;
        }
        Ok(report)
    }
}

impl Relay {
    /// Says this relay is alive, renews what it holds, gives back what is
    /// over its fair share and takes what is under it. Returns the slots
    /// it took.
    pub async fn rebalance(&self) -> Result<Vec<Arc<Held>>, StoreError> {
        self.init_slots().await?;
        let member = RelayMember {
            id: &self.member,
            instance: &self.settings.owner,
            sink: self.sink.name(),
        };
        let view = self.store.relay_heartbeat(&member, self.settings.lease).await?;
        self.slots.store(view.slots, Ordering::Relaxed);
        self.renew().await?;
        let target = fair_share(view.slots, &view.members, &self.member).max(0) as usize;
        let held = self.held();
        if held.len() > target {
            // The highest-numbered go back first.
            for extra in held.iter().rev().take(held.len() - target) {
                self.release(extra).await?;
            }
            return Ok(Vec::new());
        }
        if held.len() < target {
            return self.take((target - held.len()) as i32).await;
        }
        Ok(Vec::new())
    }

    /// Creates the slots on first use; says so when the count in force is
    /// not the configured one.
    async fn init_slots(&self) -> Result<(), StoreError> {
        if self.slots.load(Ordering::Relaxed) > 0 {
            return Ok(());
        }
        let slots = self.store.relay_slots_init(self.settings.slots).await?;
        if slots != self.settings.slots {
            tracing::warn!(
                configured = self.settings.slots,
                in_force = slots,
                "ONCEGATE_RELAY_SLOTS differs from the outbox's slot count; `oncegate outbox slots --set N` changes it"
            );
        }
        self.slots.store(slots, Ordering::Relaxed);
        Ok(())
    }

    async fn renew(&self) -> Result<(), StoreError> {
        let held = self.held();
        if held.is_empty() {
            return Ok(());
        }
        let leases: Vec<SlotLease> = held.iter().map(|h| h.lease).collect();
        let sent = Instant::now();
        let kept = self
            .store
            .renew_slots(&self.member, &leases, self.settings.lease)
            .await?;
        for h in held {
            if kept
                .iter()
                .any(|k| k.slot == h.lease.slot && k.generation == h.lease.generation)
            {
                h.renewed(sent, self.settings.lease);
            } else {
                self.forget(&h, "lost").await;
                tracing::info!(
                    slot = h.lease.slot,
                    "slot lost (its lease ran out and another relay took it)"
                );
            }
        }
        Ok(())
    }

    async fn take(&self, n: i32) -> Result<Vec<Arc<Held>>, StoreError> {
        let sent = Instant::now();
        let leases = self
            .store
            .take_slots(&self.member, n, self.settings.lease)
            .await?;
        let mut taken = Vec::new();
        for lease in leases {
            let held = Arc::new(Held::new(lease, sent, self.settings.lease));
            self.lock_held().insert(lease.slot, held.clone());
            metrics::counter!("oncegate_relay_slot_changes_total", "change" => "taken").increment(1);
            tracing::info!(slot = lease.slot, generation = lease.generation, member = %self.member, "slot taken");
            taken.push(held);
        }
        metrics::gauge!("oncegate_relay_slots_held").set(self.lock_held().len() as f64);
        Ok(taken)
    }

    /// Gives a slot back after the step in progress: free at once for another relay.
    async fn release(&self, held: &Arc<Held>) -> Result<(), StoreError> {
        self.forget(held, "released").await;
        self.store.release_slot(&self.member, &held.lease).await
    }

    /// Stops working on a slot and lets go of its broker identity.
    async fn forget(&self, held: &Arc<Held>, change: &'static str) {
        held.stop().await;
        self.lock_held().remove(&held.lease.slot);
        self.sink.release(held.id()).await;
        metrics::counter!("oncegate_relay_slot_changes_total", "change" => change).increment(1);
        metrics::gauge!("oncegate_relay_slots_held").set(self.lock_held().len() as f64);
    }

    /// Gives every slot back and leaves (SIGTERM): the other relays take
    /// them at their next rebalance, not after the lease.
    pub async fn leave(&self) {
        for held in self.held() {
            if let Err(e) = self.release(&held).await {
                tracing::warn!(slot = held.lease.slot, error = %e, "giving a slot back failed; it is free when its lease runs out");
            }
        }
        if let Err(e) = self.store.relay_leave(&self.member).await {
            tracing::debug!(error = %e, "leaving the relay members failed");
        }
    }
}

impl Relay {
    /// The held slots' pending events, without publishing them (each slot's
    /// broker identity taken first). For tests that stop between steps.
    pub async fn lease(&self) -> Result<Vec<OutboxEvent>, StoreError> {
        self.rebalance().await?;
        let mut events = Vec::new();
        for held in self.held() {
            if !self.publishing().ensure_taken(&held).await? {
                continue;
            }
            events.extend(self.store.slot_pending(&held.lease, self.settings.batch).await?);
        }
        Ok(events)
    }

    /// Publishes `events` (from [`Relay::lease`]) slot by slot, marking
    /// nothing: a relay that dies between publishing and marking. Returns
    /// the ids the broker took.
    pub async fn publish_unmarked(&self, events: &[OutboxEvent]) -> Vec<uuid::Uuid> {
        if let Err(e) = self.renew().await
            && crate::log_fold::RELAY.first(&format!("renewing the slots: {e}"))
        {
            tracing::warn!(error = %e, "renewing the slots failed");
        }
        let mut published = Vec::new();
        for held in self.held() {
            let slot = held.lease;
            let mine: Vec<&OutboxEvent> = events
                .iter()
                .filter(|e| crate::store::slots::slot_of(&e.award_id, slot.slots) == slot.slot)
                .collect();
            if !mine.is_empty() {
                let batch = self.sink.publish(held.id(), &mine, held.deadline()).await;
                published.extend(batch.published);
            }
        }
        published
    }

    /// Runs until shutdown: rebalances every third of the lease (at most
    /// every second) and publishes each held slot in a task of its own;
    /// at shutdown gives every slot back.
    pub async fn run(self, mut stop: Stop) {
        let relay = Arc::new(self);
        tracing::info!(sink = relay.sink.name(), member = %relay.member, "outbox relay started");
        let (wake, woken) = watch::channel(0u64);
        let waker = tokio::spawn(wake_on_outbox(relay.clone(), wake, stop.clone()));
        let mut workers = tokio::task::JoinSet::new();
        let tick = (relay.settings.lease / 3).clamp(Duration::from_millis(20), Duration::from_secs(1));
        while !stop.is_requested() {
            for held in relay.coordinate().await {
                workers.spawn(work(relay.clone(), held, woken.clone(), stop.clone()));
            }
            while workers.try_join_next().is_some() {}
            tokio::select! {
                _ = stop.requested() => {}
                _ = tokio::time::sleep(tick) => {}
            }
        }
        relay.leave().await;
        while workers.join_next().await.is_some() {}
        waker.abort();
        tracing::info!("outbox relay stopped");
    }

    /// One rebalance in the run loop; the slots newly taken. A paused
    /// relay keeps its slots (it renews them) but takes none, and does not
    /// count itself among the live relays until its broker answers.
    async fn coordinate(&self) -> Vec<Arc<Held>> {
        let result = if self.connected().await {
            self.rebalance().await
        } else {
            self.renew().await.map(|()| Vec::new())
        };
        result.unwrap_or_else(|e| {
            if crate::log_fold::RELAY.first(&format!("rebalance: {e}")) {
                tracing::warn!(error = %e, "relay rebalance failed");
            }
            Vec::new()
        })
    }

    /// How long to pause after a step that met an outage or an error.
    fn pause(&self) -> Duration {
        self.breaker
            .pause()
            .unwrap_or(self.settings.retry_backoff.max(Duration::from_millis(100)))
    }
}

/// Publishes one held slot until it is released, lost, or the relay stops.
async fn work(relay: Arc<Relay>, held: Arc<Held>, mut woken: watch::Receiver<u64>, mut stop: Stop) {
    let mut errors = 0u32;
    while !held.is_gone() && !stop.is_requested() {
        // Seen before the step: a wake-up during it is not lost.
        woken.borrow_and_update();
        let wait = match relay.publishing().step(&held).await {
            Ok(r) if r.lost => return,
            Ok(r) if r.deferred > 0 || r.unconnected => Some(relay.pause()),
            Ok(r) if r.leased as i64 >= relay.settings.batch && r.failed == 0 => None,
            Ok(r) => {
                errors = 0;
                if r.leased == 0 {
                    tokio::select! {
                        _ = stop.requested() => {}
                        _ = woken.changed() => {}
                        _ = tokio::time::sleep(relay.settings.poll) => {}
                    }
                }
                Some(relay.settings.linger)
            }
            Err(e) => {
                errors += 1;
                if crate::log_fold::RELAY.first(&format!("step: {e}")) {
                    tracing::warn!(slot = held.lease.slot, error = %e, "relay step failed");
                }
                Some((Duration::from_millis(100) * 2u32.pow(errors.min(7))).min(Duration::from_secs(10)))
            }
        };
        if let Some(wait) = wait.filter(|w| !w.is_zero()) {
            tokio::select! {
                _ = stop.requested() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// Wakes the slots' tasks when events are written: this instance's own
/// commits, another process's `pg_notify`, or the poll interval.
async fn wake_on_outbox(relay: Arc<Relay>, wake: watch::Sender<u64>, mut stop: Stop) {
    loop {
        tokio::select! {
            _ = stop.requested() => return,
            _ = relay.store.wait_for_outbox(relay.settings.poll) => {}
        }
        wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Refreshes the outbox gauges from the store every `interval`, whatever
/// the relay is doing (paused by an outage, backing off, busy), so the
/// backlog alert sees events waiting during an outage.
pub async fn report_outbox_gauges(store: &dyn PublishStore, interval: Duration, mut stop: Stop) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.requested() => return,
            _ = tick.tick() => {
                match tokio::time::timeout(interval.max(Duration::from_secs(1)), store.outbox_stats()).await {
                    Ok(Ok(s)) => {
                        metrics::gauge!("oncegate_outbox_backlog").set(s.backlog as f64);
                        metrics::gauge!("oncegate_outbox_oldest_age_seconds").set(s.oldest_age.as_secs_f64());
                        metrics::gauge!("oncegate_outbox_quarantined").set(s.quarantined as f64);
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "reading the outbox statistics failed"),
                    Err(_) => tracing::debug!("reading the outbox statistics timed out"),
                }
            }
        }
    }
}
