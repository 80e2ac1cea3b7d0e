-- Fills a freshly migrated scratch database with :n committed claims for
-- the growth measurement (psql -v n=10000000 -f bench/fill.sql), set-based:
-- ledger rows (1000 awards, contiguous sequences, time-ordered ids), the
-- claim rows pointing at them, consistent balances. Rows go in time order as
-- in production: the key indexes take random inserts, the time indexes
-- append. VACUUM ANALYZE at the end, so autovacuum does not start during the
-- measurement.
SET work_mem = '256MB';
SET maintenance_work_mem = '512MB';
SET synchronous_commit = off;  -- the fill only; the measurement runs with the server default
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
    submission_timestamp, payload_digest, fingerprint, recorded_at)
SELECT (lpad(to_hex(i), 12, '0') || substr(md5(i::text || 'u'), 1, 20))::uuid,
       md5(i::text || 'g') || md5(i::text || 'k'), 'grow-' || (i % 1000), 1 + i % 9973,
       i / 1000 + 1, '2026-01-01T00:00:00Z', md5(i::text || 'p') || md5(i::text || 'q'),
       md5(i::text || 'f') || md5(i::text || 'h'),
       now() - interval '30 days' + i * interval '100 microseconds'
FROM generate_series(0, :n - 1) AS i;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
SELECT md5(i::text || 'g') || md5(i::text || 'k'), 'grow-' || (i % 1000),
       md5(i::text || 'f') || md5(i::text || 'h'),
       (lpad(to_hex(i), 12, '0') || substr(md5(i::text || 'u'), 1, 20))::uuid,
       now() - interval '30 days' + i * interval '100 microseconds'
FROM generate_series(0, :n - 1) AS i;
INSERT INTO award_balances (award_id, total_cents, disbursement_count, last_sequence, updated_at)
SELECT award_id, sum(amount_cents), count(*), max(sequence), now()
FROM disbursements GROUP BY award_id;
VACUUM ANALYZE;
CHECKPOINT;
