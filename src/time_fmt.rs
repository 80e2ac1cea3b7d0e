//! Timestamp formatting shared by the wire, the outbox and the caches.

use time::OffsetDateTime;

/// RFC 3339 UTC with exactly six fractional digits.
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// Microseconds since the Unix epoch.
pub fn to_micros(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1000) as i64
}

/// The inverse of [`to_micros`].
pub fn from_micros(us: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(us as i128 * 1000).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Now, truncated to microseconds (both stores keep microseconds).
pub fn now_micros() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1000 * 1000)
        .unwrap_or(now)
}

/// Serde `serialize_with` helpers: times as [`rfc3339`] strings.
pub mod serde_rfc3339 {
    use time::OffsetDateTime;

    pub fn serialize<S: serde::Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::rfc3339(*t))
    }

    /// An optional time: `null` when absent.
    pub fn option<S: serde::Serializer>(t: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::rfc3339(*t)),
            None => s.serialize_none(),
        }
    }
}
