//! The gRPC service `oncegate.v1.Effects` (DESIGN §9): admission, the
//! caller's deadline (a waiting `Begin` ends with `DEADLINE_EXCEEDED`), and
//! the wire mapping.

use super::{admit, deadline_of, record_status, server_span, within_deadline};
use crate::effects::{Begun, Effects};
use crate::error::GateError;
use crate::pb;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub struct EffectsService {
    effects: Arc<Effects>,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl EffectsService {
    pub fn new(effects: Arc<Effects>, max_in_flight: usize) -> Self {
        Self {
            effects,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
        }
    }

    fn admit(&self) -> Result<super::Admitted, GateError> {
        admit(&self.in_flight, 1, self.max_in_flight)
    }
}

fn observe<T>(method: &'static str, start: Instant, result: &Result<T, GateError>) {
    super::observe(
        method,
        start,
        result.as_ref().map_or_else(GateError::label, |_| "ok"),
    );
}

fn begin_response(b: Begun) -> pb::BeginResponse {
    use pb::begin_response::Outcome;
    pb::BeginResponse {
        outcome: Some(match b {
            Begun::Acquired { token, attempt } => Outcome::Acquired(pb::Acquired {
                lease_token: token,
                attempt,
            }),
            Begun::Completed { record, tier } => Outcome::Completed(pb::Completed {
                response: record.response.clone(),
                completed_at: crate::time_fmt::rfc3339(record.completed_at),
                attempt: record.attempt,
                decided_by: super::wire_tier(tier) as i32,
            }),
        }),
    }
}

#[tonic::async_trait]
impl pb::effects_server::Effects for EffectsService {
    async fn begin(&self, req: Request<pb::BeginRequest>) -> Result<Response<pb::BeginResponse>, Status> {
        let start = Instant::now();
        let span = server_span(&req, "oncegate.v1.Effects/Begin");
        let deadline = deadline_of(&req);
        let _permit = self.admit()?;
        let raw = req.into_inner();
        // Inline, not `within_deadline`: a waiting Begin whose caller went
        // away must stop waiting (and not take a lease for nobody); each of
        // its store transactions runs in a task of its own.
        let result = self.effects.begin(&raw, deadline).instrument(span.clone()).await;
        record_status(&span, &result);
        observe("Begin", start, &result);
        Ok(Response::new(begin_response(result?)))
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let start = Instant::now();
        let span = server_span(&req, "oncegate.v1.Effects/Complete");
        let deadline = deadline_of(&req);
        let permit = self.admit()?;
        let effects = self.effects.clone();
        let raw = req.into_inner();
        let work = async move {
            let _permit = permit;
            effects.complete(&raw).await
        };
        let result = within_deadline(deadline, work.instrument(span.clone())).await;
        record_status(&span, &result);
        observe("Complete", start, &result);
        Ok(Response::new(pb::CompleteResponse {
            completed_at: crate::time_fmt::rfc3339(result?.completed_at),
        }))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let start = Instant::now();
        let span = server_span(&req, "oncegate.v1.Effects/Release");
        let deadline = deadline_of(&req);
        let permit = self.admit()?;
        let effects = self.effects.clone();
        let raw = req.into_inner();
        let work = async move {
            let _permit = permit;
            effects.release(&raw).await
        };
        let result = within_deadline(deadline, work.instrument(span.clone())).await;
        record_status(&span, &result);
        observe("Release", start, &result);
        result?;
        Ok(Response::new(pb::ReleaseResponse {}))
    }
}
