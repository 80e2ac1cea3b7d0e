//! L2: Redis, shared by every instance.
//!
//! `SET {prefix}{key} <token> NX GET EX <lease ttl>` claims an in-flight lease
//! before the database; a committed result replaces the token for the dedup
//! window. A key holding a *result* of the current epoch is a duplicate; a
//! key holding *another instance's token*, or a result tagged with another
//! primary's epoch ([`crate::primary`]: committed on a server this store no
//! longer talks to, so possibly lost in a failover), is not: the database
//! resolves it, and the result it commits or finds replaces the old one. On
//! failure the lease is released by compare-and-delete.
//!
//! Every call has a short timeout and goes through a circuit breaker, so a
//! slow or dead Redis costs at most one timeout per breaker period.

use crate::store::{Disbursement, StoredResult};
use crate::time_fmt::{from_micros, to_micros};
use fred::prelude::*;
use fred::types::{Expiration, SetOptions};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

const RESULT_TAG: &str = "r2|";
const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// Redis tier settings.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub url: String,
    pub key_prefix: String,
    pub timeout: Duration,
    pub lease_ttl: Duration,
    pub dedup_ttl: Duration,
    pub breaker_threshold: u32,
    pub breaker_cooldown: Duration,
}

/// What the lease attempt found.
#[derive(Debug)]
pub enum Lease {
    /// We hold the in-flight lease; release it if the transaction fails.
    Held(String),
    /// A committed result: a duplicate.
    Found(StoredResult),
    /// Another instance's in-flight token: go to the database, which waits
    /// for that transaction and resolves it.
    Foreign,
    /// Redis skipped (breaker open) or failed: go to the database.
    Skipped,
}

pub struct RedisTier {
    client: Client,
    settings: RedisSettings,
    instance: Arc<str>,
    breaker: Breaker,
}

/// The longest wait between reconnect attempts, in ms: a quarter of the
/// breaker's cooldown (50 ms to 2 s), so a Redis that comes back is
/// connected before the breaker's next probe, which then closes it.
fn reconnect_cap(settings: &RedisSettings) -> u32 {
    (settings.breaker_cooldown.as_millis() / 4).clamp(50, 2_000) as u32
}

impl RedisTier {
    /// Builds the client and starts connecting in the background; the tier
    /// works (through the breaker) whether or not Redis is up yet.
    pub async fn connect(settings: RedisSettings, instance: Arc<str>) -> Result<Self, Error> {
        let mut config = Config::from_url(&settings.url)?;
        // A first connection that fails (Redis down when the pod starts)
        // follows the reconnect policy too; by default fred gives up on it
        // and the tier would stay dead for the process's lifetime.
        config.fail_fast = false;
        let timeout = settings.timeout;
        let client = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_millis(500).max(timeout);
                c.internal_command_timeout = Duration::from_secs(2);
                c.max_command_attempts = 1;
                // As sqlx and tonic do: no Nagle delay between commands.
                c.tcp.nodelay = Some(true);
            })
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .set_policy(ReconnectPolicy::new_exponential(
                0,
                50,
                reconnect_cap(&settings),
                2,
            ))
            .build()?;
        // fred's connection task reconnects on its own; waiting briefly here
        // only makes the first requests after start use the tier.
        let _connection = client.connect();
        let _ = tokio::time::timeout(Duration::from_secs(1), client.wait_for_connect()).await;
        let breaker = Breaker::new(settings.breaker_threshold, settings.breaker_cooldown);
        Ok(Self {
            client,
            settings,
            instance,
            breaker,
        })
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}{}", self.settings.key_prefix, key)
    }

    /// One call, bounded by the client's command timeout (the tier's
    /// timeout, [`Self::connect`]: one timer per call, not a second of our
    /// own around it), through the breaker.
    async fn call<T, F>(&self, op: &'static str, fut: F) -> Option<T>
    where
        F: Future<Output = Result<T, Error>>,
    {
        match fut.await {
            Ok(v) => {
                self.breaker.success();
                Some(v)
            }
            Err(e) => {
                metrics::counter!("oncegate_tier_errors_total", "tier" => "REDIS", "op" => op).increment(1);
                if *e.kind() == ErrorKind::Timeout {
                    tracing::debug!(op, "redis call timed out");
                } else {
                    tracing::debug!(op, error = %e, "redis call failed");
                }
                self.breaker.failure();
                None
            }
        }
    }

    /// Tries to take the in-flight lease for `key`, learning in the same
    /// round trip whether a result of epoch `tag` or another token is there.
    pub async fn lease(&self, key: &str, tag: &str) -> Lease {
        if !self.breaker.allow() {
            metrics::counter!("oncegate_tier_lookups_total", "tier" => "REDIS", "result" => "skipped")
                .increment(1);
            return Lease::Skipped;
        }
        let token = format!("t:{}:{}", self.instance, Uuid::new_v4().simple());
        let ttl = self.settings.lease_ttl.as_secs().max(1) as i64;
        let previous: Option<Option<String>> = self
            .call(
                "lease",
                self.client.set::<Option<String>, _, _>(
                    self.redis_key(key),
                    token.as_str(),
                    Some(Expiration::EX(ttl)),
                    Some(SetOptions::NX),
                    true,
                ),
            )
            .await;
        let lease = match previous {
            None => Lease::Skipped,
            Some(None) => Lease::Held(token),
            Some(Some(v)) => match decode(&v) {
                Some((epoch, r)) if r.key == key && epoch == tag => Lease::Found(r),
                _ => Lease::Foreign,
            },
        };
        let result = match &lease {
            Lease::Found(_) => "hit",
            Lease::Skipped => "error",
            _ => "miss",
        };
        metrics::counter!("oncegate_tier_lookups_total", "tier" => "REDIS", "result" => result).increment(1);
        lease
    }

    /// Reads a stored result of epoch `tag` without leasing (for `Lookup`).
    pub async fn get(&self, key: &str, tag: &str) -> Option<StoredResult> {
        self.get_value(key)
            .await
            .as_deref()
            .and_then(decode)
            .filter(|(epoch, r)| r.key == key && epoch == tag)
            .map(|(_, r)| r)
    }

    /// Stores a result committed in epoch `tag` for the dedup window
    /// (replacing any token or older result).
    pub async fn store_result(&self, result: &StoredResult, tag: &str) {
        self.store_value(&result.key, encode(result, tag), self.settings.dedup_ttl)
            .await;
    }

    /// Releases our own lease (compare-and-delete): never another's token,
    /// never a result.
    pub async fn release(&self, key: &str, token: &str) {
        if !self.breaker.allow() {
            return;
        }
        let _: Option<i64> = self
            .call(
                "release",
                self.client.eval::<i64, _, _, _>(
                    RELEASE_SCRIPT,
                    vec![self.redis_key(key)],
                    vec![token.to_string()],
                ),
            )
            .await;
    }

    /// Reads the value under `{prefix}{key}` (a result, a token, or an
    /// effect record under a key no claim key can be).
    pub async fn get_value(&self, key: &str) -> Option<String> {
        if !self.breaker.allow() {
            return None;
        }
        let v: Option<Option<String>> = self
            .call("get", self.client.get::<Option<String>, _>(self.redis_key(key)))
            .await;
        v.flatten()
    }

    /// Stores `value` under `{prefix}{key}` for `ttl` (at least a second).
    pub async fn store_value(&self, key: &str, value: String, ttl: Duration) {
        if !self.breaker.allow() {
            return;
        }
        let ttl = ttl.as_secs().max(1) as i64;
        let _: Option<()> = self
            .call(
                "store",
                self.client.set::<(), _, _>(
                    self.redis_key(key),
                    value,
                    Some(Expiration::EX(ttl)),
                    None,
                    false,
                ),
            )
            .await;
    }

    /// Closes the connection (shutdown).
    pub async fn quit(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.quit()).await;
    }
}

/// `r2|epoch|fingerprint|disbursement id|amount|recorded µs|sequence|key|award id`
/// (award ids never contain '|'; it is last anyway). The epoch tag names
/// the primary that committed it (empty for the embedded store).
pub fn encode(r: &StoredResult, tag: &str) -> String {
    let d = &r.disbursement;
    format!(
        "{RESULT_TAG}{tag}|{}|{}|{}|{}|{}|{}|{}",
        r.fingerprint,
        d.id.simple(),
        d.amount_cents,
        to_micros(d.recorded_at),
        d.sequence,
        r.key,
        d.award_id
    )
}

/// The inverse of [`encode`]: the epoch tag and the result; `None` for
/// tokens and anything malformed.
pub fn decode(v: &str) -> Option<(String, StoredResult)> {
    let mut parts = v.strip_prefix(RESULT_TAG)?.splitn(8, '|');
    let tag = parts.next()?.to_string();
    let fingerprint = parts.next()?.to_string();
    let id = Uuid::parse_str(parts.next()?).ok()?;
    let amount_cents = parts.next()?.parse().ok()?;
    let recorded_at = from_micros(parts.next()?.parse().ok()?);
    let sequence = parts.next()?.parse().ok()?;
    let key = parts.next()?.to_string();
    let award_id = parts.next()?.to_string();
    Some((
        tag,
        StoredResult {
            key,
            fingerprint,
            disbursement: Disbursement {
                id,
                award_id,
                amount_cents,
                recorded_at,
                sequence,
            },
        },
    ))
}

/// Circuit breaker state, also exported as the gauge
/// `oncegate_redis_breaker_state` (0 closed, 1 open, 2 half-open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant, cooldown: Duration },
    HalfOpen { cooldown: Duration },
}

/// Opens after `threshold` consecutive failures; after the cooldown lets one
/// probe through; closes on its success, reopens with a doubled cooldown
/// (capped) on its failure. One WARN when it opens and one INFO when it
/// closes again, however many probes fail in between (each is counted in
/// `oncegate_redis_breaker_transitions_total{to="open"}` and logged at DEBUG).
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cooldown: Duration,
    inner: Mutex<Inner>,
}

const MAX_COOLDOWN: Duration = Duration::from_secs(30);

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        metrics::gauge!("oncegate_redis_breaker_state").set(0.0);
        Self {
            threshold: threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a call may go out now. In the open state, the first call after
    /// the cooldown is the probe.
    pub fn allow(&self) -> bool {
        let mut inner = self.lock();
        match *inner {
            Inner::Closed { .. } => true,
            Inner::HalfOpen { .. } => false,
            Inner::Open { until, cooldown } => {
                if Instant::now() >= until {
                    *inner = Inner::HalfOpen { cooldown };
                    metrics::gauge!("oncegate_redis_breaker_state").set(2.0);
                    true
                } else {
                    false
                }
            }
        }
    }

    pub fn success(&self) {
        let mut inner = self.lock();
        match *inner {
            Inner::Closed { failures: 0 } => {}
            Inner::Closed { .. } => *inner = Inner::Closed { failures: 0 },
            _ => {
                *inner = Inner::Closed { failures: 0 };
                metrics::gauge!("oncegate_redis_breaker_state").set(0.0);
                metrics::counter!("oncegate_redis_breaker_transitions_total", "to" => "closed").increment(1);
                tracing::info!("redis tier recovered; circuit closed");
            }
        }
    }

    pub fn failure(&self) {
        let mut inner = self.lock();
        let (open_for, probe_failed) = match *inner {
            Inner::Closed { failures } if failures + 1 < self.threshold => {
                *inner = Inner::Closed {
                    failures: failures + 1,
                };
                return;
            }
            Inner::Closed { .. } => (self.cooldown, false),
            Inner::HalfOpen { cooldown } => ((cooldown * 2).min(MAX_COOLDOWN), true),
            Inner::Open { .. } => return,
        };
        *inner = Inner::Open {
            until: Instant::now() + open_for,
            cooldown: open_for,
        };
        metrics::gauge!("oncegate_redis_breaker_state").set(1.0);
        metrics::counter!("oncegate_redis_breaker_transitions_total", "to" => "open").increment(1);
        let retry_in_ms = open_for.as_millis() as u64;
        if probe_failed {
            // Still the same outage: its WARN went out when the circuit opened.
            tracing::debug!(retry_in_ms, "redis tier probe failed; circuit stays open");
        } else {
            tracing::warn!(
                retry_in_ms,
                "redis tier failing; circuit open, serving from the database"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_probes_and_closes() {
        let b = Breaker::new(3, Duration::from_secs(1));
        for _ in 0..3 {
            assert!(b.allow());
            b.failure();
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allow());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(b.allow(), "first call after the cooldown is the probe");
        assert!(!b.allow(), "only one probe at a time");
        b.failure();
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(!b.allow(), "cooldown doubled after a failed probe");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(b.allow());
        b.success();
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn results_round_trip_and_tokens_are_not_results() {
        let r = StoredResult {
            key: "k".repeat(64),
            fingerprint: "f".repeat(64),
            disbursement: Disbursement {
                id: Uuid::now_v7(),
                award_id: "AWD-é".into(),
                amount_cents: 1234,
                recorded_at: crate::time_fmt::now_micros(),
                sequence: 7,
            },
        };
        assert_eq!(decode(&encode(&r, "6a.2")), Some(("6a.2".to_string(), r.clone())));
        assert_eq!(decode(&encode(&r, "")), Some((String::new(), r)));
        assert_eq!(decode("t:pod-a:0123"), None);
    }
}
