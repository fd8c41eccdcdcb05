//! CRC-32C of two byte runs joined, from each run's CRC and the second run's length, in time
//! logarithmic in the length with a small constant.
//!
//! Sealing a frame needs `crc(header || body)` where the body's CRC was computed while it was
//! encoded and the header's fields are only filled in under the produce lock. The `crc32c`
//! crate's `crc32c_combine` squares a 32x32 bit matrix for every bit of the length (tens of
//! microseconds for a slab-sized frame, on every append); here the shift by `8 * len` zero bits
//! multiplies by powers of `x` taken from a table of `x^(2^k) mod P`, each multiplication a
//! 32-step loop. The arithmetic is the standard one for reflected CRCs (bit 31 holds `x^0`).

/// The CRC-32C (Castagnoli) polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;

/// `a * b mod P`, both reflected.
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0u32;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        // b *= x (mod P): one step right in the reflected order.
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `x^(2^k) mod P` for `k` in `0..64`.
const X_POW_2K: [u32; 64] = {
    let mut table = [0u32; 64];
    // x^1, reflected.
    let mut p = 1u32 << 30;
    let mut k = 0;
    while k < 64 {
        table[k] = p;
        p = mul_mod_p(p, p);
        k += 1;
    }
    table
};

/// `x^(8 * len) mod P`: the operator that moves a CRC past `len` zero bytes.
fn x_pow_8n(len: usize) -> u32 {
    // x^0 = 1, reflected.
    let mut p = 1u32 << 31;
    let (mut n, mut k) = (len as u64, 3usize);
    while n != 0 {
        if n & 1 != 0 {
            p = mul_mod_p(X_POW_2K[k % 64], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The CRC-32C of `a || b`, given `crc_a` (of `a`), `crc_b` (of `b`) and `b`'s length, for
/// CRCs as [`crc32c::crc32c`] computes them.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    mul_mod_p(x_pow_8n(len_b), crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::crc32c_combine;

    #[test]
    fn an_empty_second_run_leaves_the_first_crc() {
        assert_eq!(crc32c_combine(0x1234_5678, 0, 0), 0x1234_5678);
        let a = b"123456789";
        assert_eq!(
            crc32c_combine(crc32c::crc32c(a), crc32c::crc32c(b""), 0),
            0xE306_9283
        );
    }

    #[test]
    fn a_frame_sized_body_combines_as_the_whole_would_hash() {
        let head: Vec<u8> = (0..20u8).collect();
        let body: Vec<u8> = (0..600_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let whole: Vec<u8> = head.iter().chain(&body).copied().collect();
        assert_eq!(
            crc32c_combine(crc32c::crc32c(&head), crc32c::crc32c(&body), body.len()),
            crc32c::crc32c(&whole)
        );
    }

    proptest! {
        #[test]
        fn combining_two_crcs_is_the_crc_of_the_joined_bytes(
            a in proptest::collection::vec(any::<u8>(), 0..300),
            b in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
            let combined = crc32c_combine(crc32c::crc32c(&a), crc32c::crc32c(&b), b.len());
            prop_assert_eq!(combined, crc32c::crc32c(&whole));
            prop_assert_eq!(combined, crc32c::crc32c_combine(crc32c::crc32c(&a), crc32c::crc32c(&b), b.len()));
        }
    }
}
