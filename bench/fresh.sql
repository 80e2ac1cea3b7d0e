-- pgbench: the sidecar's per-delivery transaction for one fresh delivery,
-- statement for statement (src/store/postgres.rs claim_in_tx with one item):
-- claim insert ON CONFLICT, balances upsert RETURNING, audit insert (with the
-- changed-payload EXISTS probe), ledger insert ON CONFLICT RETURNING, outbox
-- insert (its NOTIFY trigger fires), one transaction, one commit.
-- Keys are 64 hex characters like the sidecar's; ids are time-ordered
-- (uuid v7 layout) like Uuid::now_v7. Run with -M prepared (sqlx prepares too).
\set k random(1, 9000000000000000000)
\set a random(0, 99)
\set amt random(1, 9973)
BEGIN;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
  VALUES (md5(:k::text) || md5(:k::text || 'k'), 'pgbench-' || :a,
          md5(:k::text || 'f') || md5(:k::text || 'g'),
          (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || substr(md5(:k::text || 'u'), 1, 20))::uuid,
          now())
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING disbursement_id AS did \gset
INSERT INTO award_balances AS b (award_id, total_cents, disbursement_count, last_sequence, updated_at)
  VALUES ('pgbench-' || :a, :amt, 1, 1, now())
  ON CONFLICT (award_id) DO UPDATE SET
    total_cents = b.total_cents + excluded.total_cents,
    disbursement_count = b.disbursement_count + excluded.disbursement_count,
    last_sequence = b.last_sequence + excluded.disbursement_count,
    updated_at = excluded.updated_at
  RETURNING last_sequence AS seq \gset
INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail)
  SELECT now(), 'processed', NULL, substr(md5(:k::text), 1, 12), 'pgbench-' || :a, 'pgbench',
    EXISTS (SELECT 1 FROM disbursements o WHERE o.award_id = 'pgbench-' || :a
            AND o.submission_timestamp = '2026-11-29T10:57:45.000000Z'
            AND o.idempotency_key <> md5(:k::text) || md5(:k::text || 'k')),
    NULL;
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
    submission_timestamp, payload_digest, fingerprint, recorded_at)
  VALUES (:did, md5(:k::text) || md5(:k::text || 'k'), 'pgbench-' || :a, :amt, :seq,
    '2026-11-29T10:57:45.000000Z', md5(:k::text || 'p') || md5(:k::text || 'q'),
    md5(:k::text || 'f') || md5(:k::text || 'g'), now())
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key;
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at)
  VALUES ((lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || substr(md5(:k::text || 'e'), 1, 20))::uuid,
    'disbursement.recorded', 'pgbench-' || :a, :seq,
    ('{"event_id":"' || gen_random_uuid() || '","type":"disbursement.recorded","disbursement_id":"' || :did
      || '","award_id":"pgbench-' || :a || '","amount_cents":' || :amt || ',"idempotency_key":"'
      || md5(:k::text) || md5(:k::text || 'k') || '","sequence":' || :seq
      || ',"recorded_at":"2026-11-29T10:57:45.123456Z"}')::jsonb,
    clock_timestamp());
COMMIT;
