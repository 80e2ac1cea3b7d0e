//! Integration tests: one binary, real Postgres, Redis and NATS, real gRPC
//! over loopback. Each test has its own database and Redis key prefix, so
//! the suite runs in parallel. `TEST_LOG=1` shows tracing output.

/// Runs each named `async fn(Kind)` test on both stores, as
/// `<module>::postgres::<name>` and `<module>::sqlite::<name>`: one test
/// code, both backends (the conformance suite's pattern). Every capability
/// of the store runs through it: claims in `store_suite`, the relay's in
/// `store_suite::slots` and `relay`, effects in `effects`, reconcile and
/// inspect in `ops`, the sealed trail in `seal`, retention in `retention`.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(crate::helpers::Kind::Postgres).await })*
        }
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(crate::helpers::Kind::Sqlite).await })*
        }
    };
}

mod cache_window;
mod chaos;
mod cli;
mod cluster;
mod effects;
mod failover;
mod hardening;
mod helpers;
mod hostile;
mod kafka;
mod kafka_topics;
mod keys;
mod ops;
mod pods;
mod pooler;
mod privilege;
mod refusals;
mod relay;
mod retention;
mod seal;
mod security;
mod store_suite;
mod structure;
mod sync_guard;
mod tiers;
mod traces;
mod upgrade;
mod vectors;
