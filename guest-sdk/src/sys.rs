//! The only `extern` block of the SDK: the host imports of ABI v1 (wasm32 only; native
//! builds use [`crate::stub`] instead).

#[link(wasm_import_module = "narad")]
unsafe extern "C" {
    /// `narad.log(level, ptr, len)`: one UTF-8 log line, rate-limited by the host.
    #[link_name = "log"]
    fn narad_log(level: i32, ptr: i32, len: i32);
}

/// Sends one log line to the host.
pub(crate) fn log(level: i32, line: &str) {
    // SAFETY: `line` is a live UTF-8 slice of this module's memory for the whole call; the
    // host only reads `len` bytes at `ptr` and calls nothing back.
    unsafe { narad_log(level, line.as_ptr() as i32, line.len() as i32) }
}

/// Bytes of linear memory 0.
pub(crate) fn memory_bytes() -> usize {
    core::arch::wasm32::memory_size(0) * crate::heap::PAGE_BYTES
}
