//! narad-host's build script has one job: to put `protoc-bin-vendored` in the build, so that
//! cargo downloads and unpacks its protoc binary before any build script runs. etcd-client's
//! build script then finds it through `$PROTOC` (`.cargo/config.toml` points that at
//! `scripts/protoc`), and `cargo build` needs nothing outside cargo.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        // Not fatal: a protoc on PATH or in $PROTOC serves as well.
        println!(
            "cargo:warning=no bundled protoc for this platform ({e}); etcd-client's build needs protoc on PATH or in PROTOC"
        );
    }
}
