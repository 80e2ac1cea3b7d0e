-- bench/fill.sql adapted for timing `oncegate reconcile` (psql -v n=200000
-- -f bench/fill_reconcile.sql on a freshly migrated scratch database): the
-- same :n claims over 1000 awards with dense sequences and consistent
-- balances, but a ledger reconcile finds consistent. Fingerprints are the
-- real sha256(award|amount|payload digest); claims are spread evenly over the
-- last 30 days, and those of the last 7 days (the outbox retention) have
-- their published outbox event, as in production after the cleanup.
SET work_mem = '256MB';
SET maintenance_work_mem = '512MB';
SET synchronous_commit = off;
CREATE TEMP TABLE fill AS
SELECT i,
       (lpad(to_hex(i), 12, '0') || substr(md5(i::text || 'u'), 1, 20))::uuid AS id,
       md5(i::text || 'g') || md5(i::text || 'k') AS k,
       'grow-' || (i % 1000) AS award,
       (1 + i % 9973)::bigint AS amount,
       (i / 1000 + 1)::bigint AS seq,
       md5(i::text || 'p') || md5(i::text || 'q') AS digest,
       date_trunc('milliseconds', now() - interval '30 days' + i * (interval '30 days' / :n)) AS at
FROM generate_series(0, :n - 1) AS i;
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
    submission_timestamp, payload_digest, fingerprint, recorded_at)
SELECT id, k, award, amount, seq, '2026-01-01T00:00:00Z', digest,
       encode(sha256(convert_to(award || '|' || amount || '|' || digest, 'UTF8')), 'hex'), at
FROM fill ORDER BY at;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
SELECT idempotency_key, award_id, fingerprint, id, recorded_at FROM disbursements ORDER BY recorded_at;
INSERT INTO award_balances (award_id, total_cents, disbursement_count, last_sequence, updated_at)
SELECT award_id, sum(amount_cents), count(*), max(sequence), now()
FROM disbursements GROUP BY award_id;
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, published_at)
SELECT e, 'disbursement.recorded', award, seq,
       jsonb_build_object('event_id', e, 'type', 'disbursement.recorded', 'disbursement_id', id,
         'award_id', award, 'amount_cents', amount, 'idempotency_key', k, 'sequence', seq,
         'recorded_at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
       at, at + interval '50 milliseconds'
FROM (SELECT *, (lpad(to_hex(i), 12, '0') || substr(md5(i::text || 'e'), 1, 20))::uuid AS e FROM fill) f
WHERE at > now() - interval '7 days' ORDER BY at;
VACUUM ANALYZE;
CHECKPOINT;
