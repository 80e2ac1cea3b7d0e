//! L1 for effect records: an in-process moka cache of *completed* records
//! only, bounded by bytes, each entry living for its namespace's window
//! (capped by the L1 TTL).

use crate::store::CompletedEffect;
use moka::Expiry;
use moka::future::Cache;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes charged per entry beyond its own: the claims' L1's measured figure.
use crate::cache::ENTRY_OVERHEAD;

#[derive(Clone)]
struct Entry {
    record: Arc<CompletedEffect>,
    ttl: Duration,
    /// The cache generation it was filled in ([`crate::primary::Epoch`]).
    generation: u64,
}

struct PerEntryTtl;

impl Expiry<Arc<str>, Entry> for PerEntryTtl {
    fn expire_after_create(&self, _key: &Arc<str>, value: &Entry, _now: Instant) -> Option<Duration> {
        Some(value.ttl)
    }
}

#[derive(Clone)]
pub struct EffectCache {
    inner: Cache<Arc<str>, Entry>,
}

impl EffectCache {
    pub fn new(capacity_bytes: u64) -> Self {
        let inner = Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|k: &Arc<str>, v: &Entry| {
                (k.len() as u32)
                    .saturating_add(v.record.weight())
                    .saturating_add(ENTRY_OVERHEAD)
            })
            .expire_after(PerEntryTtl)
            .build();
        Self { inner }
    }

    /// The completed record cached under `id` (`{namespace}|{key}`), if it
    /// was filled in `generation`; an older generation's entry is dropped.
    pub async fn get(&self, id: &str, generation: u64) -> Option<Arc<CompletedEffect>> {
        let entry = self.inner.get(id).await?;
        if entry.generation == generation {
            return Some(entry.record);
        }
        self.inner.invalidate(id).await;
        None
    }

    pub async fn insert(&self, id: &str, record: Arc<CompletedEffect>, ttl: Duration, generation: u64) {
        self.inner
            .insert(
                Arc::from(id),
                Entry {
                    record,
                    ttl,
                    generation,
                },
            )
            .await;
    }

    /// Drops every entry (the primary changed).
    pub fn clear(&self) {
        self.inner.invalidate_all();
    }
}
