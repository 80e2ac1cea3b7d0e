//! Log sink, for local use: one INFO line per event (no submission payload
//! exists in events; this logs only their identifiers).

use super::{PublishError, Sink};
use crate::store::OutboxEvent;
use async_trait::async_trait;

pub struct LogSink;

#[async_trait]
impl Sink for LogSink {
    fn name(&self) -> &'static str {
        "log"
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        tracing::info!(event_id = %event.event_id, event_type = %event.event_type, award_id = %event.award_id, sequence = event.sequence, "outbox event");
        Ok(())
    }
}
