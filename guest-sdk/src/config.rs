//! A small config format a `no_std` guest parses without dependencies: UTF-8 `key=value`
//! lines.
//!
//! Rules: lines end with `\n` (a trailing `\r` is dropped); blank lines and lines whose first
//! non-blank character is `#` are skipped; each other line is split at its first `=`; key and
//! value are trimmed of ASCII whitespace; a key is non-empty and appears once. Entries keep
//! their order. Empty config bytes are an empty config.
//!
//! ```
//! use narad_guest::config::Config;
//! let cfg = Config::parse(b"# route by region\nheader = region\nus=0\n").unwrap();
//! assert_eq!(cfg.get("header"), Some("region"));
//! assert_eq!(cfg.get_u32("us").unwrap(), Some(0));
//! ```

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// A parsed config: ordered, unique `key=value` entries borrowed from the config bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config<'a> {
    entries: Vec<(&'a str, &'a str)>,
}

impl<'a> Config<'a> {
    /// Parses config bytes (see the module docs for the rules).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ConfigError> {
        let text = core::str::from_utf8(bytes).map_err(|e| ConfigError::NotUtf8 {
            valid_up_to: e.valid_up_to(),
        })?;
        let mut entries: Vec<(&str, &str)> = Vec::new();
        for (i, raw) in text.split('\n').enumerate() {
            let line_no = i + 1;
            let line = raw.strip_suffix('\r').unwrap_or(raw).trim_ascii();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or(ConfigError::MissingEquals { line: line_no })?;
            let (key, value) = (key.trim_ascii(), value.trim_ascii());
            if key.is_empty() {
                return Err(ConfigError::EmptyKey { line: line_no });
            }
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(ConfigError::DuplicateKey {
                    line: line_no,
                    key: key.into(),
                });
            }
            entries.push((key, value));
        }
        Ok(Self { entries })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The value of `key`, or [`ConfigError::Missing`].
    pub fn require(&self, key: &str) -> Result<&'a str, ConfigError> {
        self.get(key)
            .ok_or_else(|| ConfigError::Missing { key: key.into() })
    }

    /// The value of `key` as a decimal `u32`, `None` when absent.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        self.get(key)
            .map(|v| {
                v.parse::<u32>().map_err(|_| ConfigError::NotANumber {
                    key: key.into(),
                    value: v.into(),
                })
            })
            .transpose()
    }

    /// The entries in file order.
    pub fn entries(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        self.entries.iter().copied()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the config has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Config bytes break a rule of the format, or lack what a plugin needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The bytes are not UTF-8 (valid up to byte `valid_up_to`).
    NotUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// Line `line` (1-based) has no `=`.
    MissingEquals {
        /// 1-based line number.
        line: usize,
    },
    /// Line `line` has nothing before its `=`.
    EmptyKey {
        /// 1-based line number.
        line: usize,
    },
    /// Line `line` repeats `key`.
    DuplicateKey {
        /// 1-based line number.
        line: usize,
        /// The repeated key.
        key: String,
    },
    /// A key the plugin requires is absent.
    Missing {
        /// The missing key.
        key: String,
    },
    /// A value that must be a decimal `u32` is not.
    NotANumber {
        /// Its key.
        key: String,
        /// The value found.
        value: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotUtf8 { valid_up_to } => {
                write!(f, "config is not UTF-8 (invalid byte at {valid_up_to})")
            }
            Self::MissingEquals { line } => write!(f, "config line {line} has no '='"),
            Self::EmptyKey { line } => write!(f, "config line {line} has an empty key"),
            Self::DuplicateKey { line, key } => {
                write!(f, "config line {line} repeats key {key:?}")
            }
            Self::Missing { key } => write!(f, "config lacks required key {key:?}"),
            Self::NotANumber { key, value } => {
                write!(
                    f,
                    "config key {key:?}: {value:?} is not a number in 0..=4294967295"
                )
            }
        }
    }
}

impl core::error::Error for ConfigError {}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    #[test]
    fn comments_blank_lines_and_whitespace_are_ignored() {
        let cfg = Config::parse(b"\n# comment\n  a = 1 \r\nb=x=y\n\n").unwrap();
        assert_eq!(
            cfg.entries().collect::<Vec<_>>(),
            [("a", "1"), ("b", "x=y")]
        );
        assert_eq!(cfg.len(), 2);
    }

    #[test]
    fn empty_bytes_are_an_empty_config() {
        assert!(Config::parse(b"").unwrap().is_empty());
    }

    #[test]
    fn malformed_lines_name_their_line_number() {
        assert_eq!(
            Config::parse(b"a=1\nnovalue\n"),
            Err(ConfigError::MissingEquals { line: 2 })
        );
        assert_eq!(
            Config::parse(b" =1"),
            Err(ConfigError::EmptyKey { line: 1 })
        );
        assert_eq!(
            Config::parse(b"a=1\na=2"),
            Err(ConfigError::DuplicateKey {
                line: 2,
                key: "a".into()
            })
        );
        assert_eq!(
            Config::parse(b"a=\xff"),
            Err(ConfigError::NotUtf8 { valid_up_to: 2 })
        );
    }

    #[test]
    fn typed_getters_report_missing_and_non_numeric_values() {
        let cfg = Config::parse(b"n=12\nx=abc").unwrap();
        assert_eq!(cfg.get_u32("n"), Ok(Some(12)));
        assert_eq!(cfg.get_u32("absent"), Ok(None));
        assert!(matches!(
            cfg.get_u32("x"),
            Err(ConfigError::NotANumber { .. })
        ));
        assert_eq!(
            cfg.require("absent"),
            Err(ConfigError::Missing {
                key: "absent".into()
            })
        );
    }
}
