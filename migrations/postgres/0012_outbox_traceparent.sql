-- The W3C trace context an outbox event was recorded under (traceparent,
-- e.g. 00-<trace id>-<span id>-01), sent with the event by every sink so a
-- downstream consumer continues the trace. NULL when the submission had
-- none. Add-only: older rows and older sidecars leave it NULL.
ALTER TABLE outbox ADD COLUMN traceparent text;
