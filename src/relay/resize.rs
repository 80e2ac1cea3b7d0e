//! Changing the slot count (`oncegate outbox slots --set N`), online.
//!
//! A slot is a hash of the award modulo the count, so a new count moves
//! most awards to another slot — and, with Kafka, to another transactional
//! id. Every old slot must therefore be settled before the new count is in
//! force, or an event a committed transaction of its old slot carried, not
//! yet marked, would be published again from its new one. The procedure:
//!
//! 1. take every slot at once, whoever holds it (a new generation each: the
//!    relays holding them are fenced in the store and stop at their next
//!    renewal or write);
//! 2. with a transactional sink, take each old slot's broker identity
//!    (fencing its former holder, aborting its open transaction) and mark
//!    published what the slot's mark says was committed;
//! 3. set the count and free every slot with a new generation; the relays
//!    take them again at their next rebalance.
//!
//! Claims go on throughout; events wait for the few seconds it takes. A
//! resize that fails part-way frees the slots unchanged (the old count
//! stays in force) and says why.

use crate::broker::{Sink, SinkSettings, SlotId};
use crate::error::StoreError;
use crate::store::RelayStore;
use crate::store::slots::SlotLease;
use std::time::Duration;

/// How long a resize holds the slots at most (it gives them back sooner).
const RESIZE_LEASE: Duration = Duration::from_secs(300);

/// The largest slot count: each slot holding a producer (Kafka) in some pod.
pub const MAX_SLOTS: i32 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Refused(String),
}

/// What a resize did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Resized {
    pub from: i32,
    pub to: i32,
    /// Events the old slots' marks said were committed, marked published.
    pub settled: usize,
}

/// Sets the slot count to `count` (see the module doc). `sink` is the
/// relays' sink: needed when they publish transactionally (Kafka), which
/// the live relays' registrations tell.
pub async fn resize(
    store: &dyn RelayStore,
    sink: Option<&SinkSettings>,
    count: i32,
    member: &str,
) -> Result<Resized, ResizeError> {
    if !(1..=MAX_SLOTS).contains(&count) {
        return Err(ResizeError::Refused(format!(
            "the slot count must be 1 to {MAX_SLOTS}, got {count}"
        )));
    }
    let sink = checked_sink(store, sink).await?;
    let seized = store.seize_slots(member, RESIZE_LEASE).await?;
    let from = seized.first().map_or(0, |l| l.slots);
    let settled = match &sink {
        Some(sink) => match settle_all(store, &**sink, &seized).await {
            Ok(n) => n,
            Err(e) => {
                give_back(store, member, &seized).await;
                return Err(e);
            }
        },
        None => 0,
    };
    if !store.finish_resize(member, &seized, count).await? {
        give_back(store, member, &seized).await;
        return Err(ResizeError::Refused(
            "a slot was taken from the resize meanwhile (its lease ran out); nothing changed, run it again"
                .into(),
        ));
    }
    Ok(Resized {
        from,
        to: count,
        settled,
    })
}

/// The sink to settle with: required when a live relay publishes to a
/// broker with slot identities (Kafka), refused when it is another broker
/// than theirs.
async fn checked_sink(
    store: &dyn RelayStore,
    sink: Option<&SinkSettings>,
) -> Result<Option<std::sync::Arc<dyn Sink>>, ResizeError> {
    let table = store.relay_slot_table().await?;
    let theirs: Vec<&str> = table.members.iter().map(|m| m.sink.as_str()).collect();
    let ours = sink.map_or("none", |s| s.spec.name());
    if let Some(other) = theirs.iter().find(|s| **s != ours && **s == "kafka") {
        return Err(ResizeError::Refused(format!(
            "the relays publish to {other}: run the resize with their ONCEGATE_RELAY_SINK, ONCEGATE_RELAY_STREAM and \
             ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX, so that it settles every slot before the count changes"
        )));
    }
    let Some(settings) = sink else {
        return Ok(None);
    };
    let built = settings
        .build()
        .map_err(|e| ResizeError::Refused(format!("ONCEGATE_RELAY_SINK: {e:#}")))?;
    match built {
        Some(sink) => {
            sink.connect()
                .await
                .map_err(|e| ResizeError::Refused(format!("the broker: {e}")))?;
            Ok(Some(sink))
        }
        None => Ok(None),
    }
}

/// Takes every old slot's broker identity and marks what it settles.
async fn settle_all(
    store: &dyn RelayStore,
    sink: &dyn Sink,
    seized: &[SlotLease],
) -> Result<usize, ResizeError> {
    let mut settled = 0;
    for lease in seized {
        let slot = SlotId {
            index: lease.slot as u32,
            count: lease.slots as u32,
        };
        let ids = sink
            .take(slot)
            .await
            .map_err(|e| ResizeError::Refused(format!("settling slot {}: {e}", lease.slot)))?;
        sink.release(slot).await;
        if !ids.is_empty() && !store.mark_published(lease, &ids).await? {
            return Err(ResizeError::Refused(format!(
                "slot {} was taken from the resize meanwhile; nothing changed, run it again",
                lease.slot
            )));
        }
        settled += ids.len();
    }
    Ok(settled)
}

async fn give_back(store: &dyn RelayStore, member: &str, seized: &[SlotLease]) {
    for lease in seized {
        if let Err(e) = store.release_slot(member, lease).await {
            tracing::warn!(slot = lease.slot, error = %e, "giving a slot back after a failed resize failed; it is free when its lease runs out");
        }
    }
}
