-- pgbench: a redelivery decided by the database: the claim insert hits the
-- existing key (ON CONFLICT DO NOTHING, no row) and the stored result is
-- loaded from the ledger. Keys 1..100000 are pre-populated by prepare.sql.
-- (The sidecar also writes an audit row per duplicate, batched; this
-- yardstick does not, which favours pgbench.)
\set d random(1, 100000)
BEGIN;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
  VALUES (md5(:d::text) || md5(:d::text || 'k'), 'pgdup-' || (:d % 100),
          md5(:d::text || 'f') || md5(:d::text || 'g'), gen_random_uuid(), now())
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key;
SELECT idempotency_key, fingerprint, id, award_id, amount_cents, recorded_at, sequence
  FROM disbursements WHERE idempotency_key = md5(:d::text) || md5(:d::text || 'k');
COMMIT;
