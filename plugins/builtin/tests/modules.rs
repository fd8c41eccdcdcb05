//! Each embedded module is what the host's deploy check accepts: valid Wasm, exactly one
//! `narad.manifest` section naming the plugin, only the `narad.log` import, every ABI export.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use narad_abi::{MANIFEST_SECTION, Manifest, symbols};
use wasmparser::{Parser, Payload, TypeRef, Validator};

struct Module {
    manifests: Vec<Vec<u8>>,
    imports: Vec<(String, String, bool)>,
    exports: Vec<String>,
}

fn inspect(bytes: &[u8]) -> Module {
    Validator::new().validate_all(bytes).unwrap();
    let mut m = Module {
        manifests: Vec::new(),
        imports: Vec::new(),
        exports: Vec::new(),
    };
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.unwrap() {
            Payload::CustomSection(c) if c.name() == MANIFEST_SECTION => {
                m.manifests.push(c.data().to_vec());
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import.unwrap();
                    m.imports.push((
                        import.module.to_string(),
                        import.name.to_string(),
                        matches!(import.ty, TypeRef::Func(_)),
                    ));
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    m.exports.push(export.unwrap().name.to_string());
                }
            }
            _ => {}
        }
    }
    m
}

#[test]
fn every_builtin_is_valid_wasm_with_its_own_manifest() {
    assert_eq!(narad_builtin_plugins::all().len(), 4);
    for (name, bytes) in narad_builtin_plugins::all() {
        let m = inspect(bytes);
        assert_eq!(m.manifests.len(), 1, "{name}: one manifest section");
        let manifest: Manifest = serde_json::from_slice(&m.manifests[0]).unwrap();
        manifest.validate().unwrap();
        assert_eq!(manifest.name, *name);
    }
}

#[test]
fn only_header_route_asks_for_headers_and_none_for_values() {
    for (name, bytes) in narad_builtin_plugins::all() {
        let m = inspect(bytes);
        let manifest: Manifest = serde_json::from_slice(&m.manifests[0]).unwrap();
        assert_eq!(manifest.needs.headers(), *name == "header-route", "{name}");
        assert!(!manifest.needs.values(), "{name}");
    }
}

#[test]
fn only_key_hash_asks_for_the_hosts_key_hashes_and_it_takes_no_key_bytes() {
    for (name, bytes) in narad_builtin_plugins::all() {
        let m = inspect(bytes);
        let manifest: Manifest = serde_json::from_slice(&m.manifests[0]).unwrap();
        let is_key_hash = *name == "key-hash";
        assert_eq!(manifest.needs.key_hash(), is_key_hash, "{name}");
        assert_eq!(manifest.needs.keys(), !is_key_hash, "{name}");
    }
}

#[test]
fn builtins_import_nothing_but_the_log_call_and_export_the_whole_abi() {
    for (name, bytes) in narad_builtin_plugins::all() {
        let m = inspect(bytes);
        for (module, field, is_func) in &m.imports {
            assert_eq!(
                (module.as_str(), field.as_str(), *is_func),
                (symbols::IMPORT_MODULE, symbols::IMPORT_LOG, true),
                "{name}"
            );
        }
        for export in symbols::REQUIRED_EXPORTS {
            assert!(
                m.exports.iter().any(|e| e == export),
                "{name} lacks {export}"
            );
        }
    }
}

#[test]
fn builtins_are_small() {
    // Size-tuned nested build (opt-level "s", LTO, stripped): each module stays well under
    // the host's 16 MiB upload limit and compiles fast.
    for (name, bytes) in narad_builtin_plugins::all() {
        assert!(bytes.len() < 128 * 1024, "{name} is {} bytes", bytes.len());
    }
}

#[test]
fn builtins_are_found_by_name() {
    assert_eq!(
        narad_builtin_plugins::get("round-robin"),
        Some(narad_builtin_plugins::ROUND_ROBIN)
    );
    assert_eq!(narad_builtin_plugins::get("nope"), None);
    for name in narad_builtin_plugins::DEFAULT_CHAIN {
        assert!(narad_builtin_plugins::get(name).is_some());
    }
}
