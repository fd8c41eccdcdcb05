//! The record-batch codecs Kafka producers use (gzip, snappy, lz4, zstd), decompressed with
//! a cap: a small compressed batch can claim gigabytes, so output past the cap stops the
//! decoder and refuses the batch instead of filling memory. Batches are stored decompressed,
//! so fetches always answer uncompressed whatever the producer used. Every codec is pure
//! Rust (flate2, snap, lz4_flex, ruzstd): no C library to build.

use std::io::Read;

use bytes::Bytes;

/// Compression of a record batch: the low three bits of its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    /// Not compressed.
    None,
    /// gzip (one or more members).
    Gzip,
    /// Snappy, in Kafka's (xerial) framing or raw.
    Snappy,
    /// LZ4 frame format.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Codec {
    /// The codec of batch attributes, `None` for an unknown one (5, 6, 7).
    pub(crate) fn from_attributes(attributes: i16) -> Option<Codec> {
        match attributes & 0x7 {
            0 => Some(Codec::None),
            1 => Some(Codec::Gzip),
            2 => Some(Codec::Snappy),
            3 => Some(Codec::Lz4),
            4 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// Why a batch's records could not be decompressed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum DecompressError {
    /// The decompressed records would exceed the cap.
    #[error("decompressed records exceed {cap} bytes")]
    TooLarge {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The compressed bytes are not valid for their codec.
    #[error("invalid {codec:?} data: {message}")]
    Invalid {
        /// The codec.
        codec: Codec,
        /// The decoder's description.
        message: String,
    },
}

/// The xerial snappy-java stream header Kafka's snappy batches start with: magic (8 bytes),
/// version and compatible version (4 bytes each), then blocks of `[u32 length][raw snappy]`.
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
/// Bytes of the xerial header before the first block.
const XERIAL_HEADER_BYTES: usize = 16;

/// Decompresses `data` (a batch's records section) written with `codec`, refusing output
/// larger than `cap` bytes.
pub(crate) fn decompress(codec: Codec, data: Bytes, cap: usize) -> Result<Bytes, DecompressError> {
    match codec {
        Codec::None => {
            if data.len() > cap {
                return Err(DecompressError::TooLarge { cap });
            }
            Ok(data)
        }
        Codec::Gzip => {
            let mut out = Vec::new();
            read_capped(
                flate2::read::MultiGzDecoder::new(&data[..]),
                cap,
                codec,
                &mut out,
            )?;
            Ok(Bytes::from(out))
        }
        Codec::Zstd => zstd(&data, cap),
        Codec::Lz4 => lz4(&data, cap),
        Codec::Snappy => snappy(&data, cap),
    }
}

/// Reads `reader` to its end, appending to `out`, failing once `out` holds more than `cap`
/// bytes (so at most `cap + 1` bytes are ever buffered, whatever the input claims).
fn read_capped(
    reader: impl Read,
    cap: usize,
    codec: Codec,
    out: &mut Vec<u8>,
) -> Result<(), DecompressError> {
    let room = cap.saturating_sub(out.len());
    let limit = u64::try_from(room).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(out)
        .map_err(|e| DecompressError::Invalid {
            codec,
            message: e.to_string(),
        })?;
    if out.len() > cap {
        return Err(DecompressError::TooLarge { cap });
    }
    Ok(())
}

/// LZ4 frames, one or more back to back (lz4_flex's decoder ends a read at each frame's end
/// mark, so it is read again until the input is used up). Block and content checksums are
/// checked by the decoder; its buffers are bounded by the frame's block size (4 MiB at most).
fn lz4(data: &[u8], cap: usize) -> Result<Bytes, DecompressError> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let before = rest.len();
        read_capped(
            lz4_flex::frame::FrameDecoder::new(&mut rest),
            cap,
            Codec::Lz4,
            &mut out,
        )?;
        if rest.len() == before {
            // Defensive: a decoder that consumed nothing would loop forever.
            return Err(DecompressError::Invalid {
                codec: Codec::Lz4,
                message: "trailing bytes are not an LZ4 frame".into(),
            });
        }
    }
    Ok(Bytes::from(out))
}

/// The largest zstd window accepted when the cap is smaller: zstd's default parameters use
/// at most 8 MiB (level 19) for input of unknown size, and encoders shrink the window to the
/// input's size when they know it, so only crafted frames ask for more.
const ZSTD_MIN_WINDOW_BYTES: usize = 8 << 20;

/// Zstandard frames, one or more back to back, skippable frames skipped. The decoder sets
/// aside a frame's declared window before decoding, so windows larger than the cap (or 8 MiB
/// when that is larger) are refused as invalid; content checksums are verified.
fn zstd(data: &[u8], cap: usize) -> Result<Bytes, DecompressError> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};

    let invalid = |message: String| DecompressError::Invalid {
        codec: Codec::Zstd,
        message,
    };
    let max_window = u64::try_from(cap.max(ZSTD_MIN_WINDOW_BYTES)).unwrap_or(u64::MAX);
    let mut out = Vec::new();
    let mut rest = data;
    loop {
        match StreamingDecoder::new_with_max_window_size(&mut rest, max_window) {
            Ok(mut decoder) => {
                read_capped(&mut decoder, cap, Codec::Zstd, &mut out)?;
                let frame = &decoder.decoder;
                if let (Some(stored), Some(computed)) = (
                    frame.get_checksum_from_data(),
                    frame.get_calculated_checksum(),
                ) && stored != computed
                {
                    return Err(invalid(format!(
                        "content checksum {stored:#010x} does not match the content's {computed:#010x}"
                    )));
                }
            }
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                let length = usize::try_from(length).unwrap_or(usize::MAX);
                let Some(tail) = rest.get(length..) else {
                    return Err(invalid(format!(
                        "skippable frame of {length} bytes with {} left",
                        rest.len()
                    )));
                };
                rest = tail;
            }
            Err(e) => return Err(invalid(e.to_string())),
        }
        if rest.is_empty() {
            return Ok(Bytes::from(out));
        }
    }
}

/// Snappy: xerial blocks when the header is there, else one raw block (as the Java client
/// reads it). Each block's decompressed length is read from its header and checked against
/// what is left of the cap before anything is allocated.
fn snappy(data: &[u8], cap: usize) -> Result<Bytes, DecompressError> {
    let invalid = |message: String| DecompressError::Invalid {
        codec: Codec::Snappy,
        message,
    };
    let mut out = Vec::new();
    let block = |raw: &[u8], out: &mut Vec<u8>| -> Result<(), DecompressError> {
        let len = snap::raw::decompress_len(raw).map_err(|e| invalid(e.to_string()))?;
        if out.len().saturating_add(len) > cap {
            return Err(DecompressError::TooLarge { cap });
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(raw, &mut out[start..])
            .map_err(|e| invalid(e.to_string()))?;
        Ok(())
    };
    if data.len() < XERIAL_HEADER_BYTES || &data[..XERIAL_MAGIC.len()] != XERIAL_MAGIC {
        block(data, &mut out)?;
        return Ok(Bytes::from(out));
    }
    let mut rest = &data[XERIAL_HEADER_BYTES..];
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(invalid("truncated block length".into()));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len > tail.len() {
            return Err(invalid(format!(
                "block of {len} bytes with {} left",
                tail.len()
            )));
        }
        block(&tail[..len], &mut out)?;
        rest = &tail[len..];
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// One zstd frame of `data` (with a content checksum: ruzstd's `hash` feature is on).
    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    /// One LZ4 frame of `data`, as Kafka clients write them.
    fn lz4_frame(data: &[u8]) -> Vec<u8> {
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn zstd_and_lz4_bombs_are_refused_at_the_cap_not_decompressed_whole() {
        let zeros = vec![0u8; 8 << 20];
        for (codec, bomb) in [
            (Codec::Zstd, zstd_frame(&zeros)),
            (Codec::Lz4, lz4_frame(&zeros)),
        ] {
            assert!(bomb.len() < 64 << 10, "{codec:?}: {} bytes", bomb.len());
            let bomb = Bytes::from(bomb);
            let err = decompress(codec, bomb.clone(), 1 << 20).unwrap_err();
            assert!(
                matches!(err, DecompressError::TooLarge { .. }),
                "{codec:?}: {err}"
            );
            assert_eq!(
                decompress(codec, bomb, 8 << 20).unwrap().len(),
                8 << 20,
                "{codec:?}"
            );
        }
    }

    #[test]
    fn zstd_and_lz4_batches_of_several_frames_decompress_to_all_of_them() {
        let (first, second) = (b"first frame ".repeat(50), b"second frame ".repeat(40));
        let whole = [&first[..], &second[..]].concat();
        // A zstd skippable frame (magic 0x184D2A50, 4 bytes of payload) between the two.
        let skippable = [0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
        let zst = [zstd_frame(&first), skippable.to_vec(), zstd_frame(&second)].concat();
        let lz = [lz4_frame(&first), lz4_frame(&second)].concat();
        for (codec, compressed) in [(Codec::Zstd, zst), (Codec::Lz4, lz)] {
            let compressed = Bytes::from(compressed);
            let out = decompress(codec, compressed.clone(), whole.len()).unwrap();
            assert_eq!(&out[..], &whole[..], "{codec:?}");
            let err = decompress(codec, compressed, whole.len() - 1).unwrap_err();
            assert!(
                matches!(err, DecompressError::TooLarge { .. }),
                "{codec:?}: {err}"
            );
        }
    }

    #[test]
    fn a_zstd_frame_whose_checksum_does_not_match_is_refused_as_invalid() {
        let mut frame = zstd_frame(&b"narad kafka records ".repeat(100));
        let last = frame.len() - 1;
        frame[last] ^= 0xff;
        let err = decompress(Codec::Zstd, Bytes::from(frame), 1 << 20).unwrap_err();
        assert!(matches!(err, DecompressError::Invalid { .. }), "{err}");
    }

    #[test]
    fn truncated_zstd_and_lz4_frames_are_refused_as_invalid() {
        let data = b"narad kafka records ".repeat(100);
        for (codec, mut compressed) in [
            (Codec::Zstd, zstd_frame(&data)),
            (Codec::Lz4, lz4_frame(&data)),
        ] {
            compressed.truncate(compressed.len() / 2);
            let err = decompress(codec, Bytes::from(compressed), 1 << 20).unwrap_err();
            assert!(
                matches!(err, DecompressError::Invalid { .. }),
                "{codec:?}: {err}"
            );
        }
    }

    #[test]
    fn a_gzip_bomb_is_refused_at_the_cap_not_decompressed_whole() {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(&vec![0u8; 8 << 20]).unwrap();
        let bomb = Bytes::from(encoder.finish().unwrap());
        assert!(bomb.len() < 64 << 10);
        let err = decompress(Codec::Gzip, bomb.clone(), 1 << 20).unwrap_err();
        assert!(matches!(err, DecompressError::TooLarge { .. }), "{err}");
        assert_eq!(
            decompress(Codec::Gzip, bomb, 8 << 20).unwrap().len(),
            8 << 20
        );
    }

    #[test]
    fn every_codec_round_trips_within_the_cap() {
        let data = b"narad kafka records ".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let zst = zstd_frame(&data);
        let lz = lz4_frame(&data);
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        let mut xerial = XERIAL_MAGIC.to_vec();
        xerial.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        xerial.extend_from_slice(&(raw.len() as u32).to_be_bytes());
        xerial.extend_from_slice(&raw);
        for (codec, compressed) in [
            (Codec::Gzip, gz.finish().unwrap()),
            (Codec::Zstd, zst),
            (Codec::Lz4, lz),
            (Codec::Snappy, raw.clone()),
            (Codec::Snappy, xerial),
        ] {
            let out = decompress(codec, Bytes::from(compressed.clone()), data.len()).unwrap();
            assert_eq!(&out[..], &data[..], "{codec:?}");
            let err = decompress(codec, Bytes::from(compressed), data.len() - 1).unwrap_err();
            assert!(
                matches!(err, DecompressError::TooLarge { .. }),
                "{codec:?}: {err}"
            );
        }
    }
}
