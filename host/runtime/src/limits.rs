//! Per-instance and per-call limits: memory, tables, stack, fuel, deadline, log rate; and the
//! shape limits a module must meet before it is compiled ([`ModuleLimits`]).
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
/// modulo and a store. Measured: a plugin hashing 16-byte keys in Wasm spends about 170 units
/// per record (689,366 for a slab of 4,096); `key-hash`, which reads the host's hashes
/// (`needs = [key_hash]`), about 30 (122,144); 2,000 leaves ten times the former for plugins
/// that do more per record (header lookups, config maps), and the per-byte term covers long
/// keys.
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
/// Memories a module may declare (or import): one, the exported `memory`.
pub const MAX_MEMORIES: usize = 1;
/// Tables a module may declare: a few (reference-types guests may declare more than one).
pub const MAX_TABLES: usize = 4;

/// Default rate of `narad.log` lines per instance: 100 per second sustained.
pub const DEFAULT_LOG_LINES_PER_SEC: u32 = 100;

/// Default burst of `narad.log` lines per instance.
pub const DEFAULT_LOG_BURST_LINES: u32 = 200;

/// Default most functions a module may define (its code section's entries; imports do not
/// count). Measured: the built-ins define 82 to 127 (`header-route` the most); a router with a
/// JSON parser and a regex engine stays in the low thousands. Each defined function costs the
/// compiler a fixed few KB whatever its size, so this is what stops a module of a million empty
/// functions (4 MB on the wire, 5.7 GB to compile) before it reaches the compiler.
pub const DEFAULT_MAX_FUNCTIONS: u32 = 10_000;

/// Default largest function body in bytes (locals declarations and code). Measured: the
/// built-ins' largest is 2,036 to 2,784 bytes, 47 times under this; rustc's release builds rarely pass a few tens of KiB even for big
/// `match`es. Cranelift's time and memory grow faster than linearly with one function's size
/// (a 7 MB body took 34 s and 4.7 GB), so this is the bound on one function's compile cost.
pub const DEFAULT_MAX_FUNCTION_BODY_BYTES: u32 = 128 * 1024;

/// Default most bytes of the whole code section: 4 MiB. Measured: the built-ins have 17,649
/// to 37,027 bytes of code (`header-route`), over a hundred times less. Together with the two limits above it bounds
/// one compile; see the measurement on [`ModuleLimits`].
pub const DEFAULT_MAX_CODE_BYTES: u64 = 4 * 1024 * 1024;

/// Default most locals one function may declare (parameters not counted). The built-ins
/// declare at most 14 to 22 (measured); wasmparser's own ceiling is 50,000. Each local is a value
/// the register allocator must track through the whole function.
pub const DEFAULT_MAX_LOCALS_PER_FUNCTION: u32 = 2_000;

/// Default most entries of each of the other index spaces and segment lists of a module:
/// types, imports, exports, globals, data segments, element segments, and the items of all
/// element segments together. Measured: the built-ins have 15 types, 1 import, 8 exports, 3
/// globals, 2 data segments, 1 element segment of 26 to 41 items; a router needs one import
/// (`narad.log`) and six exports. 10,000 matches [`DEFAULT_TABLE_ELEMENTS`], the
/// most entries a function table may have at run time.
pub const DEFAULT_MAX_MODULE_ITEMS: u32 = 10_000;

/// Default most bytes of all data segments together: 8 MiB. Measured: the built-ins carry
/// 2,305 to 6,228 bytes (string constants and tables); the data is copied into every new instance, and an instance
/// has [`DEFAULT_MEMORY_BYTES`] of memory at most anyway.
pub const DEFAULT_MAX_DATA_BYTES: u64 = 8 * 1024 * 1024;

/// Limits on the shape of a module, checked by walking its bytes with wasmparser **before**
/// it is handed to the compiler (see [`crate::plugin`]). A module over any of them is refused
/// with [`crate::LoadError::ModuleLimit`] naming the limit, the value found and the maximum;
/// nothing of it is compiled.
///
/// Why these: compiling is the one step of a deploy that fuel and deadlines do not bound, and
/// its cost grows with the number of functions, the size of the largest one and the code size
/// (wasmtime's guidance for untrusted code is to bound what reaches the compiler; its own
/// parser limits, such as a million functions or 7.6 MB per function, are far above what a
/// host can afford per upload). The other counts bound the metadata wasmtime builds per item.
/// Declared memory and table minimums are checked against [`Limits::memory_bytes`] and
/// [`Limits::table_elements`], and at most one memory and [`MAX_TABLES`] tables are allowed.
///
/// Measured cost at the defaults (on the module of the test
/// `a_module_right_at_the_default_limits_passes_the_shape_check_and_exporting_nothing_is_never_compiled`
/// in `tests/all/limits.rs`, when exports were still checked after the compile; a module
/// that does not export the ABI is now refused before it): a module with every limit reached at once (10,000 functions filling
/// 4 MiB of code with loads and adds, one of them a 128 KiB body with 2,000 locals) compiles in
/// 11.8 s with a peak RSS of 107 MiB for the whole test process, single-threaded, in a debug
/// build (dependencies at opt-level 1) on a shared 2-core machine; that one largest function
/// alone (`one_function_right_at_the_body_and_locals_limits_passes_the_shape_check`) takes 3.2 s and
/// 36 MiB. Before these limits, a 4 MB
/// module of 999,000 empty functions took 90 s and 5.7 GB, and one 7 MB function 34 s and 4.7 GB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleLimits {
    /// Most defined functions (default [`DEFAULT_MAX_FUNCTIONS`]).
    pub max_functions: u32,
    /// Largest function body, bytes (default [`DEFAULT_MAX_FUNCTION_BODY_BYTES`]).
    pub max_function_body_bytes: u32,
    /// Largest code section, bytes (default [`DEFAULT_MAX_CODE_BYTES`]).
    pub max_code_bytes: u64,
    /// Most declared locals in one function (default [`DEFAULT_MAX_LOCALS_PER_FUNCTION`]).
    pub max_locals_per_function: u32,
    /// Most types, imports, exports, globals, data segments, element segments and element
    /// items, each counted on its own (default [`DEFAULT_MAX_MODULE_ITEMS`]).
    pub max_items: u32,
    /// Most bytes of all data segments (default [`DEFAULT_MAX_DATA_BYTES`]).
    pub max_data_bytes: u64,
}

impl ModuleLimits {
    /// The documented defaults.
    pub const DEFAULT: ModuleLimits = ModuleLimits {
        max_functions: DEFAULT_MAX_FUNCTIONS,
        max_function_body_bytes: DEFAULT_MAX_FUNCTION_BODY_BYTES,
        max_code_bytes: DEFAULT_MAX_CODE_BYTES,
        max_locals_per_function: DEFAULT_MAX_LOCALS_PER_FUNCTION,
        max_items: DEFAULT_MAX_MODULE_ITEMS,
        max_data_bytes: DEFAULT_MAX_DATA_BYTES,
    };
}

impl Default for ModuleLimits {
    fn default() -> Self {
        ModuleLimits::DEFAULT
    }
}

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
    /// The shape limits a module must meet before it is compiled (default
    /// [`ModuleLimits::DEFAULT`]).
    pub module: ModuleLimits,
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
            module: ModuleLimits::DEFAULT,
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
