//! Byte sizes on the command line: `4MiB`, `512 MiB`, `1GB`, `65536`.

use std::fmt;
use std::str::FromStr;

/// A number of bytes, parsed from text with an optional unit (`B`, `KB`/`MB`/`GB` powers of
/// 1000, `KiB`/`MiB`/`GiB` or `K`/`M`/`G` powers of 1024; case-insensitive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// Why a size did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a size: {reason} (examples: 4MiB, 512MB, 1GiB, 65536)")]
pub struct ByteSizeError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<ByteSize, ByteSizeError> {
        let err = |reason| ByteSizeError {
            text: text.to_owned(),
            reason,
        };
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let number: f64 = number.parse().map_err(|_| err("no number"))?;
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            _ => return Err(err("unknown unit")),
        };
        let bytes = number * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(err("out of range"));
        }
        if bytes.fract() != 0.0 {
            return Err(err("not a whole number of bytes"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_units_parse_to_bytes() {
        assert_eq!("4MiB".parse(), Ok(ByteSize(4 << 20)));
        assert_eq!("4 mib".parse(), Ok(ByteSize(4 << 20)));
        assert_eq!("512M".parse(), Ok(ByteSize(512 << 20)));
        assert_eq!("1GB".parse(), Ok(ByteSize(1_000_000_000)));
        assert_eq!("0.5KiB".parse(), Ok(ByteSize(512)));
        assert_eq!("65536".parse(), Ok(ByteSize(65_536)));
    }

    #[test]
    fn nonsense_is_refused_with_a_reason() {
        assert_eq!(
            "4 parsecs".parse::<ByteSize>().unwrap_err().reason,
            "unknown unit"
        );
        assert_eq!("MiB".parse::<ByteSize>().unwrap_err().reason, "no number");
        assert!("0.3B".parse::<ByteSize>().is_err());
    }

    #[test]
    fn sizes_print_in_the_largest_exact_binary_unit() {
        assert_eq!(ByteSize(4 << 20).to_string(), "4MiB");
        assert_eq!(ByteSize(1 << 30).to_string(), "1GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }
}
