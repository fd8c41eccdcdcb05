//! Postcard's unsigned varint (LEB128: 7 bits per byte, low group first, high bit = more),
//! written by hand so the guest decodes its route context with no serde in its Wasm.

use crate::error::ContextError;

/// Most bytes a `u32` varint takes (ceil(32 / 7)).
pub(crate) const U32_MAX_BYTES: usize = 5;

/// Bytes the varint encoding of `v` takes.
pub(crate) const fn u32_len(mut v: u32) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Writes `v` at the start of `out`, returning the bytes written, or `None` when `out` is
/// too short.
pub(crate) fn write_u32(mut v: u32, out: &mut [u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let slot = out.get_mut(i)?;
        if v < 0x80 {
            *slot = v as u8;
            return Some(i + 1);
        }
        *slot = (v as u8 & 0x7f) | 0x80;
        v >>= 7;
        i += 1;
    }
}

/// A cursor over postcard bytes that never reads past the end.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A `u32` varint; rejects encodings longer than five bytes or above `u32::MAX`, as
    /// postcard does.
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, ContextError> {
        let mut value: u32 = 0;
        for i in 0..U32_MAX_BYTES {
            let byte = *self
                .buf
                .get(self.pos)
                .ok_or(ContextError::Truncated { field })?;
            self.pos += 1;
            let group = u32::from(byte & 0x7f);
            if i == U32_MAX_BYTES - 1 && byte > 0x0f {
                return Err(ContextError::VarintOverflow { field });
            }
            value |= group << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ContextError::VarintOverflow { field })
    }

    /// A varint length followed by that many bytes, borrowed.
    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], ContextError> {
        let len = self.u32(field)? as usize;
        let end = self
            .pos
            .checked_add(len)
            .ok_or(ContextError::Truncated { field })?;
        let bytes = self
            .buf
            .get(self.pos..end)
            .ok_or(ContextError::Truncated { field })?;
        self.pos = end;
        Ok(bytes)
    }

    /// Like [`Self::bytes`], checked to be UTF-8.
    pub(crate) fn str(&mut self, field: &'static str) -> Result<&'a str, ContextError> {
        let bytes = self.bytes(field)?;
        core::str::from_utf8(bytes).map_err(|_| ContextError::InvalidUtf8 { field })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    #[test]
    fn varint_boundaries_round_trip() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u32::MAX - 1, u32::MAX] {
            let mut buf = [0u8; U32_MAX_BYTES];
            let n = write_u32(v, &mut buf).unwrap();
            assert_eq!(n, u32_len(v));
            assert_eq!(Reader::new(&buf[..n]).u32("v"), Ok(v));
        }
    }

    #[test]
    fn varint_above_u32_max_is_rejected() {
        // 2^32 encoded as a 5-byte varint: the fifth group overflows 32 bits.
        let bytes = [0x80, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(
            Reader::new(&bytes).u32("v"),
            Err(ContextError::VarintOverflow { field: "v" })
        );
        let endless = [0xff; 6];
        assert!(matches!(
            Reader::new(&endless).u32("v"),
            Err(ContextError::VarintOverflow { .. })
        ));
    }

    #[test]
    fn truncated_varint_and_bytes_are_reported() {
        assert_eq!(
            Reader::new(&[0x80]).u32("v"),
            Err(ContextError::Truncated { field: "v" })
        );
        assert_eq!(
            Reader::new(&[3, b'a']).bytes("b"),
            Err(ContextError::Truncated { field: "b" })
        );
    }

    #[test]
    fn short_output_buffer_is_refused() {
        assert_eq!(write_u32(300, &mut [0u8; 1]), None);
    }
}
