//! [`Decisions`]: the output slots of one slab, one child partition per record.

use narad_abi::{RecordView, UNDECIDED};

use crate::error::RouteError;

/// The decisions for one slab: slot `i` belongs to record `i`. Every slot starts
/// [`UNDECIDED`]; a router sets the ones it decides and leaves the rest to the next plugin.
#[derive(Debug)]
pub struct Decisions<'a> {
    slots: &'a mut [u32],
}

impl<'a> Decisions<'a> {
    /// Decisions over `slots` (one per record of the slab).
    pub fn new(slots: &'a mut [u32]) -> Self {
        Self { slots }
    }

    /// Number of slots (the slab's record count).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the slab is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Sends `record` to child partition `partition`. The host checks the index against the
    /// child's partition count after the chain.
    #[inline]
    pub fn decide(&mut self, record: &RecordView<'_>, partition: u32) {
        // Records come from the same slab as the slots, so the index is always in range.
        if let Some(slot) = self.slots.get_mut(record.index()) {
            *slot = partition;
        }
    }

    /// Sends record `index` to `partition`; an error for an index past the slab.
    pub fn set(&mut self, index: usize, partition: u32) -> Result<(), RouteError> {
        let len = self.slots.len();
        let slot = self.slots.get_mut(index).ok_or_else(|| {
            RouteError::plugin(alloc::format!(
                "decision for record {index} of a slab of {len}"
            ))
        })?;
        *slot = partition;
        Ok(())
    }

    /// The decision for record `index`, `None` while undecided (or past the slab).
    pub fn get(&self, index: usize) -> Option<u32> {
        self.slots.get(index).copied().filter(|&p| p != UNDECIDED)
    }

    /// The raw slots.
    pub fn as_slice(&self) -> &[u32] {
        self.slots
    }

    /// The slots to write directly, slot `i` for record `i` (every slot starts
    /// [`UNDECIDED`]). For hot loops: zipping them with [`narad_abi::SlabView::records`]
    /// decides each record without the index check of [`Decisions::decide`].
    pub fn slots_mut(&mut self) -> &mut [u32] {
        self.slots
    }
}
