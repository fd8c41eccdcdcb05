//! The record-batch codecs Kafka producers use (gzip, snappy, lz4, zstd), decompressed with
//! a cap: a small compressed batch can claim gigabytes, so output past the cap stops the
//! decoder and refuses the batch instead of filling memory. Batches are stored decompressed,
//! so fetches always answer uncompressed whatever the producer used.

use std::io::Read;

use bytes::Bytes;

/// Compression of a record batch: the low three bits of its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
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
    pub fn from_attributes(attributes: i16) -> Option<Codec> {
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
pub enum DecompressError {
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
pub fn decompress(codec: Codec, data: Bytes, cap: usize) -> Result<Bytes, DecompressError> {
    let invalid = |e: &dyn std::fmt::Display| DecompressError::Invalid {
        codec,
        message: e.to_string(),
    };
    match codec {
        Codec::None => {
            if data.len() > cap {
                return Err(DecompressError::TooLarge { cap });
            }
            Ok(data)
        }
        Codec::Gzip => read_capped(flate2::read::MultiGzDecoder::new(&data[..]), cap, codec),
        Codec::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(&data[..]).map_err(|e| invalid(&e))?;
            read_capped(decoder, cap, codec)
        }
        Codec::Lz4 => {
            let decoder = lz4::Decoder::new(&data[..]).map_err(|e| invalid(&e))?;
            read_capped(decoder, cap, codec)
        }
        Codec::Snappy => snappy(&data, cap),
    }
}

/// Reads `reader` to its end, failing once more than `cap` bytes came out.
fn read_capped(reader: impl Read, cap: usize, codec: Codec) -> Result<Bytes, DecompressError> {
    let mut out = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| DecompressError::Invalid {
            codec,
            message: e.to_string(),
        })?;
    if out.len() > cap {
        return Err(DecompressError::TooLarge { cap });
    }
    Ok(Bytes::from(out))
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
        let zst = zstd::stream::encode_all(&data[..], 3).unwrap();
        let mut lz = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        lz.write_all(&data).unwrap();
        let (lz, done) = lz.finish();
        done.unwrap();
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
