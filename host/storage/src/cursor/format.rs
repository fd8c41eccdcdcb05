//! The cursor record: encoding and decoding, no I/O.
//!
//! ```text
//! {"crc":"5e9303c4","epoch":"67953471cc57a32a","next_offset":98332}<spaces>\n
//! |<---- 17 bytes -->|<-------- covered by the CRC-32C, through the newline -------->|
//! ```
//!
//! The record is exactly [`CURSOR_RECORD_BYTES`] long: the JSON object, padded with spaces,
//! and a final newline. `crc` is the CRC-32C (Castagnoli) of every byte after the first 17
//! (`{"crc":"xxxxxxxx"`), as 8 lowercase hex digits, so a reader can tell a record torn by a
//! crash, or caught half-written, from a real position. An epoch too long to fit is written
//! unpadded (longer than 256 bytes, same CRC rule), always by atomic replacement.
//!
//! The older format had no `crc` and no padding (`{"epoch":"...","next_offset":N}`). It is
//! read, and migrated on the first write.

use serde::Deserialize;

/// Size of a cursor record in the fixed format (engine reference: 256 bytes, advanced in place).
pub const CURSOR_RECORD_BYTES: usize = 256;

/// Length of the prefix the CRC does not cover: `{"crc":"` + 8 hex digits + `"`.
pub const CRC_PREFIX_BYTES: usize = 17;

/// Largest cursor file a reader accepts; anything longer is not a cursor record.
pub const MAX_CURSOR_FILE_BYTES: usize = 64 * 1024;

/// A durable fan-out position: which attachment it belongs to and where to resume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorRecord {
    /// Attach epoch of the link this position belongs to.
    pub epoch: String,
    /// The first parent offset not yet committed to the child.
    pub next_offset: u64,
}

/// How a record was stored on disk, which decides how it may be rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordLayout {
    /// The 256-byte padded record with a CRC: advanced in place.
    Fixed,
    /// A record with a CRC whose epoch was too long to pad: replaced atomically.
    Long,
    /// The older variable-length record without a CRC: migrated by atomic replacement.
    Legacy,
}

/// The outcome of decoding a file's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record and the layout it was stored in.
    Valid(CursorRecord, RecordLayout),
    /// The bytes are not a valid record; the reason says why.
    Invalid(InvalidRecord),
}

/// Why the bytes of a cursor file are not a valid record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRecord {
    /// Longer than [`MAX_CURSOR_FILE_BYTES`].
    #[error("{len} bytes is too long for a cursor record")]
    TooLong {
        /// The file's length in bytes (capped at one past the limit when read).
        len: usize,
    },
    /// A record with a CRC prefix, too short to hold one.
    #[error("record of {len} bytes is truncated")]
    Truncated {
        /// The record's length in bytes.
        len: usize,
    },
    /// The `crc` field is not 8 lowercase hex digits followed by a quote.
    #[error("the crc field is not 8 lowercase hex digits")]
    BadCrcField,
    /// The stated CRC does not match the bytes it covers (a torn or damaged record).
    #[error("CRC-32C mismatch: the record says {stated:08x}, its bytes give {computed:08x}")]
    CrcMismatch {
        /// The CRC the record states.
        stated: u32,
        /// The CRC-32C of bytes 17 to the end.
        computed: u32,
    },
    /// The record passed its CRC but does not end with a newline.
    #[error("the record does not end with a newline")]
    NoNewline,
    /// The record passed its CRC but is not the expected JSON object.
    #[error("the record is not valid JSON: {detail}")]
    NotJson {
        /// The JSON parser's description, with line and column.
        detail: String,
    },
    /// An older-format record (no CRC) whose epoch is empty.
    #[error("the older-format record has an empty epoch")]
    LegacyEmptyEpoch,
    /// Bytes without a CRC prefix that are not an older-format record either.
    #[error("not a cursor record: {detail}")]
    NotARecord {
        /// The JSON parser's description, with line and column.
        detail: String,
    },
}

/// Why a record could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The epoch holds characters that would need JSON escaping (epochs are hex).
    #[error("attach epoch {0:?} may only hold ASCII letters, digits, '-' and '_'")]
    InvalidEpoch(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WithCrc {
    crc: String,
    epoch: String,
    next_offset: u64,
}

#[derive(Deserialize)]
struct Legacy {
    epoch: String,
    next_offset: u64,
}

fn epoch_is_plain(epoch: &str) -> bool {
    !epoch.is_empty()
        && epoch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Encodes `record`: 256 bytes when it fits ([`RecordLayout::Fixed`]), else an unpadded
/// record with the same CRC rule ([`RecordLayout::Long`]).
pub fn encode(record: &CursorRecord) -> Result<(Vec<u8>, RecordLayout), EncodeError> {
    if !epoch_is_plain(&record.epoch) {
        return Err(EncodeError::InvalidEpoch(record.epoch.clone()));
    }
    let body = format!(
        ",\"epoch\":\"{}\",\"next_offset\":{}}}",
        record.epoch, record.next_offset
    );
    let fixed_room = CURSOR_RECORD_BYTES - CRC_PREFIX_BYTES - 1;
    let (mut covered, layout) = if body.len() <= fixed_room {
        let mut covered = body.into_bytes();
        covered.resize(fixed_room, b' ');
        (covered, RecordLayout::Fixed)
    } else {
        (body.into_bytes(), RecordLayout::Long)
    };
    covered.push(b'\n');
    let crc = crc32c::crc32c(&covered);
    let mut bytes = format!("{{\"crc\":\"{crc:08x}\"").into_bytes();
    debug_assert_eq!(bytes.len(), CRC_PREFIX_BYTES);
    bytes.extend_from_slice(&covered);
    Ok((bytes, layout))
}

/// Decodes the bytes of a cursor file.
pub fn decode(bytes: &[u8]) -> Decoded {
    if bytes.len() > MAX_CURSOR_FILE_BYTES {
        return Decoded::Invalid(InvalidRecord::TooLong { len: bytes.len() });
    }
    if bytes.starts_with(b"{\"crc\":\"") {
        decode_with_crc(bytes)
    } else {
        decode_legacy(bytes)
    }
}

fn decode_with_crc(bytes: &[u8]) -> Decoded {
    if bytes.len() < CRC_PREFIX_BYTES + 2 {
        return Decoded::Invalid(InvalidRecord::Truncated { len: bytes.len() });
    }
    let stated = match std::str::from_utf8(&bytes[8..16])
        .ok()
        .filter(|hex| {
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
    {
        Some(crc) if bytes[16] == b'"' => crc,
        _ => return Decoded::Invalid(InvalidRecord::BadCrcField),
    };
    let actual = crc32c::crc32c(&bytes[CRC_PREFIX_BYTES..]);
    if stated != actual {
        return Decoded::Invalid(InvalidRecord::CrcMismatch {
            stated,
            computed: actual,
        });
    }
    if bytes.last() != Some(&b'\n') {
        return Decoded::Invalid(InvalidRecord::NoNewline);
    }
    let parsed: WithCrc = match serde_json::from_slice(bytes) {
        Ok(parsed) => parsed,
        Err(e) => {
            return Decoded::Invalid(InvalidRecord::NotJson {
                detail: e.to_string(),
            });
        }
    };
    debug_assert_eq!(u32::from_str_radix(&parsed.crc, 16).ok(), Some(stated));
    let layout = if bytes.len() == CURSOR_RECORD_BYTES {
        RecordLayout::Fixed
    } else {
        RecordLayout::Long
    };
    Decoded::Valid(
        CursorRecord {
            epoch: parsed.epoch,
            next_offset: parsed.next_offset,
        },
        layout,
    )
}

fn decode_legacy(bytes: &[u8]) -> Decoded {
    match serde_json::from_slice::<Legacy>(bytes) {
        Ok(legacy) if !legacy.epoch.is_empty() => Decoded::Valid(
            CursorRecord {
                epoch: legacy.epoch,
                next_offset: legacy.next_offset,
            },
            RecordLayout::Legacy,
        ),
        Ok(_) => Decoded::Invalid(InvalidRecord::LegacyEmptyEpoch),
        Err(e) => Decoded::Invalid(InvalidRecord::NotARecord {
            detail: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(epoch: &str, next_offset: u64) -> CursorRecord {
        CursorRecord {
            epoch: epoch.into(),
            next_offset,
        }
    }

    #[test]
    fn fixed_record_is_256_bytes_padded_with_spaces_and_a_newline() {
        let (bytes, layout) = encode(&record("67953471cc57a32a", 98_332)).unwrap();
        assert_eq!(layout, RecordLayout::Fixed);
        assert_eq!(bytes.len(), 256);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with("{\"crc\":\""));
        let json_end = text.find('}').unwrap() + 1;
        assert_eq!(
            &text[17..json_end],
            ",\"epoch\":\"67953471cc57a32a\",\"next_offset\":98332}"
        );
        assert!(text[json_end..255].bytes().all(|b| b == b' '));
        assert_eq!(bytes[255], b'\n');
    }

    #[test]
    fn the_documented_example_carries_the_crc_computed_independently() {
        // docs/fanout.md shows this record; its CRC was computed outside this crate with a
        // bitwise CRC-32C.
        let (bytes, _) = encode(&record("67953471cc57a32a", 98_332)).unwrap();
        assert_eq!(&bytes[..17], b"{\"crc\":\"3e52f981\"");
    }

    #[test]
    fn crc_covers_bytes_17_to_256_including_padding_and_newline() {
        let (bytes, _) = encode(&record("67953471cc57a32a", 7)).unwrap();
        let stated = u32::from_str_radix(std::str::from_utf8(&bytes[8..16]).unwrap(), 16).unwrap();
        assert_eq!(stated, crc32c::crc32c(&bytes[17..256]));
        // Independent check of the Castagnoli polynomial: the standard check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn decode_reads_back_what_encode_wrote() {
        let original = record("0011223344556677", u64::MAX);
        let (bytes, _) = encode(&original).unwrap();
        assert_eq!(
            decode(&bytes),
            Decoded::Valid(original, RecordLayout::Fixed)
        );
    }

    #[test]
    fn a_flipped_padding_byte_fails_the_crc() {
        let (mut bytes, _) = encode(&record("0011223344556677", 5)).unwrap();
        bytes[200] = b'x';
        assert!(matches!(
            decode(&bytes),
            Decoded::Invalid(InvalidRecord::CrcMismatch { stated, computed }) if stated != computed
        ));
    }

    #[test]
    fn a_record_torn_between_two_offsets_is_rejected() {
        let (old, _) = encode(&record("0011223344556677", 9_999)).unwrap();
        let (new, _) = encode(&record("0011223344556677", 10_000)).unwrap();
        // First half from the new write, second half from the old one.
        let mut torn = new[..60].to_vec();
        torn.extend_from_slice(&old[60..]);
        assert_ne!(torn, new);
        assert!(matches!(decode(&torn), Decoded::Invalid(_)));
    }

    #[test]
    fn an_epoch_too_long_to_pad_gets_the_long_layout() {
        let epoch = "e".repeat(300);
        let (bytes, layout) = encode(&record(&epoch, 1)).unwrap();
        assert_eq!(layout, RecordLayout::Long);
        assert!(bytes.len() > 256);
        assert_eq!(
            decode(&bytes),
            Decoded::Valid(record(&epoch, 1), RecordLayout::Long)
        );
    }

    #[test]
    fn the_older_variable_length_format_is_read() {
        let bytes = b"{\"epoch\":\"67953471cc57a32a\",\"next_offset\":98332}\n";
        assert_eq!(
            decode(bytes),
            Decoded::Valid(record("67953471cc57a32a", 98_332), RecordLayout::Legacy)
        );
    }

    #[test]
    fn garbage_and_empty_files_are_invalid() {
        assert!(matches!(decode(b""), Decoded::Invalid(_)));
        assert!(matches!(decode(b"\0\0\0\0"), Decoded::Invalid(_)));
        assert!(matches!(
            decode(b"{\"crc\":\"zzzzzzzz\""),
            Decoded::Invalid(_)
        ));
    }

    #[test]
    fn epochs_needing_escapes_are_refused() {
        assert_eq!(
            encode(&record("a\"b", 1)),
            Err(EncodeError::InvalidEpoch("a\"b".into()))
        );
    }

    proptest! {
        #[test]
        fn any_single_byte_change_is_detected_or_harmless(
            next in any::<u64>(), index in 0usize..256, byte in any::<u8>()
        ) {
            let original = record("67953471cc57a32a", next);
            let (mut bytes, _) = encode(&original).unwrap();
            bytes[index] = byte;
            match decode(&bytes) {
                // A change that still decodes must decode to the same position (e.g. the
                // byte was replaced by itself).
                Decoded::Valid(found, _) => prop_assert_eq!(found, original),
                Decoded::Invalid(_) => {}
            }
        }
    }
}
