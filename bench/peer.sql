-- The peer (DESIGN §6): the seeds' plain per-delivery transaction, the way
-- a team would write it in the consumer — claim ON CONFLICT DO NOTHING, the
-- running total, the ledger row, the outbox row, the audit row, one commit.
-- Runs on bench/peer_schema.sql (no trigger, no NOTIFY). -M prepared.
\set k random(1, 9000000000000000000)
\set a random(0, 99)
\set amt random(1, 9973)
BEGIN;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id)
  VALUES (md5(:k::text) || md5(:k::text || 'k'), 'peer-' || :a,
          md5(:k::text || 'f') || md5(:k::text || 'g'), gen_random_uuid())
  ON CONFLICT (idempotency_key) DO NOTHING RETURNING disbursement_id AS did \gset
INSERT INTO award_balances AS b (award_id, total_cents, last_sequence)
  VALUES ('peer-' || :a, :amt, 1)
  ON CONFLICT (award_id) DO UPDATE SET total_cents = b.total_cents + excluded.total_cents,
    last_sequence = b.last_sequence + 1
  RETURNING last_sequence AS seq \gset
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence)
  VALUES (:did, md5(:k::text) || md5(:k::text || 'k'), 'peer-' || :a, :amt, :seq);
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload)
  VALUES (gen_random_uuid(), 'disbursement.recorded', 'peer-' || :a, :seq,
    jsonb_build_object('disbursement_id', :did::text, 'award_id', 'peer-' || :a, 'amount_cents', :amt::bigint,
      'idempotency_key', md5(:k::text) || md5(:k::text || 'k'), 'sequence', :seq::bigint));
INSERT INTO audit_log (decision, key_prefix, award_id)
  VALUES ('processed', substr(md5(:k::text), 1, 12), 'peer-' || :a);
COMMIT;
