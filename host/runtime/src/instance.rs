//! One live instance of a plugin: its store, exports and reusable slab buffer.
//!
//! An [`Instance`] owns a wasmtime `Store` holding the limiter and the log bucket. Each call
//! gets a fresh fuel budget ([`crate::limits::FuelBudget`]) and epoch deadline. The host keeps
//! one guest buffer per instance (from `narad_alloc`) and reuses it across slabs, growing it
//! with `narad_dealloc` + `narad_alloc` only when a slab needs more.
//!
//! Any failure discards the store: the next call instantiates the plugin afresh, so a trap
//! cannot leave half-updated guest state behind (a round-robin counter resets, which is what
//! a retry wants: keyless records are placed afresh).
//!
//! `Instance` is `Send`: the daemon moves it to a blocking pool to run it off the I/O threads.

use wasmtime::{Memory, Store, Trap, TypedFunc};

use narad_abi::status::{ROUTE_ERR_BAD_CONFIG, ROUTE_ERR_BAD_INPUT, ROUTE_ERR_PLUGIN, ROUTE_OK};
use narad_abi::{LAST_ERROR_MAX_BYTES, UNDECIDED, symbols};

use crate::error::{ErrorCode, Failure, Violation};
use crate::hostlog::TokenBucket;
use crate::limits::{LimitExceeded, StoreLimiter};
use crate::plugin::Plugin;
use crate::text;

/// Smallest slab buffer allocated in a guest: 64 KiB (one Wasm page), so small slabs never
/// reallocate.
const MIN_BUFFER_BYTES: u32 = 64 * 1024;

/// The data of each plugin store.
#[derive(Debug)]
pub(crate) struct HostState {
    pub(crate) limiter: StoreLimiter,
    pub(crate) log_bucket: TokenBucket,
    pub(crate) log_lines_emitted: u64,
    pub(crate) log_lines_dropped: u64,
    pub(crate) plugin_name: String,
    /// The call deadline, for reporting a deadline overrun.
    pub(crate) deadline_ms: u64,
    /// The last error-level `narad.log` line of the current call (escaped and cut), kept even
    /// when the rate limit dropped it from the log: a trap is reported with it, since the SDK's
    /// panic handler logs the panic message just before it traps.
    pub(crate) last_error_line: Option<String>,
}

/// Counters of one instance, kept across rebuilds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceCounters {
    /// Times the plugin was instantiated (1 + rebuilds after failures).
    pub instantiations: u64,
    /// `narad.log` lines emitted.
    pub log_lines_emitted: u64,
    /// `narad.log` lines dropped by the rate limit (or with a bad pointer).
    pub log_lines_dropped: u64,
    /// Fuel spent by successful `narad_route` calls (deterministic: a function of the slabs).
    pub fuel_consumed: u64,
    /// The successful call that came closest to its fuel budget, as (fuel spent, budget):
    /// how much headroom the plugin has. `(0, 0)` before the first successful call.
    pub peak_fuel_use: (u64, u64),
}

/// A live instance and its exports.
struct Live {
    store: Store<HostState>,
    memory: Memory,
    abi_version: TypedFunc<(), i32>,
    alloc: TypedFunc<i32, i32>,
    dealloc: TypedFunc<(i32, i32), ()>,
    route: TypedFunc<(i32, i32, i32), i32>,
    last_error: TypedFunc<(), i64>,
    /// Fuel of the `narad_last_error` fetch.
    check_fuel: u64,
    /// The reusable slab buffer: (pointer, capacity in bytes).
    buffer: Option<(u32, u32)>,
}

/// One instance of a plugin, rebuilt after any failure.
pub struct Instance {
    plugin: Plugin,
    live: Option<Live>,
    counters: InstanceCounters,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("plugin", &self.plugin.name())
            .field("live", &self.live.is_some())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Instance {
    /// An instance of `plugin`; it is instantiated lazily, on the first call.
    pub fn new(plugin: Plugin) -> Self {
        Instance {
            plugin,
            live: None,
            counters: InstanceCounters::default(),
        }
    }

    /// The plugin this is an instance of.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Counters kept across rebuilds.
    pub fn counters(&self) -> InstanceCounters {
        let mut counters = self.counters;
        if let Some(live) = &self.live {
            counters.log_lines_emitted += live.store.data().log_lines_emitted;
            counters.log_lines_dropped += live.store.data().log_lines_dropped;
        }
        counters
    }

    /// Whether a live store exists (false before the first call and after a failure).
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// Calls `narad_abi_version()` (deploy-time check).
    pub(crate) fn abi_version(&mut self) -> Result<i32, Failure> {
        let fuel = self.check_fuel();
        let result = self.with_live(fuel, |live| {
            live.abi_version
                .call(&mut live.store, ())
                .map_err(|e| classify(&e, fuel, live))
        });
        self.discard_on_err(result)
    }

    /// Routes one slab of `records` records whose encoded input is `input_len` bytes:
    /// `fill` writes the input straight into guest memory (one copy), the host pre-fills
    /// `out` (which must hold `records` slots) with [`UNDECIDED`] in guest memory, calls
    /// `narad_route` and copies the decisions back into `out`.
    pub fn route_with(
        &mut self,
        records: usize,
        input_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), Failure>,
        out: &mut [u32],
    ) -> Result<(), Failure> {
        if out.len() != records {
            return Err(host_error("output slots do not match the record count"));
        }
        let budget = self
            .plugin
            .runtime()
            .limits()
            .fuel
            .for_slab(records, input_len);
        let result = self.with_live(budget, |live| {
            route_live(live, budget, input_len, fill, out)?;
            Ok(budget.saturating_sub(live.store.get_fuel().unwrap_or(budget)))
        });
        let spent = self.discard_on_err(result)?;
        self.counters.fuel_consumed += spent;
        let (peak_spent, peak_budget) = self.counters.peak_fuel_use;
        // spent/budget > peak_spent/peak_budget, without division (budgets are never zero).
        if peak_budget == 0
            || u128::from(spent) * u128::from(peak_budget)
                > u128::from(peak_spent) * u128::from(budget)
        {
            self.counters.peak_fuel_use = (spent, budget);
        }
        Ok(())
    }

    /// Routes one slab whose encoded input is `input` (see [`Instance::route_with`]).
    pub fn route(&mut self, input: &[u8], out: &mut [u32]) -> Result<(), Failure> {
        let records = out.len();
        self.route_with(
            records,
            input.len(),
            |dst| {
                dst.copy_from_slice(input);
                Ok(())
            },
            out,
        )
    }

    /// Fuel of the deploy checks, instantiation and the error-message fetch.
    fn check_fuel(&self) -> u64 {
        self.plugin.runtime().limits().fuel.base
    }

    fn discard_on_err<T>(&mut self, result: Result<T, Failure>) -> Result<T, Failure> {
        if result.is_err() {
            self.discard();
        }
        result
    }

    /// Drops the live store (if any): the next call instantiates the plugin afresh. The chain
    /// calls it when it blames this plugin for an answer it refused (out of range, undecided).
    pub fn reset(&mut self) {
        self.discard();
    }

    fn discard(&mut self) {
        if let Some(live) = self.live.take() {
            self.counters.log_lines_emitted += live.store.data().log_lines_emitted;
            self.counters.log_lines_dropped += live.store.data().log_lines_dropped;
        }
    }

    /// Runs `f` on the live instance (instantiating it if needed) with `fuel` and the
    /// deadline armed.
    fn with_live<T>(
        &mut self,
        fuel: u64,
        f: impl FnOnce(&mut Live) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let live = match self.live.take() {
            Some(live) => live,
            None => {
                let live = self.instantiate()?;
                self.counters.instantiations += 1;
                live
            }
        };
        let live = self.live.insert(live);
        arm(
            &mut live.store,
            fuel,
            self.plugin.runtime().inner.deadline_ticks,
        )?;
        f(live)
    }

    fn instantiate(&self) -> Result<Live, Failure> {
        let runtime = &self.plugin.runtime().inner;
        let limits = &runtime.limits;
        let mut store = Store::new(
            &runtime.engine,
            HostState {
                limiter: StoreLimiter::new(limits),
                log_bucket: TokenBucket::new(limits.log_lines_per_sec, limits.log_burst_lines),
                log_lines_emitted: 0,
                log_lines_dropped: 0,
                plugin_name: self.plugin.name().to_owned(),
                deadline_ms: u64::try_from(limits.deadline.as_millis()).unwrap_or(u64::MAX),
                last_error_line: None,
            },
        );
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        let fuel = limits.fuel.base;
        arm(&mut store, fuel, runtime.deadline_ticks)?;
        let instance = self
            .plugin
            .instance_pre()
            .instantiate(&mut store)
            .map_err(|e| classify_store(&e, fuel, &store))?;
        let memory = instance
            .get_memory(&mut store, symbols::MEMORY)
            .ok_or_else(|| host_error("memory export vanished"))?;
        let typed = |store: &mut Store<HostState>, name| {
            instance
                .get_func(&mut *store, name)
                .ok_or_else(|| host_error(&format!("export {name} vanished")))
        };
        let abi_version = typed(&mut store, symbols::ABI_VERSION)?
            .typed(&store)
            .map_err(|e| host_error(&format!("{e:#}")))?;
        let alloc = typed(&mut store, symbols::ALLOC)?
            .typed(&store)
            .map_err(|e| host_error(&format!("{e:#}")))?;
        let dealloc = typed(&mut store, symbols::DEALLOC)?
            .typed(&store)
            .map_err(|e| host_error(&format!("{e:#}")))?;
        let route = typed(&mut store, symbols::ROUTE)?
            .typed(&store)
            .map_err(|e| host_error(&format!("{e:#}")))?;
        let last_error = typed(&mut store, symbols::LAST_ERROR)?
            .typed(&store)
            .map_err(|e| host_error(&format!("{e:#}")))?;
        Ok(Live {
            store,
            memory,
            abi_version,
            alloc,
            dealloc,
            route,
            last_error,
            check_fuel: fuel,
            buffer: None,
        })
    }
}

/// Sets the fuel budget and the epoch deadline of the next guest call.
fn arm(store: &mut Store<HostState>, fuel: u64, deadline_ticks: u64) -> Result<(), Failure> {
    store
        .set_fuel(fuel)
        .map_err(|e| host_error(&format!("{e:#}")))?;
    store.set_epoch_deadline(deadline_ticks);
    store.data_mut().last_error_line = None;
    Ok(())
}

fn route_live(
    live: &mut Live,
    budget: u64,
    input_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), Failure>,
    out: &mut [u32],
) -> Result<(), Failure> {
    let records = out.len();
    let input_len_u32 = u32::try_from(input_len).map_err(|_| host_error("input over 4 GiB"))?;
    let aligned_input = input_len_u32
        .checked_next_multiple_of(8)
        .ok_or_else(|| host_error("input over 4 GiB"))?;
    let output_len = u32::try_from(records)
        .ok()
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| host_error("too many records"))?;
    let needed = aligned_input
        .checked_add(output_len)
        .ok_or_else(|| host_error("slab over 4 GiB"))?;
    let ptr = ensure_buffer(live, budget, needed)?;
    let out_ptr = ptr + aligned_input;
    let input_range = ptr as usize..(ptr + input_len_u32) as usize;
    let output_range = out_ptr as usize..(out_ptr + output_len) as usize;
    {
        // In bounds: `ensure_buffer` checked the buffer against the memory size, and linear
        // memory never shrinks.
        let data = live.memory.data_mut(&mut live.store);
        fill(
            data.get_mut(input_range)
                .ok_or_else(|| host_error("slab buffer outside guest memory"))?,
        )?;
        data.get_mut(output_range.clone())
            .ok_or_else(|| host_error("slab buffer outside guest memory"))?
            .fill(0xFF);
    }
    let rc = live
        .route
        .call(
            &mut live.store,
            (ptr as i32, input_len_u32 as i32, out_ptr as i32),
        )
        .map_err(|e| classify(&e, budget, live))?;
    match rc {
        ROUTE_OK => {
            let slots = live
                .memory
                .data(&live.store)
                .get(output_range)
                .ok_or_else(|| host_error("slab buffer outside guest memory"))?;
            for (slot, bytes) in out.iter_mut().zip(slots.chunks_exact(4)) {
                *slot = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
            Ok(())
        }
        ROUTE_ERR_PLUGIN | ROUTE_ERR_BAD_INPUT | ROUTE_ERR_BAD_CONFIG => {
            let code = match rc {
                ROUTE_ERR_PLUGIN => ErrorCode::Plugin,
                ROUTE_ERR_BAD_INPUT => ErrorCode::BadInput,
                _ => ErrorCode::BadConfig,
            };
            Err(Failure::ErrorReturn {
                code,
                message: last_error_message(live),
            })
        }
        other => Err(Failure::Protocol(Violation::ReturnCode(other))),
    }
}

/// Returns a guest buffer of at least `needed` bytes, reusing the instance's buffer when it is
/// big enough.
fn ensure_buffer(live: &mut Live, budget: u64, needed: u32) -> Result<u32, Failure> {
    if let Some((ptr, cap)) = live.buffer
        && cap >= needed
    {
        return Ok(ptr);
    }
    if let Some((ptr, cap)) = live.buffer.take() {
        live.dealloc
            .call(&mut live.store, (ptr as i32, cap as i32))
            .map_err(|e| classify(&e, budget, live))?;
    }
    let size = needed
        .checked_next_power_of_two()
        .unwrap_or(needed)
        .max(MIN_BUFFER_BYTES);
    let ptr = live
        .alloc
        .call(&mut live.store, size as i32)
        .map_err(|e| classify(&e, budget, live))? as u32;
    if ptr == 0 {
        return Err(Failure::Protocol(Violation::AllocFailed { size }));
    }
    let memory_len = live.memory.data_size(&live.store) as u64;
    if !ptr.is_multiple_of(8) || u64::from(ptr) + u64::from(size) > memory_len {
        return Err(Failure::Protocol(Violation::BadAllocation { ptr, size }));
    }
    live.buffer = Some((ptr, size));
    Ok(ptr)
}

/// The guest's `narad_last_error` message, if it gives a readable one.
fn last_error_message(live: &mut Live) -> Option<String> {
    // The route call may have spent its fuel; the message fetch gets its own small budget.
    live.store.set_fuel(live.check_fuel).ok()?;
    let packed = live.last_error.call(&mut live.store, ()).ok()?;
    if packed == 0 {
        return None;
    }
    let ptr = (packed as u64 >> 32) as usize;
    let asked = (packed as u64 & 0xFFFF_FFFF) as usize;
    let len = asked.min(LAST_ERROR_MAX_BYTES);
    let data = live.memory.data(&live.store);
    let bytes = data.get(ptr..ptr.checked_add(len)?)?;
    // Guest bytes end up in log lines and the children listing: escaped and cut here, once.
    Some(text::sanitize_bytes(
        bytes,
        asked - len,
        text::MAX_PLUGIN_TEXT_BYTES,
    ))
}

fn classify(error: &wasmtime::Error, budget: u64, live: &Live) -> Failure {
    classify_store(error, budget, &live.store)
}

/// Turns a wasmtime error from a guest call into a [`Failure`].
fn classify_store(error: &wasmtime::Error, budget: u64, store: &Store<HostState>) -> Failure {
    if let Some(limit) = error.downcast_ref::<LimitExceeded>() {
        if limit.what == "memory" {
            return Failure::MemoryLimit {
                limit_bytes: limit.limit,
            };
        }
        return trapped(error, Some("TableLimit".to_owned()), store);
    }
    if let Some(trap) = error.downcast_ref::<Trap>() {
        match trap {
            Trap::OutOfFuel => return Failure::FuelExhausted { budget },
            Trap::Interrupt => {
                return Failure::Deadline {
                    deadline_ms: store.data().deadline_ms,
                };
            }
            other => return trapped(error, Some(format!("{other:?}")), store),
        }
    }
    trapped(error, None, store)
}

/// A trap as operators read it: its cause in one line and the guest's last error line (an SDK
/// plugin's panic message). The Wasm backtrace names only the guest's functions, usually by
/// number, and spans many lines: it goes to the debug log, not into the failure.
fn trapped(error: &wasmtime::Error, code: Option<String>, store: &Store<HostState>) -> Failure {
    let state = store.data();
    tracing::debug!(
        target: "narad_plugin",
        plugin = state.plugin_name.as_str(),
        backtrace = %text::sanitize(&format!("{error:#}"), text::MAX_PLUGIN_TEXT_BYTES),
        "routing plugin trapped"
    );
    Failure::Trap {
        code,
        message: text::sanitize(&trap_cause(error), text::MAX_PLUGIN_TEXT_BYTES),
        guest_said: state.last_error_line.clone(),
    }
}

/// The root cause of a trap without wasmtime's `wasm trap: ` prefix (the failure already says
/// it trapped).
fn trap_cause(error: &wasmtime::Error) -> String {
    let cause = error.root_cause().to_string();
    match cause.strip_prefix("wasm trap: ") {
        Some(rest) => rest.to_owned(),
        None => cause,
    }
}

fn host_error(message: &str) -> Failure {
    Failure::Host {
        message: message.to_owned(),
    }
}

const _: () = {
    // The decision slots are pre-filled with 0xFF bytes, which is UNDECIDED in every slot.
    assert!(UNDECIDED == u32::MAX);
};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn instance_can_move_to_a_blocking_pool() {
        assert_send::<Instance>();
    }
}
