//! `narad.log(level, ptr, len)`: the only import a plugin may use, rate limited per instance.
//!
//! A token bucket per instance lets a burst through and then a steady rate; excess lines are
//! dropped and counted, so a chatty plugin cannot flood the daemon's logs or slow a slab.
//! Lines go out through `tracing` under the `narad_plugin` target with the plugin's name,
//! escaped and cut by [`crate::text::sanitize`]: a plugin cannot forge a daemon log line with a
//! `\n`, write a NUL or a terminal escape, or fill the log with one long line.

use std::time::Instant;

use wasmtime::{Caller, Extern, Linker};

use crate::instance::HostState;
use crate::text;

/// Longest log line read from the guest: 4 KiB; the rest is cut off. What is logged is then
/// escaped and cut to [`crate::text::MAX_PLUGIN_TEXT_BYTES`], with a marker counting the bytes
/// left out (those past this limit included).
pub const MAX_LOG_LINE_BYTES: usize = 4096;

/// The import module name.
pub(crate) const IMPORT_MODULE: &str = "narad";
/// The import field name.
pub(crate) const IMPORT_LOG: &str = "log";

/// A token bucket: `burst` tokens, refilled at `per_sec` tokens a second.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(per_sec: u32, burst: u32) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_sec: f64::from(per_sec),
            last: Instant::now(),
        }
    }

    /// Takes one token if there is one.
    pub(crate) fn try_take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Adds `narad.log` to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        IMPORT_MODULE,
        IMPORT_LOG,
        |mut caller: Caller<'_, HostState>, level: i32, ptr: i32, len: i32| {
            let logged = caller.data_mut().log_bucket.try_take();
            // An error line is read even when the rate limit drops it from the log: the call's
            // last one is reported with a trap (the SDK's panic message).
            if !logged && level != 0 {
                caller.data_mut().log_lines_dropped += 1;
                return;
            }
            let Some(line) = read_line(&mut caller, ptr, len) else {
                // A bad pointer is the guest's bug; the line is lost, not the slab.
                caller.data_mut().log_lines_dropped += 1;
                return;
            };
            if !logged {
                caller.data_mut().log_lines_dropped += 1;
                caller.data_mut().last_error_line = Some(line);
                return;
            }
            let plugin = caller.data().plugin_name.as_str();
            match level {
                0 => tracing::error!(target: "narad_plugin", plugin, "{line}"),
                1 => tracing::warn!(target: "narad_plugin", plugin, "{line}"),
                2 => tracing::info!(target: "narad_plugin", plugin, "{line}"),
                _ => tracing::debug!(target: "narad_plugin", plugin, "{line}"),
            }
            let state = caller.data_mut();
            state.log_lines_emitted += 1;
            if level == 0 {
                state.last_error_line = Some(line);
            }
        },
    )?;
    Ok(())
}

/// The guest's line at `ptr..ptr + len`, read up to [`MAX_LOG_LINE_BYTES`], escaped and cut;
/// `None` when the range is outside its memory.
fn read_line(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Option<String> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return None;
    };
    let data = memory.data(&*caller);
    let start = ptr as u32 as usize;
    let asked = len as u32 as usize;
    let len = asked.min(MAX_LOG_LINE_BYTES);
    let bytes = data.get(start..start.saturating_add(len))?;
    Some(text::sanitize_bytes(
        bytes,
        asked - len,
        text::MAX_PLUGIN_TEXT_BYTES,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lets_the_burst_through_then_refuses() {
        // A rate of zero never refills, so the outcome does not depend on timing.
        let mut bucket = TokenBucket::new(0, 3);
        assert!(bucket.try_take());
        assert!(bucket.try_take());
        assert!(bucket.try_take());
        assert!(!bucket.try_take());
    }
}
