//! Where a cursor with no offset file for its epoch begins.

/// The starting point of a cursor that has no usable offset file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StartPoint {
    /// The parent's high watermark recorded for this partition when the link was attached.
    AttachOffset(u64),
    /// The partition was added to the parent after the attach: it has no history from before
    /// the attach, so everything in it is copied.
    Beginning,
    /// The link predates attach points: start at the parent's tail as of the first read (the
    /// older behaviour; detach and re-attach to upgrade).
    LiveTail,
}

/// Applies the start rules to a link's recorded `attach_offsets` (index = parent partition).
pub(crate) fn start_point(attach_offsets: Option<&[u64]>, partition: u32) -> StartPoint {
    match attach_offsets {
        Some(offsets) => match offsets.get(partition as usize) {
            Some(&offset) => StartPoint::AttachOffset(offset),
            None => StartPoint::Beginning,
        },
        None => StartPoint::LiveTail,
    }
}

impl StartPoint {
    /// The offset this start point names, given the parent's current high watermark (only
    /// used by [`StartPoint::LiveTail`]).
    pub(crate) fn resolve(self, high_watermark: u64) -> u64 {
        match self {
            StartPoint::AttachOffset(offset) => offset,
            StartPoint::Beginning => 0,
            StartPoint::LiveTail => high_watermark,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_within_the_slice_starts_exactly_at_its_recorded_offset() {
        let offsets = [19, 10, 9];
        assert_eq!(start_point(Some(&offsets), 0), StartPoint::AttachOffset(19));
        assert_eq!(start_point(Some(&offsets), 2), StartPoint::AttachOffset(9));
        assert_eq!(start_point(Some(&offsets), 1).resolve(500), 10);
    }

    #[test]
    fn a_partition_added_after_the_attach_starts_at_zero() {
        let offsets = [19, 10, 9];
        assert_eq!(start_point(Some(&offsets), 3), StartPoint::Beginning);
        assert_eq!(start_point(Some(&offsets), 3).resolve(1_000), 0);
    }

    #[test]
    fn a_link_without_attach_offsets_starts_at_the_live_tail() {
        assert_eq!(start_point(None, 0), StartPoint::LiveTail);
        assert_eq!(start_point(None, 7).resolve(1_234), 1_234);
    }
}
