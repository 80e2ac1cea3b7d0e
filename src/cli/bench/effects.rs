//! `oncegate bench --effects`: each client runs the Effects API the way a
//! consumer calling a provider does — `Begin` a fresh key (acquired), then
//! `Complete` it with a response — and, with `--duplicate-ratio`, `Begin`s
//! keys it completed before (answered with the stored response). Reported
//! like claims: completed effects as `claims`, stored answers as
//! `duplicates`, latency per class.

use super::{BenchArgs, ClientStats};
use crate::pb::effects_client::EffectsClient;
use crate::pb::{self, begin_response::Outcome};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;
use tonic::transport::Channel;

/// What one Begin (and its Complete) came to.
enum Answer {
    /// Acquired and completed by this call.
    Performed,
    /// Answered with the stored response.
    Stored,
}

async fn effect_once(
    client: &mut EffectsClient<Channel>,
    key: &str,
    request: &[u8],
) -> Result<Answer, String> {
    let begin = pb::BeginRequest {
        namespace: "bench".into(),
        idempotency_key: key.to_string(),
        request: request.to_vec(),
        lease_ttl: None,
    };
    let answer = client
        .begin(begin)
        .await
        .map_err(|s| format!("{:?}", s.code()))?
        .into_inner();
    match answer.outcome {
        Some(Outcome::Completed(_)) => Ok(Answer::Stored),
        Some(Outcome::Acquired(lease)) => {
            let complete = pb::CompleteRequest {
                namespace: "bench".into(),
                idempotency_key: key.to_string(),
                lease_token: lease.lease_token,
                response: b"{\"provider\":\"accepted\"}".to_vec(),
            };
            client
                .complete(complete)
                .await
                .map_err(|s| format!("{:?}", s.code()))?;
            Ok(Answer::Performed)
        }
        None => Err("empty BeginResponse".into()),
    }
}

/// One client until `until`.
pub(super) async fn client_loop(
    mut client: EffectsClient<Channel>,
    run: Arc<str>,
    next: Arc<AtomicU64>,
    args: Arc<BenchArgs>,
    until: Instant,
    seed: u64,
) -> ClientStats {
    let mut stats = ClientStats::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut done: Vec<u64> = Vec::new();
    let request = vec![b'r'; args.payload_bytes];
    while Instant::now() < until {
        let again = !done.is_empty() && rng.random_bool(args.duplicate_ratio.clamp(0.0, 1.0));
        let n = if again {
            done[rng.random_range(0..done.len())]
        } else {
            next.fetch_add(1, Ordering::Relaxed)
        };
        let start = Instant::now();
        let answer = effect_once(&mut client, &format!("{run}-{n}"), &request).await;
        let micros = start.elapsed().as_micros() as u64;
        match answer {
            Ok(Answer::Performed) => {
                stats.claimed += 1;
                done.push(n);
                stats.record("EFFECT", micros);
            }
            Ok(Answer::Stored) => {
                stats.duplicates += 1;
                stats.record("EFFECT_STORED", micros);
            }
            Err(code) => {
                *stats.errors.entry(code).or_default() += 1;
                continue;
            }
        }
        stats.record("ALL", micros);
    }
    stats
}
