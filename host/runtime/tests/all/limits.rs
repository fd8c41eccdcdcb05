//! Compile bombs: modules over the module limits are refused before anything is compiled,
//! with a typed error naming the limit; loads of one module share one compile.
//!
//! The hostile modules are written in the binary format by hand here (a few sections of
//! LEB128-prefixed vectors), so a module of a million functions costs milliseconds to build.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::common::{Spec, runtime};
use narad_runtime::limits::{
    DEFAULT_MAX_CODE_BYTES, DEFAULT_MAX_FUNCTION_BODY_BYTES, DEFAULT_MAX_FUNCTIONS,
    DEFAULT_MAX_LOCALS_PER_FUNCTION, DEFAULT_MAX_MODULE_ITEMS, DEFAULT_MEMORY_BYTES,
};
use narad_runtime::{
    CacheOutcome, Limits, LoadError, ModuleLimit, ModuleLimits, ModuleShape, Plugin, Runtime,
    RuntimeConfig,
};

/// Appends `value` as unsigned LEB128.
fn leb(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A section: its id, its size, its contents.
fn section(id: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![id];
    leb(contents.len() as u64, &mut out);
    out.extend_from_slice(contents);
    out
}

/// A vector of `items`: the count, then each item.
fn vector<'a>(items: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    leb(items.len() as u64, &mut out);
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// A module of the given sections.
fn module(sections: &[Vec<u8>]) -> Vec<u8> {
    let mut out = b"\0asm\x01\0\0\0".to_vec();
    for s in sections {
        out.extend_from_slice(s);
    }
    out
}

/// The type section with one type, `func () -> ()`.
fn one_type() -> Vec<u8> {
    section(1, &[1, 0x60, 0, 0])
}

/// `count` functions of type 0, each with `body` (locals declarations, code, `end`).
fn functions(count: usize, body: &[u8]) -> Vec<u8> {
    let declarations = vector(std::iter::repeat_n(&[0u8][..], count));
    let mut entry = Vec::new();
    leb(body.len() as u64, &mut entry);
    entry.extend_from_slice(body);
    let code = vector(std::iter::repeat_n(entry.as_slice(), count));
    let mut out = one_type();
    out.extend(section(3, &declarations));
    out.extend(section(10, &code));
    out
}

/// No locals, then `nops` nops, then `end`.
fn nop_body(nops: usize) -> Vec<u8> {
    let mut body = vec![0u8];
    body.resize(1 + nops, 0x01);
    body.push(0x0b);
    body
}

fn refused(runtime: &Runtime, bytes: &[u8]) -> (ModuleLimit, u64, u64, Option<u32>) {
    match Plugin::load(runtime, bytes) {
        Err(LoadError::ModuleLimit {
            limit,
            found,
            max,
            function,
        }) => (limit, found, max, function),
        other => panic!("expected a module-limit refusal, got {other:?}"),
    }
}

#[test]
fn a_module_of_a_million_empty_functions_is_refused_before_compiling() {
    let bomb = module(&[functions(999_000, &[0x00, 0x0b])]);
    assert!(bomb.len() < 4 * 1024 * 1024, "{} bytes", bomb.len());
    let runtime = runtime();
    let started = Instant::now();
    let (limit, found, max, function) = refused(&runtime, &bomb);
    assert_eq!(limit, ModuleLimit::Functions);
    assert_eq!(found, 999_000);
    assert_eq!(max, u64::from(DEFAULT_MAX_FUNCTIONS));
    assert_eq!(function, None);
    assert_eq!(runtime.compiles(), 0, "nothing was compiled");
    // Not a timing assertion of the product: a guard that this test never turns into the
    // 90-second compile it protects against.
    assert!(started.elapsed() < Duration::from_secs(30));
    let message = Plugin::load(&runtime, &bomb).unwrap_err().to_string();
    assert!(
        message.contains("functions limit")
            && message.contains("999000")
            && message.contains(&DEFAULT_MAX_FUNCTIONS.to_string()),
        "{message}"
    );
}

#[test]
fn one_huge_function_is_refused_naming_its_size_and_index() {
    let small = nop_body(10);
    let huge = nop_body(7 * 1024 * 1024);
    let mut code = Vec::new();
    leb(2, &mut code);
    for body in [&small, &huge] {
        leb(body.len() as u64, &mut code);
        code.extend_from_slice(body);
    }
    let bytes = module(&[one_type(), section(3, &[2, 0, 0]), section(10, &code)]);
    // The whole code section is over its own limit too; raised, so the body limit shows.
    let limits = Limits {
        module: ModuleLimits {
            max_code_bytes: 64 * 1024 * 1024,
            ..ModuleLimits::DEFAULT
        },
        ..Limits::default()
    };
    let runtime = Runtime::new(RuntimeConfig::default().limits(limits)).unwrap();
    let (limit, found, max, function) = refused(&runtime, &bytes);
    assert_eq!(limit, ModuleLimit::FunctionBodyBytes);
    assert_eq!(found, huge.len() as u64);
    assert_eq!(max, u64::from(DEFAULT_MAX_FUNCTION_BODY_BYTES));
    assert_eq!(function, Some(1));
    assert_eq!(runtime.compiles(), 0);
}

#[test]
fn functions_each_under_the_body_limit_are_refused_by_their_total_code_size() {
    let body = nop_body(DEFAULT_MAX_FUNCTION_BODY_BYTES as usize - 16);
    let count = (DEFAULT_MAX_CODE_BYTES / body.len() as u64) as usize + 1;
    let bytes = module(&[functions(count, &body)]);
    let (limit, found, max, _) = refused(&runtime(), &bytes);
    assert_eq!(limit, ModuleLimit::CodeBytes);
    assert!(found > DEFAULT_MAX_CODE_BYTES, "{found}");
    assert_eq!(max, DEFAULT_MAX_CODE_BYTES);
}

#[test]
fn a_function_declaring_too_many_locals_is_refused() {
    // One declaration of 50,000 i32 locals (wasmparser's own ceiling), then `end`.
    let mut body = vec![1u8];
    leb(50_000, &mut body);
    body.extend_from_slice(&[0x7f, 0x0b]);
    let bytes = module(&[functions(1, &body)]);
    let (limit, found, max, function) = refused(&runtime(), &bytes);
    assert_eq!(limit, ModuleLimit::LocalsPerFunction);
    assert_eq!(found, 50_000);
    assert_eq!(max, u64::from(DEFAULT_MAX_LOCALS_PER_FUNCTION));
    assert_eq!(function, Some(0));
}

#[test]
fn too_many_globals_are_refused_by_the_item_limit() {
    // Each: immutable i32 initialised by `i32.const 0; end`.
    let global: &[u8] = &[0x7f, 0x00, 0x41, 0x00, 0x0b];
    let count = DEFAULT_MAX_MODULE_ITEMS as usize + 1;
    let bytes = module(&[section(6, &vector(std::iter::repeat_n(global, count)))]);
    let (limit, found, _, _) = refused(&runtime(), &bytes);
    assert_eq!(limit, ModuleLimit::Globals);
    assert_eq!(found, count as u64);
}

#[test]
fn a_declared_memory_minimum_over_the_memory_limit_is_refused() {
    // One memory of at least 2,000 pages (125 MiB), no maximum.
    let mut memory = vec![1u8, 0x00];
    leb(2_000, &mut memory);
    let bytes = module(&[section(5, &memory)]);
    let (limit, found, max, _) = refused(&runtime(), &bytes);
    assert_eq!(limit, ModuleLimit::MemoryMinimumBytes);
    assert_eq!(found, 2_000 * 65_536);
    assert_eq!(max, DEFAULT_MEMORY_BYTES);
}

#[test]
fn raising_a_limit_lets_the_same_module_through() {
    let wasm = Spec::new("counted").wasm();
    let shape = ModuleShape::of(&wasm).unwrap();
    assert!(shape.functions >= 2, "{shape:?}");
    let tight = Limits {
        module: ModuleLimits {
            max_functions: shape.functions as u32 - 1,
            ..ModuleLimits::DEFAULT
        },
        ..Limits::default()
    };
    let runtime = Runtime::new(RuntimeConfig::default().limits(tight)).unwrap();
    let (limit, found, _, _) = refused(&runtime, &wasm);
    assert_eq!((limit, found), (ModuleLimit::Functions, shape.functions));
    let raised = Limits {
        module: ModuleLimits {
            max_functions: shape.functions as u32,
            ..ModuleLimits::DEFAULT
        },
        ..Limits::default()
    };
    let runtime = Runtime::new(RuntimeConfig::default().limits(raised)).unwrap();
    Plugin::load(&runtime, &wasm).unwrap();
}

#[test]
fn a_module_over_todays_limits_is_refused_even_with_its_compiled_code_cached() {
    let cache = tempfile::tempdir().unwrap();
    let wasm = Spec::new("stored-long-ago").wasm();
    let then = Runtime::new(RuntimeConfig::with_cache_dir(cache.path())).unwrap();
    assert_eq!(
        Plugin::load(&then, &wasm).unwrap().cache_outcome(),
        CacheOutcome::Compiled
    );
    let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(cached.len(), 1);

    let tighter = Limits {
        module: ModuleLimits {
            max_functions: 1,
            ..ModuleLimits::DEFAULT
        },
        ..Limits::default()
    };
    let now = Runtime::new(RuntimeConfig::with_cache_dir(cache.path()).limits(tighter)).unwrap();
    let (limit, _, max, _) = refused(&now, &wasm);
    assert_eq!((limit, max), (ModuleLimit::Functions, 1));
    // The compiled copy is left alone: raising the limit again makes it load from the cache.
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1);
    let again = Runtime::new(RuntimeConfig::with_cache_dir(cache.path())).unwrap();
    assert_eq!(
        Plugin::load(&again, &wasm).unwrap().cache_outcome(),
        CacheOutcome::Hit
    );
    assert_eq!(again.compiles(), 0);
}

#[test]
fn concurrent_loads_of_one_module_compile_it_once() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig::with_cache_dir(cache.path())).unwrap();
    let wasm = Arc::new(Spec::new("popular").wasm());
    let loaders = 8;
    let start = Arc::new(Barrier::new(loaders));
    let threads: Vec<_> = (0..loaders)
        .map(|_| {
            let (runtime, wasm, start) = (runtime.clone(), Arc::clone(&wasm), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                Plugin::load(&runtime, &wasm).map(|p| p.digest())
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(
            thread.join().unwrap().unwrap(),
            narad_runtime::Digest::of(&wasm)
        );
    }
    // Loads that overlapped waited for the first; any that came after it found its code in
    // the cache.
    assert_eq!(runtime.compiles(), 1);
}

#[test]
fn the_refusal_is_the_same_whether_the_module_is_loaded_or_inspected() {
    let bomb = module(&[functions(DEFAULT_MAX_FUNCTIONS as usize + 1, &[0x00, 0x0b])]);
    let runtime = runtime();
    assert!(matches!(
        Plugin::inspect(&runtime, &bomb),
        Err(LoadError::ModuleLimit {
            limit: ModuleLimit::Functions,
            ..
        })
    ));
    let manifest = Plugin::inspect(&runtime, &Spec::new("listed").wasm()).unwrap();
    assert_eq!(manifest.name, "listed");
    assert_eq!(runtime.compiles(), 0, "inspecting never compiles");
}

/// A body of `bytes` bytes (about) declaring `locals` i32 locals and doing loads, adds and
/// local writes over them, so the register allocator has real work (not the nops a compiler
/// skips through).
fn busy_body(bytes: usize, locals: u32) -> Vec<u8> {
    let mut body = vec![1u8];
    leb(u64::from(locals), &mut body);
    body.push(0x7f);
    let mut i: u32 = 0;
    // local.get a; i32.load; local.get b; i32.add; local.set c
    while body.len() + 16 < bytes {
        let (a, b, c) = (i % locals, (i * 7 + 3) % locals, (i * 13 + 5) % locals);
        body.push(0x20);
        leb(u64::from(a), &mut body);
        body.extend_from_slice(&[0x28, 0x02, 0x00]);
        body.push(0x20);
        leb(u64::from(b), &mut body);
        body.push(0x6a);
        body.push(0x21);
        leb(u64::from(c), &mut body);
        i += 1;
    }
    body.push(0x0b);
    body
}

/// Builds a module right at the default limits (the most functions, one function of the
/// largest body with the most locals, the rest filling the code section to its limit): the
/// shape check lets it through, and since it exports nothing it is refused before its compile
/// (imports and exports are read first). The compile figures in `limits.rs` were measured on
/// this module when the exports were checked after the compile.
#[test]
fn a_module_right_at_the_default_limits_passes_the_shape_check_and_exporting_nothing_is_never_compiled()
 {
    let functions = DEFAULT_MAX_FUNCTIONS as usize;
    let largest = busy_body(
        DEFAULT_MAX_FUNCTION_BODY_BYTES as usize - 8,
        DEFAULT_MAX_LOCALS_PER_FUNCTION,
    );
    // Leave room for the section's own count and each body's size prefix.
    let rest_bytes = DEFAULT_MAX_CODE_BYTES as usize - largest.len() - 8 - 3 * functions;
    let small = busy_body(rest_bytes / (functions - 1), 16);
    let mut code = Vec::new();
    leb(functions as u64, &mut code);
    for body in std::iter::once(&largest).chain(std::iter::repeat_n(&small, functions - 1)) {
        leb(body.len() as u64, &mut code);
        code.extend_from_slice(body);
    }
    let declarations = vector(std::iter::repeat_n(&[0u8][..], functions));
    let bytes = module(&[
        one_type(),
        section(3, &declarations),
        section(5, &[1, 0x00, 1]),
        section(10, &code),
    ]);
    let shape = ModuleShape::of(&bytes).unwrap();
    eprintln!("{} bytes: {shape:?}", bytes.len());
    let runtime = runtime();
    narad_runtime::precheck::check(&narad_runtime::Limits::default(), &bytes)
        .expect("within every module limit");
    let err = Plugin::load(&runtime, &bytes).unwrap_err();
    assert!(matches!(err, LoadError::MissingExport { .. }), "{err:?}");
    assert_eq!(runtime.compiles(), 0, "refused before its compile");
}

/// One function right at the body and locals limits, alone: the worst single function passes
/// the shape check; exporting nothing, it is refused before its compile (measured like the
/// test above when exports were checked after the compile).
#[test]
fn one_function_right_at_the_body_and_locals_limits_passes_the_shape_check() {
    let body = busy_body(
        DEFAULT_MAX_FUNCTION_BODY_BYTES as usize - 8,
        DEFAULT_MAX_LOCALS_PER_FUNCTION,
    );
    let mut code = Vec::new();
    leb(1, &mut code);
    leb(body.len() as u64, &mut code);
    code.extend_from_slice(&body);
    let bytes = module(&[
        one_type(),
        section(3, &[1, 0]),
        section(5, &[1, 0x00, 1]),
        section(10, &code),
    ]);
    eprintln!(
        "{} bytes: {:?}",
        bytes.len(),
        ModuleShape::of(&bytes).unwrap()
    );
    narad_runtime::precheck::check(&narad_runtime::Limits::default(), &bytes)
        .expect("within every module limit");
    let runtime = runtime();
    let err = Plugin::load(&runtime, &bytes).unwrap_err();
    assert!(matches!(err, LoadError::MissingExport { .. }), "{err:?}");
    assert_eq!(runtime.compiles(), 0, "refused before its compile");
}
