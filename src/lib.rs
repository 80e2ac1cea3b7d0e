//! oncegate: exactly-once *effect* for message consumers over at-least-once
//! brokers, as a gRPC sidecar.
//!
//! A consumer hands each delivery to `Submit`; oncegate derives a
//! deterministic idempotency key, claims it atomically in the authoritative
//! store in the same transaction as the side effect (ledger row, running
//! total, outbox event, audit row), and answers `CLAIMED` or `DUPLICATE` with
//! the stored original result. The consumer acks only after that answer.
//!
//! # Layout
//! - [`key`]: key derivation (byte-for-byte the Python reference) and fingerprints.
//! - [`submission`]: validation of incoming submissions.
//! - [`gate`]: the tier decision L1 → L2 → store, and its invariant.
//! - [`cache`]: L1, in-process moka cache of committed results.
//! - [`redis_tier`]: L2, Redis leases and results, with a circuit breaker.
//! - [`store`]: the authoritative store seam; `store/postgres`, `store/sqlite`.
//! - [`group_commit`]: concurrent claims coalesced into one transaction.
//! - [`audit`]: audit rows written off the hot path.
//! - [`relay`]: the outbox relay; `relay/redis_stream`, `relay/nats`, `relay/log`.
//! - [`retention`]: the §200.334 purge.
//! - [`server`]: the gRPC service; [`app`]: start-up and drain.
//! - [`config`], [`metrics`], [`error`], [`bench`], [`client`].
#![forbid(unsafe_code)]

pub mod app;
pub mod audit;
pub mod bench;
pub mod cache;
pub mod client;
pub mod config;
pub mod error;
pub mod gate;
pub mod group_commit;
pub mod key;
pub mod metrics;
pub mod redis_tier;
pub mod relay;
pub mod retention;
pub mod server;
pub mod store;
pub mod submission;
pub mod time_fmt;

/// Generated from `proto/oncegate/v1/gate.proto`.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("oncegate.v1");

    /// The encoded descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/oncegate_descriptor.bin"));
}

pub use app::App;
