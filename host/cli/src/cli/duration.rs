//! Durations on the command line: `250ms`, `10s`, `5m`, `2h`, `1d`, or a bare number of seconds.

use std::time::Duration;

/// Parses `text` as a duration: a non-negative integer followed by `ms`, `s`, `m`, `h` or `d`
/// (no unit means seconds). Used as a clap `value_parser`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let bad = || format!("{text:?} is not a duration: use e.g. 500ms, 10s, 5m, 2h or 1d");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let ms_per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

/// Formats a duration the way [`parse_duration`] reads it, in the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_a_bare_number_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn a_unknown_unit_or_a_negative_number_is_refused() {
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for text in ["250ms", "10s", "5m", "2h", "1d", "1500ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
