//! Compiles the built-in plugin crates to `wasm32-unknown-unknown` with a nested cargo and
//! copies the modules into `OUT_DIR` for `include_bytes!`.
//!
//! The nested build uses its own target directory (`<target>/wasm-plugins`, shared by every
//! profile so `cargo check`, `test` and `build` reuse one another's work), the workspace's
//! `Cargo.lock` (`--locked`), and a size-tuned release profile given through
//! `CARGO_PROFILE_RELEASE_*` variables (opt-level 3, fat LTO, one codegen unit, no debug
//! info, symbols stripped; the `narad.manifest` custom section survives stripping). Opt-level
//! 3 rather than "s": measured on key-hash over 4,096 16-byte keys, it routes about 15% faster
//! and the module is no larger (about 21 KB either way, mostly `core::fmt` for error messages).
//! Flags meant for the host build (RUSTFLAGS, clippy's wrapper, the outer target and target
//! dir) are removed so they cannot break or pollute the wasm build.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin crates to build: (directory under `plugins/`, crate name).
const PLUGINS: [(&str, &str); 4] = [
    ("key-hash", "narad-plugin-key-hash"),
    ("keyless-index", "narad-plugin-keyless-index"),
    ("round-robin", "narad-plugin-round-robin"),
    ("header-route", "narad-plugin-header-route"),
];

/// The Wasm target; rust-toolchain.toml lists it so rustup installs it with the toolchain.
const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Environment variables of the outer build that must not reach the nested one.
const SCRUBBED_ENV: [&str; 10] = [
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_PRIMARY_PACKAGE",
];

fn main() {
    if let Err(message) = run() {
        // A build script reports failure by exiting non-zero; cargo shows stderr.
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn var(name: &str) -> Result<String, String> {
    env::var(name).map_err(|_| format!("cargo did not set {name}"))
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
    let plugins_dir = manifest_dir
        .parent()
        .ok_or("plugins/builtin has no parent directory")?
        .to_path_buf();
    let workspace = plugins_dir
        .parent()
        .ok_or("plugins/ has no parent directory")?
        .to_path_buf();
    let out_dir = PathBuf::from(var("OUT_DIR")?);

    for (dir, _) in PLUGINS {
        println!(
            "cargo::rerun-if-changed={}",
            plugins_dir.join(dir).display()
        );
    }
    for path in [
        "guest-sdk/src",
        "guest-sdk/Cargo.toml",
        "guest-sdk/macros/src",
        "guest-sdk/macros/Cargo.toml",
        "guest-sdk/abi/src",
        "guest-sdk/abi/Cargo.toml",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        println!("cargo::rerun-if-changed={}", workspace.join(path).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    check_wasm_target(&rustc)?;

    let target_dir = wasm_target_dir(&out_dir, &workspace);
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(&workspace)
        .arg("build")
        .arg("--release")
        .arg("--locked")
        .arg("--target")
        .arg(WASM_TARGET)
        .arg("--target-dir")
        .arg(&target_dir)
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"));
    for (_, krate) in PLUGINS {
        cmd.arg("-p").arg(krate);
    }
    for name in SCRUBBED_ENV {
        cmd.env_remove(name);
    }
    cmd.env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_LTO", "fat")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false");
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "building the built-in plugins for {WASM_TARGET} failed ({status}); see the output above"
        ));
    }

    let built = target_dir.join(WASM_TARGET).join("release");
    for (dir, krate) in PLUGINS {
        let file = format!("{}.wasm", krate.replace('-', "_"));
        let from = built.join(&file);
        let to = out_dir.join(format!("{dir}.wasm"));
        fs::copy(&from, &to)
            .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    Ok(())
}

/// Makes sure the toolchain has the wasm32 standard library. rustup installs the targets that
/// rust-toolchain.toml lists when it installs the toolchain, but not when the toolchain already
/// exists without them (a linked or preinstalled toolchain); then this adds the target through
/// rustup, as `rustup target add` would, and fails with the fix when it cannot.
fn check_wasm_target(rustc: &str) -> Result<(), String> {
    let sysroot = sysroot(rustc)?;
    if has_wasm_std(&sysroot) {
        return Ok(());
    }
    if let Ok(toolchain) = env::var("RUSTUP_TOOLCHAIN") {
        println!(
            "cargo::warning=the {WASM_TARGET} target is missing from toolchain {toolchain}; \
             adding it with rustup (the built-in plugins are compiled to Wasm)"
        );
        let added = Command::new("rustup")
            .args(["target", "add", WASM_TARGET, "--toolchain", &toolchain])
            .status();
        if matches!(added, Ok(status) if status.success()) && has_wasm_std(&sysroot) {
            return Ok(());
        }
    }
    Err(format!(
        "the {WASM_TARGET} target is not installed for this toolchain ({sysroot}); \
         the built-in plugins are compiled to Wasm. Fix: rustup target add {WASM_TARGET}"
    ))
}

fn sysroot(rustc: &str) -> Result<String, String> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("could not run {rustc}: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn has_wasm_std(sysroot: &str) -> bool {
    Path::new(sysroot)
        .join("lib")
        .join("rustlib")
        .join(WASM_TARGET)
        .is_dir()
}

/// `<target>/wasm-plugins`, where `<target>` is the outer build's target directory, found
/// from OUT_DIR (`<target>[/<triple>]/<profile>/build/<pkg>-<hash>/out`); falls back to a
/// directory inside OUT_DIR when that shape is not recognised.
fn wasm_target_dir(out_dir: &Path, workspace: &Path) -> PathBuf {
    if let Ok(dir) = env::var("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_absolute() {
            dir
        } else {
            workspace.join(dir)
        };
        return dir.join("wasm-plugins");
    }
    let mut ancestors = out_dir.ancestors();
    let build = ancestors.nth(2);
    if build
        .and_then(Path::file_name)
        .is_some_and(|n| n == "build")
    {
        // out -> pkg-hash -> build -> profile -> (triple ->) target
        let mut target = out_dir.ancestors().nth(4);
        let triple = env::var("TARGET").unwrap_or_default();
        if target
            .and_then(Path::file_name)
            .is_some_and(|n| n == triple.as_str())
        {
            target = out_dir.ancestors().nth(5);
        }
        if let Some(t) = target {
            return t.join("wasm-plugins");
        }
    }
    out_dir.join("wasm-plugins")
}
