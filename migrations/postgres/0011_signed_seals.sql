-- Signed seals (README "Audit trail and retention"): with
-- ONCEGATE_AUDIT_SIGNING_KEY_FILE set, each seal carries an Ed25519
-- signature over its digest and the id of the key that made it. A database
-- owner who rewrites rows can recompute every digest from the published
-- encoding, but not the signatures: `oncegate audit verify --public-key`
-- refuses such a chain. Add-only: older seals stay unsigned (NULL).
ALTER TABLE audit_seals
    ADD COLUMN signature text,
    ADD COLUMN key_id    text,
    ADD CONSTRAINT audit_seals_signed_with_key CHECK ((signature IS NULL) = (key_id IS NULL));
