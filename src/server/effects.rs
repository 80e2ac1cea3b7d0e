//! The gRPC service `oncegate.v1.Effects` (DESIGN §9): admission, the
//! caller's deadline (a waiting `Begin` ends with `DEADLINE_EXCEEDED`), and
//! the wire mapping.

use super::{Call, admit};
use crate::effects::{Begun, Effects};
use crate::error::GateError;
use crate::pb;
use std::sync::Arc;
use tokio::sync::Semaphore;
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

/// A call's metric label: `ok`, or the error's.
fn label<T>(result: &Result<T, GateError>) -> &'static str {
    result.as_ref().map_or_else(GateError::label, |_| "ok")
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
        let call = Call::new(&req, "oncegate.v1.Effects/Begin");
        let _permit = call.admit(self.admit())?;
        let raw = req.into_inner();
        // Inline, not `Call::run`: a waiting Begin whose caller went away
        // must stop waiting (and not take a lease for nobody); each of its
        // store transactions runs in a task of its own.
        let result = (self.effects.begin(&raw, call.deadline))
            .instrument(call.span.clone())
            .await;
        super::record_status(&call.span, &result);
        call.observe(label(&result));
        Ok(Response::new(begin_response(result?)))
    }

    async fn complete(
        &self,
        req: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let call = Call::new(&req, "oncegate.v1.Effects/Complete");
        let permit = call.admit(self.admit())?;
        let (effects, raw) = (self.effects.clone(), req.into_inner());
        let result = call
            .run(permit, async move { effects.complete(&raw).await })
            .await;
        call.observe(label(&result));
        Ok(Response::new(pb::CompleteResponse {
            completed_at: crate::time_fmt::rfc3339(result?.completed_at),
        }))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let call = Call::new(&req, "oncegate.v1.Effects/Release");
        let permit = call.admit(self.admit())?;
        let (effects, raw) = (self.effects.clone(), req.into_inner());
        let result = call.run(permit, async move { effects.release(&raw).await }).await;
        call.observe(label(&result));
        result?;
        Ok(Response::new(pb::ReleaseResponse {}))
    }
}
