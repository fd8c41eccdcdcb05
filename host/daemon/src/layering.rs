//! Keeps the module layering of `lib.rs` true: every `crate::` path in `src/` must name a
//! top-level module of a lower layer than the file's own, so no module cycle can come back.
//!
//! The check reads the source text (comments dropped), so it sees `use` lines, inline paths
//! such as `crate::fanout::MAX_X` and groups such as `use crate::{a, b}` alike. A new
//! top-level module must be given a layer here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules, lowest layer first. A module may import only from earlier entries.
const LAYERS: &[&[&str]] = &[
    &["protocol"],
    &[
        "shutdown",
        "durable",
        "ownership",
        "fdlimit",
        "auth",
        "scram",
        "acl",
    ],
    &["blocking"],
    &["tls"],
    &["peer"],
    &["config"],
    &["metastore"],
    &["cluster"],
    &["produce"],
    &["topics"],
    &["plugins", "groups"],
    &["fanout"],
    &["reconciler"],
    &["operations"],
    &["api", "kafka"],
    &["http_server"],
    &["server"],
];

/// Files that are no module's: the crate root, and this check (its table names modules).
const NOT_LAYERED: &[&str] = &["lib.rs", "layering.rs"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        // Hidden files (editor locks and swaps) are not modules.
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a piece of source names through `crate::`, comments left out.
fn crate_paths(source: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for line in source.lines() {
        // A `//` inside a string cuts the line short: that can only hide a path, never make
        // one up.
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names = match rest.strip_prefix('{') {
                // `crate::{a, b::c}` (on one line, as rustfmt leaves short groups).
                Some(group) => group.split('}').next().unwrap_or(""),
                None => rest,
            };
            for item in names.split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    named.insert(name);
                }
                if !rest.starts_with('{') {
                    break;
                }
            }
        }
    }
    named
}

#[test]
fn no_module_imports_a_module_of_its_own_or_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let shown = relative.display().to_string();
        if NOT_LAYERED.contains(&shown.as_str()) {
            continue;
        }
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy();
        let module = module.strip_suffix(".rs").unwrap_or(&module);
        let Some(own) = layer_of(module) else {
            problems.push(format!(
                "src/{shown}: module `{module}` has no layer; add it to LAYERS in src/layering.rs"
            ));
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap();
        for named in crate_paths(&source) {
            if named == module {
                continue;
            }
            match layer_of(&named) {
                Some(theirs) if theirs < own => {}
                Some(_) => problems.push(format!(
                    "src/{shown} uses crate::{named}, but `{named}` is not below `{module}` in \
                     the layering (LAYERS in src/layering.rs)"
                )),
                None => problems.push(format!(
                    "src/{shown} uses crate::{named}, a module with no layer in src/layering.rs"
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn crate_paths_are_found_in_uses_groups_and_inline_paths_but_not_comments() {
    let source = "use crate::fanout::cursor::CursorKey;\n\
                  use crate::{api, topics::NewTopic};\n\
                  let n = crate::metastore::link::MAX_DELAY_MS; // crate::cli\n\
                  /// [`crate::server`]\n";
    let found: Vec<String> = crate_paths(source).into_iter().collect();
    assert_eq!(found, ["api", "fanout", "metastore", "topics"]);
}

/// The modules a prose list names in backticks, in order, keeping those `LAYERS` knows.
fn listed_modules(list: &str) -> Vec<String> {
    list.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| layer_of(word).is_some())
        .map(str::to_owned)
        .collect()
}

/// Checks that `list` names every layered module, lowest layer first.
fn check_list(what: &str, list: &str) -> Vec<String> {
    let listed = listed_modules(list);
    let mut problems = Vec::new();
    for layer in LAYERS {
        for module in *layer {
            if !listed.iter().any(|m| m == module) {
                problems.push(format!("{what} does not list `{module}`"));
            }
        }
    }
    for pair in listed.windows(2) {
        if layer_of(&pair[1]) < layer_of(&pair[0]) {
            problems.push(format!(
                "{what} lists `{}` after `{}`, which LAYERS puts above it",
                pair[1], pair[0]
            ));
        }
    }
    problems
}

/// The text of `source` from the line holding `from` to the line holding `to`.
fn between<'a>(source: &'a str, from: &str, to: &str) -> &'a str {
    let start = source.find(from).unwrap_or_else(|| panic!("no {from:?}"));
    let end = source[start..]
        .find(to)
        .map_or(source.len(), |at| start + at);
    &source[start..end]
}

#[test]
fn the_crate_roots_and_the_architecture_pages_layer_lists_are_layers_in_words() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let page = std::fs::read_to_string(root.join("../../docs/architecture.md")).unwrap();
    let mut problems = check_list(
        "src/lib.rs",
        between(&lib, "Modules are layered", "#![cfg_attr"),
    );
    problems.extend(check_list(
        "docs/architecture.md",
        between(&page, "Lowest first:", "This list is `LAYERS`"),
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
