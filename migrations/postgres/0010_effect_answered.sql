-- The audit trail's decisions, once more (DESIGN §9): a `Begin` answered
-- with an effect's completed record, from L1, L2 or the store, is audited
-- as 'effect_answered' (with the tier that answered), as a duplicate
-- submission is audited as 'duplicate'. Nothing here is new for the
-- application role to be granted: it already inserts audit rows
-- (migrations/GRANTS.md).
--
-- NOT VALID, as in 0006_operations.sql: every row already there passed the
-- previous, stricter list, and validating would scan every partition while
-- this migration holds the table's ACCESS EXCLUSIVE lock (claims wait on
-- audit inserts meanwhile). The constraint is enforced for every row
-- written from now on. To mark it validated, run as the owner at any time
-- (it takes only SHARE UPDATE EXCLUSIVE, so inserts go on):
--   ALTER TABLE audit_log VALIDATE CONSTRAINT audit_log_decision_check;
ALTER TABLE audit_log DROP CONSTRAINT audit_log_decision_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_decision_check CHECK (decision IN (
    'processed', 'duplicate', 'rejected', 'redriven',
    'effect_acquired', 'effect_completed', 'effect_released', 'effect_retaken', 'effect_rejected',
    'effect_answered'
)) NOT VALID;
