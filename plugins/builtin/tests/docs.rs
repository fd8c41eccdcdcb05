//! The docs' examples work: the plugin guide's crate is extracted from docs/plugin-guide.md
//! (its fenced blocks tagged `guide-cargo` and `guide-lib`), built against this checkout's
//! narad-guest, tested natively and compiled to Wasm; the WAT example of docs/abi.md is a
//! valid plugin module.
#![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use narad_abi::{MANIFEST_SECTION, Manifest, symbols};
use wasmparser::{Parser, Payload, Validator};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The body of the fenced block whose info string is `lang tag`, or a panic naming it.
fn fenced_block(markdown: &str, lang: &str, tag: &str) -> String {
    let opening = format!("```{lang} {tag}");
    let mut lines = markdown.lines().skip_while(|l| l.trim_end() != opening);
    assert!(lines.next().is_some(), "no ```{lang} {tag} block");
    let body: Vec<&str> = lines.take_while(|l| l.trim_end() != "```").collect();
    body.join("\n") + "\n"
}

/// The manifest and imports of a module, after validating it.
fn manifest_and_imports(wasm: &[u8]) -> (Manifest, Vec<(String, String)>) {
    Validator::new().validate_all(wasm).unwrap();
    let mut manifests = Vec::new();
    let mut imports = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.unwrap() {
            Payload::CustomSection(c) if c.name() == MANIFEST_SECTION => {
                manifests.push(serde_json::from_slice::<Manifest>(c.data()).unwrap());
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import.unwrap();
                    imports.push((import.module.to_string(), import.name.to_string()));
                }
            }
            _ => {}
        }
    }
    assert_eq!(manifests.len(), 1, "exactly one manifest section");
    (manifests.remove(0), imports)
}

/// A cargo command with the outer build's flags removed (they target the host build).
fn cargo(dir: &Path) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir);
    for name in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(name);
    }
    cmd
}

fn run(mut cmd: Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_plugin_guide_example_tests_natively_and_builds_for_wasm() {
    let root = repo_root();
    let guide = std::fs::read_to_string(root.join("docs/plugin-guide.md")).unwrap();
    let sdk = root.join("guest-sdk").canonicalize().unwrap();

    // The guide's Cargo.toml, pointed at this checkout's SDK and made its own workspace (it
    // lives under this workspace's target dir).
    let manifest: String = fenced_block(&guide, "toml", "guide-cargo")
        .lines()
        .map(|l| {
            if l.starts_with("narad-guest =") {
                format!("narad-guest = {{ path = {:?} }}", sdk.display().to_string())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n\n[workspace]\n";
    assert!(
        manifest.contains(&sdk.display().to_string()),
        "guide has a narad-guest dependency"
    );
    let lib = fenced_block(&guide, "rust", "guide-lib");

    // A fixed directory under the target dir, so reruns are incremental.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-guide-example");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/lib.rs"), lib).unwrap();
    // Same dependency versions as the workspace, and nothing to download.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();

    let mut test = cargo(&dir);
    test.args(["test", "--offline", "--quiet"]);
    run(test);

    let mut build = cargo(&dir);
    build.args([
        "build",
        "--offline",
        "--quiet",
        "--release",
        "--target",
        "wasm32-unknown-unknown",
    ]);
    run(build);

    let wasm =
        std::fs::read(dir.join("target/wasm32-unknown-unknown/release/vip_route.wasm")).unwrap();
    let (manifest, imports) = manifest_and_imports(&wasm);
    manifest.validate().unwrap();
    assert_eq!(manifest.name, "vip-route");
    assert_eq!(manifest.version, "1.0.0");
    for (module, name) in imports {
        assert_eq!(
            (module.as_str(), name.as_str()),
            (symbols::IMPORT_MODULE, symbols::IMPORT_LOG)
        );
    }
}

#[test]
fn the_abi_wat_example_is_a_valid_plugin_module() {
    let abi = std::fs::read_to_string(repo_root().join("docs/abi.md")).unwrap();
    let opening = "```wat";
    let start = abi.find(opening).expect("a ```wat block") + opening.len();
    let end = start + abi[start..].find("\n```").unwrap();
    let wasm = wat::parse_str(&abi[start..end]).unwrap();
    let (manifest, imports) = manifest_and_imports(&wasm);
    manifest.validate().unwrap();
    assert_eq!(manifest.name, "keyed-to-zero");
    assert!(imports.is_empty());
    let mut exports = Vec::new();
    for payload in Parser::new(0).parse_all(&wasm) {
        if let Payload::ExportSection(reader) = payload.unwrap() {
            exports.extend(reader.into_iter().map(|e| e.unwrap().name.to_string()));
        }
    }
    for export in symbols::REQUIRED_EXPORTS {
        assert!(
            exports.iter().any(|e| e == export),
            "WAT example lacks {export}"
        );
    }
}
