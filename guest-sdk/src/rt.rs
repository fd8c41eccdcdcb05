//! Runtime glue behind the exports `#[router]` generates (re-exported as `__private`; not
//! part of the public API). The generated code is one-line calls into here, so all unsafe
//! pointer handling lives in this one reviewed file.

pub use alloc::format;
pub use narad_abi::Needs;

#[cfg(target_arch = "wasm32")]
pub use wasm::*;

#[cfg(target_arch = "wasm32")]
mod wasm {
    use alloc::alloc::{alloc, dealloc};
    use alloc::string::{String, ToString};
    use core::alloc::Layout;
    use core::cell::UnsafeCell;

    use narad_abi::status::ROUTE_OK;
    use narad_abi::{ABI_VERSION, ALLOC_ALIGN_BYTES, LAST_ERROR_MAX_BYTES, SlabView};

    use crate::plugin::Plugin;

    /// A value owned by the (single-threaded) plugin instance: its router state, its last
    /// error message.
    pub struct InstanceCell<T>(UnsafeCell<Option<T>>);

    // SAFETY: a wasm32 plugin instance is single-threaded (the SDK's allocator refuses the
    // `atomics` feature and the host creates no shared memory), and exports are not
    // re-entered: the only import, `narad.log`, never calls back into the guest.
    unsafe impl<T> Sync for InstanceCell<T> {}

    impl<T> InstanceCell<T> {
        /// An empty cell, filled on first use.
        pub const fn new() -> Self {
            Self(UnsafeCell::new(None))
        }

        /// Runs `f` on the value, created with `init` on first use.
        fn with<R>(&self, init: impl FnOnce() -> T, f: impl FnOnce(&mut T) -> R) -> R {
            // SAFETY: single-threaded and not re-entered (see `Sync`), so this is the only
            // reference to the cell's contents for the duration of `f`.
            let slot = unsafe { &mut *self.0.get() };
            f(slot.get_or_insert_with(init))
        }
    }

    impl<T> Default for InstanceCell<T> {
        fn default() -> Self {
            Self::new()
        }
    }

    static LAST_ERROR: InstanceCell<String> = InstanceCell::new();

    /// `narad_abi_version`.
    pub fn abi_version() -> i32 {
        ABI_VERSION as i32
    }

    fn layout(size: i32) -> Option<Layout> {
        let size = usize::try_from(size).ok()?.max(1);
        Layout::from_size_align(size, ALLOC_ALIGN_BYTES).ok()
    }

    /// `narad_alloc`: an 8-aligned buffer of `size` bytes, 0 when it cannot.
    pub fn export_alloc(size: i32) -> i32 {
        match layout(size) {
            // SAFETY: the layout has a non-zero size.
            Some(l) => unsafe { alloc(l) as i32 },
            None => 0,
        }
    }

    /// `narad_dealloc`.
    ///
    /// # Safety
    /// `ptr` must come from `narad_alloc(size)` and not be freed twice (the host's promise).
    pub unsafe fn export_dealloc(ptr: i32, size: i32) {
        if ptr == 0 {
            return;
        }
        if let Some(l) = layout(size) {
            // SAFETY: the caller's promise, with the same layout `export_alloc` used.
            unsafe { dealloc(ptr as usize as *mut u8, l) }
        }
    }

    /// `narad_last_error`: `(ptr << 32) | len` of the last error message, 0 for none.
    pub fn last_error() -> i64 {
        LAST_ERROR.with(String::new, |m| {
            if m.is_empty() {
                0
            } else {
                ((m.as_ptr() as usize as i64) << 32) | m.len() as i64
            }
        })
    }

    fn set_last_error(message: &str) {
        let message = crate::log::truncate(message, LAST_ERROR_MAX_BYTES);
        LAST_ERROR.with(String::new, |m| {
            m.clear();
            m.push_str(message);
        });
    }

    fn bad_input(message: &str) -> i32 {
        set_last_error(message);
        narad_abi::status::ROUTE_ERR_BAD_INPUT
    }

    /// `narad_route`: checks the pointers the host passed against linear memory, then routes.
    ///
    /// # Safety
    /// The host must not touch guest memory during the call (true of a synchronous call).
    pub unsafe fn route<S: Default>(
        plugin: &'static Plugin<S>,
        state: &'static InstanceCell<S>,
        input_ptr: i32,
        input_len: i32,
        output_ptr: i32,
    ) -> i32 {
        LAST_ERROR.with(String::new, String::clear);
        let memory = crate::sys::memory_bytes() as u64;
        let (ip, il, op) = (
            input_ptr as u32 as u64,
            input_len as u32 as u64,
            output_ptr as u32 as u64,
        );
        if ip == 0 || input_len < 0 || ip + il > memory {
            return bad_input("input buffer lies outside linear memory");
        }
        // SAFETY: the range is inside linear memory (checked above), non-null, and the host
        // does not write it during the call.
        let input = unsafe { core::slice::from_raw_parts(ip as usize as *const u8, il as usize) };
        let slab = match SlabView::parse(input) {
            Ok(s) => s,
            Err(e) => return bad_input(&e.to_string()),
        };
        let n = slab.len() as u64;
        let out_end = op + 4 * n;
        if n > 0 && (op == 0 || op % 4 != 0 || out_end > memory || (op < ip + il && ip < out_end)) {
            return bad_input("output slots are misaligned, outside memory or overlap the input");
        }
        let out: &mut [u32] = if n == 0 {
            &mut []
        } else {
            // SAFETY: in memory, 4-aligned, non-null and disjoint from `input` (checked above);
            // any bit pattern is a valid u32.
            unsafe { core::slice::from_raw_parts_mut(op as usize as *mut u32, n as usize) }
        };
        let result = state.with(S::default, |s| plugin.route_slab(s, &slab, out));
        match result {
            Ok(()) => ROUTE_OK,
            Err(e) => {
                set_last_error(&e.to_string());
                e.status().code()
            }
        }
    }

    #[cfg(feature = "panic-handler")]
    #[panic_handler]
    fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
        use core::fmt::Write;
        let mut line = FixedLine::<512>::new();
        let _ = write!(line, "plugin panicked: {info}");
        crate::sys::log(narad_abi::LogLevel::Error.as_i32(), line.as_str());
        core::arch::wasm32::unreachable()
    }

    /// A formatting buffer on the stack (a panic may come from a failed allocation).
    #[cfg(feature = "panic-handler")]
    struct FixedLine<const N: usize> {
        buf: [u8; N],
        len: usize,
    }

    #[cfg(feature = "panic-handler")]
    impl<const N: usize> FixedLine<N> {
        fn new() -> Self {
            Self {
                buf: [0; N],
                len: 0,
            }
        }

        fn as_str(&self) -> &str {
            // Only whole `&str`s (cut on a char boundary) are copied in.
            core::str::from_utf8(&self.buf[..self.len]).unwrap_or("plugin panicked")
        }
    }

    #[cfg(feature = "panic-handler")]
    impl<const N: usize> core::fmt::Write for FixedLine<N> {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            let s = crate::log::truncate(s, N - self.len);
            self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
            self.len += s.len();
            Ok(())
        }
    }
}
