//! `narad admin rebuild-metastore`: a new topic list built from what is on disk, for a data
//! directory whose metastore file is lost (the daemon refuses to start on one).
//!
//! What the directories tell: which topics exist and how many partitions each has (the
//! partition directories `p00000`..). What they do not tell, and the rebuilt metastore
//! therefore does not hold: retention limits (every rebuilt topic keeps its records until the
//! operator sets them again), the fan-out children (cursor files name them, so the report
//! lists them, but their routers and delays are gone: re-attach them; a re-attach has a new
//! epoch, so each cursor starts at the new attach point), and the names of uploaded plugins
//! (their module files are moved to `set-aside/plugins/` so the daemon's start does not remove
//! them as unreferenced; deploy them again by name).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_storage::fs::FileSystem;
use narad_storage::{Store, StoreOptions};

use super::set_aside;
use super::startup::{self, TopicDir};
use crate::metastore::file::{BACKUP_FILE_NAME, FILE_NAME};
use crate::metastore::journal;
use crate::metastore::{FileMetastore, Metastore, MetastoreError, TopicMeta};
use crate::topics::intent::{Intent, IntentState};

/// What a rebuild found and recorded.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RebuildReport {
    /// The topics recorded, with their partition counts.
    pub topics: Vec<RebuiltTopic>,
    /// Topic directories left out, with why (an interrupted create or delete, no partitions).
    pub skipped: Vec<String>,
    /// (parent, child) pairs whose cursor files were found: links to attach again.
    pub children_seen: Vec<(String, String)>,
    /// Uploaded plugin modules moved to `set-aside/plugins/`, by file path.
    pub plugin_files: Vec<PathBuf>,
    /// True when nothing was written (`--dry-run`).
    pub dry_run: bool,
}

/// One topic of a rebuild.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RebuiltTopic {
    /// Name.
    pub name: String,
    /// Partition count recorded (one more than the highest partition directory).
    pub partitions: u32,
    /// Bytes of segment files found.
    pub segment_bytes: u64,
    /// Partition indexes below the count that had no directory: made empty by the rebuild, so
    /// they start again at offset 0.
    pub missing_partitions: Vec<u32>,
}

/// Why a rebuild refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RebuildError {
    /// A metastore file is present: a rebuild only replaces a lost one.
    #[error(
        "{} exists; a rebuild only replaces a lost metastore. If it is damaged, follow the \
         daemon's start-up error (restore {} or a backup); move every metastore.* file away \
         first only if you mean to rebuild from the directories",
        path.display(), BACKUP_FILE_NAME
    )]
    MetastorePresent {
        /// The file found.
        path: PathBuf,
    },
    /// The data directory cannot be opened (missing, locked by a running daemon, I/O).
    #[error(transparent)]
    Storage(#[from] narad_storage::StorageError),
    /// Scanning the topic directories failed.
    #[error(transparent)]
    Scan(#[from] startup::StartupError),
    /// Writing the new metastore failed.
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Rebuilds the topic list of `data_dir` from its directories (see the module doc). With
/// `dry_run`, reports what it would record and writes nothing. Takes the data-dir lock, so it
/// refuses to run beside a daemon. Opens the data dir on the real file system.
pub async fn rebuild(data_dir: &Path, dry_run: bool) -> Result<RebuildReport, RebuildError> {
    rebuild_on(crate::durable::real(), data_dir, dry_run).await
}

/// [`rebuild`] of `data_dir` on `fs`: the store, the metastore it writes and the plugin
/// modules it moves are all on `fs`.
pub(crate) async fn rebuild_on(
    fs: Arc<dyn FileSystem>,
    data_dir: &Path,
    dry_run: bool,
) -> Result<RebuildReport, RebuildError> {
    if !fs.metadata(data_dir).is_ok_and(|m| m.is_dir) {
        return Err(RebuildError::Io {
            context: format!("opening the data dir {}", data_dir.display()),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    // A journal continues the snapshot it was written on: a rebuilt snapshot beside it would
    // have the journal's changes replayed over the wrong state.
    for name in [
        FILE_NAME,
        BACKUP_FILE_NAME,
        journal::FILE_NAME,
        journal::BACKUP_FILE_NAME,
    ] {
        let path = data_dir.join(name);
        let present = fs.exists(&path).map_err(|source| RebuildError::Io {
            context: format!("checking {}", path.display()),
            source,
        })?;
        if present {
            return Err(RebuildError::MetastorePresent { path });
        }
    }
    let store = Store::open(
        data_dir,
        StoreOptions {
            fs: Arc::clone(&fs),
            ..StoreOptions::default()
        },
    )?;
    let dirs = startup::scan(&*fs, data_dir)?;
    let mut report = RebuildReport {
        dry_run,
        ..RebuildReport::default()
    };
    let mut children = BTreeSet::new();
    for dir in &dirs {
        match plan_topic(dir) {
            Ok(topic) => {
                for p in dir.partitions.keys() {
                    let part = data_dir
                        .join(narad_storage::store::TOPICS_DIR_NAME)
                        .join(&dir.name)
                        .join(format!("p{p:05}"));
                    for child in cursor_children(&*fs, &part) {
                        children.insert((dir.name.clone(), child));
                    }
                }
                report.topics.push(topic);
            }
            Err(why) => report.skipped.push(format!("{}: {why}", dir.name)),
        }
    }
    report.children_seen = children.into_iter().collect();
    if dry_run {
        report.plugin_files = plugin_files(&*fs, data_dir)?;
        return Ok(report);
    }
    report.plugin_files = move_plugin_files(&*fs, data_dir)?;
    // The report names them: recording them is accepting their loss, so their directories are
    // made empty now (a recorded partition without a directory would be quarantined at start).
    for topic in &report.topics {
        for &p in &topic.missing_partitions {
            store.create_partition(
                &narad_storage::PartitionId::new(topic.name.clone(), p),
                narad_storage::LogConfig::default(),
            )?;
        }
    }
    drop(store);
    let metastore = FileMetastore::open_on(fs, data_dir)?;
    let now = crate::topics::now_ms();
    for topic in &report.topics {
        metastore
            .create_topic(TopicMeta {
                writable_as_child: false,
                name: topic.name.clone(),
                partitions: topic.partitions,
                retention_ms: None,
                retention_bytes: None,
                created_at_ms: now,
                owners: Vec::new(),
            })
            .await?;
    }
    Ok(report)
}

/// The topic a directory stands for, or why it is left out.
fn plan_topic(dir: &TopicDir) -> Result<RebuiltTopic, String> {
    match &dir.intent {
        IntentState::Found(Intent::Delete) => {
            return Err("it was being deleted; the daemon's start finishes the delete".to_owned());
        }
        IntentState::Found(Intent::Create { .. })
            if dir.partitions.values().all(|&bytes| bytes == 0) =>
        {
            return Err(
                "an interrupted create that holds no record; the daemon's start removes it"
                    .to_owned(),
            );
        }
        _ => {}
    }
    let Some((&highest, _)) = dir.partitions.last_key_value() else {
        return Err("it holds no partition directory".to_owned());
    };
    let partitions = highest + 1;
    let missing = (0..partitions)
        .filter(|p| !dir.partitions.contains_key(p))
        .collect();
    Ok(RebuiltTopic {
        name: dir.name.clone(),
        partitions,
        segment_bytes: dir.partitions.values().sum(),
        missing_partitions: missing,
    })
}

/// The children named by the cursor files (`fanout-{child}.offset`) of a partition directory.
fn cursor_children(fs: &dyn FileSystem, partition_dir: &Path) -> Vec<String> {
    let Ok(entries) = fs.read_dir(partition_dir) else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let name = entry.name;
            name.strip_prefix("fanout-")
                .and_then(|rest| rest.strip_suffix(".offset"))
                .map(str::to_owned)
        })
        .collect()
}

fn plugins_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("plugins").join("sha256")
}

fn plugin_files(fs: &dyn FileSystem, data_dir: &Path) -> Result<Vec<PathBuf>, RebuildError> {
    let dir = plugins_dir(data_dir);
    let entries = match fs.read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RebuildError::Io {
                context: format!("listing {}", dir.display()),
                source,
            });
        }
    };
    let builtins: BTreeMap<String, &str> = narad_builtin_plugins::all()
        .iter()
        .map(|&(name, bytes)| (narad_runtime::Digest::of(bytes).to_hex(), name))
        .collect();
    let mut out = Vec::new();
    for entry in entries {
        let path = dir.join(&entry.name);
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if path.extension().is_some_and(|e| e == "wasm") && !builtins.contains_key(stem) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Moves the uploaded (not built-in) plugin modules to `set-aside/plugins/`: no recorded version
/// names them any more, and the daemon's start removes such files.
fn move_plugin_files(fs: &dyn FileSystem, data_dir: &Path) -> Result<Vec<PathBuf>, RebuildError> {
    let files = plugin_files(fs, data_dir)?;
    if files.is_empty() {
        return Ok(files);
    }
    let target = set_aside::plugins_dir(data_dir);
    fs.create_dir_all(&target)
        .map_err(|source| RebuildError::Io {
            context: format!("creating {}", target.display()),
            source,
        })?;
    let mut moved = Vec::new();
    for file in files {
        let Some(name) = file.file_name() else {
            continue;
        };
        let dest = target.join(name);
        fs.rename(&file, &dest).map_err(|source| RebuildError::Io {
            context: format!("moving {} to {}", file.display(), dest.display()),
            source,
        })?;
        moved.push(dest);
    }
    for d in [target.as_path(), &plugins_dir(data_dir)] {
        fs.sync_dir(d).map_err(|source| RebuildError::Io {
            context: format!("syncing {}", d.display()),
            source,
        })?;
    }
    Ok(moved)
}
