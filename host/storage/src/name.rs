//! Partition identity and the topic-name rule (names become directory names).

use std::fmt;

/// Longest topic name in bytes, so `topics/{topic}` stays well inside a 255-byte file-name
/// limit; the same bound Kafka uses for topic names.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Largest partition index: the directory name `p{index}` has five digits (`p00000`), the
/// layout of the engine reference.
pub const MAX_PARTITION_INDEX: u32 = 99_999;

/// A partition of a topic. Its directory is `{data_dir}/topics/{topic}/p{partition:05}/`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId {
    /// Topic name (valid per [`validate_topic_name`]).
    pub topic: String,
    /// Partition index, `0..=MAX_PARTITION_INDEX`.
    pub partition: u32,
}

impl PartitionId {
    /// Builds an id from a topic name and a partition index (not validated here).
    pub fn new(topic: impl Into<String>, partition: u32) -> Self {
        PartitionId {
            topic: topic.into(),
            partition,
        }
    }

    /// The partition's directory name, `p` and five digits.
    pub fn dir_name(&self) -> String {
        format!("p{:05}", self.partition)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/p{:05}", self.topic, self.partition)
    }
}

/// Why a topic name was refused.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name is the empty string.
    #[error("the name is empty; use 1 to 249 characters of A-Z a-z 0-9 . _ -")]
    Empty,
    /// The name is longer than [`MAX_TOPIC_NAME_LEN`].
    #[error("the name is {len} characters long; the limit is 249")]
    TooLong {
        /// Length of the name in bytes.
        len: usize,
    },
    /// The name holds a character outside `[A-Za-z0-9._-]`.
    #[error("character {ch:?} at position {position} is not allowed; use only A-Z a-z 0-9 . _ -")]
    InvalidChar {
        /// The first offending character.
        ch: char,
        /// Its index in characters.
        position: usize,
    },
    /// The name is `.` or `..`, which are directory references.
    #[error("the names \".\" and \"..\" are reserved")]
    Reserved,
}

/// Checks a topic name: 1..=249 characters of `[A-Za-z0-9._-]`, and not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some((position, ch)) = name
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::InvalidChar { ch, position });
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(NameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(NameError::Reserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_are_accepted() {
        for name in ["orders", "a", "A.b_c-9", "...", &"x".repeat(249)] {
            assert_eq!(validate_topic_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn bad_names_are_refused_with_the_reason() {
        assert_eq!(validate_topic_name(""), Err(NameError::Empty));
        assert_eq!(validate_topic_name("."), Err(NameError::Reserved));
        assert_eq!(validate_topic_name(".."), Err(NameError::Reserved));
        assert_eq!(
            validate_topic_name(&"x".repeat(250)),
            Err(NameError::TooLong { len: 250 })
        );
        assert_eq!(
            validate_topic_name("a/b"),
            Err(NameError::InvalidChar {
                ch: '/',
                position: 1
            })
        );
        assert_eq!(
            validate_topic_name("tópico"),
            Err(NameError::InvalidChar {
                ch: 'ó',
                position: 1
            })
        );
        assert!(matches!(
            validate_topic_name("a b"),
            Err(NameError::InvalidChar { ch: ' ', .. })
        ));
    }

    #[test]
    fn partition_ids_display_as_topic_and_five_digits() {
        assert_eq!(PartitionId::new("orders", 3).to_string(), "orders/p00003");
        assert_eq!(PartitionId::new("orders", 3).dir_name(), "p00003");
    }
}
