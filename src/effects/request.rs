//! Validation of effect calls (DESIGN §9): every failure names its field,
//! and nothing reaches the store before it passes.

use crate::error::GateError;
use crate::pb;
use crate::store::EffectBegin;
use crate::store::effect::Fence;
use std::sync::Arc;
use std::time::Duration;

/// Largest `request` and `response`.
pub const MAX_BYTES: usize = 1024 * 1024;
/// `lease_ttl` when the caller sets none.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Longest `lease_ttl`.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(15 * 60);
const MAX_NAMESPACE: usize = 64;
const MAX_TOKEN: usize = 64;
const MAX_REASON: usize = 256;

/// A validated `Begin`: the request itself is gone, only its digest is kept.
#[derive(Debug, Clone)]
pub(super) struct BeginRequest {
    pub namespace: String,
    pub key: String,
    /// `{namespace}|{key}`: the caches' and waiters' key.
    pub id: String,
    pub fingerprint: String,
    pub lease_ttl: Duration,
}

impl BeginRequest {
    pub fn validate(raw: &pb::BeginRequest) -> Result<Self, GateError> {
        validate_namespace(&raw.namespace)?;
        validate_key(&raw.idempotency_key)?;
        check_size("request", &raw.request)?;
        Ok(Self {
            id: record_id(&raw.namespace, &raw.idempotency_key),
            namespace: raw.namespace.clone(),
            key: raw.idempotency_key.clone(),
            fingerprint: crate::key::payload_digest(&raw.request),
            lease_ttl: lease_ttl(raw.lease_ttl.as_ref())?,
        })
    }

    /// The store's view, with a fresh lease token.
    pub fn to_store(&self, instance: Arc<str>) -> EffectBegin {
        EffectBegin {
            namespace: self.namespace.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            token: uuid::Uuid::new_v4().simple().to_string(),
            lease_ttl: self.lease_ttl,
            instance,
        }
    }
}

/// A validated `Complete` or `Release` target.
#[derive(Debug, Clone)]
pub(super) struct Fenced {
    pub namespace: String,
    pub key: String,
    pub id: String,
    pub token: String,
}

impl Fenced {
    pub fn validate(namespace: &str, key: &str, token: &str) -> Result<Self, GateError> {
        validate_namespace(namespace)?;
        validate_key(key)?;
        if token.is_empty() {
            return Err(GateError::invalid("lease_token is required"));
        }
        if token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(GateError::invalid(
                "lease_token is not a token Begin issued (at most 64 ASCII letters and digits)",
            ));
        }
        Ok(Self {
            id: record_id(namespace, key),
            namespace: namespace.to_string(),
            key: key.to_string(),
            token: token.to_string(),
        })
    }

    pub fn fence<'a>(&'a self, instance: &'a str) -> Fence<'a> {
        Fence {
            namespace: &self.namespace,
            key: &self.key,
            token: &self.token,
            instance,
        }
    }
}

/// `RESOURCE_EXHAUSTED` over [`MAX_BYTES`], as Submit's payload (DESIGN §1):
/// the message names the field and both sizes.
pub fn check_size(field: &str, bytes: &[u8]) -> Result<(), GateError> {
    if bytes.len() > MAX_BYTES {
        return Err(GateError::TooLarge(format!(
            "{field} is {} bytes, the limit is {MAX_BYTES} bytes",
            bytes.len()
        )));
    }
    Ok(())
}

fn record_id(namespace: &str, key: &str) -> String {
    format!("{namespace}|{key}")
}

/// 1–64 characters of `[a-z0-9._-]`.
pub fn validate_namespace(ns: &str) -> Result<(), GateError> {
    if ns.is_empty() {
        return Err(GateError::invalid("namespace is required"));
    }
    if ns.len() > MAX_NAMESPACE {
        return Err(GateError::invalid(format!(
            "namespace is {} characters, at most {MAX_NAMESPACE} allowed",
            ns.chars().count()
        )));
    }
    if !ns
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(GateError::invalid(
            "namespace may contain only lowercase ASCII letters, digits and . _ -",
        ));
    }
    Ok(())
}

/// As a producer-supplied key of DESIGN §1, and required.
fn validate_key(key: &str) -> Result<(), GateError> {
    if key.is_empty() {
        return Err(GateError::invalid("idempotency_key is required"));
    }
    crate::submission::validate_producer_key(key)
}

fn lease_ttl(raw: Option<&prost_types::Duration>) -> Result<Duration, GateError> {
    let Some(d) = raw else {
        return Ok(DEFAULT_LEASE_TTL);
    };
    if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) {
        return Err(GateError::invalid("lease_ttl must be greater than 0"));
    }
    let ttl = Duration::new(d.seconds as u64, d.nanos.min(999_999_999) as u32);
    if ttl > MAX_LEASE_TTL {
        return Err(GateError::invalid(format!(
            "lease_ttl is {}, at most 15m allowed",
            humantime::format_duration(ttl)
        )));
    }
    Ok(ttl.max(Duration::from_millis(1)))
}

/// At most 256 characters, none of them control characters (it is written
/// to the audit row as it is).
pub fn validate_reason(reason: &str) -> Result<&str, GateError> {
    if reason.chars().count() > MAX_REASON {
        return Err(GateError::invalid(format!(
            "reason is longer than {MAX_REASON} characters"
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(GateError::invalid("reason must not contain control characters"));
    }
    Ok(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(ns: &str, key: &str, ttl: Option<(i64, i32)>) -> pb::BeginRequest {
        pb::BeginRequest {
            namespace: ns.into(),
            idempotency_key: key.into(),
            request: b"{}".to_vec(),
            lease_ttl: ttl.map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        }
    }

    fn message(raw: pb::BeginRequest) -> String {
        BeginRequest::validate(&raw).unwrap_err().to_string()
    }

    #[test]
    fn each_bad_field_is_named() {
        assert!(message(begin("", "k", None)).contains("namespace"));
        assert!(message(begin("Pay", "k", None)).contains("namespace"));
        assert!(message(begin(&"a".repeat(65), "k", None)).contains("namespace"));
        assert!(message(begin("pay", "", None)).contains("idempotency_key"));
        assert!(message(begin("pay", "a b", None)).contains("idempotency_key"));
        assert!(message(begin("pay", "k", Some((0, 0)))).contains("lease_ttl"));
        assert!(message(begin("pay", "k", Some((-1, 0)))).contains("lease_ttl"));
        assert!(message(begin("pay", "k", Some((901, 0)))).contains("lease_ttl"));
        assert!(
            validate_reason("a\nb")
                .unwrap_err()
                .to_string()
                .contains("reason")
        );
    }

    #[test]
    fn oversized_request_and_response_are_resource_exhausted_naming_the_field() {
        let mut big = begin("pay", "k", None);
        big.request = vec![0; MAX_BYTES + 1];
        let e = BeginRequest::validate(&big).unwrap_err();
        assert!(matches!(e, GateError::TooLarge(_)), "{e:?}");
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            e.to_string(),
            format!(
                "request is {} bytes, the limit is {MAX_BYTES} bytes",
                MAX_BYTES + 1
            )
        );
        big.request.pop();
        assert!(BeginRequest::validate(&big).is_ok(), "exactly 1 MiB is allowed");
        let e = check_size("response", &vec![0; MAX_BYTES + 1]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.to_string().starts_with("response is 1048577 bytes"), "{e}");
        assert!(check_size("response", &vec![0; MAX_BYTES]).is_ok());
    }

    #[test]
    fn defaults_and_limits() {
        let ok = BeginRequest::validate(&begin("a.b_c-9", &"k".repeat(128), None)).unwrap();
        assert_eq!(ok.lease_ttl, DEFAULT_LEASE_TTL);
        assert_eq!(ok.id, format!("a.b_c-9|{}", "k".repeat(128)));
        let max = BeginRequest::validate(&begin("a", "k", Some((900, 0)))).unwrap();
        assert_eq!(max.lease_ttl, MAX_LEASE_TTL);
    }
}
