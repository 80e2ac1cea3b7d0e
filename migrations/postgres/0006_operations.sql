-- Operations (DESIGN §10): `oncegate reconcile`, `inspect` and
-- `outbox list|retry`. Nothing here is new for the application role to be
-- granted: the commands read the tables it already reads, and a redrive
-- updates outbox rows and inserts an audit row, which it already may
-- (migrations/GRANTS.md). Indexes need no grant.

-- 1. The audit trail's decisions. A redrive of a quarantined outbox event is
-- audited as 'redriven'; the effect_* decisions are the idempotency records'
-- (DESIGN §9), listed now so that this CHECK changes once.
--
-- NOT VALID: every row already there passed the previous, stricter list, and
-- validating would scan every partition while this migration holds the
-- table's ACCESS EXCLUSIVE lock (claims wait on audit inserts meanwhile).
-- The constraint is enforced for every row written from now on. To mark it
-- validated, run as the owner at any time (it takes only SHARE UPDATE
-- EXCLUSIVE, so inserts go on):
--   ALTER TABLE audit_log VALIDATE CONSTRAINT audit_log_decision_check;
ALTER TABLE audit_log DROP CONSTRAINT audit_log_decision_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_decision_check CHECK (decision IN (
    'processed', 'duplicate', 'rejected', 'redriven',
    'effect_acquired', 'effect_completed', 'effect_released', 'effect_retaken', 'effect_rejected'
)) NOT VALID;

-- 2. Indexes.
--
-- An event by its ledger row (reconcile: one event per ledger row; inspect;
-- `outbox list --award`). Every claim inserts one more entry here.
CREATE INDEX IF NOT EXISTS outbox_award_sequence ON outbox (award_id, sequence);
-- The quarantined events, for `outbox list --quarantined` and
-- `outbox retry --all-quarantined` (only quarantined rows are in it).
CREATE INDEX IF NOT EXISTS outbox_quarantined ON outbox (created_at, sequence)
    WHERE quarantined_at IS NOT NULL AND published_at IS NULL;
-- A key's audit history (`inspect`): audit rows hold the key's first 12
-- characters. On a large audit_log this build blocks audit inserts while it
-- runs; build it beforehand without blocking, as the owner, and this
-- statement is then a no-op:
--   CREATE INDEX audit_log_key_prefix ON ONLY audit_log (key_prefix);
--   -- for each partition P of audit_log:
--   CREATE INDEX CONCURRENTLY P_key_prefix_idx ON P (key_prefix);
--   ALTER INDEX audit_log_key_prefix ATTACH PARTITION P_key_prefix_idx;
CREATE INDEX IF NOT EXISTS audit_log_key_prefix ON audit_log (key_prefix);
