//! Prometheus metrics through the `metrics` facade, served on their own port.
//!
//! The recorder is process-wide (installed once); each listener renders it.

use axum::{Router, routing::get};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use tokio::net::TcpListener;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets in seconds: 50 µs to 5 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Installs the process-wide recorder (once) and returns its handle.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS))
                .expect("static bucket lists are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder already installed (only possible in tests that
            // embed the library): metrics then go there.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

/// Serves `/metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = handle();
    let app = Router::new().route("/metrics", get(move || std::future::ready(handle.render())));
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "oncegate_decisions_total",
        "Decisions by outcome (CLAIMED, DUPLICATE) and deciding tier"
    );
    describe_counter!("oncegate_rejections_total", "Requests refused, by reason");
    describe_counter!(
        "oncegate_store_failovers_total",
        "Times the store's connections reached a different primary (system identifier or timeline changed): L1 emptied, L2 moved to a new epoch"
    );
    describe_gauge!(
        "oncegate_db_sync_replica",
        "1 when the primary acknowledges a commit only once a synchronous standby has it (read at start; with ONCEGATE_REQUIRE_SYNC_REPLICA on every identity probe too); 0 when a failover can lose acknowledged claims"
    );
    describe_gauge!(
        "oncegate_sync_standby_shortfall",
        "With ONCEGATE_REQUIRE_SYNC_REPLICA: 1 for the reason claims are refused now (no_standby_named, commit_does_not_wait, standby_not_streaming, standbys_unreadable, unknown), 0 for the others"
    );
    describe_counter!(
        "oncegate_sync_guard_refusals_total",
        "Claims, effect leases and completions refused without a transaction while no synchronous standby confirms commits, by what"
    );
    describe_counter!(
        "oncegate_sync_guard_unconfirmed_commits_total",
        "Commits that returned while synchronous_standby_names was empty (released unreplicated, or not waiting at all): answered UNAVAILABLE, not acknowledged"
    );
    describe_gauge!(
        "oncegate_store_identity_confirmed",
        "1 while a connection has confirmed the primary's identity and caches may answer; 0 while cache answers are suspended"
    );
    describe_counter!(
        "oncegate_store_refusals_total",
        "Claims a store that answered refused, by cause (insufficient_privilege: SQLSTATE 42501; read_only: 25006)"
    );
    describe_gauge!(
        "oncegate_store_refusing",
        "1 while the store refuses claims for this cause (the Gate's health is NOT_SERVING), until a claim is taken"
    );
    describe_histogram!(
        "oncegate_store_identity_probe_seconds",
        "Time taken by the periodic probe of the primary's identity"
    );
    describe_counter!(
        "oncegate_store_identity_probe_failures_total",
        "Identity probes that failed or timed out (each suspends cache answers)"
    );
    describe_histogram!(
        "oncegate_request_duration_seconds",
        "gRPC request latency by method and result"
    );
    describe_gauge!(
        "oncegate_requests_in_flight",
        "Gate and Effects requests admitted and not yet answered (batch items count each; ONCEGATE_MAX_IN_FLIGHT bounds it)"
    );
    describe_counter!(
        "oncegate_tier_lookups_total",
        "Tier lookups by tier and result (hit, miss, error, skipped; suspended: no cache asked while the primary is unconfirmed)"
    );
    describe_counter!(
        "oncegate_tier_errors_total",
        "Tier call failures by tier and operation"
    );
    describe_gauge!(
        "oncegate_redis_breaker_state",
        "Redis circuit breaker: 0 closed, 1 open, 2 half-open"
    );
    describe_counter!(
        "oncegate_redis_breaker_transitions_total",
        "Redis circuit breaker transitions"
    );
    describe_counter!(
        "oncegate_db_transactions_total",
        "Claim transactions by result (commit, retry, abort)"
    );
    describe_gauge!(
        "oncegate_db_pool_connections",
        "Database pool connections by state"
    );
    describe_gauge!(
        "oncegate_db_connections_held",
        "Connections this process holds to the database: the pool's, the identity probe's, the relay's LISTEN session"
    );
    describe_histogram!(
        "oncegate_group_commit_batch_size",
        "Deliveries per claim transaction"
    );
    describe_counter!(
        "oncegate_group_commit_fallbacks_total",
        "Batches retried item by item"
    );
    describe_counter!(
        "oncegate_group_commit_turn_timeouts_total",
        "Batches started beside one that had held the turn for 20 ms (stuck, e.g. behind a row lock)"
    );
    describe_counter!(
        "oncegate_log_lines_dropped_total",
        "Log lines dropped because stderr did not keep up"
    );
    describe_counter!(
        "oncegate_late_redeliveries_total",
        "Redeliveries of purged claims caught by the ledger key"
    );
    describe_counter!(
        "oncegate_payload_changed_resubmissions_total",
        "New keys for an award id and timestamp already recorded"
    );
    describe_counter!(
        "oncegate_audit_written_total",
        "Audit rows written off the hot path"
    );
    describe_counter!(
        "oncegate_audit_dropped_total",
        "Audit rows dropped (queue full or store down at shutdown)"
    );
    describe_gauge!("oncegate_audit_queue_depth", "Audit rows waiting");
    describe_gauge!(
        "oncegate_audit_spool_unsynced_rows",
        "Audit rows the spool synced to disk at the last flush interval: what a node crash just before it would have lost"
    );
    describe_counter!(
        "oncegate_audit_spool_replayed_total",
        "Audit rows a start found in the spool (left by a killed process) and wrote"
    );
    describe_counter!(
        "oncegate_audit_spool_unreadable_total",
        "Spool lines skipped at start because they were cut short (a node crash in the middle of a write) or unreadable"
    );
    describe_counter!(
        "oncegate_audit_spool_errors_total",
        "Failed spool writes, syncs or bookkeeping (a row a cached answer waits on is written through to the database; others stay in memory)"
    );
    describe_counter!(
        "oncegate_audit_spool_write_through_total",
        "Audit rows the spool could not take, written to the database before their decision was answered"
    );
    describe_gauge!("oncegate_outbox_backlog", "Unpublished outbox events");
    describe_gauge!(
        "oncegate_outbox_oldest_age_seconds",
        "Age of the oldest unpublished outbox event"
    );
    describe_gauge!("oncegate_outbox_quarantined", "Quarantined outbox events");
    describe_counter!("oncegate_outbox_published_total", "Outbox events published");
    describe_counter!("oncegate_outbox_publish_errors_total", "Failed publishes");
    describe_counter!(
        "oncegate_outbox_quarantined_total",
        "Events quarantined after repeated failures"
    );
    describe_counter!(
        "oncegate_purge_deleted_total",
        "Rows removed by retention, by table"
    );
    describe_counter!(
        "oncegate_effects_total",
        "Effect calls (DESIGN §9) by namespace and outcome: acquired, retaken, answered (Begin \
         answered with the stored response), completed, released, and refusals by reason"
    );
    describe_counter!(
        "oncegate_effect_answers_total",
        "Begin calls answered with a completed record, by namespace and tier"
    );
    describe_histogram!(
        "oncegate_effect_begin_duration_seconds",
        "Begin latency by namespace, waiting for another holder included"
    );
    describe_gauge!(
        "oncegate_purge_lag_seconds",
        "How far the oldest claim is past retention"
    );
    describe_counter!(
        "oncegate_group_commit_worker_restarts_total",
        "Group-commit workers that died and were replaced"
    );
    describe_gauge!(
        "oncegate_db_role_privileged",
        "1 when the database role can change the ledger, audit trail or retention floor"
    );
    describe_gauge!(
        "oncegate_relay_breaker_state",
        "Relay's broker: 0 reachable, 1 paused by an outage"
    );
    describe_counter!(
        "oncegate_relay_outages_total",
        "Broker outages that paused the relay"
    );
    describe_gauge!(
        "oncegate_relay_outage",
        "1 while the relay is paused for this cause (unreachable, topic_missing, not_authorized, misconfigured) and resource (topic)"
    );
    describe_gauge!("oncegate_relay_slots_held", "Outbox slots this relay holds");
    describe_counter!(
        "oncegate_relay_slot_changes_total",
        "Slots taken, released (given back) and lost (taken by another relay after the lease ran out)"
    );
    describe_counter!(
        "oncegate_relay_settled_total",
        "Events an earlier holder's committed transaction carried, marked published when a slot was taken"
    );
    describe_counter!(
        "oncegate_relay_unknown_outcomes_total",
        "Broker transactions whose outcome was unknown (the slot settled before sending again)"
    );
    describe_counter!(
        "oncegate_relay_unreadable_marks_total",
        "Records of the Kafka marks topic that were not relay marks (skipped)"
    );
    describe_gauge!(
        "oncegate_reconciliation_mismatches",
        "Mismatches found by the last reconciliation, by check"
    );
    describe_gauge!(
        "oncegate_reconciliation_last_run_timestamp_seconds",
        "Unix time the last reconciliation finished"
    );
    describe_gauge!(
        "oncegate_reconciliation_last_duration_seconds",
        "How long the last reconciliation took"
    );
    describe_counter!(
        "oncegate_reconciliation_runs_total",
        "Reconciliation runs by result (clean, mismatch, error, skipped)"
    );
    describe_counter!(
        "oncegate_audit_rows_sealed_total",
        "Audit rows sealed into the hash chain by this instance"
    );
    describe_gauge!(
        "oncegate_audit_last_seal_age_seconds",
        "Age of the newest seal (any instance), as of this instance's last sealing run"
    );
    describe_gauge!(
        "oncegate_audit_unsealed_rows",
        "Audit rows no seal covers yet, as of the last sealing run"
    );
    describe_counter!(
        "oncegate_audit_anchor_failures_total",
        "Seals whose anchor could not be appended to ONCEGATE_AUDIT_ANCHOR_FILE (written with the next seal)"
    );
    describe_counter!(
        "oncegate_audit_seal_deferred_total",
        "Sealing runs that sealed nothing because open transactions outlived the wait"
    );
    describe_gauge!(
        "oncegate_audit_verify_mismatches",
        "Rows and seals that did not match in the last verification (0: clean)"
    );
}
