//! What the relay writes into Kafka, and reconcile and the settle read back:
//! the event record (key = award id, value = the event JSON, headers), the
//! transactional id of a slot, and the slot's mark record.

use crate::store::OutboxEvent;
use rdkafka::message::{Header, OwnedHeaders};
use uuid::Uuid;

/// The headers every event record carries.
pub mod header {
    pub const EVENT_ID: &str = "event_id";
    pub const EVENT_TYPE: &str = "event_type";
    pub const AWARD_ID: &str = "award_id";
    pub const SEQUENCE: &str = "sequence";
    pub const TRACEPARENT: &str = "traceparent";
}

/// librdkafka's name for the Java client's default partitioner (murmur2 of
/// the key; random for a record without one): an award's events land in
/// the partition Java producers and Kafka Streams compute for its key.
/// librdkafka's own default (`consistent_random`, CRC32) would not.
pub const PARTITIONER: &str = "murmur2_random";

/// The compacted topic holding each slot's mark, one partition per slot.
pub fn marks_topic(topic: &str) -> String {
    format!("{topic}.oncegate-relay-marks")
}

/// The `transactional.id` of `slot`: the unit of work owns it, never the
/// process, so whoever takes the slot fences whoever held it.
pub fn transactional_id(prefix: &str, slot: u32) -> String {
    format!("{prefix}{slot}")
}

/// The mark partition of `slot`.
pub fn mark_partition(slot: u32) -> i32 {
    i32::try_from(slot).unwrap_or(i32::MAX)
}

/// The value of a mark record (key: the slot's transactional id): every
/// event a committed transaction of the slot carried that may not be
/// marked published yet.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Mark {
    pub transactional_id: String,
    pub events: Vec<Uuid>,
}

impl Mark {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a mark serialises")
    }

    /// The mark in a record's value, or `None` when it is not one.
    pub fn decode(value: &[u8]) -> Option<Self> {
        serde_json::from_slice(value).ok()
    }
}

/// The headers of an event record.
pub fn event_headers(event: &OutboxEvent) -> OwnedHeaders {
    let (id, sequence) = (event.event_id.to_string(), event.sequence.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: header::EVENT_ID,
            value: Some(&id),
        })
        .insert(Header {
            key: header::EVENT_TYPE,
            value: Some(&event.event_type),
        })
        .insert(Header {
            key: header::AWARD_ID,
            value: Some(&event.award_id),
        })
        .insert(Header {
            key: header::SEQUENCE,
            value: Some(&sequence),
        });
    match &event.traceparent {
        Some(traceparent) => headers.insert(Header {
            key: header::TRACEPARENT,
            value: Some(traceparent),
        }),
        None => headers,
    }
}
