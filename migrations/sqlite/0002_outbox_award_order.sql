-- The relay's lease query skips an event while an earlier event of the same
-- award is leased or postponed; this index answers that per candidate row.
CREATE INDEX outbox_pending_by_award ON outbox (award_id, created_at, sequence)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
