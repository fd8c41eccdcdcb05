//! Per-instance and per-call limits: memory, tables, stack, fuel, deadline, log rate.
//!
//! Fuel is the deterministic limit: a call's budget depends only on the slab it is given, so a
//! slab that exhausts it fails the same way on every replay, on every node. The epoch deadline
//! is the wall-clock backstop for what fuel cannot see (a host as slow as a stalled VM).

use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Fuel every call gets regardless of its size: one-off work per slab such as decoding the
/// postcard route context, parsing the link's config, and the allocator's first use. Measured
/// on a one-record slab: 1,200 to 1,400 units for the three default built-ins, 5,700 for
/// `header-route` with a three-line config. wasmtime charges about one unit per Wasm
/// instruction, so 5 million units (a few ms of guest time) leaves room for configs thousands of
/// times larger while still stopping an endless loop within the 100 ms deadline.
pub const FUEL_BASE: u64 = 5_000_000;

/// Fuel per record handed in: reading a 40-byte table entry, hashing a key with murmur2, a
/// modulo and a store. Measured: `key-hash` spends about 170 units per record with 16-byte keys
/// (689,366 for a slab of 4,096); 2,000 leaves ten times that for plugins that do more per
/// record (header lookups, config maps), and the per-byte term covers long keys.
pub const FUEL_PER_RECORD: u64 = 2_000;

/// Fuel per input byte: a plugin may scan every byte it is given (keys, headers, values) a few
/// times (hash, compare, parse); 20 units per byte covers a handful of passes.
pub const FUEL_PER_INPUT_BYTE: u64 = 20;

/// The default wall-clock deadline of one call: the default, 100 ms.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(100);

/// Default linear-memory limit per instance: 64 MiB, the default. A slab is at most
/// 4 MiB of records (the engine's slab bound), so this leaves the guest ample room.
pub const DEFAULT_MEMORY_BYTES: u64 = 64 * 1024 * 1024;

/// Default table-element limit per instance. Rust and C guests have one function table sized
/// by their indirect-call targets (a few hundred); 10,000 is far above that and keeps a
/// `table.grow` bomb to 80 KiB of host memory.
pub const DEFAULT_TABLE_ELEMENTS: usize = 10_000;

/// Default Wasm stack limit: 512 KiB, wasmtime's own default, set explicitly so it is part of
/// our contract with plugin authors and not a library detail.
pub const DEFAULT_MAX_WASM_STACK_BYTES: usize = 512 * 1024;

/// Instances, memories and tables a store may hold: one plugin instance with one memory, and a
/// few tables (reference-types guests may declare more than one).
const MAX_INSTANCES: usize = 1;
const MAX_MEMORIES: usize = 1;
const MAX_TABLES: usize = 4;

/// Default rate of `narad.log` lines per instance: 100 per second sustained.
pub const DEFAULT_LOG_LINES_PER_SEC: u32 = 100;

/// Default burst of `narad.log` lines per instance.
pub const DEFAULT_LOG_BURST_LINES: u32 = 200;

/// How a call's fuel budget is computed from its slab:
/// `base + per_record * records + per_input_byte * input_bytes`.
///
/// It depends only on the slab, never on time or load, so a poison slab fails identically on
/// replay. The defaults are [`FUEL_BASE`], [`FUEL_PER_RECORD`], [`FUEL_PER_INPUT_BYTE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuelBudget {
    /// Fuel every call gets.
    pub base: u64,
    /// Fuel per record handed in.
    pub per_record: u64,
    /// Fuel per byte of encoded input.
    pub per_input_byte: u64,
}

impl FuelBudget {
    /// The documented defaults.
    pub const DEFAULT: FuelBudget = FuelBudget {
        base: FUEL_BASE,
        per_record: FUEL_PER_RECORD,
        per_input_byte: FUEL_PER_INPUT_BYTE,
    };

    /// The budget of a call over `records` records and `input_bytes` bytes of input
    /// (saturating).
    pub fn for_slab(&self, records: usize, input_bytes: usize) -> u64 {
        self.base
            .saturating_add(self.per_record.saturating_mul(records as u64))
            .saturating_add(self.per_input_byte.saturating_mul(input_bytes as u64))
    }
}

impl Default for FuelBudget {
    fn default() -> Self {
        FuelBudget::DEFAULT
    }
}

/// The limits every plugin instance and call runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock deadline of one call (default [`DEFAULT_DEADLINE`], 100 ms).
    pub deadline: Duration,
    /// Linear-memory limit per instance in bytes (default [`DEFAULT_MEMORY_BYTES`], 64 MiB).
    pub memory_bytes: u64,
    /// Table-element limit per table (default [`DEFAULT_TABLE_ELEMENTS`]).
    pub table_elements: usize,
    /// Wasm stack limit in bytes (default [`DEFAULT_MAX_WASM_STACK_BYTES`], 512 KiB).
    pub max_wasm_stack_bytes: usize,
    /// Sustained `narad.log` lines per second per instance (default 100).
    pub log_lines_per_sec: u32,
    /// `narad.log` burst per instance (default 200).
    pub log_burst_lines: u32,
    /// The fuel budget per call (default [`FuelBudget::DEFAULT`]); the deploy checks and the
    /// `narad_last_error` fetch get `fuel.base`.
    pub fuel: FuelBudget,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: DEFAULT_DEADLINE,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            table_elements: DEFAULT_TABLE_ELEMENTS,
            max_wasm_stack_bytes: DEFAULT_MAX_WASM_STACK_BYTES,
            log_lines_per_sec: DEFAULT_LOG_LINES_PER_SEC,
            log_burst_lines: DEFAULT_LOG_BURST_LINES,
            fuel: FuelBudget::DEFAULT,
        }
    }
}

/// The error a denied `memory.grow` or `table.grow` raises inside the guest. Raising it (rather
/// than returning -1 to the guest) stops a grow bomb at once and lets the host name the cause.
#[derive(Debug, thiserror::Error)]
#[error("{what} limit of {limit} exceeded (asked for {desired})")]
pub(crate) struct LimitExceeded {
    pub(crate) what: &'static str,
    pub(crate) limit: u64,
    pub(crate) desired: u64,
}

/// The [`ResourceLimiter`] kept in each store's data.
#[derive(Debug)]
pub(crate) struct StoreLimiter {
    memory_bytes: u64,
    table_elements: usize,
}

impl StoreLimiter {
    pub(crate) fn new(limits: &Limits) -> Self {
        StoreLimiter {
            memory_bytes: limits.memory_bytes,
            table_elements: limits.table_elements,
        }
    }
}

impl ResourceLimiter for StoreLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.memory_bytes {
            return Err(wasmtime::Error::new(LimitExceeded {
                what: "memory",
                limit: self.memory_bytes,
                desired: desired as u64,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            return Err(wasmtime::Error::new(LimitExceeded {
                what: "table",
                limit: self.table_elements as u64,
                desired: desired as u64,
            }));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuel_budget_grows_with_records_and_bytes_only() {
        let fuel = FuelBudget::DEFAULT;
        assert_eq!(fuel.for_slab(0, 0), FUEL_BASE);
        assert_eq!(
            fuel.for_slab(4096, 1000),
            FUEL_BASE + 4096 * FUEL_PER_RECORD + 1000 * FUEL_PER_INPUT_BYTE
        );
    }

    #[test]
    fn fuel_budget_saturates_instead_of_overflowing() {
        assert_eq!(
            FuelBudget::DEFAULT.for_slab(usize::MAX, usize::MAX),
            u64::MAX
        );
    }

    #[test]
    fn limiter_refuses_growth_past_the_memory_limit() {
        let mut limiter = StoreLimiter::new(&Limits::default());
        assert!(
            limiter
                .memory_growing(0, DEFAULT_MEMORY_BYTES as usize, None)
                .unwrap()
        );
        let err = limiter
            .memory_growing(0, DEFAULT_MEMORY_BYTES as usize + 65536, None)
            .unwrap_err();
        assert!(err.is::<LimitExceeded>());
    }
}
