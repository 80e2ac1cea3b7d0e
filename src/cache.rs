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

#[derive(Clone)]
pub struct LocalCache {
    inner: Cache<Arc<str>, Arc<StoredResult>>,
}

impl LocalCache {
    pub fn new(capacity_bytes: u64, ttl: Duration) -> Self {
        let inner = Cache::builder()
            .max_capacity(capacity_bytes)
            .weigher(|k: &Arc<str>, v: &Arc<StoredResult>| k.len() as u32 + v.weight() + ENTRY_OVERHEAD)
            .time_to_live(ttl)
            .build();
        Self { inner }
    }

    pub async fn get(&self, key: &str) -> Option<Arc<StoredResult>> {
        self.inner.get(key).await
    }

    pub async fn insert(&self, result: Arc<StoredResult>) {
        self.inner.insert(Arc::from(result.key.as_str()), result).await;
    }
}
