//! Why a partition stops serving, as values an operator (and a test) can read field by field:
//! [`Damage`] is what quarantines a partition (acknowledged records damaged or missing),
//! [`Failure`] what stops one after a disk error it could not undo. Each names the file and
//! the byte position or offsets involved, and its `Display` is the sentence the logs, the HTTP
//! API and `narad` print.
//!
//! They are kept in the partition's slot and handed out with every refused read or append, so
//! they are `Clone` and comparable; an OS error inside one is shared ([`IoCause`]), not copied
//! into text.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::log::format::FrameError;
use crate::log::segment::segment_name;

/// Damage found where acknowledged records live. The partition is quarantined: it refuses
/// reads and appends until an operator repairs or restores its files; other partitions keep
/// working.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    /// The metadata records the partition, so its directory was made (directories are made
    /// durable before a partition is recorded), but the directory is gone: every record it
    /// held is missing. Starting it empty would give its offsets to new records.
    #[error(
        "the partition directory {} is missing, although the partition is recorded (its \
         directory was made before it was recorded): restore the directory from a backup and \
         restart, or accept the loss of every record it held with `narad partition recreate \
         TOPIC/PARTITION --accept-loss` (the new log starts above what its children hold, or \
         at --start-offset)",
        dir.display()
    )]
    DirectoryMissing {
        /// The partition directory.
        dir: PathBuf,
    },
    /// The log-start file fails its check (size, magic, version or CRC), so whether the
    /// oldest segments are all there cannot be told.
    #[error(
        "the log-start file in {} fails its check, so it cannot be told whether the oldest \
         segments are all there; after checking them, remove the file to accept the oldest \
         segment file as the log start",
        dir.display()
    )]
    LogStartUnreadable {
        /// The partition directory.
        dir: PathBuf,
    },
    /// No segment file is left, but the log-start file records a later start than 0.
    #[error(
        "{} holds no segment files, but its log-start file records offset {log_start} as the \
         log start: every record from offset {log_start} on is missing",
        dir.display()
    )]
    EverySegmentMissing {
        /// The partition directory.
        dir: PathBuf,
        /// The recorded log start offset.
        log_start: u64,
    },
    /// The oldest segment file starts after the recorded log start: the segments holding
    /// `log_start..oldest_base` are missing, and retention did not delete them.
    #[error(
        "the oldest segment file in {} is {}, but the log-start file records offset \
         {log_start} as the log start: the segment files holding offsets {log_start} to {} are \
         missing (retention did not delete them)",
        dir.display(),
        segment_name(*oldest_base),
        oldest_base.saturating_sub(1)
    )]
    HeadMissing {
        /// The partition directory.
        dir: PathBuf,
        /// Base offset of the oldest segment file present.
        oldest_base: u64,
        /// The recorded log start offset.
        log_start: u64,
    },
    /// Older segments than the recorded log start exist, but none starts exactly there.
    #[error(
        "the log-start file in {} records offset {log_start} as the log start, but no segment \
         file starts there ({} is missing)",
        dir.display(),
        segment_name(*log_start)
    )]
    LogStartSegmentMissing {
        /// The partition directory.
        dir: PathBuf,
        /// The recorded log start offset.
        log_start: u64,
    },
    /// No segment file is left, but the high-watermark file records acknowledged offsets.
    #[error(
        "{} holds no segment files, but its high-watermark file records offsets up to \
         {durable_next_offset} as durable",
        dir.display()
    )]
    NoSegmentsButDurable {
        /// The partition directory.
        dir: PathBuf,
        /// The next offset the high-watermark file records as durable.
        durable_next_offset: u64,
    },
    /// The segment the high-watermark file names as the durable boundary is missing.
    #[error(
        "the high-watermark file in {} names segment {} as durable, but that file is missing",
        dir.display(),
        segment_name(*segment_base)
    )]
    DurableSegmentMissing {
        /// The partition directory.
        dir: PathBuf,
        /// Base offset of the missing segment.
        segment_base: u64,
    },
    /// A segment does not start where the previous one ends: offsets are missing between
    /// them (`base > expected`), or the two overlap.
    #[error(
        "{} starts at offset {base} but the previous segment ends at offset {expected}: {}",
        segment.display(),
        sequence_gap(*base, *expected)
    )]
    SegmentOutOfSequence {
        /// The segment file.
        segment: PathBuf,
        /// The offset its name says it starts at.
        base: u64,
        /// Where the previous segment ends (the offset this one should start at).
        expected: u64,
    },
    /// A segment is shorter than the bytes of it the high-watermark file records as durable.
    #[error(
        "{} is {len} bytes long, but the high-watermark file records {durable_len} bytes of it \
         as durable",
        segment.display()
    )]
    SegmentShorterThanDurable {
        /// The segment file.
        segment: PathBuf,
        /// Its length in bytes.
        len: u64,
        /// The bytes of it recorded as durable.
        durable_len: u64,
    },
    /// A frame carries another base offset than the one the log has reached.
    #[error(
        "{} byte {position}: frame has base offset {base_offset}, expected {expected}",
        segment.display()
    )]
    FrameOutOfSequence {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the frame in the file.
        position: u64,
        /// The base offset the frame carries.
        base_offset: u64,
        /// The offset the log had reached.
        expected: u64,
    },
    /// A bad frame below the durable boundary, where acknowledged records live.
    #[error(
        "{} byte {position}: {error}; this is below the durable boundary, where acknowledged \
         records live",
        segment.display()
    )]
    BadFrameBelowBoundary {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the frame.
        position: u64,
        /// What is wrong with it (a CRC mismatch carries the stored and computed CRCs).
        error: FrameError,
    },
    /// A bad frame in a segment that was complete before the next one was started.
    #[error(
        "{} byte {position}: {error}; the segment was complete before the next one was started",
        segment.display()
    )]
    BadFrameInCompleteSegment {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the frame.
        position: u64,
        /// What is wrong with it.
        error: FrameError,
    },
    /// A bad frame followed by a valid one: damage in the middle, not a torn tail.
    #[error(
        "{} byte {position}: {error}; a valid frame follows at byte {valid_at}, so this is not \
         a torn tail",
        segment.display()
    )]
    BadFrameBeforeValidFrame {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the bad frame.
        position: u64,
        /// What is wrong with it.
        error: FrameError,
        /// Byte position of the valid frame after it.
        valid_at: u64,
    },
    /// The log ends before the offsets the high-watermark file records as durable.
    #[error(
        "the log in {} ends at offset {end_offset}, but the high-watermark file records offsets \
         up to {durable_next_offset} as durable",
        dir.display()
    )]
    LogShorterThanDurable {
        /// The partition directory.
        dir: PathBuf,
        /// The next offset after the last intact record.
        end_offset: u64,
        /// The next offset the high-watermark file records as durable.
        durable_next_offset: u64,
    },
    /// Recovery left no segment (a defect: it always creates one).
    #[error("{} has no segments after recovery", dir.display())]
    NoSegmentsAfterRecovery {
        /// The partition directory.
        dir: PathBuf,
    },
    /// A read found a bad frame below the durable end.
    #[error(
        "{} byte {position}: {error}; found by a read below the durable end",
        segment.display()
    )]
    BadFrameOnRead {
        /// The segment file.
        segment: PathBuf,
        /// Byte position of the frame.
        position: u64,
        /// What is wrong with it.
        error: FrameError,
    },
    /// A read found a frame whose CRC matches but whose body does not decode.
    #[error("{} frame at offset {base_offset}: {error}", segment.display())]
    UndecodableFrame {
        /// The segment file.
        segment: PathBuf,
        /// The frame's base offset.
        base_offset: u64,
        /// Why it does not decode.
        error: FrameError,
    },
    /// A read reached the end of a segment's frames before the offsets it holds.
    #[error(
        "{} ends before offset {offset} although it holds records up to {segment_next_offset}",
        segment.display()
    )]
    SegmentEndsEarly {
        /// The segment file.
        segment: PathBuf,
        /// The offset the read reached.
        offset: u64,
        /// One past the last record the segment holds.
        segment_next_offset: u64,
    },
    /// An append failed, and the check of the durable tail that followed found that the
    /// device no longer holds records already acknowledged.
    #[error(
        "appending to {} failed ({append_error}), and the device no longer holds acknowledged \
         records: {loss}",
        segment.display()
    )]
    LostOnDevice {
        /// The active segment file.
        segment: PathBuf,
        /// The error of the append.
        append_error: IoCause,
        /// What the device holds instead.
        loss: DeviceLoss,
    },
}

/// What a device check of the durable tail found instead of the acknowledged records (see
/// [`Damage::LostOnDevice`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceLoss {
    /// A frame with another base offset than the acknowledged one.
    #[error(
        "byte {position}: the device holds a frame with base offset {base_offset}, expected {expected}"
    )]
    WrongFrame {
        /// Byte position in the segment.
        position: u64,
        /// The base offset the device's frame carries.
        base_offset: u64,
        /// The acknowledged base offset.
        expected: u64,
    },
    /// A bad frame (zeros, a CRC mismatch, ...) where acknowledged records were.
    #[error("byte {position}: {error}; the device no longer holds acknowledged records there")]
    BadFrame {
        /// Byte position in the segment.
        position: u64,
        /// What is wrong with the bytes.
        error: FrameError,
    },
    /// The device's frames stop before the acknowledged end.
    #[error(
        "the device holds records up to offset {device_end}, but offsets up to {acknowledged} \
         were acknowledged"
    )]
    Short {
        /// One past the last record the device holds.
        device_end: u64,
        /// One past the last acknowledged record.
        acknowledged: u64,
    },
}

/// Why a partition stopped after a disk error. It is not damage: its first use after
/// `StoreOptions::failed_reopen_after` (or a restart) runs recovery and reopens it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// An append failed, and so did undoing it: truncating the active segment back to its
    /// durable length on a fresh handle and reading that back from the device.
    #[error(
        "appending to {} failed ({append_error}), and truncating back to the durable length \
         {durable_len} and reading it back from the device failed too ({recovery_error})",
        segment.display()
    )]
    UndoFailed {
        /// The active segment file.
        segment: PathBuf,
        /// Bytes of it known durable.
        durable_len: u64,
        /// The error of the append.
        append_error: IoCause,
        /// The error of the truncate-back or the read-back.
        recovery_error: IoCause,
    },
}

/// An OS error kept inside a [`Damage`] or [`Failure`]: shared, so the reason can be cloned
/// into every refusal; two are equal when their kind, OS code and message are.
#[derive(Clone, Debug)]
pub struct IoCause(Arc<io::Error>);

impl IoCause {
    /// The OS error.
    pub fn get(&self) -> &io::Error {
        &self.0
    }

    /// The error's kind.
    pub fn kind(&self) -> io::ErrorKind {
        self.0.kind()
    }
}

impl From<io::Error> for IoCause {
    fn from(e: io::Error) -> IoCause {
        IoCause(Arc::new(e))
    }
}

impl fmt::Display for IoCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.0, crate::error::advice_suffix(&self.0))
    }
}

impl PartialEq for IoCause {
    fn eq(&self, other: &IoCause) -> bool {
        self.kind() == other.kind()
            && self.0.raw_os_error() == other.0.raw_os_error()
            && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for IoCause {}

/// What lies between two segments that do not meet: the missing offsets, or an overlap.
fn sequence_gap(base: u64, expected: u64) -> String {
    if base > expected {
        format!(
            "offsets {expected} to {} are missing (not deleted by retention)",
            base - 1
        )
    } else {
        "the two overlap".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_names_its_file_and_numbers_as_before() {
        let hole = Damage::SegmentOutOfSequence {
            segment: PathBuf::from("/p/00000000000000000004.log"),
            base: 4,
            expected: 2,
        };
        assert_eq!(
            hole.to_string(),
            "/p/00000000000000000004.log starts at offset 4 but the previous segment ends at \
             offset 2: offsets 2 to 3 are missing (not deleted by retention)"
        );
        let crc = Damage::BadFrameBelowBoundary {
            segment: PathBuf::from("/p/00000000000000000000.log"),
            position: 120,
            error: FrameError::CrcMismatch {
                stored: 0xdead_beef,
                computed: 0x0102_0304,
            },
        };
        assert_eq!(
            crc.to_string(),
            "/p/00000000000000000000.log byte 120: CRC-32C mismatch (stored deadbeef, computed \
             01020304); this is below the durable boundary, where acknowledged records live"
        );
        let head = Damage::HeadMissing {
            dir: PathBuf::from("/p"),
            oldest_base: 10,
            log_start: 0,
        };
        assert_eq!(
            head.to_string(),
            "the oldest segment file in /p is 00000000000000000010.log, but the log-start file \
             records offset 0 as the log start: the segment files holding offsets 0 to 9 are \
             missing (retention did not delete them)"
        );
        let cause = IoCause::from(io::Error::from_raw_os_error(5));
        assert_eq!(cause, IoCause::from(io::Error::from_raw_os_error(5)));
        assert_ne!(cause, IoCause::from(io::Error::from_raw_os_error(28)));
    }
}
