//! docs/cluster.md's quickstart is what `scripts/cluster-quickstart` runs, and that script runs
//! clean on the real binary, a real etcd and three real nodes: the doc's commands and outputs
//! cannot drift from what the build does without a failing test.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// The repository's root (two levels above the CLI crate).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("the CLI crate lives at host/cli")
}

/// The lines that are commands: not blank, not a comment alone.
fn commands(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// The `sh` blocks of the quickstart section, after the one that installs what it needs.
fn doc_commands() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/cluster.md")).expect("docs/cluster.md");
    let start = doc
        .find("## Quickstart: three nodes on your machine")
        .expect("the quickstart section");
    let section = &doc[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut blocks = Vec::new();
    let mut rest = &section[..end];
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("```").expect("a closed block");
        blocks.push(&body[..close]);
        rest = &body[close + 3..];
    }
    blocks
        .into_iter()
        .filter(|b| !b.contains("cargo build"))
        .flat_map(commands)
        .collect()
}

#[test]
fn the_quickstart_script_runs_exactly_the_commands_of_the_doc() {
    let script = std::fs::read_to_string(repo().join("scripts/cluster-quickstart"))
        .expect("scripts/cluster-quickstart");
    let body = commands(&script);
    // The script adds strict mode and its traps; the rest is the doc's, in order.
    let ours: Vec<String> = body
        .into_iter()
        .filter(|l| !l.starts_with("set -euo") && !l.starts_with("trap "))
        .collect();
    let doc = doc_commands();
    assert!(doc.len() > 40, "the quickstart lost its commands: {doc:?}");
    for (i, (doc_line, script_line)) in doc.iter().zip(&ours).enumerate() {
        assert_eq!(doc_line, script_line, "line {i} of the commands differs");
    }
    assert_eq!(
        doc.len(),
        ours.len(),
        "the doc and the script differ in length"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[test]
fn the_quickstart_script_runs_clean_on_this_build() {
    let narad = Path::new(env!("CARGO_BIN_EXE_narad"));
    let bin_dir = narad.parent().expect("the binary's directory");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scratch = tempfile::tempdir().expect("tempdir");
    // Free ports of our own, so parallel tests and a quickstart a user runs do not collide.
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let out = Command::new("bash")
        .arg(repo().join("scripts/cluster-quickstart"))
        .env("PATH", path)
        .env("TMPDIR", scratch.path())
        .env("ETCD_PORT", ports[0].to_string())
        .env("ETCD_PEER_PORT", ports[1].to_string())
        .env("P1", ports[2].to_string())
        .env("P2", ports[3].to_string())
        .env("P3", ports[4].to_string())
        .env_remove("NARAD_URL")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the quickstart failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // What the doc shows at its end: every copy there once, nothing stalled.
    assert!(
        stdout.contains("created topic orders with 3 partitions"),
        "{stdout}"
    );
    assert!(stdout.contains("narad_cluster_live_nodes 3"), "{stdout}");
    // The script removed what it made.
    let left: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("read the scratch dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "the quickstart left {left:?}");
}
