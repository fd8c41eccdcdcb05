//! Export and import names of ABI v1. The host looks these up; the guest SDK's macro emits
//! exports with exactly these names, so a rename cannot drift between the two sides.

/// Exported linear memory.
pub const MEMORY: &str = "memory";
/// `narad_abi_version() -> i32`: returns [`crate::ABI_VERSION`].
pub const ABI_VERSION: &str = "narad_abi_version";
/// `narad_alloc(size: i32) -> i32`: 8-aligned buffer of `size` bytes, 0 when out of memory.
pub const ALLOC: &str = "narad_alloc";
/// `narad_dealloc(ptr: i32, size: i32)`: frees a buffer from `narad_alloc`.
pub const DEALLOC: &str = "narad_dealloc";
/// `narad_route(input_ptr: i32, input_len: i32, output_ptr: i32) -> i32`: routes one slab.
pub const ROUTE: &str = "narad_route";
/// `narad_last_error() -> i64`: `(ptr << 32) | len` of the last error message, 0 for none.
pub const LAST_ERROR: &str = "narad_last_error";

/// Every export a plugin must have, in the order the host checks them.
pub const REQUIRED_EXPORTS: [&str; 6] = [MEMORY, ABI_VERSION, ALLOC, DEALLOC, ROUTE, LAST_ERROR];

/// Module name of the only import a plugin may have.
pub const IMPORT_MODULE: &str = "narad";
/// `narad.log(level: i32, ptr: i32, len: i32)`: a rate-limited log line.
pub const IMPORT_LOG: &str = "log";
