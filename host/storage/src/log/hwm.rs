//! The durable high-watermark file: one fixed 64-byte record per partition, rewritten in place
//! (one write at offset 0, one `fdatasync`), holding the durable boundary and whether the log
//! was closed cleanly.
//!
//! ```text
//!  0  magic "NRDH"                 4 bytes
//!  4  crc32c                       u32 LE, Castagnoli, over bytes 8..64
//!  8  version                      u16 LE (1)
//! 10  flags                        u16 LE (bit 0: closed cleanly)
//! 12  boundary segment base        u64 LE
//! 20  boundary byte position       u64 LE (bytes of that segment known durable)
//! 28  next offset                  u64 LE (one past the last record below the boundary)
//! 36  newest committed_at_ms       i64 LE
//! 44  reserved                     20 zero bytes
//! ```
//!
//! Do not reorder fields: this layout is persisted.

use std::path::Path;

use crate::fs::{File, FileSystem, OpenMode};

/// File name inside the partition directory.
pub const HWM_FILE_NAME: &str = "high-watermark";
/// Size of the record in bytes: small enough for one sector, so an in-place rewrite is not
/// torn on common hardware (a torn one fails its CRC and is ignored).
pub const HWM_LEN: usize = 64;
const MAGIC: [u8; 4] = *b"NRDH";
const VERSION: u16 = 1;
const FLAG_CLEAN: u16 = 1;

/// The contents of the high-watermark file (persisted by `encode`; do not reorder the
/// encoded fields, see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwmRecord {
    /// Base offset of the segment holding the boundary.
    pub segment_base: u64,
    /// Bytes of that segment known durable and valid (all earlier segments are wholly).
    pub segment_pos: u64,
    /// Next offset at the boundary.
    pub next_offset: u64,
    /// Newest commit time below the boundary.
    pub newest_committed_at_ms: i64,
    /// True only when written by a clean close: then the boundary is the exact end of the log.
    pub clean: bool,
}

impl HwmRecord {
    /// Encodes the fixed-size record.
    pub fn encode(&self) -> [u8; HWM_LEN] {
        let mut b = [0u8; HWM_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.clean { FLAG_CLEAN } else { 0 };
        b[10..12].copy_from_slice(&flags.to_le_bytes());
        b[12..20].copy_from_slice(&self.segment_base.to_le_bytes());
        b[20..28].copy_from_slice(&self.segment_pos.to_le_bytes());
        b[28..36].copy_from_slice(&self.next_offset.to_le_bytes());
        b[36..44].copy_from_slice(&self.newest_committed_at_ms.to_le_bytes());
        let crc = crc32c::crc32c(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a record; `None` if it is short, has the wrong magic or version, or fails its
    /// CRC (torn or damaged: treated as "no boundary known").
    pub fn decode(b: &[u8]) -> Option<HwmRecord> {
        if b.len() < HWM_LEN || b[0..4] != MAGIC {
            return None;
        }
        let u64_at = |at: usize| {
            let mut a = [0; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let crc = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if crc32c::crc32c(&b[8..HWM_LEN]) != crc {
            return None;
        }
        if u16::from_le_bytes([b[8], b[9]]) != VERSION {
            return None;
        }
        Some(HwmRecord {
            clean: u16::from_le_bytes([b[10], b[11]]) & FLAG_CLEAN != 0,
            segment_base: u64_at(12),
            segment_pos: u64_at(20),
            next_offset: u64_at(28),
            newest_committed_at_ms: u64_at(36) as i64,
        })
    }
}

/// Reads the partition's high-watermark file. `Ok(None)` if it is missing or invalid.
pub fn read(fs: &dyn FileSystem, dir: &Path) -> std::io::Result<Option<HwmRecord>> {
    let path = dir.join(HWM_FILE_NAME);
    let file = match fs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut buf = [0u8; HWM_LEN];
    match file.read_exact_at(&mut buf, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let rec = HwmRecord::decode(&buf);
    if rec.is_none() {
        tracing::warn!(path = %path.display(), "high-watermark file fails its check; ignoring it");
    }
    Ok(rec)
}

/// Writes `rec` in place and syncs it. A failed write or sync leaves the handle untrusted, so
/// the caller drops it and opens the file again next time.
pub fn write(file: &dyn File, rec: &HwmRecord) -> std::io::Result<()> {
    file.write_all_at(&rec.encode(), 0)?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_flipped_byte_is_rejected() {
        let r = HwmRecord {
            segment_base: 100,
            segment_pos: 4096,
            next_offset: 150,
            newest_committed_at_ms: 1_700_000_000_000,
            clean: true,
        };
        let b = r.encode();
        assert_eq!(HwmRecord::decode(&b), Some(r));
        for i in 0..HWM_LEN {
            let mut bad = b;
            bad[i] ^= 0x10;
            assert_eq!(HwmRecord::decode(&bad), None, "byte {i}");
        }
    }
}
