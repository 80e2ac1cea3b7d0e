-- The outbox no longer notifies from inside the claim transaction.
--
-- A transaction that has issued NOTIFY takes a database-wide lock at
-- pre-commit and holds it until its commit record is flushed, so with this
-- trigger every inserting transaction committed one at a time — every claim
-- batch of every instance. The sidecar now wakes its own relay in-process
-- after each commit that wrote outbox rows, and tells other processes'
-- relays (`oncegate relay`, other pods) with a `pg_notify` of its own,
-- outside the claim transaction and at most every few milliseconds; polling
-- (ONCEGATE_RELAY_POLL) stays the floor.
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
DROP FUNCTION IF EXISTS oncegate_outbox_notify();
