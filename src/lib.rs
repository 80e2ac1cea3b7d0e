//! oncegate: exactly-once *effect* for message consumers over at-least-once
//! brokers, as a gRPC sidecar.
//!
//! A consumer hands each delivery to `Submit`; oncegate derives a
//! deterministic idempotency key, claims it atomically in the authoritative
//! store in the same transaction as the side effect (ledger row, running
//! total, outbox event, audit row), and answers `CLAIMED` or `DUPLICATE` with
//! the stored original result. The consumer acks only after that answer.
//!
//! `DESIGN §N` (or `§N.M`) in a comment, test or script means that section of
//! `docs/DESIGN.md`, the design document: the contract this crate keeps.
//! `tests/it/structure.rs` fails on a citation of a section it does not have.
//!
//! # Layout
//! Configuration flows one way: [`cli`] (the command tree) → [`config`]
//! (flags and environment → each component's settings type) → the
//! components, which never import clap or `config`.
//!
//! - [`cli`]: subcommands; `cli/remote` (`submit`, `lookup`), `cli/effect`
//!   (`effect begin|complete|release|get`), `cli/ops` (`reconcile`,
//!   `inspect`, `outbox`), `cli/audit` (`audit seal|verify|export|keygen`),
//!   `cli/bench`, `cli/console` (the console's settings).
//! - [`config`]: shared argument groups (each setting declared once) →
//!   [`app::AppConfig`], [`store::StoreSettings`], [`relay::RelaySettings`], …
//!   **A new setting** goes here (the flag) and into its component's
//!   settings type (the value); `config/reference` prints the reference
//!   (`docs/CONFIGURATION.md`), `config/deprecated` keeps retired names working.
//! - [`app`]: `App::build` (binds everything) and `run_until_shutdown`;
//!   [`shutdown`]: the drain's phases and the named background tasks.
//! - [`server`]: the gRPC service (admission, deadlines, wire mapping);
//!   `server/effects` for `oncegate.v1.Effects`.
//! - [`gate`]: the tier decision L1 → L2 → store, and its invariant.
//! - [`effects`]: effects outside the ledger (DESIGN §9): idempotency records
//!   behind the same tiers and invariant, leases fenced in the store, the
//!   waiting `Begin`; `effects/request` (validation), `effects/cache` (its L1).
//!   Store side: `store/effect` (row types) and `effect.rs` in each backend.
//! - [`submission`]: validation; [`key`]: key derivation and fingerprints.
//! - [`cache`]: L1, in-process moka; [`redis_tier`]: L2, leases and results.
//! - [`primary`]: the primary's identity (system identifier, timeline) and
//!   the cache epoch: a failover to a new primary drops what caches hold;
//!   `primary/guard`: the synchronous-standby guard.
//! - [`group_commit`]: concurrent claims coalesced into one transaction,
//!   batch de-duplication and the retry of aborted transactions.
//! - [`store`]: the authoritative store seam, split by capability, its row
//!   types and `open`: [`store::StoreBase`] (the backend and the primary it
//!   reaches), [`store::ClaimStore`] (the gate and group commit),
//!   [`store::SlotStore`] and [`store::PublishStore`] (the relay's slots, and
//!   a held slot's events; [`store::RelayStore`] is the two),
//!   [`store::EffectStore`], [`store::OpsStore`] (reconcile, inspect,
//!   redrive), [`store::AuditStore`] (the sealed trail) and
//!   [`store::AdminStore`] (migrations, privileges, retention, health);
//!   [`store::Store`] is their sum, and a component takes the capability it
//!   uses. **A new store** is a room in `store/` implementing each capability
//!   in a file of its own (as `store/postgres/slots.rs` the relay's two),
//!   chosen by URL scheme in `store::open`, run on both backends by
//!   `on_both_stores!` (`tests/it/main.rs`: the conformance suite). Rows are
//!   read once for both in `store/rows`. Today: `store/postgres` (+ `claim.rs`,
//!   `claim.sql`, `tx.rs`), `store/sqlite`, and `store/shared` for what both
//!   build alike.
//! - [`broker`]: the brokers, one room each (its sink, its reconcile
//!   reader, its URL and wire format) and one registry table,
//!   [`broker::BROKERS`]. **A new broker** is one room implementing
//!   [`broker::Sink`] (its own settings, [`broker::BrokerSetting`]s, in it)
//!   plus one registry line. Today: `broker/log`,
//!   `broker/redis_stream`, `broker/nats`, `broker/amqp`, `broker/kafka`.
//! - [`relay`]: the outbox relay across pods: slots held with generations
//!   (`relay/share` the fair share, `relay/slot` one slot's step,
//!   `relay/outage` the breaker, `relay/resize` the slot-count change,
//!   `relay/state` the breaker as a running sidecar's metrics report it);
//!   store side: `store/slots` and `slots.rs` in each backend.
//! - [`reconcile`]: the ledger checked against itself and the broker
//!   (`reconcile/compare` the comparisons, `reconcile/seen` what the broker
//!   held, `reconcile/report`).
//! - [`audit`]: audit rows written off the hot path (`audit/spool`: kept
//!   through a kill); [`retention`]: the §200.334 purge; [`seal`]: the sealed
//!   audit trail — the hash chain (`seal/canonical`), its verification
//!   (`seal/verify`), exports (`seal/export`), signatures (`seal/signing`)
//!   and anchors (`seal/anchor`); `cli/audit` runs them from the command line.
//! - [`console`]: the read-only web console (axum + maud): find, a
//!   delivery's history, an award, the relay, the trail; `console/state`
//!   (the token, the trail's last verification), `console/pages` (each
//!   page's read and HTML). It reads through [`store::OpsStore`],
//!   [`store::AuditStore`] and the relay's slot table, runs
//!   [`reconcile::check_award`] and `seal/verify`, `seal/export`.
//! - [`telemetry`]: OpenTelemetry traces (OTLP), the `traceparent` helpers
//!   and [`trace_span!`], the only way spans for the exporter are made.
//! - Leaves: [`error`] (the service error and its one mapping to a status,
//!   store errors, `ConfigError`), [`metrics`], [`log_writer`], [`log_fold`]
//!   (repeated warnings folded into one line per cause and interval), [`secret`]
//!   (masking), [`time_fmt`].
//!
//! `tests/it/structure.rs` checks that no module imports another in a cycle
//! (nor any file of a module another of its files, inside rooms too), that
//! no function grows past 60 lines nor any trait past 20 methods, that
//! every `DESIGN §N` names a section of `docs/DESIGN.md`, and that the
//! README's map of the repository links every module declared here.
#![forbid(unsafe_code)]

pub mod app;
pub mod audit;
pub mod broker;
pub mod cache;
pub mod cli;
pub mod config;
pub mod console;
pub mod effects;
pub mod error;
pub mod gate;
pub mod group_commit;
pub mod key;
pub mod log_fold;
pub mod log_writer;
pub mod metrics;
pub mod primary;
pub mod reconcile;
pub mod redis_tier;
pub mod relay;
pub mod retention;
pub mod seal;
pub mod secret;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod submission;
pub mod telemetry;
pub mod time_fmt;

/// Generated from `proto/oncegate/v1/gate.proto` and `effects.proto`.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("oncegate.v1");

    /// The encoded descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/oncegate_descriptor.bin"));
}

pub use app::App;
