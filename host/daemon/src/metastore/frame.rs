//! The checksummed JSON frame both metastore files use, the snapshot and each journal line:
//!
//! ```text
//! {"crc32c":"xxxxxxxx","<field>":<body JSON>}\n
//! ```
//!
//! `crc32c` is the CRC-32C (Castagnoli) of the exact bytes of `<body JSON>`, as 8 lowercase hex
//! digits. The part before the body has a fixed length for a given field, so a reader slices
//! the body out without parsing it first and checks the CRC on exactly what was written. A
//! frame is valid JSON, so an operator can read either file with any JSON tool.

/// The bytes every frame starts with: where a reader looks for the next frame after damage.
pub(crate) const START: &[u8] = PREFIX_START;
const PREFIX_START: &[u8] = b"{\"crc32c\":\"";
const CRC_HEX_LEN: usize = 8;
const SUFFIX: &[u8] = b"}\n";

/// The frame around `body` (which must be one JSON value without a newline, as
/// `serde_json::to_vec` writes it) under `field`.
pub(crate) fn encode(field: &str, body: &[u8]) -> Vec<u8> {
    let crc = format!("{:08x}", crc32c::crc32c(body));
    let mut out = Vec::with_capacity(head_len(field) + body.len() + SUFFIX.len());
    out.extend_from_slice(PREFIX_START);
    out.extend_from_slice(crc.as_bytes());
    push_prefix_end(&mut out, field);
    out.extend_from_slice(body);
    out.extend_from_slice(SUFFIX);
    out
}

/// Why bytes are not one whole frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// Fewer bytes than the shortest frame under the field.
    #[error("only {len} bytes, shorter than any complete frame")]
    Short {
        /// The bytes given.
        len: usize,
    },
    /// The part before the body is not the frame's header for the field.
    #[error("header is not {{\"crc32c\":\"........\",\"{field}\":")]
    Header {
        /// The field expected.
        field: String,
    },
    /// The frame does not end where it should.
    #[error("does not end with }}\\n: truncated or with trailing bytes")]
    Unterminated,
    /// The checksum field is not 8 hex digits.
    #[error("crc32c is not 8 hex digits")]
    CrcNotHex,
    /// The body does not hash to the stored checksum.
    #[error("checksum mismatch: the frame says {stored:08x}, its contents hash to {actual:08x}")]
    Checksum {
        /// The CRC-32C the frame holds.
        stored: u32,
        /// The CRC-32C of its body.
        actual: u32,
    },
}

/// The body of one whole frame under `field` (`bytes` ends with the frame's newline), or why
/// it is not one.
pub(crate) fn decode<'a>(field: &str, bytes: &'a [u8]) -> Result<&'a [u8], FrameError> {
    let head_len = head_len(field);
    if bytes.len() < head_len + SUFFIX.len() {
        return Err(FrameError::Short { len: bytes.len() });
    }
    let (head, rest) = bytes.split_at(head_len);
    let mut prefix_end = Vec::with_capacity(field.len() + 5);
    push_prefix_end(&mut prefix_end, field);
    if !head.starts_with(PREFIX_START) || !head.ends_with(&prefix_end) {
        return Err(FrameError::Header {
            field: field.to_owned(),
        });
    }
    let Some(body) = rest.strip_suffix(SUFFIX) else {
        return Err(FrameError::Unterminated);
    };
    let hex = &head[PREFIX_START.len()..PREFIX_START.len() + CRC_HEX_LEN];
    let stored = std::str::from_utf8(hex)
        .ok()
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or(FrameError::CrcNotHex)?;
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(FrameError::Checksum { stored, actual });
    }
    Ok(body)
}

fn head_len(field: &str) -> usize {
    // `","` + field + `":`
    PREFIX_START.len() + CRC_HEX_LEN + field.len() + 5
}

fn push_prefix_end(out: &mut Vec<u8>, field: &str) {
    out.extend_from_slice(b"\",\"");
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_json_and_gives_back_its_body_only_when_every_byte_is_intact() {
        let body = br#"{"a":[1,2,"x"]}"#;
        let framed = encode("state", body);
        let value: serde_json::Value = serde_json::from_slice(&framed).unwrap();
        assert_eq!(value["state"]["a"][2], "x");
        assert_eq!(decode("state", &framed), Ok(&body[..]));
        assert!(decode("entry", &framed).is_err(), "another field's frame");
        for at in 0..framed.len() {
            let mut bad = framed.clone();
            bad[at] ^= 0x04;
            assert!(decode("state", &bad).is_err(), "flipped bit at {at}");
        }
        for cut in 0..framed.len() {
            assert!(decode("state", &framed[..cut]).is_err(), "cut at {cut}");
        }
    }
}
