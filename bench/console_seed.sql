-- The console benchmark's ledger (scripts/bench --console), set-based:
-- :claims claims over :awards awards (each award's sequences dense, 1..n),
-- their ledger rows, running totals and published outbox events, three
-- audit rows per claim (processed, then two duplicates from the L1 and L2
-- tiers), a backlog of :pending waiting events and :quarantined quarantined
-- ones. psql -v claims=1000000 -v awards=20000 -v pending=1000 -v quarantined=100
\set ON_ERROR_STOP on
SET synchronous_commit = off;

INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
                           submission_timestamp, payload_digest, fingerprint, recorded_at)
SELECT md5('d' || g)::uuid,
       encode(sha256(('k' || g)::bytea), 'hex'),
       'AWD-B-' || lpad((g % :awards)::text, 6, '0'),
       100 + g % 100000,
       g / :awards + 1,
       to_char(timestamptz '2026-01-01' + g * interval '1 second', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       encode(sha256(('p' || g)::bytea), 'hex'),
       encode(sha256(('f' || g)::bytea), 'hex'),
       now() - (:claims - g) * interval '100 milliseconds'
FROM generate_series(0, :claims - 1) g;

INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at)
SELECT idempotency_key, award_id, fingerprint, id, recorded_at FROM disbursements;

INSERT INTO award_balances (award_id, total_cents, disbursement_count, last_sequence, updated_at)
SELECT award_id, sum(amount_cents), count(*), max(sequence), max(recorded_at)
FROM disbursements GROUP BY award_id;

-- Published events: the outbox as the relay leaves it (the queue trigger
-- skips them, being published).
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, published_at, attempts)
SELECT md5('e' || d.id::text)::uuid, 'disbursement.recorded', d.award_id, d.sequence,
       jsonb_build_object('idempotency_key', d.idempotency_key, 'award_id', d.award_id,
                          'amount_cents', d.amount_cents, 'sequence', d.sequence),
       d.recorded_at, d.recorded_at + interval '5 milliseconds', 1
FROM disbursements d;

-- A backlog, and quarantined events (new sequences past each award's last).
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at)
SELECT md5('w' || g)::uuid, 'disbursement.recorded', 'AWD-B-' || lpad((g % :awards)::text, 6, '0'),
       1000000 + g, jsonb_build_object('idempotency_key', 'pending-' || g), now() - g * interval '1 second'
FROM generate_series(1, :pending) g;
INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, attempts, last_error, quarantined_at)
SELECT md5('q' || g)::uuid, 'disbursement.recorded', 'AWD-B-' || lpad((g % :awards)::text, 6, '0'),
       2000000 + g, jsonb_build_object('idempotency_key', 'quarantined-' || g), now() - interval '1 hour',
       5, 'broker rejected the record: MESSAGE_TOO_LARGE', now() - interval '30 minutes'
FROM generate_series(1, :quarantined) g;

-- Three audit rows per claim, in time order.
INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed)
SELECT d.recorded_at + (a.n * interval '1 second'),
       CASE a.n WHEN 0 THEN 'processed' ELSE 'duplicate' END,
       CASE a.n WHEN 0 THEN NULL WHEN 1 THEN 'LOCAL_CACHE' ELSE 'REDIS' END,
       left(d.idempotency_key, 12), d.award_id, 'bench-pod-' || (d.sequence % 4), false
FROM disbursements d CROSS JOIN generate_series(0, 2) AS a(n)
ORDER BY 1;

ANALYZE;
