-- A slot's read of its pending events (the relay's hot statement) walks
-- the unpublished events in order and stops at its batch, instead of
-- reading every unpublished event (and every index entry a publish has
-- left dead since the last vacuum) and sorting them, once per slot.
--
-- outbox_unpublished replaces outbox_pending: the same rows in the read's
-- order (created_at, sequence), so an index scan returns them sorted and
-- the read stops after its batch; a plain index scan also marks the entries
-- of published rows dead as it passes them, so the next read skips them
-- without a visit to the table (a bitmap scan never does).
CREATE INDEX outbox_unpublished ON outbox (created_at, sequence)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
DROP INDEX outbox_pending;

-- The hold-back of an award behind an event waiting for its retry looks
-- only at events that wait (leased_until set: rejected and postponed), a
-- handful, instead of every earlier unpublished event of the award per
-- candidate row. It replaces outbox_pending_by_award, so a claim's outbox
-- row still updates the same number of indexes.
CREATE INDEX outbox_retry_wait ON outbox (award_id, created_at, sequence)
    WHERE leased_until IS NOT NULL AND published_at IS NULL AND quarantined_at IS NULL;
DROP INDEX outbox_pending_by_award;

-- The read itself. The planner cannot know that a slot is one in `slots`
-- of the unpublished events (the slot is a hash modulo a count it sees as a
-- parameter), so it estimates a handful and prefers to read them all and
-- sort; the settings below make it walk outbox_unpublished in order. They
-- hold for this function's statement only. Same semantics as the statement
-- it replaces: the slot's events in (created_at, sequence) order, nothing
-- once the slot is not held with `generation`, nothing behind an earlier
-- event of its award that waits for a retry. SECURITY INVOKER: it reads
-- with the caller's privileges (SELECT on outbox and relay_slots).
CREATE FUNCTION oncegate_slot_pending(slot integer, generation bigint, slots bigint, batch bigint)
RETURNS TABLE (event_id uuid, event_type text, award_id text, sequence bigint, payload text,
               attempts integer, traceparent text)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_sort = off
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT o.event_id, o.event_type, o.award_id, o.sequence, o.payload::text, o.attempts, o.traceparent
    FROM outbox o
    WHERE o.published_at IS NULL AND o.quarantined_at IS NULL
      AND coalesce(o.award_hash, oncegate_award_hash(o.award_id)) % $3 = $1
      AND (o.leased_until IS NULL OR o.leased_until <= now())
      AND NOT EXISTS (SELECT 1 FROM outbox e
        WHERE e.award_id = o.award_id AND e.published_at IS NULL AND e.quarantined_at IS NULL
          AND e.leased_until IS NOT NULL AND e.leased_until > now()
          AND (e.created_at, e.sequence) < (o.created_at, o.sequence))
      AND EXISTS (SELECT 1 FROM relay_slots s
        WHERE s.slot = $1 AND s.generation = $2 AND s.leased_until > now())
    ORDER BY o.created_at, o.sequence
    LIMIT $4;
END $$;
