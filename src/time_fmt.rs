//! Timestamp formatting shared by the wire, the outbox and the caches.

use time::OffsetDateTime;

/// RFC 3339 UTC with exactly six fractional digits
/// (`2026-12-03T18:19:04.441293Z`). Written digit by digit: on every
/// answer's wire time and every log line, where `format!` cost ~3,500
/// instructions.
pub fn rfc3339(t: OffsetDateTime) -> String {
    match four_digit_year(t) {
        Some(text) => String::from_utf8(text.to_vec()).expect("digits and separators are ASCII"),
        None => rfc3339_any_year(t),
    }
}

/// [`rfc3339`]'s text in a buffer, for years 0000-9999 (else `None`).
fn four_digit_year(t: OffsetDateTime) -> Option<[u8; 27]> {
    let t = t.to_offset(time::UtcOffset::UTC);
    let year = u32::try_from(t.year()).ok().filter(|y| *y <= 9999)?;
    let mut out = *b"0000-00-00T00:00:00.000000Z";
    put_digits(&mut out[0..4], year);
    put_digits(&mut out[5..7], u8::from(t.month()).into());
    put_digits(&mut out[8..10], t.day().into());
    put_digits(&mut out[11..13], t.hour().into());
    put_digits(&mut out[14..16], t.minute().into());
    put_digits(&mut out[17..19], t.second().into());
    put_digits(&mut out[20..26], t.microsecond());
    Some(out)
}

/// `value`'s last `out.len()` decimal digits, zero-padded.
fn put_digits(out: &mut [u8], mut value: u32) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// The general form, for years outside 0000-9999 (a sign, or five digits).
fn rfc3339_any_year(t: OffsetDateTime) -> String {
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

/// The log lines' time: now, as [`rfc3339`] (the same text as
/// `tracing_subscriber`'s default timer, at a third of its cost).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogTime;

impl tracing_subscriber::fmt::time::FormatTime for LogTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let now = OffsetDateTime::now_utc();
        match four_digit_year(now) {
            Some(text) => w.write_str(std::str::from_utf8(&text).expect("digits and separators are ASCII")),
            None => w.write_str(&rfc3339_any_year(now)),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The digit-by-digit form is the general one's text, from the epoch to
    /// 9999 (ends of months and years, leap days, every field's extremes).
    #[test]
    fn rfc3339_writes_what_the_general_form_writes() {
        let mut us: i64 = 0;
        let end = to_micros(time::macros::datetime!(9999-12-31 23:59:59.999999 UTC));
        let mut step: i64 = 1;
        while us <= end {
            let t = from_micros(us);
            assert_eq!(rfc3339(t), rfc3339_any_year(t), "at {us} µs");
            us += step;
            step = step * 3 + 7;
            if step > 86_400_000_000 * 97 {
                step = 1 + us % 1_000_003;
            }
        }
        let last = from_micros(end);
        assert_eq!(rfc3339(last), "9999-12-31T23:59:59.999999Z");
        assert_eq!(rfc3339(from_micros(0)), "1970-01-01T00:00:00.000000Z");
        let leap = time::macros::datetime!(2028-02-29 07:08:09.010203 +02:00);
        assert_eq!(rfc3339(leap), "2028-02-29T05:08:09.010203Z");
    }

    #[test]
    fn years_outside_four_digits_keep_the_general_form() {
        let before = time::macros::datetime!(-0001-01-01 00:00:00 UTC);
        assert_eq!(rfc3339(before), rfc3339_any_year(before));
    }
}
