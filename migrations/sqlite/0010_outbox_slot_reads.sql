-- A slot's read of its pending events (the relay's hot statement), as in
-- migrations/postgres/0015_outbox_slot_reads.sql: the unpublished events
-- indexed in the read's order (created_at, sequence), so it walks them
-- sorted and stops at its batch (no sort of the ties on created_at), and
-- the hold-back of an award behind an event waiting for its retry looks
-- only at the events that wait (leased_until set), not at every earlier
-- unpublished event of the award per candidate row. Each replaces an
-- index, so an outbox row still updates as many.
CREATE INDEX outbox_unpublished ON outbox (created_at, sequence)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
DROP INDEX outbox_pending;

CREATE INDEX outbox_retry_wait ON outbox (award_id, created_at, sequence)
    WHERE leased_until IS NOT NULL AND published_at IS NULL AND quarantined_at IS NULL;
DROP INDEX outbox_pending_by_award;
