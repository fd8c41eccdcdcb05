//! Kafka's default partitioner.
//!
//! Kafka clients place a keyed record at `(murmur2(key) & 0x7fffffff) % partitions`
//! (`org.apache.kafka.common.utils.Utils#murmur2` and `toPositive`). Masking the sign bit
//! rather than taking `abs()` matters: `abs(i32::MIN)` overflows, and the two disagree on
//! every negative hash.

/// Kafka's 32-bit murmur2 hash of `data`, bit-identical to the Java client's `Utils.murmur2`
/// (seed `0x9747b28c`), returned as the signed value Java would print.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    let length = data.len() as u32;
    let mut h: u32 = SEED ^ length;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives `key` among `partitions` partitions:
/// `(murmur2(key) & 0x7fffffff) % partitions`. Returns `None` when `partitions` is zero.
pub fn partition_for_key(key: &[u8], partitions: u32) -> Option<u32> {
    if partitions == 0 {
        return None;
    }
    let positive = (murmur2(key) as u32) & 0x7fff_ffff;
    Some(positive % partitions)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    /// Vectors from Kafka's `UtilsTest#testMurmur2`.
    const KAFKA_VECTORS: &[(&str, i32)] = &[
        ("21", -973_932_308),
        ("foobar", -790_332_482),
        ("a-little-bit-long-string", -985_981_536),
        ("a-little-bit-longer-string", -1_486_304_829),
        (
            "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
            -58_897_971,
        ),
        ("abc", 479_470_107),
        ("", 275_646_681),
    ];

    #[test]
    fn murmur2_matches_kafka_test_vectors() {
        for (input, expected) in KAFKA_VECTORS {
            assert_eq!(murmur2(input.as_bytes()), *expected, "murmur2({input:?})");
        }
    }

    #[test]
    fn partition_masks_the_sign_bit_instead_of_taking_abs() {
        // "21" hashes negative: masking gives a different answer from abs().
        let h = murmur2(b"21");
        assert!(h < 0);
        let masked = ((h as u32) & 0x7fff_ffff) % 7;
        let abs = h.unsigned_abs() % 7;
        assert_ne!(masked, abs, "vector must distinguish mask from abs");
        assert_eq!(partition_for_key(b"21", 7), Some(masked));
    }

    #[test]
    fn zero_partitions_has_no_answer() {
        assert_eq!(partition_for_key(b"k", 0), None);
    }
}
