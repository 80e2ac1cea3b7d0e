//! L1: an in-process moka cache of committed results, bounded by bytes, with
//! a TTL. Filled after a commit and on any tier's duplicate answer; never the
//! reason a fresh submission is skipped (it only ever holds committed results).

use crate::store::StoredResult;
use moka::future::Cache;
use std::sync::Arc;
use std::time::Duration;

/// Bytes charged per entry beyond its strings: moka's node and its
/// frequency-sketch and timer-wheel bookkeeping, the `Arc`s, the struct and
/// the allocator's rounding. Measured: with 256 here, a full 64 MiB L1 cost
/// about 110 MiB of real memory (1,000,000 keys, `scripts/bench --memory`),
/// about 1.7 times the charge; 680 charges what an entry really takes, so the
/// byte budget is a real bound on memory.
pub(crate) const ENTRY_OVERHEAD: u32 = 680;

/// L1 settings.
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// Byte budget, entries charged what they really cost.
    pub capacity_bytes: u64,
    pub ttl: Duration,
}

/// An entry: the result and the cache generation it was filled in
/// ([`crate::primary::Epoch::generation`]).
type Entry = (u64, Arc<StoredResult>);

#[derive(Clone)]
pub struct LocalCache {
    inner: Cache<Arc<str>, Entry>,
}

impl LocalCache {
    pub fn new(capacity_bytes: u64, ttl: Duration) -> Self {
        let inner = Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|k: &Arc<str>, v: &Entry| k.len() as u32 + v.1.weight() + ENTRY_OVERHEAD)
            .time_to_live(ttl)
            .build();
        Self { inner }
    }

    /// The result for `key` if it was filled in `generation`; an entry of an
    /// earlier generation (another primary's result) is dropped, never answered.
    pub async fn get(&self, key: &str, generation: u64) -> Option<Arc<StoredResult>> {
        let (filled_in, result) = self.inner.get(key).await?;
        if filled_in == generation {
            return Some(result);
        }
        self.inner.invalidate(key).await;
        None
    }

    /// Caches `result`, committed (or read) in `generation`.
    pub async fn insert(&self, result: Arc<StoredResult>, generation: u64) {
        self.inner
            .insert(Arc::from(result.key.as_str()), (generation, result))
            .await;
    }

    /// Drops every entry (the primary changed).
    pub fn clear(&self) {
        self.inner.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Disbursement;

    #[tokio::test]
    async fn an_entry_of_another_generation_never_answers() {
        let l1 = LocalCache::new(1 << 20, Duration::from_secs(60));
        let r = Arc::new(StoredResult {
            key: "k".repeat(64),
            fingerprint: "f".repeat(64),
            disbursement: Disbursement {
                id: uuid::Uuid::now_v7(),
                award_id: "AWD".into(),
                amount_cents: 1,
                recorded_at: crate::time_fmt::now_micros(),
                sequence: 1,
            },
        });
        l1.insert(r.clone(), 0).await;
        assert_eq!(l1.get(&r.key, 0).await, Some(r.clone()));
        assert_eq!(l1.get(&r.key, 1).await, None, "filled on the old primary");
        assert_eq!(l1.get(&r.key, 0).await, None, "and dropped");
    }
}
