//! Routing cost per record: the default chain in Wasm against the same three strategies
//! written natively in Rust, on slabs of 4,096 records with 16-byte keys (all keyed, and 10 %
//! keyless), in the same run; plus the parts of the Wasm path (encode with the host's key
//! hashes, copy in, call, copy out, bucketing) so the difference can be attributed, and the
//! guest alone with and without the fuel and epoch checks.
//!
//! Time is the benchmark thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID` on Linux), not wall
//! time: the bench machine is shared, and time spent descheduled is not routing cost. Criterion
//! reports CPU time per slab (`time:`) and, through `Throughput::Elements(4096)`, CPU time per
//! record (`thrpt:`, in ns/rec).
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use narad_abi::{Needs, RecordInput, RouteContext, SlabEncoder, UNDECIDED, partition_for_key};
use narad_runtime::{Chain, Instance, Plugin, Runtime, RuntimeConfig, bucket};

const SLAB_RECORDS: usize = 4096;
const KEY_BYTES: usize = 16;
const PARENT_PARTITIONS: u32 = 8;
const CHILD_PARTITIONS: u32 = 16;

struct Workload {
    name: &'static str,
    keys: Vec<Option<[u8; KEY_BYTES]>>,
}

impl Workload {
    /// `keyless_every`: every n-th record has no key (0 = all keyed).
    fn new(name: &'static str, keyless_every: usize) -> Self {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let keys = (0..SLAB_RECORDS)
            .map(|i| {
                if keyless_every != 0 && i % keyless_every == 0 {
                    return None;
                }
                let mut key = [0u8; KEY_BYTES];
                for chunk in key.chunks_mut(8) {
                    // xorshift64: deterministic, well-spread keys.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    chunk.copy_from_slice(&state.to_le_bytes());
                }
                Some(key)
            })
            .collect();
        Workload { name, keys }
    }

    fn records(&self) -> Vec<RecordInput<'_>> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, k)| RecordInput {
                parent_offset: 1_000_000 + i as u64,
                committed_at_ms: 1_700_000_000_000 + i as i64,
                key: k.as_ref().map(|k| k.as_slice()),
                headers: &[],
                value: b"",
            })
            .collect()
    }
}

fn context() -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition: 3,
        parent_partition_count: PARENT_PARTITIONS,
        child_topic: "analytics".into(),
        child_partition_count: CHILD_PARTITIONS,
        attempt: 0,
        config: Vec::new(),
    }
}

/// The default chain's three strategies, natively: key hash, keep the parent index when the
/// counts match, round-robin (per chain, continuing across slabs) otherwise.
struct NativeChain {
    next: u32,
}

impl NativeChain {
    fn route(&mut self, ctx: &RouteContext, records: &[RecordInput<'_>], out: &mut [u32]) {
        let n = ctx.child_partition_count;
        for (slot, r) in out.iter_mut().zip(records) {
            *slot = match r.key {
                Some(key) => partition_for_key(key, n).unwrap_or(UNDECIDED),
                None if ctx.parent_partition_count == n => ctx.parent_partition,
                None => {
                    let p = self.next % n;
                    self.next = self.next.wrapping_add(1);
                    p
                }
            };
        }
    }
}

fn default_chain(runtime: &Runtime) -> Chain {
    let plugins = [
        narad_builtin_plugins::KEY_HASH,
        narad_builtin_plugins::KEYLESS_INDEX,
        narad_builtin_plugins::ROUND_ROBIN,
    ]
    .iter()
    .map(|wasm| Plugin::load(runtime, wasm).unwrap())
    .collect::<Vec<_>>();
    Chain::new(plugins).unwrap()
}

fn bench_chains(c: &mut Criterion<ThreadCpuTime>) {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let ctx = context();
    let mut group = c.benchmark_group("route");
    group.throughput(Throughput::Elements(SLAB_RECORDS as u64));
    for workload in [
        Workload::new("all_keyed", 0),
        Workload::new("keyless_10pct", 10),
    ] {
        let records = workload.records();
        let mut chain = default_chain(&runtime);
        let mut native = NativeChain { next: 0 };
        // Both paths must agree before their speed means anything (round-robin aside, which
        // continues across slabs and so differs per call).
        let wasm_decisions = chain.route(&ctx, &records).unwrap();
        let mut native_decisions = vec![0u32; records.len()];
        native.route(&ctx, &records, &mut native_decisions);
        for (i, r) in records.iter().enumerate() {
            if r.key.is_some() {
                assert_eq!(wasm_decisions[i], native_decisions[i], "record {i}");
            }
        }
        let mut out = vec![0u32; records.len()];
        group.bench_function(BenchmarkId::new("wasm_default_chain", workload.name), |b| {
            b.iter(|| {
                chain
                    .route_into(black_box(&ctx), black_box(&records), &mut out)
                    .unwrap()
            })
        });
        group.bench_function(
            BenchmarkId::new("native_default_chain", workload.name),
            |b| b.iter(|| native.route(black_box(&ctx), black_box(&records), &mut out)),
        );
    }
    group.finish();
}

/// The parts of the Wasm path, on the all-keyed workload through `key-hash` alone.
fn bench_breakdown(c: &mut Criterion<ThreadCpuTime>) {
    let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
    let ctx = context();
    let workload = Workload::new("all_keyed", 0);
    let records = workload.records();
    let key_hash = Plugin::load(&runtime, narad_builtin_plugins::KEY_HASH).unwrap();
    // What the chain encodes for key-hash: its manifest asks for the key hashes alone, without
    // the record table.
    let key_hash_needs = key_hash.needs();
    assert_eq!(key_hash_needs, Needs::KEY_HASH_ONLY);
    let encoder = SlabEncoder::new(ctx.as_ref(), key_hash_needs).unwrap();
    let layout = encoder.layout(records.iter()).unwrap();
    let mut input = vec![0u8; layout.total_len()];
    encoder.write(&layout, records.iter(), &mut input).unwrap();
    let mut instance = Instance::new(key_hash);
    let mut out = vec![UNDECIDED; records.len()];
    instance.route(&input, &mut out).unwrap();
    let decisions = out.clone();

    let mut group = c.benchmark_group("breakdown");
    group.throughput(Throughput::Elements(SLAB_RECORDS as u64));
    // Encoding the input (in production this writes straight into guest memory), in the
    // layout key-hash asks for (the hash entries, the host's murmur2 of every key) and in the
    // two it was handed before: the hashes beside the record table (before the
    // `key_hash_only` need), and an ABI v1 keys-only input (table and key bytes, no hashes;
    // before the `key_hash` need).
    for (name, needs) in [
        ("encode_input", key_hash_needs),
        ("encode_input_hashes_and_table", Needs::KEY_HASH),
        ("encode_input_keys_no_hashes", Needs::KEYS),
    ] {
        let encoder = SlabEncoder::new(ctx.as_ref(), needs).unwrap();
        let mut buf = encoder.encode_to_vec(records.iter()).unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                let layout = encoder.layout(black_box(&records).iter()).unwrap();
                encoder.write(&layout, records.iter(), &mut buf).unwrap()
            })
        });
    }
    // murmur2 alone over the keys, natively: the part of `encode_input` that hashes.
    let mut hashes = vec![0u32; records.len()];
    group.bench_function("native_murmur2_only", |b| {
        b.iter(|| {
            for (slot, r) in hashes.iter_mut().zip(black_box(&records)) {
                *slot = narad_abi::murmur2(r.key.unwrap_or_default()) as u32;
            }
        })
    });
    // Its first pass alone: measuring the records.
    group.bench_function("encode_layout_pass", |b| {
        b.iter(|| encoder.layout(black_box(&records).iter()).unwrap())
    });
    // The memcpy of an encoded slab, which `Instance::route` adds over the production path.
    let mut guest_like = vec![0u8; input.len()];
    group.bench_function("copy_in_memcpy", |b| {
        b.iter(|| guest_like.copy_from_slice(black_box(&input)))
    });
    // One key-hash call: memcpy in, pre-fill, the guest's decode + hash, copy out.
    group.bench_function("key_hash_call", |b| {
        b.iter(|| instance.route(black_box(&input), &mut out).unwrap())
    });
    // The fixed cost of one call (host bookkeeping, wasmtime entry and exit, the guest's
    // header and context decoding), on a one-record slab. Its `thrpt` (the group's 4,096
    // elements) is that fixed cost's share of each record of a full slab.
    let one = &records[..1];
    let one_layout = encoder.layout(one.iter()).unwrap();
    let mut one_input = vec![0u8; one_layout.total_len()];
    encoder
        .write(&one_layout, one.iter(), &mut one_input)
        .unwrap();
    let mut one_out = [UNDECIDED];
    group.bench_function("key_hash_call_one_record", |b| {
        b.iter(|| instance.route(black_box(&one_input), &mut one_out).unwrap())
    });
    // The guest's work natively: murmur2 and modulo per key. The partition count is hidden
    // from the optimiser, as it is from the guest (which reads it from the context): a
    // constant 16 would turn the division into a mask.
    group.bench_function("native_hash", |b| {
        b.iter(|| {
            let partitions = black_box(CHILD_PARTITIONS);
            for (slot, r) in out.iter_mut().zip(black_box(&records)) {
                *slot =
                    partition_for_key(r.key.unwrap_or_default(), partitions).unwrap_or(UNDECIDED);
            }
        })
    });
    // Copying 4,096 little-endian u32 decisions out of guest memory.
    let out_bytes: Vec<u8> = decisions.iter().flat_map(|d| d.to_le_bytes()).collect();
    group.bench_function("copy_out", |b| {
        b.iter(|| {
            for (slot, bytes) in out.iter_mut().zip(black_box(&out_bytes).chunks_exact(4)) {
                *slot = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            }
        })
    });
    group.bench_function("bucketing", |b| {
        b.iter(|| bucket(black_box(&decisions), CHILD_PARTITIONS).unwrap())
    });
    group.finish();
}

/// The key-hash guest alone, called through a bare wasmtime instance with the slab already in
/// its memory: once with neither fuel nor epoch checks, once with both (as every production
/// call runs). The first against `breakdown/native_hash` is Cranelift's code against LLVM's;
/// the difference between the two is what the mandated limits cost per record.
fn bench_guest(c: &mut Criterion<ThreadCpuTime>) {
    let ctx = context();
    let workload = Workload::new("all_keyed", 0);
    let records = workload.records();
    // key-hash's input as the chain writes it (key hashes alone; its manifest's needs).
    let encoder = SlabEncoder::new(ctx.as_ref(), Needs::KEY_HASH_ONLY).unwrap();
    let input = encoder.encode_to_vec(records.iter()).unwrap();
    let mut native = vec![0u32; records.len()];
    NativeChain { next: 0 }.route(&ctx, &records, &mut native);

    let mut group = c.benchmark_group("guest");
    group.throughput(Throughput::Elements(SLAB_RECORDS as u64));
    for (name, metered) in [("key_hash_bare", false), ("key_hash_fuel_and_epoch", true)] {
        // The runtime's code-generation settings, without or with its metering.
        let mut config = wasmtime::Config::new();
        config
            .strategy(wasmtime::Strategy::Cranelift)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .cranelift_nan_canonicalization(true)
            .consume_fuel(metered)
            .epoch_interruption(metered);
        let engine = wasmtime::Engine::new(&config).unwrap();
        let module = wasmtime::Module::new(&engine, narad_builtin_plugins::KEY_HASH).unwrap();
        let mut linker = wasmtime::Linker::new(&engine);
        linker
            .func_wrap("narad", "log", |_: i32, _: i32, _: i32| {})
            .unwrap();
        let mut store = wasmtime::Store::new(&engine, ());
        if metered {
            store.set_fuel(1 << 62).unwrap();
            store.set_epoch_deadline(1 << 40);
        }
        let instance = linker.instantiate(&mut store, &module).unwrap();
        let memory = instance.get_memory(&mut store, "memory").unwrap();
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "narad_alloc")
            .unwrap();
        let route = instance
            .get_typed_func::<(i32, i32, i32), i32>(&mut store, "narad_route")
            .unwrap();
        let out_len = 4 * records.len();
        let input_at = alloc.call(&mut store, input.len() as i32).unwrap();
        let out_at = alloc.call(&mut store, out_len as i32).unwrap();
        memory.write(&mut store, input_at as usize, &input).unwrap();
        let args = (input_at, input.len() as i32, out_at);
        assert_eq!(route.call(&mut store, args).unwrap(), 0);
        let mut answers = vec![0u8; out_len];
        memory.read(&store, out_at as usize, &mut answers).unwrap();
        let answers: Vec<u32> = answers
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(
            answers, native,
            "{name}: the guest must route as the native code does"
        );
        group.bench_function(name, |b| {
            b.iter(|| route.call(&mut store, black_box(args)).unwrap())
        });
    }
    group.finish();
}

/// CPU time of the calling thread, in nanoseconds.
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    /// `CLOCK_THREAD_CPUTIME_ID` from `<time.h>` (Linux).
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (64-bit Linux layout) for the call's duration.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall time elsewhere (no portable per-thread CPU clock in std).
#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Criterion measurement: the benchmark thread's CPU time.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NanosFormatter
    }
}

/// Formats CPU nanoseconds per slab as µs, and throughput as ns per record.
struct NanosFormatter;

impl ValueFormatter for NanosFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e3);
        "µs cpu"
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        // This bench only declares element throughput (records per slab).
        let n = match throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => *n,
            _ => return "ns/iter",
        };
        values.iter_mut().for_each(|v| *v /= n as f64);
        "ns/rec"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench_chains, bench_breakdown, bench_guest
}
criterion_main!(benches);
