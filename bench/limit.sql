-- The limit (DESIGN §6): oncegate's own set-based statements with :B fresh
-- deliveries per transaction (pgbench -D B=…) on oncegate's own schema —
-- what Postgres can do when batching is perfect. Two statements: the claim
-- rows, then one statement with the running totals, audit rows, ledger rows
-- and outbox events (the sidecar's two statements split elsewhere: the claim
-- rows and the running totals, then the rest, built from the keys it
-- learns it claimed and their numbers).
\set base random(1, 4000000000000000000)
BEGIN;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
  SELECT md5((:base::bigint + g)::text) || md5((:base::bigint + g)::text || 'k'), 'limit-' || ((:base::bigint + g) % 100),
         md5((:base::bigint + g)::text || 'f') || md5((:base::bigint + g)::text || 'g'), gen_random_uuid(), now()
  FROM generate_series(1, :B) AS g ORDER BY 1
  ON CONFLICT (idempotency_key) DO NOTHING;
WITH items AS (
    SELECT g, md5((:base::bigint + g)::text) || md5((:base::bigint + g)::text || 'k') AS k,
           'limit-' || ((:base::bigint + g) % 100) AS a, 1 + (:base::bigint + g) % 9973 AS amt
    FROM generate_series(1, :B) AS g
), bal AS (
    INSERT INTO award_balances AS b (award_id, total_cents, disbursement_count, last_sequence, updated_at)
    SELECT a, sum(amt), count(*), count(*), now() FROM items GROUP BY a ORDER BY a
    ON CONFLICT (award_id) DO UPDATE SET
      total_cents = b.total_cents + excluded.total_cents,
      disbursement_count = b.disbursement_count + excluded.disbursement_count,
      last_sequence = b.last_sequence + excluded.disbursement_count,
      updated_at = excluded.updated_at
    WHERE b.total_cents <= 9223372036854775807 - excluded.total_cents
    RETURNING award_id, last_sequence, disbursement_count, clock_timestamp() AS at
), rows AS (
    SELECT i.*, gen_random_uuid() AS id,
           bal.last_sequence - count(*) OVER (PARTITION BY i.a) + row_number() OVER (PARTITION BY i.a ORDER BY i.g) AS seq,
           bal.at
    FROM items i JOIN bal ON bal.award_id = i.a
), aud AS (
    INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail)
    SELECT now(), 'processed', NULL, substr(k, 1, 12), a, 'pgbench',
           EXISTS (SELECT 1 FROM disbursements o WHERE o.award_id = a
                   AND o.submission_timestamp = '2026-11-29T10:57:45.000000Z' AND o.idempotency_key <> k),
           NULL
    FROM rows
), led AS (
    INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
        submission_timestamp, payload_digest, fingerprint, recorded_at)
    SELECT id, k, a, amt, seq, '2026-11-29T10:57:45.000000Z', md5(k || 'p') || md5(k || 'q'), md5(k || 'f'), at
    FROM rows
    ON CONFLICT (idempotency_key) DO NOTHING
)
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at)
SELECT gen_random_uuid(), 'disbursement.recorded', a, seq,
       jsonb_build_object('disbursement_id', id, 'award_id', a, 'amount_cents', amt,
         'idempotency_key', k, 'sequence', seq, 'recorded_at', at),
       clock_timestamp()
FROM rows ORDER BY a, seq;
COMMIT;
