-- The audit rows, the ledger rows and the outbox events of one claim
-- transaction, in one statement (one round trip instead of three). Runs
-- after the claim rows and the running totals; with no claimed item the
-- ledger and outbox arrays are empty and only audit rows are written.
--
-- Parameters (the arrays of one group are parallel: element i is row i):
--   $1  at                 timestamptz    the transaction's time
--   $2  instance           text           this instance, for the audit rows
-- audit rows, one per item decided in the transaction:
--   $3  decision           text[]         processed | duplicate | rejected
--   $4  tier               text[]         deciding tier; NULL for processed
--   $5  key_prefix         text[]         first 12 characters of the key
--   $6  award_id           text[]
--   $7  submitted_at       text[]         submission timestamp (changed-payload probe)
--   $8  idempotency_key    text[]         (changed-payload probe only; never stored)
--   $9  changed_in_batch   bool[]         an earlier item of this batch has the
--                                         same award id and timestamp under another key
-- ledger rows and their outbox events, one per claimed item:
--   $10 id                 uuid[]
--   $11 idempotency_key    text[]
--   $12 award_id           text[]
--   $13 amount_cents       bigint[]
--   $14 sequence           bigint[]
--   $15 submission_ts      text[]
--   $16 payload_digest     text[]
--   $17 fingerprint        text[]
--   $18 recorded_at        timestamptz[]
--   $19 event_id           uuid[]
--   $20 event_body         text[]         JSON
--   $21 traceparent        text[]         W3C trace context; NULL elements for none
-- the synchronous-standby guard (ONCEGATE_REQUIRE_SYNC_REPLICA):
--   $22 read_standbys      bool           read oncegate_sync_standbys() (else NULLs)
-- the relay's slots:
--   $23 award_hash         bigint[]       the award's slot hash (store::slots::award_hash)
--
-- Returns one row: the number of processed audit rows flagged
-- payload_changed, and the keys whose ledger row went in. A claimed key
-- missing from that list was already in the ledger (its claim purged long
-- ago): a late redelivery, and the caller rolls back. With $22, also the
-- primary's synchronous standbys as this statement — the transaction's last
-- before COMMIT — found them: the caller rolls back when they fall short
-- (the function is not called at all without $22: a one-time filter).
--
-- A processed item is flagged payload_changed when the ledger already holds
-- its award id and timestamp under another key. The probe sees the ledger as
-- it was before this statement (a statement's snapshot excludes its own
-- rows), so repeats within the batch come from $9.
--
-- Outbox created_at is clock_timestamp(), taken after the awards' balance
-- rows were locked earlier in the transaction, so per award created_at order
-- is sequence order.
WITH aud AS (
    INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail)
    SELECT $1, x.d, x.t, x.p, x.a, $2,
        x.d = 'processed' AND (x.b OR EXISTS (
            SELECT 1 FROM disbursements o
            WHERE o.award_id = x.a AND o.submission_timestamp = x.ts AND o.idempotency_key <> x.k)),
        CASE WHEN x.d = 'rejected' THEN 'idempotency key reused with a different submission' END
    FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bool[])
        AS x(d, t, p, a, ts, k, b)
    RETURNING payload_changed
), led AS (
    INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence,
        submission_timestamp, payload_digest, fingerprint, recorded_at)
    SELECT * FROM unnest($10::uuid[], $11::text[], $12::text[], $13::bigint[], $14::bigint[],
        $15::text[], $16::text[], $17::text[], $18::timestamptz[])
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING idempotency_key
), ob AS (
    INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at, traceparent, award_hash)
    SELECT e, 'disbursement.recorded', a, s, p::jsonb, clock_timestamp(), t, h
    FROM unnest($19::uuid[], $12::text[], $14::bigint[], $20::text[], $21::text[], $23::bigint[])
        AS x(e, a, s, p, t, h)
    ORDER BY a, s
)
SELECT (SELECT count(*) FILTER (WHERE payload_changed) FROM aud),
       (SELECT coalesce(array_agg(idempotency_key), '{}') FROM led),
       g.standby_names, g.required, g.streaming
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT * FROM oncegate_sync_standbys() WHERE $22) AS g ON true
