//! Deploy-time validation: every way a module can be wrong gets its own typed error.
#![allow(clippy::unwrap_used, missing_docs)]

use crate::common::{Poison, Spec, manifest_json, runtime};
use narad_runtime::{
    CacheOutcome, DeployProbe, Digest, ErrorCode, Failure, FuelBudget, Limits, LoadError, Plugin,
    Runtime, RuntimeConfig, Violation,
};

fn load(spec: &Spec) -> Result<Plugin, LoadError> {
    Plugin::load(&runtime(), &spec.wasm())
}

#[test]
fn a_well_formed_plugin_loads_with_its_manifest_and_digest() {
    let wasm = Spec::new("zero-or-one").wasm();
    let plugin = Plugin::load(&runtime(), &wasm).unwrap();
    assert_eq!(plugin.name(), "zero-or-one");
    assert_eq!(plugin.manifest().version, "1.0.0");
    assert_eq!(plugin.digest(), Digest::of(&wasm));
    assert_eq!(
        Digest::from_hex(&plugin.digest().to_hex()),
        Some(plugin.digest())
    );
    assert_eq!(plugin.size_bytes(), wasm.len());
}

#[test]
fn bytes_that_are_not_wasm_are_refused() {
    let err = Plugin::load(&runtime(), b"{\"not\": \"wasm\"}").unwrap_err();
    assert!(matches!(err, LoadError::NotWasm), "{err:?}");
    let err = Plugin::load(&runtime(), b"").unwrap_err();
    assert!(matches!(err, LoadError::NotWasm), "{err:?}");
}

#[test]
fn a_component_is_not_a_core_module() {
    let err = Plugin::load(&runtime(), b"\0asm\x0d\x00\x01\x00").unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::NotCoreModule {
                version: 0x0001_000d
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_module_that_does_not_validate_is_a_compile_error() {
    let err = Plugin::load(&runtime(), b"\0asm\x01\x00\x00\x00\x01\xff\xff").unwrap_err();
    assert!(matches!(err, LoadError::Compile { .. }), "{err:?}");
}

/// Imports and exports are read before the compile: a module that can never load costs no
/// compile (seconds for one at the module limits) to refuse.
#[test]
fn a_module_with_a_forbidden_import_or_a_missing_export_is_refused_before_any_compile() {
    let runtime = runtime();
    let mut wasi = Spec::new("wasi");
    wasi.imports = r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#;
    let mut bad_log = Spec::new("badlog");
    bad_log.imports = r#"(import "narad" "log" (func (param i64)))"#;
    let mut no_export = Spec::new("no-last-error");
    no_export.omit_export = Some("narad_last_error");
    for (spec, what) in [
        (wasi, "wasi"),
        (bad_log, "badlog"),
        (no_export, "no export"),
    ] {
        let bytes = wat::parse_str(spec.wat()).unwrap();
        let err = Plugin::load(&runtime, &bytes).unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::ForbiddenImport { .. }
                    | LoadError::WrongImportType { .. }
                    | LoadError::MissingExport { .. }
            ),
            "{what}: {err:?}"
        );
    }
    assert_eq!(runtime.compiles(), 0, "nothing was compiled");
    // A module that passes is compiled once, as before.
    let good = wat::parse_str(Spec::new("good").wat()).unwrap();
    Plugin::load(&runtime, &good).unwrap();
    assert_eq!(runtime.compiles(), 1);
}

#[test]
fn a_wasi_import_is_forbidden_by_name() {
    let mut spec = Spec::new("wasi");
    spec.imports = r#"(import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))"#;
    match load(&spec).unwrap_err() {
        LoadError::ForbiddenImport { module, name } => {
            assert_eq!(module, "wasi_snapshot_preview1");
            assert_eq!(name, "fd_write");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_clock_import_from_the_narad_module_is_forbidden_too() {
    let mut spec = Spec::new("clock");
    spec.imports = r#"(import "narad" "now" (func (result i64)))"#;
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::ForbiddenImport { .. }
    ));
}

#[test]
fn the_log_import_with_a_wrong_signature_is_refused() {
    let mut spec = Spec::new("badlog");
    spec.imports = r#"(import "narad" "log" (func (param i64)))"#;
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::WrongImportType { .. }
    ));
}

#[test]
fn a_missing_export_is_named() {
    let mut spec = Spec::new("no-last-error");
    spec.omit_export = Some("narad_last_error");
    match load(&spec).unwrap_err() {
        LoadError::MissingExport { name } => assert_eq!(name, "narad_last_error"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_export_with_the_wrong_signature_is_named() {
    let mut spec = Spec::new("bad-alloc");
    spec.omit_export = Some("narad_alloc");
    spec.imports = "";
    let wat = spec.wat().replace(
        "(func $narad_dealloc (param i32 i32))",
        "(func $narad_dealloc (param i32 i32)) (func (export \"narad_alloc\") (param i64) (result i32) (i32.const 0))",
    );
    let err = Plugin::load(&runtime(), &wat::parse_str(wat).unwrap()).unwrap_err();
    match err {
        LoadError::WrongExportType { name, .. } => assert_eq!(name, "narad_alloc"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_wrong_abi_version_is_refused() {
    let mut spec = Spec::new("abi-two");
    spec.abi_version = 2;
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::AbiVersion {
            found: 2,
            expected: 1
        }
    ));
}

#[test]
fn a_missing_manifest_is_refused() {
    let mut spec = Spec::new("anon");
    spec.manifests.clear();
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::ManifestMissing
    ));
}

#[test]
fn two_manifests_are_refused() {
    let mut spec = Spec::new("twice");
    spec.manifests.push(manifest_json("twice", 1));
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::ManifestDuplicate { count: 2 }
    ));
}

#[test]
fn a_manifest_that_is_not_json_is_refused() {
    let mut spec = Spec::new("garbled");
    spec.manifests = vec!["{name: garbled".into()];
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::ManifestInvalid { .. }
    ));
}

#[test]
fn a_manifest_with_a_bad_name_is_refused() {
    let mut spec = Spec::new("ok");
    spec.manifests = vec![manifest_json("Not/A Name", 1)];
    match load(&spec).unwrap_err() {
        LoadError::ManifestName { name } => assert_eq!(name, "Not/A Name"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_for_another_abi_is_refused() {
    let mut spec = Spec::new("future");
    spec.manifests = vec![manifest_json("future", 2)];
    assert!(matches!(
        load(&spec).unwrap_err(),
        LoadError::ManifestAbi {
            found: 2,
            expected: 1
        }
    ));
}

#[test]
fn an_endless_loop_fails_the_test_slab_by_fuel() {
    let err = load(&Spec::new("spin").poison(Poison::EndlessLoop).always()).unwrap_err();
    assert!(
        matches!(err, LoadError::TestSlab(Failure::FuelExhausted { .. })),
        "{err:?}"
    );
}

#[test]
fn a_loop_with_unbounded_fuel_fails_the_test_slab_by_its_deadline() {
    // Fuel large enough that only the wall clock can stop the loop.
    let limits = Limits {
        deadline: std::time::Duration::from_millis(20),
        fuel: FuelBudget {
            base: u64::MAX / 2,
            ..FuelBudget::DEFAULT
        },
        ..Limits::default()
    };
    let runtime = Runtime::new(RuntimeConfig::default().limits(limits)).unwrap();
    let wasm = Spec::new("slow")
        .poison(Poison::EndlessLoop)
        .always()
        .wasm();
    let err = Plugin::load(&runtime, &wasm).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::TestSlab(Failure::Deadline { deadline_ms: 20 })
        ),
        "{err:?}"
    );
}

#[test]
fn a_memory_grow_bomb_fails_the_test_slab_at_the_memory_limit() {
    let err = load(&Spec::new("bomb").poison(Poison::GrowBomb).always()).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::TestSlab(Failure::MemoryLimit {
                limit_bytes: 67_108_864
            })
        ),
        "{err:?}"
    );
}

#[test]
fn a_trap_fails_the_test_slab_with_its_trap_code() {
    let err = load(&Spec::new("trap").poison(Poison::Trap).always()).unwrap_err();
    match err {
        LoadError::TestSlab(Failure::Trap { code, .. }) => {
            assert_eq!(code.as_deref(), Some("UnreachableCodeReached"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unbounded_recursion_hits_the_stack_limit() {
    let err = load(&Spec::new("deep").poison(Poison::Recurse).always()).unwrap_err();
    match err {
        LoadError::TestSlab(Failure::Trap { code, .. }) => {
            assert_eq!(code.as_deref(), Some("StackOverflow"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn precompiled_code_is_never_accepted_as_a_plugin() {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, Spec::new("pre").wasm()).unwrap();
    let precompiled = module.serialize().unwrap();
    assert!(matches!(
        Plugin::load(&runtime(), &precompiled).unwrap_err(),
        LoadError::NotWasm
    ));
}

#[test]
fn an_out_of_range_answer_fails_the_test_slab() {
    let err = load(&Spec::new("range").poison(Poison::OutOfRange).always()).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::TestSlab(Failure::OutOfRange {
                value: 99,
                record_offset: 0,
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn a_return_value_that_is_not_a_code_is_a_protocol_violation() {
    let err = load(&Spec::new("count").poison(Poison::ReturnCount).always()).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::TestSlab(Failure::Protocol(Violation::ReturnCode(4)))
        ),
        "{err:?}"
    );
}

#[test]
fn an_error_return_fails_the_test_slab_with_the_guest_message() {
    let err = load(&Spec::new("refuse").poison(Poison::ErrorReturn).always()).unwrap_err();
    match err {
        LoadError::TestSlab(Failure::ErrorReturn { code, message }) => {
            assert_eq!(code, ErrorCode::Plugin);
            assert_eq!(message.as_deref(), Some("no route for this record"));
        }
        other => panic!("{other:?}"),
    }
}

/// A manifest that declares `probe_config`.
fn manifest_with_probe(name: &str, probe_config: &str) -> String {
    format!(
        r#"{{"name":"{name}","version":"1.0.0","abi":1,"description":"d","probe_config":"{probe_config}"}}"#
    )
}

#[test]
fn a_bad_config_answer_to_the_empty_probe_config_deploys_and_says_its_routing_was_not_checked() {
    let plugin = load(&Spec::new("needs-config").poison(Poison::BadConfig).always()).unwrap();
    assert!(
        matches!(
            plugin.deploy_probe(),
            DeployProbe::NeedsConfig { message: Some(_) }
        ),
        "{:?}",
        plugin.deploy_probe()
    );
    // A plugin that routes the probe says so.
    assert_eq!(
        load(&Spec::new("routes")).unwrap().deploy_probe(),
        DeployProbe::Routed
    );
}

#[test]
fn the_deploy_probe_hands_the_plugin_its_declared_probe_config() {
    let mut spec = Spec::new("configured")
        .poison(Poison::NeedsConfigEndingInOne)
        .always();
    spec.manifests = vec![manifest_with_probe("configured", "partition = 1")];
    assert_eq!(load(&spec).unwrap().deploy_probe(), DeployProbe::Routed);
}

#[test]
fn a_bad_config_answer_to_a_declared_probe_config_is_refused_like_any_error_return() {
    let mut spec = Spec::new("liar").poison(Poison::BadConfig).always();
    spec.manifests = vec![manifest_with_probe("liar", "partition = 0")];
    match load(&spec).unwrap_err() {
        LoadError::TestSlab(Failure::ErrorReturn { code, .. }) => {
            assert_eq!(code, ErrorCode::BadConfig);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_without_a_description_deploys() {
    let mut spec = Spec::new("terse");
    spec.manifests = vec![r#"{"name":"terse","version":"1","abi":1}"#.to_owned()];
    assert_eq!(load(&spec).unwrap().manifest().description, "");
}

#[test]
fn a_missing_manifest_is_named_with_how_to_add_one() {
    let mut spec = Spec::new("anon");
    spec.manifests.clear();
    let message = load(&spec).unwrap_err().to_string();
    assert!(
        message.contains("the narad manifest custom section is missing"),
        "{message}"
    );
    assert!(message.contains("wasm-tools"), "{message}");
}

#[test]
fn a_plugin_that_leaves_records_undecided_still_deploys() {
    load(&Spec::new("skipper").undecided_by_default()).unwrap();
}

#[test]
fn a_restart_loads_compiled_code_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = Spec::new("cached").wasm();
    let first = Runtime::new(RuntimeConfig::with_cache_dir(dir.path())).unwrap();
    let plugin = Plugin::load(&first, &wasm).unwrap();
    assert_eq!(plugin.cache_outcome(), CacheOutcome::Compiled);
    drop((plugin, first));
    let second = Runtime::new(RuntimeConfig::with_cache_dir(dir.path())).unwrap();
    let plugin = Plugin::load(&second, &wasm).unwrap();
    assert_eq!(plugin.cache_outcome(), CacheOutcome::Hit);
}

#[test]
fn a_corrupt_cache_file_is_recompiled_and_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = Spec::new("cached").wasm();
    let runtime = Runtime::new(RuntimeConfig::with_cache_dir(dir.path())).unwrap();
    Plugin::load(&runtime, &wasm).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&Digest::of(&wasm).to_hex()), "{name}");
    // Flip a byte deep inside the compiled code.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xFF;
    std::fs::write(&files[0], &bytes).unwrap();

    let plugin = Plugin::load(&runtime, &wasm).unwrap();
    assert_eq!(plugin.cache_outcome(), CacheOutcome::Compiled);
    let again = Plugin::load(&runtime, &wasm).unwrap();
    assert_eq!(again.cache_outcome(), CacheOutcome::Hit);
}

#[test]
fn the_runtime_refuses_a_zero_deadline() {
    let limits = Limits {
        deadline: std::time::Duration::ZERO,
        ..Limits::default()
    };
    assert!(Runtime::new(RuntimeConfig::default().limits(limits)).is_err());
}

/// The body of the first fenced block of `markdown` opened by `opening`.
fn fenced(markdown: &str, opening: &str) -> String {
    let start = markdown.find(opening).expect("the fenced block") + opening.len();
    let end = start + markdown[start..].find("\n```").unwrap();
    markdown[start..end].to_owned()
}

/// What a wabt user does with the ABI's WAT example: wabt drops `@custom`, so the module
/// has no manifest; the docs' script appends it by hand, and the module deploys.
#[test]
fn the_abi_example_built_without_its_custom_section_gets_it_from_the_documented_script() {
    let abi =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/abi.md")).unwrap();
    let wat = fenced(&abi, "```wat");
    let (kept, custom): (Vec<&str>, Vec<&str>) = {
        let mut kept = Vec::new();
        let mut custom = Vec::new();
        let mut in_custom = false;
        for line in wat.lines() {
            in_custom |= line.trim_start().starts_with("(@custom");
            if in_custom {
                custom.push(line);
                if line.trim_end().ends_with(')') {
                    in_custom = false;
                }
            } else {
                kept.push(line);
            }
        }
        (kept, custom)
    };
    // The manifest JSON as written in the annotation, unescaped.
    let custom = custom.join("\n");
    let quoted = &custom[custom.find("\"{").unwrap() + 1..custom.rfind("}\"").unwrap() + 1];
    let manifest = quoted.replace("\\\"", "\"");
    let without = wat::parse_str(kept.join("\n")).unwrap();
    assert!(matches!(
        Plugin::load(&runtime(), &without).unwrap_err(),
        LoadError::ManifestMissing
    ));

    let dir = tempfile::tempdir().unwrap();
    let (module, json, script) = (
        dir.path().join("m.wasm"),
        dir.path().join("manifest.json"),
        dir.path().join("add-manifest.py"),
    );
    std::fs::write(&module, &without).unwrap();
    std::fs::write(&json, manifest).unwrap();
    std::fs::write(&script, fenced(&abi, "```python abi-append-manifest")).unwrap();
    let ran = std::process::Command::new("python3")
        .arg(&script)
        .arg(&module)
        .arg(&json)
        .status();
    match ran {
        Ok(status) => assert!(status.success(), "the script failed: {status}"),
        Err(e) => {
            eprintln!("python3 is not available ({e}); the script was not run");
            return;
        }
    }
    let plugin = Plugin::load(&runtime(), &std::fs::read(&module).unwrap()).unwrap();
    assert_eq!(plugin.name(), "keyed-to-zero");
}
