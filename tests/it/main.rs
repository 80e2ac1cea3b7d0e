//! Integration tests: one binary, real Postgres, Redis and NATS, real gRPC
//! over loopback. Each test has its own database and Redis key prefix, so
//! the suite runs in parallel. `TEST_LOG=1` shows tracing output.

mod chaos;
mod helpers;
mod hostile;
mod keys;
mod relay;
mod retention;
mod security;
mod store_suite;
mod tiers;
