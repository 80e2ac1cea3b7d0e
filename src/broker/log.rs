//! The log sink, for local use: one INFO line per event (events hold no
//! submission payload; this logs only their identifiers).

use super::seam::{Broker, PublishError, Sink};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use std::sync::Arc;

pub const BROKER: Broker = Broker {
    name: "log",
    schemes: &["log"],
    check_url: |_| Ok(()),
    sink: |_, _| Ok(Arc::new(LogSink)),
    reader: None,
    exactly_once: false,
    about: "one INFO line per event, for local use",
    stream_is: "",
    settings: &[],
};

pub struct LogSink;

#[async_trait]
impl Sink for LogSink {
    fn name(&self) -> &'static str {
        "log"
    }

    async fn publish_one(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        tracing::info!(event_id = %event.event_id, event_type = %event.event_type, award_id = %event.award_id, sequence = event.sequence, "outbox event");
        Ok(())
    }
}
