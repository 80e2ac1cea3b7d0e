//! The gRPC service `oncegate.v1.Gate`: admission (in-flight limit), the
//! caller's deadline, and the mapping between the wire and the gate;
//! `server/effects`: the same for `oncegate.v1.Effects`.

pub mod effects;

use crate::error::GateError;
use crate::gate::{Decided, Gate, Tier};
use crate::pb;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub struct GateService {
    gate: Arc<Gate>,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    max_batch_items: usize,
}

impl GateService {
    pub fn new(gate: Arc<Gate>, max_in_flight: usize, max_batch_items: usize) -> Self {
        Self {
            gate,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            max_batch_items,
        }
    }

    fn admit(&self, n: usize) -> Result<Admitted, GateError> {
        admit(&self.in_flight, n, self.max_in_flight)
    }
}

/// `n` admitted requests (batch items count each), held until they are
/// answered: counted in `oncegate_requests_in_flight`, the gauge of what
/// `ONCEGATE_MAX_IN_FLIGHT` bounds and a SIGTERM drain waits for.
struct Admitted {
    _permit: OwnedSemaphorePermit,
    n: usize,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!("oncegate_requests_in_flight").decrement(self.n as f64);
    }
}

/// `n` permits of the in-flight limit, or `RESOURCE_EXHAUSTED`.
fn admit(in_flight: &Arc<Semaphore>, n: usize, max_in_flight: usize) -> Result<Admitted, GateError> {
    let permit = in_flight.clone().try_acquire_many_owned(n as u32).map_err(|_| {
        GateError::Overloaded(format!(
            "more than {max_in_flight} requests in flight; retry with backoff"
        ))
    })?;
    metrics::gauge!("oncegate_requests_in_flight").increment(n as f64);
    Ok(Admitted { _permit: permit, n })
}

/// Runs `work` to completion even if the caller gives up (a caller that goes
/// away never cuts a transaction in half), answering `DEADLINE_EXCEEDED` if
/// the caller's `grpc-timeout` passes first.
///
/// The work is polled once inline first: a decision answered at once (an L1
/// hit) costs no task spawn. Only work that has to wait (a store or Redis
/// round trip) moves into its own task, boxed so the spawn moves a pointer,
/// not the whole future.
async fn within_deadline<T: Send + 'static>(
    deadline: Option<Instant>,
    work: impl Future<Output = Result<T, GateError>> + Send + 'static,
) -> Result<T, GateError> {
    let mut work = Box::pin(work);
    if let std::task::Poll::Ready(done) = futures::poll!(work.as_mut()) {
        return done;
    }
    let task = tokio::spawn(work);
    let joined = match deadline {
        Some(d) => tokio::time::timeout_at(d, task)
            .await
            .map_err(|_| GateError::DeadlineExceeded)?,
        None => task.await,
    };
    joined.map_err(|e| {
        tracing::error!(error = %e, "decision task failed");
        GateError::Internal
    })?
}

/// One unary call, the frame every handler shares: its method, start, server
/// span and the caller's deadline. A handler admits ([`Call::admit`]), runs
/// its work ([`Call::run`]) and reports ([`Call::observe`]); only the wire
/// mapping is its own.
struct Call {
    /// `Submit`, the metric's `method` label.
    method: &'static str,
    start: Instant,
    span: tracing::Span,
    deadline: Option<Instant>,
}

impl Call {
    /// `rpc` is the span's name, `oncegate.v1.Gate/Submit`.
    fn new<T>(req: &Request<T>, rpc: &'static str) -> Self {
        Self {
            method: rpc.rsplit('/').next().unwrap_or(rpc),
            start: Instant::now(),
            span: server_span(req, rpc),
            deadline: deadline_of(req),
        }
    }

    /// An admission's refusal observed (`overloaded`) and on the span.
    fn admit(&self, admitted: Result<Admitted, GateError>) -> Result<Admitted, GateError> {
        admitted.inspect_err(|e| {
            observe(self.method, self.start, e.label());
            record_code(&self.span, e.code());
        })
    }

    /// `work`, holding `permit` until it ends, in the call's span and within
    /// the caller's deadline ([`within_deadline`]); its status on the span.
    async fn run<T: Send + 'static>(
        &self,
        permit: Admitted,
        work: impl Future<Output = Result<T, GateError>> + Send + 'static,
    ) -> Result<T, GateError> {
        let work = async move {
            let _permit = permit;
            work.await
        };
        let result = within_deadline(self.deadline, work.instrument(self.span.clone())).await;
        record_status(&self.span, &result);
        result
    }

    /// The call's duration under `result`.
    fn observe(&self, result: &'static str) {
        observe(self.method, self.start, result);
    }
}

/// The caller's deadline, a little early so our answer beats the transport's:
/// tonic's own grpc-timeout timer starts when the headers arrive (before the
/// body is read and this handler runs) and answers `CANCELLED`, not
/// `DEADLINE_EXCEEDED`; the margin must cover that head start under load.
fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let value = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    let margin = (timeout / 10).min(Duration::from_millis(100));
    Some(Instant::now() + timeout.saturating_sub(margin))
}

/// The caller's W3C `traceparent` from the gRPC metadata, as sent.
fn caller_traceparent<T>(req: &Request<T>) -> Option<&str> {
    req.metadata().get("traceparent")?.to_str().ok()
}

/// The server span of one call (`method`: `oncegate.v1.Gate/Submit`), a
/// child of the caller's `traceparent` when it sent one. Disabled (free)
/// while traces are off.
fn server_span<T>(req: &Request<T>, method: &'static str) -> tracing::Span {
    let (service, name) = method.split_once('/').unwrap_or(("", method));
    let span = crate::trace_span!(
        "rpc",
        otel.name = method,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = name,
        rpc.grpc.status_code = tracing::field::Empty,
        oncegate.decision = tracing::field::Empty,
        oncegate.tier = tracing::field::Empty,
        oncegate.batch_size = tracing::field::Empty,
        oncegate.claimed = tracing::field::Empty,
        oncegate.duplicates = tracing::field::Empty,
        oncegate.errors = tracing::field::Empty,
    );
    if !span.is_disabled() {
        crate::telemetry::set_parent(&span, caller_traceparent(req));
    }
    span
}

/// The call's gRPC status on its server span (error status when not OK).
fn record_status<T>(span: &tracing::Span, result: &Result<T, GateError>) {
    record_code(
        span,
        result.as_ref().map_or_else(|e| e.code(), |_| tonic::Code::Ok),
    );
}

fn record_code(span: &tracing::Span, code: tonic::Code) {
    if span.is_disabled() {
        return;
    }
    span.record("rpc.grpc.status_code", code as i32);
    if code != tonic::Code::Ok {
        span.record("otel.status_code", "error");
    }
}

/// The decision and the deciding tier on the server span.
fn record_decision(span: &tracing::Span, result: &Result<Decided, GateError>) {
    if let Ok(d) = result {
        span.record(
            "oncegate.decision",
            if d.claimed { "CLAIMED" } else { "DUPLICATE" },
        );
        span.record("oncegate.tier", d.tier.as_str());
    }
}

/// Per-item tallies of a batch on its server span.
fn record_batch(span: &tracing::Span, results: &[Result<Decided, GateError>]) {
    if span.is_disabled() {
        return;
    }
    let claimed = results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|d| d.claimed))
        .count();
    let errors = results.iter().filter(|r| r.is_err()).count();
    span.record("oncegate.batch_size", results.len() as i64);
    span.record("oncegate.claimed", claimed as i64);
    span.record("oncegate.duplicates", (results.len() - claimed - errors) as i64);
    span.record("oncegate.errors", errors as i64);
}

fn decision(d: &Decided) -> pb::Decision {
    let r = &d.result;
    pb::Decision {
        outcome: if d.claimed {
            pb::Outcome::Claimed
        } else {
            pb::Outcome::Duplicate
        } as i32,
        idempotency_key: r.key.clone(),
        disbursement: Some(pb::Disbursement {
            id: r.disbursement.id.to_string(),
            award_id: r.disbursement.award_id.clone(),
            amount_cents: r.disbursement.amount_cents,
            recorded_at: crate::time_fmt::rfc3339(r.disbursement.recorded_at),
            sequence: r.disbursement.sequence,
        }),
        decided_by: wire_tier(d.tier) as i32,
    }
}

fn wire_tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::LocalCache => pb::Tier::LocalCache,
        Tier::Redis => pb::Tier::Redis,
        Tier::Database => pb::Tier::Database,
    }
}

fn observe(method: &'static str, start: Instant, result: &'static str) {
    metrics::histogram!("oncegate_request_duration_seconds", "method" => method, "result" => result)
        .record(start.elapsed().as_secs_f64());
}

fn result_label(r: &Result<Decided, GateError>) -> &'static str {
    match r {
        Ok(d) if d.claimed => "claimed",
        Ok(_) => "duplicate",
        Err(e) => e.label(),
    }
}

#[tonic::async_trait]
impl pb::gate_server::Gate for GateService {
    async fn submit(&self, req: Request<pb::Submission>) -> Result<Response<pb::Decision>, Status> {
        let call = Call::new(&req, "oncegate.v1.Gate/Submit");
        let permit = call.admit(self.admit(1))?;
        let gate = self.gate.clone();
        let caller = caller_traceparent(&req).map(str::to_owned);
        let submission = req.into_inner();
        let result = call
            .run(permit, async move {
                gate.submit(&submission, caller.as_deref()).await
            })
            .await;
        record_decision(&call.span, &result);
        call.observe(result_label(&result));
        Ok(Response::new(decision(&result?)))
    }

    async fn submit_batch(
        &self,
        req: Request<pb::SubmitBatchRequest>,
    ) -> Result<Response<pb::SubmitBatchResponse>, Status> {
        let call = Call::new(&req, "oncegate.v1.Gate/SubmitBatch");
        let caller = caller_traceparent(&req).map(str::to_owned);
        let items = req.into_inner().submissions;
        if items.len() > self.max_batch_items {
            return Err(GateError::TooLarge(format!(
                "submissions has {} items, at most {} allowed",
                items.len(),
                self.max_batch_items
            ))
            .into());
        }
        let permit = call.admit(self.admit(items.len().max(1)))?;
        let gate = self.gate.clone();
        let results = call
            .run(permit, async move {
                Ok(gate.submit_batch(&items, caller.as_deref()).await)
            })
            .await;
        if let Ok(r) = &results {
            record_batch(&call.span, r);
        }
        call.observe(if results.is_ok() { "ok" } else { "error" });
        let results = results?
            .into_iter()
            .map(|r| pb::Result {
                result: Some(match r {
                    Ok(d) => pb::result::Result::Decision(decision(&d)),
                    Err(e) => pb::result::Result::Error(pb::Error {
                        code: e.code() as i32,
                        message: e.to_string(),
                    }),
                }),
            })
            .collect();
        Ok(Response::new(pb::SubmitBatchResponse { results }))
    }

    async fn lookup(&self, req: Request<pb::LookupRequest>) -> Result<Response<pb::LookupResponse>, Status> {
        let start = Instant::now();
        let deadline = deadline_of(&req);
        let gate = self.gate.clone();
        let key = req.into_inner().idempotency_key;
        let found = within_deadline(deadline, async move { gate.lookup(&key).await }).await;
        observe("Lookup", start, if found.is_ok() { "ok" } else { "error" });
        Ok(Response::new(match found? {
            Some(d) => pb::LookupResponse {
                found: true,
                decision: Some(decision(&d)),
            },
            None => pb::LookupResponse {
                found: false,
                decision: None,
            },
        }))
    }
}
