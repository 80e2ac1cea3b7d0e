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
