//! Logging through the host's rate-limited `narad.log` import.

use narad_abi::{LAST_ERROR_MAX_BYTES, LogLevel};

/// Sends one line to the host log at `level`. Lines are cut at 4 KiB (on a character
/// boundary). The host rate-limits per instance and drops (and counts) the excess, so log
/// per slab, not per record. Natively, lines are kept for `testing::take_logs`.
pub fn log_line(level: LogLevel, line: &str) {
    let line = truncate(line, LAST_ERROR_MAX_BYTES);
    #[cfg(target_arch = "wasm32")]
    crate::sys::log(level.as_i32(), line);
    #[cfg(not(target_arch = "wasm32"))]
    crate::stub::log(level.as_i32(), line);
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Logs a formatted line: `log!(info, "routed {} records", n)`; the level is one of `error`,
/// `warn`, `info`, `debug`, or an expression of type [`LogLevel`].
#[macro_export]
macro_rules! log {
    (error, $($arg:tt)+) => { $crate::log!($crate::LogLevel::Error, $($arg)+) };
    (warn, $($arg:tt)+) => { $crate::log!($crate::LogLevel::Warn, $($arg)+) };
    (info, $($arg:tt)+) => { $crate::log!($crate::LogLevel::Info, $($arg)+) };
    (debug, $($arg:tt)+) => { $crate::log!($crate::LogLevel::Debug, $($arg)+) };
    ($level:expr, $($arg:tt)+) => {
        $crate::log_line($level, &$crate::__private::format!($($arg)+))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_never_splits_a_character() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn log_lines_reach_the_native_stub() {
        crate::stub::take_logs();
        crate::log!(info, "routed {} records", 3);
        crate::log!(LogLevel::Warn, "odd");
        let logs = crate::stub::take_logs();
        assert_eq!(
            logs,
            [
                (LogLevel::Info, "routed 3 records".into()),
                (LogLevel::Warn, "odd".into())
            ]
        );
    }
}
