//! The SDK's generated exports, run in a real Wasm engine at the raw ABI level (no host
//! runtime): the pointer checks of `narad_route`, the error-message protocol, the allocator,
//! and per-instance state. Inputs are written with the host-side `SlabEncoder`.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use narad_abi::status::{ROUTE_ERR_BAD_CONFIG, ROUTE_ERR_BAD_INPUT, ROUTE_OK};
use narad_abi::{
    Needs, RecordInput, RouteContext, SlabEncoder, UNDECIDED, partition_for_key, symbols,
};
use wasmtime::{Caller, Engine, Instance, Linker, Memory, Module, Store, TypedFunc};

/// One guest instance with its exports.
struct Guest {
    store: Store<Vec<(i32, String)>>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    dealloc: TypedFunc<(i32, i32), ()>,
    route: TypedFunc<(i32, i32, i32), i32>,
    last_error: TypedFunc<(), i64>,
    version: TypedFunc<(), i32>,
}

impl Guest {
    fn new(engine: &Engine, wasm: &[u8]) -> Self {
        let module = Module::new(engine, wasm).unwrap();
        let mut linker = Linker::new(engine);
        linker
            .func_wrap(
                symbols::IMPORT_MODULE,
                symbols::IMPORT_LOG,
                |mut caller: Caller<'_, Vec<(i32, String)>>, level: i32, ptr: i32, len: i32| {
                    let memory = caller.get_export("memory").unwrap().into_memory().unwrap();
                    let bytes = memory.data(&caller)[ptr as usize..][..len as usize].to_vec();
                    caller
                        .data_mut()
                        .push((level, String::from_utf8(bytes).unwrap()));
                },
            )
            .unwrap();
        let mut store = Store::new(engine, Vec::new());
        let instance: Instance = linker.instantiate(&mut store, &module).unwrap();
        let memory = instance.get_memory(&mut store, symbols::MEMORY).unwrap();
        Self {
            alloc: instance.get_typed_func(&mut store, symbols::ALLOC).unwrap(),
            dealloc: instance
                .get_typed_func(&mut store, symbols::DEALLOC)
                .unwrap(),
            route: instance.get_typed_func(&mut store, symbols::ROUTE).unwrap(),
            last_error: instance
                .get_typed_func(&mut store, symbols::LAST_ERROR)
                .unwrap(),
            version: instance
                .get_typed_func(&mut store, symbols::ABI_VERSION)
                .unwrap(),
            memory,
            store,
        }
    }

    fn alloc(&mut self, size: i32) -> i32 {
        self.alloc.call(&mut self.store, size).unwrap()
    }

    /// Writes `input` and `n` UNDECIDED slots into one guest buffer (as the host does) and
    /// routes; returns the code and the slots.
    fn route(&mut self, input: &[u8], n: usize) -> (i32, Vec<u32>) {
        let aligned = input.len().next_multiple_of(8);
        let size = (aligned + 4 * n) as i32;
        let ptr = self.alloc(size);
        assert!(ptr > 0 && ptr % 8 == 0);
        let out = ptr as usize + aligned;
        let data = self.memory.data_mut(&mut self.store);
        data[ptr as usize..][..input.len()].copy_from_slice(input);
        data[out..][..4 * n].fill(0xFF);
        let rc = self
            .route
            .call(&mut self.store, (ptr, input.len() as i32, out as i32))
            .unwrap();
        let slots = self.memory.data(&self.store)[out..][..4 * n]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        self.dealloc.call(&mut self.store, (ptr, size)).unwrap();
        (rc, slots)
    }

    fn last_error(&mut self) -> Option<String> {
        let packed = self.last_error.call(&mut self.store, ()).unwrap();
        if packed == 0 {
            return None;
        }
        let (ptr, len) = ((packed >> 32) as u32 as usize, packed as u32 as usize);
        Some(String::from_utf8(self.memory.data(&self.store)[ptr..][..len].to_vec()).unwrap())
    }
}

fn context(children: u32, config: &str) -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition: 1,
        parent_partition_count: 3,
        child_topic: "copy".into(),
        child_partition_count: children,
        attempt: 0,
        config: config.as_bytes().to_vec(),
    }
}

fn keyed_slab(ctx: &RouteContext, keys: &[Option<&[u8]>], needs: Needs) -> Vec<u8> {
    let records: Vec<RecordInput> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| RecordInput {
            parent_offset: i as u64,
            key: *k,
            ..RecordInput::default()
        })
        .collect();
    SlabEncoder::new(ctx.as_ref(), needs)
        .unwrap()
        .encode_to_vec(&records)
        .unwrap()
}

#[test]
fn key_hash_in_wasm_matches_the_native_partitioner() {
    let engine = Engine::default();
    let mut guest = Guest::new(&engine, narad_builtin_plugins::KEY_HASH);
    assert_eq!(guest.version.call(&mut guest.store, ()).unwrap(), 1);
    let keys: Vec<Vec<u8>> = (0..200u32)
        .map(|i| format!("key-{i}").into_bytes())
        .collect();
    let mut views: Vec<Option<&[u8]>> = keys.iter().map(|k| Some(k.as_slice())).collect();
    views[7] = None;
    views[9] = Some(b"");
    // With the host's hashes alone (what its manifest asks for), with them beside the record
    // table, and from an ABI v1 keys-only buffer (it then hashes in Wasm): the same answers,
    // Kafka's.
    for needs in [Needs::KEY_HASH_ONLY, Needs::KEY_HASH, Needs::KEYS] {
        for children in [1, 13, 16, 1 << 31] {
            let ctx = context(children, "");
            let (rc, out) = guest.route(&keyed_slab(&ctx, &views, needs), views.len());
            assert_eq!(rc, ROUTE_OK);
            assert_eq!(guest.last_error(), None);
            for (k, p) in views.iter().zip(&out) {
                let want = k.map_or(UNDECIDED, |k| partition_for_key(k, children).unwrap());
                assert_eq!(*p, want, "{needs:?}, {children} partitions");
            }
        }
    }
}

#[test]
fn an_empty_slab_routes_without_touching_output() {
    let engine = Engine::default();
    let mut guest = Guest::new(&engine, narad_builtin_plugins::ROUND_ROBIN);
    let (rc, out) = guest.route(&keyed_slab(&context(4, ""), &[], Needs::KEYS), 0);
    assert_eq!(rc, ROUTE_OK);
    assert!(out.is_empty());
}

#[test]
fn bad_pointers_and_bad_bytes_are_bad_input_with_a_message() {
    let engine = Engine::default();
    let mut guest = Guest::new(&engine, narad_builtin_plugins::KEY_HASH);
    let input = keyed_slab(&context(4, ""), &[Some(b"k"), Some(b"j")], Needs::KEYS);
    let memory_len = guest.memory.data_size(&guest.store) as i32;
    let ptr = guest.alloc(input.len() as i32 + 16);
    guest.memory.data_mut(&mut guest.store)[ptr as usize..][..input.len()].copy_from_slice(&input);
    let len = input.len() as i32;
    let out = ptr + ((len + 7) & !7);
    let cases = [
        (memory_len - 8, len, out), // input runs past memory
        (0, len, out),              // null input
        (ptr, len, out + 2),        // misaligned output
        (ptr, len, ptr + 8),        // output overlaps input
        (ptr, len, memory_len - 4), // output runs past memory
        (ptr, 16, out),             // input shorter than its header
    ];
    for (ip, il, op) in cases {
        let rc = guest.route.call(&mut guest.store, (ip, il, op)).unwrap();
        assert_eq!(rc, ROUTE_ERR_BAD_INPUT, "({ip}, {il}, {op})");
        assert!(guest.last_error().is_some_and(|m| !m.is_empty()));
    }
    // A good call afterwards succeeds and clears the message.
    let rc = guest.route.call(&mut guest.store, (ptr, len, out)).unwrap();
    assert_eq!(rc, ROUTE_OK);
    assert_eq!(guest.last_error(), None);
}

#[test]
fn a_bad_config_returns_bad_config_and_says_why() {
    let engine = Engine::default();
    let mut guest = Guest::new(&engine, narad_builtin_plugins::HEADER_ROUTE);
    let ctx = context(2, "header = region\nus = 5\n");
    let (rc, out) = guest.route(&keyed_slab(&ctx, &[Some(b"k")], Needs::HEADERS), 1);
    assert_eq!(rc, ROUTE_ERR_BAD_CONFIG);
    assert_eq!(out, [UNDECIDED]);
    let message = guest.last_error().unwrap();
    assert!(message.contains("partition 5"), "{message}");
}

#[test]
fn round_robin_state_lives_in_the_instance() {
    let engine = Engine::default();
    let mut a = Guest::new(&engine, narad_builtin_plugins::ROUND_ROBIN);
    let mut b = Guest::new(&engine, narad_builtin_plugins::ROUND_ROBIN);
    let input = keyed_slab(&context(3, ""), &[None, None], Needs::KEYS);
    assert_eq!(a.route(&input, 2).1, [0, 1]);
    assert_eq!(a.route(&input, 2).1, [2, 0]);
    assert_eq!(b.route(&input, 2).1, [0, 1]);
}

#[test]
fn the_allocator_honours_the_abi_and_reuses_freed_buffers() {
    let engine = Engine::default();
    let mut guest = Guest::new(&engine, narad_builtin_plugins::KEY_HASH);
    let zero = guest.alloc(0);
    assert!(zero > 0 && zero % 8 == 0, "alloc(0) = {zero}");
    assert_eq!(guest.alloc(-1), 0);
    for size in [1, 7, 100, 4096, 70_000] {
        let p = guest.alloc(size);
        assert!(p > 0 && p % 8 == 0, "alloc({size}) = {p}");
    }
    // Route many slabs, each through a fresh buffer: memory stops growing.
    let keys: Vec<Vec<u8>> = (0..1000u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let views: Vec<Option<&[u8]>> = keys.iter().map(|k| Some(k.as_slice())).collect();
    let input = keyed_slab(&context(8, ""), &views, Needs::KEYS);
    guest.route(&input, views.len());
    let pages = guest.memory.size(&guest.store);
    for _ in 0..200 {
        assert_eq!(guest.route(&input, views.len()).0, ROUTE_OK);
    }
    assert_eq!(guest.memory.size(&guest.store), pages);
}
