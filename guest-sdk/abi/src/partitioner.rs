//! Kafka's default partitioner.
//!
//! Kafka clients place a keyed record at `(murmur2(key) & 0x7fffffff) % partitions`
//! (`org.apache.kafka.common.utils.Utils#murmur2` and `toPositive`). Masking the sign bit
//! rather than taking `abs()` matters: `abs(i32::MIN)` overflows, and the two disagree on
//! every negative hash.

/// Kafka's 32-bit murmur2 hash of `data`, bit-identical to the Java client's `Utils.murmur2`
/// (seed `0x9747b28c`), returned as the signed value Java would print.
///
/// `#[inline]`: a router hashes every key of a slab in one loop, and inlined there the hash
/// needs no call (in Wasm a call also flushes the fuel counter and checks the stack).
#[inline]
pub fn murmur2(data: &[u8]) -> i32 {
    murmur2_inlined(data)
}

/// [`murmur2`], always inlined: for the host's slab encoder, whose per-record loop is large
/// enough that plain `#[inline]` was measured to leave a call per key there. (`murmur2`
/// itself stays `#[inline]`: forcing it changed the code of other callers' loops.)
#[inline(always)]
pub(crate) fn murmur2_inlined(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;

    let mut h: u32 = SEED ^ data.len() as u32;
    // Four words per block, then the 0 to 3 words left, then the 0 to 3 tail bytes: the same
    // word order as Kafka's one-word loop. In Wasm every loop iteration also pays a fuel check
    // and an epoch check, so the first block and the last words are mixed outside any loop: a
    // key under 32 bytes (a UUID, most ids) runs no loop at all.
    let (blocks, rest) = data.as_chunks::<16>();
    if let [first, more @ ..] = blocks {
        h = mix_block(h, first);
        for block in more {
            h = mix_block(h, block);
        }
    }
    // `rest` is under 16 bytes: at most three words.
    let (words, tail) = rest.as_chunks::<4>();
    if let [a, ..] = words {
        h = mix(h, u32::from_le_bytes(*a));
    }
    if let [_, b, ..] = words {
        h = mix(h, u32::from_le_bytes(*b));
    }
    if let [_, _, c, ..] = words {
        h = mix(h, u32::from_le_bytes(*c));
    }
    // Kafka's fall-through switch on the tail length XORs the tail bytes in little-endian
    // order, then multiplies once.
    let tail_word = match *tail {
        [a] => u32::from(a),
        [a, b] => u32::from(a) | u32::from(b) << 8,
        [a, b, c] => u32::from(a) | u32::from(b) << 8 | u32::from(c) << 16,
        _ => 0,
    };
    if !tail.is_empty() {
        h ^= tail_word;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// murmur2's multiplier.
const M: u32 = 0x5bd1_e995;

/// One murmur2 round: mixes the little-endian word `k` into `h`.
#[inline(always)]
fn mix(h: u32, k: u32) -> u32 {
    const R: u32 = 24;
    let mut k = k.wrapping_mul(M);
    k ^= k >> R;
    k = k.wrapping_mul(M);
    h.wrapping_mul(M) ^ k
}

/// Four murmur2 rounds over a 16-byte block.
#[inline(always)]
fn mix_block(h: u32, block: &[u8; 16]) -> u32 {
    let h = mix(h, word(block, 0));
    let h = mix(h, word(block, 4));
    let h = mix(h, word(block, 8));
    mix(h, word(block, 12))
}

/// The little-endian word at byte `at` of a 16-byte block (one load once inlined).
#[inline(always)]
fn word(block: &[u8; 16], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&block[at..at + 4]);
    u32::from_le_bytes(bytes)
}

/// The partition Kafka's default partitioner gives `key` among `partitions` partitions:
/// `(murmur2(key) & 0x7fffffff) % partitions`. Returns `None` when `partitions` is zero.
#[inline]
pub fn partition_for_key(key: &[u8], partitions: u32) -> Option<u32> {
    if partitions == 0 {
        return None;
    }
    let positive = (murmur2(key) as u32) & 0x7fff_ffff;
    Some(positive % partitions)
}

/// The partition Kafka's default partitioner gives a key whose murmur2 hash is `hash` (as
/// `u32`, e.g. from `RecordView::key_hash`): `(hash & 0x7fffffff) % partitions`, so
/// `partition_for_hash(murmur2(key) as u32, n) == partition_for_key(key, n)`. Returns `None`
/// when `partitions` is zero.
#[inline]
pub fn partition_for_hash(hash: u32, partitions: u32) -> Option<u32> {
    if partitions == 0 {
        return None;
    }
    // Kafka's `toPositive`: mask the sign bit (not `abs`, which differs on negative hashes).
    Some((hash & 0x7fff_ffff) % partitions)
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

    /// Kafka's `Utils.murmur2` transcribed loop for loop (one word per iteration, a
    /// fall-through switch on the tail), to check the blocked version against.
    fn kafka_murmur2(data: &[u8]) -> i32 {
        let length = data.len();
        let mut h: u32 = 0x9747_b28c ^ length as u32;
        for i in 0..length / 4 {
            let i4 = i * 4;
            let mut k = u32::from_le_bytes([data[i4], data[i4 + 1], data[i4 + 2], data[i4 + 3]]);
            k = k.wrapping_mul(M);
            k ^= k >> 24;
            k = k.wrapping_mul(M);
            h = h.wrapping_mul(M);
            h ^= k;
        }
        let tail = length & !3;
        let rem = length % 4;
        if rem == 3 {
            h ^= u32::from(data[tail + 2]) << 16;
        }
        if rem >= 2 {
            h ^= u32::from(data[tail + 1]) << 8;
        }
        if rem >= 1 {
            h ^= u32::from(data[tail]);
            h = h.wrapping_mul(M);
        }
        h ^= h >> 13;
        h = h.wrapping_mul(M);
        h ^= h >> 15;
        h as i32
    }

    #[test]
    fn blocked_murmur2_equals_kafkas_loop_at_every_length() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut bytes = [0u8; 200];
        for b in bytes.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        for len in 0..=bytes.len() {
            for start in [0, 1, 3] {
                let data = &bytes[start..][..len.min(bytes.len() - start)];
                assert_eq!(murmur2(data), kafka_murmur2(data), "length {}", data.len());
            }
        }
    }

    #[test]
    fn zero_partitions_has_no_answer() {
        assert_eq!(partition_for_key(b"k", 0), None);
        assert_eq!(partition_for_hash(7, 0), None);
    }

    #[test]
    fn a_keys_hash_gives_the_keys_partition() {
        for (key, _) in KAFKA_VECTORS {
            for partitions in [1, 7, 12, 100, u32::MAX] {
                assert_eq!(
                    partition_for_hash(murmur2(key.as_bytes()) as u32, partitions),
                    partition_for_key(key.as_bytes(), partitions),
                    "{key:?} among {partitions}"
                );
            }
        }
    }
}
