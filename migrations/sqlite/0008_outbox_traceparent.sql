-- The W3C trace context an outbox event was recorded under, as in
-- postgres/0012_outbox_traceparent.sql; NULL when the submission had none.
ALTER TABLE outbox ADD COLUMN traceparent TEXT;
