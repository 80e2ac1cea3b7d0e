-- Pre-populates a scratch database (migrated by `oncegate migrate`) with
-- 100000 committed claims for the pgbench duplicate transaction (dup.sql):
-- claim rows, ledger rows with per-award sequences, consistent balances.
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
    submission_timestamp, payload_digest, fingerprint, recorded_at)
SELECT gen_random_uuid(), md5(i::text) || md5(i::text || 'k'), 'pgdup-' || (i % 100), 1 + i % 9973,
       row_number() OVER (PARTITION BY i % 100 ORDER BY i), '2026-11-29T10:57:45.000000Z', md5(i::text || 'p') || md5(i::text || 'q'),
       md5(i::text || 'f') || md5(i::text || 'g'), now()
FROM generate_series(1, 100000) AS i;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
SELECT idempotency_key, award_id, fingerprint, id, recorded_at FROM disbursements WHERE award_id LIKE 'pgdup-%';
INSERT INTO award_balances (award_id, total_cents, disbursement_count, last_sequence, updated_at)
SELECT award_id, sum(amount_cents), count(*), max(sequence), now() FROM disbursements
WHERE award_id LIKE 'pgdup-%' GROUP BY award_id;
ANALYZE;
