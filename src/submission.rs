//! Validation of incoming submissions: every rule of DESIGN §1, each failure
//! naming its field. Nothing reaches a store before it passes here.

use crate::error::GateError;
use crate::key;
use crate::pb;
use time::format_description::well_known::Rfc3339;

/// Longest award id, in characters.
pub const MAX_AWARD_ID_CHARS: usize = 128;

/// Where a submission's key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// Derived from award id, timestamp and payload digest.
    Derived,
    /// Supplied by the producer.
    Producer,
}

/// A validated submission. The payload itself is not kept: only its digest.
#[derive(Debug, Clone)]
pub struct Submission {
    pub key: String,
    pub key_source: KeySource,
    pub award_id: String,
    pub submission_timestamp: String,
    pub amount_cents: i64,
    pub payload_digest: String,
    pub fingerprint: String,
}

/// Limits applied while validating.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_payload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 1024 * 1024,
        }
    }
}

impl Submission {
    /// Checks every field and derives the key and fingerprint.
    pub fn validate(raw: &pb::Submission, limits: Limits) -> Result<Self, GateError> {
        validate_award_id(&raw.award_id)?;
        validate_timestamp(&raw.submission_timestamp)?;
        if raw.amount_cents <= 0 {
            return Err(GateError::invalid(format!(
                "amount_cents must be greater than 0, got {}",
                raw.amount_cents
            )));
        }
        if raw.payload.len() > limits.max_payload_bytes {
            return Err(GateError::TooLarge(format!(
                "payload is {} bytes, the limit is {} bytes",
                raw.payload.len(),
                limits.max_payload_bytes
            )));
        }
        let payload_digest = key::payload_digest(&raw.payload);
        let (key, key_source) = match &raw.idempotency_key {
            Some(k) => {
                validate_producer_key(k)?;
                (k.clone(), KeySource::Producer)
            }
            None => (
                key::derive_key_from_digest(&raw.award_id, &raw.submission_timestamp, &payload_digest),
                KeySource::Derived,
            ),
        };
        let fingerprint = key::fingerprint(&raw.award_id, raw.amount_cents, &payload_digest);
        Ok(Self {
            key,
            key_source,
            award_id: raw.award_id.clone(),
            submission_timestamp: raw.submission_timestamp.clone(),
            amount_cents: raw.amount_cents,
            payload_digest,
            fingerprint,
        })
    }
}

fn validate_award_id(award_id: &str) -> Result<(), GateError> {
    let chars = award_id.chars().count();
    if chars == 0 {
        return Err(GateError::invalid("award_id is required"));
    }
    if chars > MAX_AWARD_ID_CHARS {
        return Err(GateError::invalid(format!(
            "award_id is {chars} characters, at most {MAX_AWARD_ID_CHARS} allowed"
        )));
    }
    if award_id.contains('|') {
        return Err(GateError::invalid("award_id must not contain '|'"));
    }
    if let Some(c) = award_id.chars().find(|c| c.is_control()) {
        return Err(GateError::invalid(format!(
            "award_id must be printable, found control character U+{:04X}",
            c as u32
        )));
    }
    Ok(())
}

fn validate_timestamp(ts: &str) -> Result<(), GateError> {
    if ts.is_empty() {
        return Err(GateError::invalid("submission_timestamp is required"));
    }
    if ts.len() > 64 {
        return Err(GateError::invalid("submission_timestamp is longer than 64 bytes"));
    }
    time::OffsetDateTime::parse(ts, &Rfc3339).map_err(|_| {
        GateError::invalid("submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)")
    })?;
    Ok(())
}

fn validate_producer_key(k: &str) -> Result<(), GateError> {
    if k.is_empty() || k.len() > 128 {
        return Err(GateError::invalid(
            "idempotency_key must be 1 to 128 characters when set",
        ));
    }
    if !k
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err(GateError::invalid(
            "idempotency_key may contain only ASCII letters, digits and - _ . :",
        ));
    }
    Ok(())
}

/// Validates an idempotency key given to `Lookup`.
pub fn validate_lookup_key(k: &str) -> Result<(), GateError> {
    validate_producer_key(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> pb::Submission {
        pb::Submission {
            award_id: "AWD-1".into(),
            submission_timestamp: "2026-11-29T10:00:00Z".into(),
            payload: b"{}".to_vec(),
            amount_cents: 100,
            idempotency_key: None,
        }
    }

    fn message_of(raw: pb::Submission) -> String {
        Submission::validate(&raw, Limits::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn each_bad_field_is_named() {
        type Mutation = fn(&mut pb::Submission);
        let cases: Vec<(Mutation, &str)> = vec![
            (|s| s.award_id.clear(), "award_id"),
            (|s| s.award_id = "x".repeat(129), "award_id"),
            (|s| s.award_id = "a|b".into(), "award_id"),
            (|s| s.award_id = "a\u{7}".into(), "award_id"),
            (|s| s.submission_timestamp.clear(), "submission_timestamp"),
            (
                |s| s.submission_timestamp = "yesterday".into(),
                "submission_timestamp",
            ),
            (|s| s.amount_cents = 0, "amount_cents"),
            (|s| s.amount_cents = -5, "amount_cents"),
            (|s| s.idempotency_key = Some(String::new()), "idempotency_key"),
            (|s| s.idempotency_key = Some("a b".into()), "idempotency_key"),
            (|s| s.payload = vec![0; 1024 * 1024 + 1], "payload"),
        ];
        for (mutate, field) in cases {
            let mut raw = ok();
            mutate(&mut raw);
            let msg = message_of(raw);
            assert!(msg.contains(field), "{msg:?} should name {field}");
        }
    }

    #[test]
    fn timestamp_is_used_verbatim() {
        let mut a = ok();
        a.submission_timestamp = "2026-11-29T10:00:00+00:00".into();
        let b = ok();
        let ka = Submission::validate(&a, Limits::default()).unwrap().key;
        let kb = Submission::validate(&b, Limits::default()).unwrap().key;
        assert_ne!(ka, kb, "equal instants written differently are different keys");
    }

    #[test]
    fn unicode_award_ids_count_characters() {
        let mut raw = ok();
        raw.award_id = "é".repeat(128);
        assert!(Submission::validate(&raw, Limits::default()).is_ok());
    }
}
