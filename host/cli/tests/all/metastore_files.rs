//! The embedded metastore's files in a data dir (`metastore.json`, its backup and journals),
//! saved and put back whole: what an operator's own backup of them is, for tests of a restore
//! to an older metadata state.

use std::fs;
use std::path::Path;

/// Every `metastore.*` file of a data dir, by name.
pub struct Saved(Vec<(String, Vec<u8>)>);

fn names(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("metastore."))
        .collect();
    names.sort();
    names
}

/// A copy of the metastore's files as they are now (the daemon stopped).
pub fn save(data_dir: &Path) -> Saved {
    Saved(
        names(data_dir)
            .into_iter()
            .map(|n| {
                let bytes = fs::read(data_dir.join(&n)).unwrap();
                (n, bytes)
            })
            .collect(),
    )
}

/// Puts `saved` back: the metastore's files are exactly those saved, older changes only.
pub fn restore(data_dir: &Path, saved: &Saved) {
    remove_all(data_dir);
    for (name, bytes) in &saved.0 {
        fs::write(data_dir.join(name), bytes).unwrap();
    }
}

/// Removes every metastore file: a data dir whose metadata was lost.
pub fn remove_all(data_dir: &Path) {
    for name in names(data_dir) {
        fs::remove_file(data_dir.join(name)).unwrap();
    }
}

/// The entries of the journal of changes since the snapshot, oldest first (empty without one).
pub fn journal_entries(data_dir: &Path) -> Vec<serde_json::Value> {
    let Ok(text) = fs::read_to_string(data_dir.join("metastore.journal")) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["entry"].clone())
        .collect()
}
