//! Small helpers for the CLI's human output: counted nouns ("1 record", "2 records"), times as
//! RFC 3339 UTC (the tables show these; `--json` keeps the API's raw milliseconds), and an
//! error with its causes on one line.

/// `count` followed by `noun`, with an `s` unless `count` is 1: `plural(1, "record")` is
/// `"1 record"`, `plural(3, "record")` is `"3 records"`. Only for nouns whose plural is `+s`.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// A byte count in the largest binary unit it fills, one decimal: `1536` is `"1.5 KiB"`,
/// `512` is `"512 B"`.
pub fn bytes(n: u64) -> String {
    for (size, unit) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if n >= size {
            return format!("{:.1} {unit}", n as f64 / size as f64);
        }
    }
    format!("{n} B")
}

/// A duration in milliseconds, as seconds from one second up: `340` is `"340 ms"`, `1240` is
/// `"1.2 s"`.
pub fn millis(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Milliseconds per day.
const MS_PER_DAY: i64 = 86_400_000;

/// Milliseconds since the Unix epoch as RFC 3339 in UTC, to the second:
/// `1764460800123` is `"2025-11-30T00:00:00Z"`. Times before 1970 work too.
pub fn rfc3339_utc(ms: i64) -> String {
    let days = ms.div_euclid(MS_PER_DAY);
    let ms_of_day = ms.rem_euclid(MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let secs = ms_of_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// RFC 3339 (`2026-12-03T18:00:00Z`, `2026-12-03T18:00:00.250+01:00`) as milliseconds since
/// the Unix epoch; the error says what was expected.
pub fn parse_rfc3339(text: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "{text:?} is not an RFC 3339 time such as 2026-12-03T18:00:00Z or \
             2026-12-03T19:00:00+01:00"
        )
    };
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = text.get(range).ok_or_else(bad)?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut at = 19;
    let mut millis = 0;
    if b[at] == b'.' {
        let end = b[at + 1..]
            .iter()
            .position(|c| !c.is_ascii_digit())
            .map_or(b.len(), |n| at + 1 + n);
        let fraction = text.get(at + 1..end).ok_or_else(bad)?;
        if fraction.is_empty() {
            return Err(bad());
        }
        let padded: String = fraction.chars().chain("000".chars()).take(3).collect();
        millis = padded.parse::<i64>().map_err(|_| bad())?;
        at = end;
    }
    let offset_minutes = match text.get(at..) {
        Some("Z" | "z") => 0,
        Some(zone) if zone.len() == 6 && matches!(zone.as_bytes()[0], b'+' | b'-') => {
            if zone.as_bytes()[3] != b':' {
                return Err(bad());
            }
            let minutes = digits(at + 1..at + 3)? * 60 + digits(at + 4..at + 6)?;
            if zone.starts_with('-') {
                -minutes
            } else {
                minutes
            }
        }
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let days = days_from_civil(year, month as u32, day as u32);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Ok(secs * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of [`civil_from_days`],
/// from the same source).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, <https://howardhinnant.github.io/date_algorithms.html>): done by hand
/// because this one conversion does not earn a date-time crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // day is 1..=31 and month 1..=12 by construction.
    (year, month as u32, day as u32)
}

/// `error` and its causes on one line, `: ` between them, leaving out a cause whose text the
/// line already holds: many errors name their cause in their own message and also hand it out
/// as their source, and printing both said everything twice ("...: No such file or directory
/// (os error 2): No such file or directory (os error 2)").
pub fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot create data directory /x: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the plugin registry")]
    struct Names {
        source: std::io::Error,
    }

    #[test]
    fn an_error_line_says_each_cause_once() {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let repeated = anyhow::Error::new(Repeats { source: gone() }).context("cannot start");
        assert_eq!(
            error_line(&repeated),
            format!("cannot start: cannot create data directory /x: {}", gone())
        );
        let named = anyhow::Error::new(Names { source: gone() });
        assert_eq!(
            error_line(&named),
            format!("cannot open the plugin registry: {}", gone())
        );
    }

    #[test]
    fn one_is_singular_and_everything_else_plural() {
        assert_eq!(plural(1, "record"), "1 record");
        assert_eq!(plural(0, "record"), "0 records");
        assert_eq!(plural(2, "partition"), "2 partitions");
    }

    #[test]
    fn rfc3339_times_parse_back_to_their_milliseconds() {
        assert_eq!(parse_rfc3339("2025-11-30T00:00:00Z"), Ok(1_764_460_800_000));
        assert_eq!(
            parse_rfc3339("2025-11-30T01:00:00.123+01:00"),
            Ok(1_764_460_800_123)
        );
        assert_eq!(
            parse_rfc3339("2025-11-29T23:30:00.5-00:30"),
            Ok(1_764_460_800_500)
        );
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), Ok(-1_000));
        for ms in [0, 951_782_400_000, 1_764_460_800_000, 4_102_444_799_000] {
            assert_eq!(parse_rfc3339(&rfc3339_utc(ms)), Ok(ms));
        }
        for bad in [
            "",
            "2025-11-30",
            "2025-11-30T00:00:00",
            "2025-13-01T00:00:00Z",
            "2025-11-30T00:00:00+0100",
            "yesterday",
            "2025-11-30T00:00:00.Z",
        ] {
            let error = parse_rfc3339(bad).unwrap_err();
            assert!(error.contains("RFC 3339"), "{bad}: {error}");
        }
    }

    #[test]
    fn epoch_milliseconds_read_as_rfc3339_utc() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_764_460_800_123), "2025-11-30T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(-86_400_000), "1969-12-31T00:00:00Z");
        assert_eq!(rfc3339_utc(1_764_590_499_000), "2025-12-01T12:01:39Z");
    }

    #[test]
    fn sizes_and_durations_read_at_a_glance() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 << 20), "5.0 MiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(millis(340), "340 ms");
        assert_eq!(millis(1240), "1.2 s");
    }
}
