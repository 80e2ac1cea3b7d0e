-- The peer's redelivery: the claim hits the existing key, the stored result
-- is read back, and the decision is audited (every decision is, in this
-- domain). Keys 1..100000 are pre-populated by bench/peer_schema.sql.
\set d random(1, 100000)
BEGIN;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id)
  VALUES (md5(:d::text) || md5(:d::text || 'k'), 'peerdup-' || (:d % 100),
          md5(md5(:d::text) || md5(:d::text || 'k')), gen_random_uuid())
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING idempotency_key;
SELECT id, award_id, amount_cents, sequence, recorded_at
  FROM disbursements WHERE idempotency_key = md5(:d::text) || md5(:d::text || 'k');
INSERT INTO audit_log (decision, key_prefix, award_id)
  VALUES ('duplicate', substr(md5(:d::text), 1, 12), 'peerdup-' || (:d % 100));
COMMIT;
