-- Signed seals, as in postgres/0011_signed_seals.sql: an Ed25519 signature
-- over the digest and the signing key's id; NULL on unsigned seals.
ALTER TABLE audit_seals ADD COLUMN signature TEXT;
ALTER TABLE audit_seals ADD COLUMN key_id TEXT;
