//! The route context: what a plugin knows about the link and the slab besides the records.
//!
//! Encoded with postcard, field order fixed (do not reorder: the bytes are the ABI):
//! `parent_topic` (varint len + UTF-8), `parent_partition` (varint), `parent_partition_count`
//! (varint), `child_topic` (varint len + UTF-8), `child_partition_count` (varint), `attempt`
//! (varint), `config` (varint len + bytes). The encoder and decoder here are written by hand
//! (tests prove them byte-identical to postcard) so a guest decodes in place, with no
//! allocation and no serde in its Wasm.

use crate::error::ContextError;
use crate::varint::{self, Reader};

/// A borrowed route context, decoded in place from the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RouteContextRef<'a> {
    /// Topic the records were read from.
    pub parent_topic: &'a str,
    /// Parent partition the slab was read from.
    pub parent_partition: u32,
    /// Partition count of the parent topic, read for this pass.
    pub parent_partition_count: u32,
    /// Child topic being routed to.
    pub child_topic: &'a str,
    /// Partition count of the child topic; every decision must be below it.
    pub child_partition_count: u32,
    /// 0 on the first try of a slab, one more on each retry.
    pub attempt: u32,
    /// The link's plugin config bytes (empty when the link gives none).
    pub config: &'a [u8],
}

impl<'a> RouteContextRef<'a> {
    /// Decodes a whole context; trailing bytes are an error so a layout mismatch between host
    /// and guest cannot go unnoticed.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, ContextError> {
        let mut r = Reader::new(bytes);
        let ctx = Self {
            parent_topic: r.str("parent_topic")?,
            parent_partition: r.u32("parent_partition")?,
            parent_partition_count: r.u32("parent_partition_count")?,
            child_topic: r.str("child_topic")?,
            child_partition_count: r.u32("child_partition_count")?,
            attempt: r.u32("attempt")?,
            config: r.bytes("config")?,
        };
        match r.remaining() {
            0 => Ok(ctx),
            count => Err(ContextError::TrailingBytes { count }),
        }
    }

    /// Bytes [`Self::encode_into`] writes, or `None` when a string or the config is longer
    /// than `u32::MAX` bytes (the ABI's length limit).
    pub fn encoded_len(&self) -> Option<usize> {
        let str_len = |b: &[u8]| -> Option<usize> {
            let n = u32::try_from(b.len()).ok()?;
            varint::u32_len(n).checked_add(b.len())
        };
        let mut total = str_len(self.parent_topic.as_bytes())?;
        total = total.checked_add(str_len(self.child_topic.as_bytes())?)?;
        total = total.checked_add(str_len(self.config)?)?;
        for v in [
            self.parent_partition,
            self.parent_partition_count,
            self.child_partition_count,
            self.attempt,
        ] {
            total = total.checked_add(varint::u32_len(v))?;
        }
        Some(total)
    }

    /// Writes the postcard encoding at the start of `out`, returning the bytes written, or
    /// `None` when `out` is shorter than [`Self::encoded_len`] or a length exceeds `u32`.
    pub fn encode_into(&self, out: &mut [u8]) -> Option<usize> {
        let mut pos = 0;
        let put_u32 = |v: u32, out: &mut [u8], pos: &mut usize| -> Option<()> {
            *pos += varint::write_u32(v, out.get_mut(*pos..)?)?;
            Some(())
        };
        let put_bytes = |b: &[u8], out: &mut [u8], pos: &mut usize| -> Option<()> {
            *pos += varint::write_u32(u32::try_from(b.len()).ok()?, out.get_mut(*pos..)?)?;
            let end = pos.checked_add(b.len())?;
            out.get_mut(*pos..end)?.copy_from_slice(b);
            *pos = end;
            Some(())
        };
        put_bytes(self.parent_topic.as_bytes(), out, &mut pos)?;
        put_u32(self.parent_partition, out, &mut pos)?;
        put_u32(self.parent_partition_count, out, &mut pos)?;
        put_bytes(self.child_topic.as_bytes(), out, &mut pos)?;
        put_u32(self.child_partition_count, out, &mut pos)?;
        put_u32(self.attempt, out, &mut pos)?;
        put_bytes(self.config, out, &mut pos)?;
        Some(pos)
    }

    /// An owned copy.
    #[cfg(feature = "alloc")]
    pub fn to_owned(&self) -> RouteContext {
        RouteContext {
            parent_topic: self.parent_topic.into(),
            parent_partition: self.parent_partition,
            parent_partition_count: self.parent_partition_count,
            child_topic: self.child_topic.into(),
            child_partition_count: self.child_partition_count,
            attempt: self.attempt,
            config: self.config.into(),
        }
    }
}

/// An owned route context (host side). Same fields and encoding as [`RouteContextRef`];
/// `postcard::to_allocvec` of it gives exactly the bytes [`RouteContextRef::encode_into`]
/// writes.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RouteContext {
    /// Topic the records were read from.
    pub parent_topic: alloc::string::String,
    /// Parent partition the slab was read from.
    pub parent_partition: u32,
    /// Partition count of the parent topic, read for this pass.
    pub parent_partition_count: u32,
    /// Child topic being routed to.
    pub child_topic: alloc::string::String,
    /// Partition count of the child topic; every decision must be below it.
    pub child_partition_count: u32,
    /// 0 on the first try of a slab, one more on each retry.
    pub attempt: u32,
    /// The link's plugin config bytes (empty when the link gives none).
    pub config: alloc::vec::Vec<u8>,
}

#[cfg(feature = "alloc")]
impl RouteContext {
    /// A borrowed view of this context, for [`crate::SlabEncoder::new`].
    pub fn as_ref(&self) -> RouteContextRef<'_> {
        RouteContextRef {
            parent_topic: &self.parent_topic,
            parent_partition: self.parent_partition,
            parent_partition_count: self.parent_partition_count,
            child_topic: &self.child_topic,
            child_partition_count: self.child_partition_count,
            attempt: self.attempt,
            config: &self.config,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    fn sample() -> RouteContextRef<'static> {
        RouteContextRef {
            parent_topic: "orders",
            parent_partition: 3,
            parent_partition_count: 12,
            child_topic: "analytics",
            child_partition_count: 300,
            attempt: 0,
            config: b"header=region\n",
        }
    }

    #[test]
    fn context_round_trips_and_reports_its_exact_length() {
        let ctx = sample();
        let mut buf = [0u8; 64];
        let n = ctx.encode_into(&mut buf).unwrap();
        assert_eq!(Some(n), ctx.encoded_len());
        assert_eq!(RouteContextRef::decode(&buf[..n]), Ok(ctx));
    }

    #[test]
    fn trailing_bytes_after_the_context_are_rejected() {
        let ctx = sample();
        let mut buf = [0u8; 64];
        let n = ctx.encode_into(&mut buf).unwrap();
        assert_eq!(
            RouteContextRef::decode(&buf[..n + 2]),
            Err(ContextError::TrailingBytes { count: 2 })
        );
    }

    #[test]
    fn every_truncation_of_a_context_is_an_error_not_a_panic() {
        let ctx = sample();
        let mut buf = [0u8; 64];
        let n = ctx.encode_into(&mut buf).unwrap();
        for cut in 0..n {
            assert!(matches!(
                RouteContextRef::decode(&buf[..cut]),
                Err(ContextError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn a_topic_that_is_not_utf8_is_rejected() {
        let bytes = [2, 0xff, 0xfe, 0, 1, 0, 1, 0, 0];
        assert_eq!(
            RouteContextRef::decode(&bytes),
            Err(ContextError::InvalidUtf8 {
                field: "parent_topic"
            })
        );
    }

    #[test]
    fn encoding_into_a_short_buffer_is_refused() {
        assert_eq!(sample().encode_into(&mut [0u8; 8]), None);
    }
}
