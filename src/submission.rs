//! Validation of incoming submissions: every rule of DESIGN §1, each failure
//! naming its field. Nothing reaches a store before it passes here.

use crate::error::GateError;
use crate::key;
use crate::pb;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

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
    /// The W3C `traceparent` its outbox event carries (see
    /// [`crate::telemetry::for_outbox`]); not part of its identity.
    pub traceparent: Option<String>,
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
            traceparent: None,
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
    if let Some((c, category)) = award_id.chars().find_map(|c| refused_char(c).map(|k| (c, k))) {
        return Err(GateError::invalid(format!(
            "award_id must be printable, found {category} U+{:04X}",
            c as u32
        )));
    }
    if award_id.starts_with(char::is_whitespace) || award_id.ends_with(char::is_whitespace) {
        return Err(GateError::invalid(
            "award_id must not begin or end with white space",
        ));
    }
    Ok(())
}

/// Why an award id may not contain `c`, or `None` when it may: a control,
/// format (zero-width, bidi override, BOM), line or paragraph separator,
/// private-use or unassigned character — what could make two award ids look
/// alike in a ledger while differing in bytes. The name is the one the
/// error message gives; `clients/vectors/refused_chars.json` is this table,
/// for the clients (its test compares every code point).
pub fn refused_char(c: char) -> Option<&'static str> {
    Some(match c.general_category() {
        GeneralCategory::Control => "control character",
        GeneralCategory::Format => "format character",
        GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator => "line or paragraph separator",
        GeneralCategory::PrivateUse => "private-use character",
        GeneralCategory::Unassigned | GeneralCategory::Surrogate => "unassigned character",
        _ => return None,
    })
}

/// The version of the Unicode tables [`refused_char`] follows.
pub const UNICODE_VERSION: (u64, u64, u64) = unicode_properties::UNICODE_VERSION;

const TIMESTAMP_FORMAT: &str =
    "submission_timestamp must be an RFC 3339 date-time (e.g. 2026-11-29T10:57:45Z)";

fn validate_timestamp(ts: &str) -> Result<(), GateError> {
    if ts.is_empty() {
        return Err(GateError::invalid("submission_timestamp is required"));
    }
    if ts.len() > 64 {
        return Err(GateError::invalid("submission_timestamp is longer than 64 bytes"));
    }
    if let Some(c) = ts.chars().find(|c| c.is_control()) {
        return Err(GateError::invalid(format!(
            "submission_timestamp must not contain control characters, found U+{:04X}",
            c as u32
        )));
    }
    if ts.as_bytes().get(10).is_some_and(|b| !matches!(b, b'T' | b't')) {
        return Err(GateError::invalid(format!(
            "{TIMESTAMP_FORMAT}: date and time must be separated by 'T'"
        )));
    }
    if !is_rfc3339_date_time(ts.as_bytes()) {
        return Err(GateError::invalid(TIMESTAMP_FORMAT));
    }
    Ok(())
}

/// RFC 3339 §5.6 `date-time`, exactly: `YYYY-MM-DD` `T`|`t` `hh:mm:ss`
/// [`.` digits] (`Z`|`z`|`±hh:mm`), with real calendar dates (leap years)
/// and a leap second only in a minute's last second (`:59:60`).
fn is_rfc3339_date_time(b: &[u8]) -> bool {
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(r)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let (Some(hour), Some(minute), Some(second)) = (digits(11..13), digits(14..16), digits(17..19)) else {
        return false;
    };
    if !(at(4, b'-') && at(7, b'-') && matches!(b.get(10), Some(b'T' | b't')) && at(13, b':') && at(16, b':'))
    {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if !(1..=days).contains(&day) || hour > 23 || minute > 59 || second > 60 || (second == 60 && minute != 59)
    {
        return false;
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|d| d.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit())
                && (h1 - b'0') * 10 + (h2 - b'0') <= 23
                && (m1 - b'0') * 10 + (m2 - b'0') <= 59
        }
        _ => false,
    }
}

pub(crate) fn validate_producer_key(k: &str) -> Result<(), GateError> {
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
    fn only_an_exact_rfc3339_date_time_is_a_timestamp() {
        for ok in [
            "2026-11-29T10:00:00Z",
            "2026-11-29t10:00:00z",
            "2026-11-29T10:00:00.123456+05:30",
            "2024-02-29T23:59:60-00:00",
            "0001-01-01T00:00:00Z",
        ] {
            assert!(validate_timestamp(ok).is_ok(), "{ok}");
        }
        for bad in [
            "2026-11-29x10:00:00Z",
            "2026-11-29 10:00:00Z",
            "2026-11-29\u{0}10:00:00Z",
            "2026-11-29\n10:00:00Z",
            "2026-11-29T10:00:00Z\n",
            "2025-02-29T10:00:00Z",
            "2026-04-31T10:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:00:60Z",
            "2026-11-29T10:00:00.Z",
            "2026-11-29T10:00:00+2400",
            "2026-11-29T10:00:00+24:00",
            "2026-11-29T10:00:00",
            "2026-11-29T10:00Z",
            "+2026-11-29T10:00:00Z",
            "２026-11-29T10:00:00Z",
        ] {
            let err = validate_timestamp(bad).expect_err(bad).to_string();
            assert!(err.contains("submission_timestamp"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn award_ids_that_could_look_like_another_are_refused() {
        for bad in [
            "AWD\u{200B}1",
            "AWD\u{202E}1",
            "\u{FEFF}AWD-1",
            "AWD\u{2028}1",
            "AWD\u{E000}1",
            "AWD\u{0378}1",
            " AWD-1",
            "AWD-1\u{00A0}",
            "AWD-1\t",
        ] {
            let err = validate_award_id(bad).expect_err(bad).to_string();
            assert!(err.contains("award_id"), "{bad:?}: {err}");
        }
        assert!(validate_award_id("AWD 2026/é-1").is_ok());
    }

    #[test]
    fn unicode_award_ids_count_characters() {
        let mut raw = ok();
        raw.award_id = "é".repeat(128);
        assert!(Submission::validate(&raw, Limits::default()).is_ok());
    }
}
