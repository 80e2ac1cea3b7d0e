-- The peer yardstick's schema (DESIGN §6): the tables a team would create to
-- run the seeds' plain per-delivery transaction in its own consumer. Same
-- keys and checks a correct ledger needs (unique idempotency key, unique
-- per-award sequence, positive amounts), an index for retention and one for
-- the relay's backlog — and nothing a user would not write: no trigger, no
-- NOTIFY, no partitioning.
CREATE TABLE processed_messages (
    idempotency_key text PRIMARY KEY,
    award_id        text        NOT NULL,
    fingerprint     text        NOT NULL,
    disbursement_id uuid        NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX processed_messages_claimed_at ON processed_messages (claimed_at);
CREATE TABLE disbursements (
    id              uuid PRIMARY KEY,
    idempotency_key text        NOT NULL UNIQUE,
    award_id        text        NOT NULL,
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    sequence        bigint      NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (award_id, sequence)
);
CREATE TABLE award_balances (
    award_id      text PRIMARY KEY,
    total_cents   bigint NOT NULL,
    last_sequence bigint NOT NULL
);
CREATE TABLE outbox (
    event_id     uuid PRIMARY KEY,
    event_type   text        NOT NULL,
    award_id     text        NOT NULL,
    sequence     bigint      NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_pending ON outbox (created_at) WHERE published_at IS NULL;
CREATE TABLE audit_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    decision   text        NOT NULL,
    key_prefix text        NOT NULL,
    award_id   text        NOT NULL
);
-- Keys 1..100000 already processed, for the duplicate transaction.
INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence)
SELECT gen_random_uuid(), md5(i::text) || md5(i::text || 'k'), 'peerdup-' || (i % 100), 1 + i % 9973,
       row_number() OVER (PARTITION BY i % 100 ORDER BY i)
FROM generate_series(1, 100000) AS i;
INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id)
SELECT idempotency_key, award_id, md5(idempotency_key), id FROM disbursements;
INSERT INTO award_balances
SELECT award_id, sum(amount_cents), max(sequence) FROM disbursements GROUP BY award_id;
ANALYZE;
