//! Native stand-in for the `sys` module (the host's imports, on Wasm), so plugins and their
//! tests build and run with plain `cargo test`: log lines are kept per thread for [`crate::testing::take_logs`].

extern crate std;

use std::cell::RefCell;
use std::string::String;
use std::vec::Vec;

use narad_abi::LogLevel;

std::thread_local! {
    static LOGS: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
}

/// Keeps one log line for the current thread's test.
pub(crate) fn log(level: i32, line: &str) {
    let level = LogLevel::from_i32(level).unwrap_or(LogLevel::Error);
    LOGS.with(|l| l.borrow_mut().push((level, line.into())));
}

/// Takes the lines logged on this thread so far.
pub(crate) fn take_logs() -> Vec<(LogLevel, String)> {
    LOGS.with(|l| core::mem::take(&mut *l.borrow_mut()))
}
