//! The registry's typed errors. The HTTP API maps each to a status (`api::error`): a refused
//! module or a bad name is 400, an unknown plugin or digest 404, a plugin in use or a built-in
//! 409, a damaged store or I/O failure 500.

use std::path::PathBuf;

use narad_runtime::{EngineError, LoadError, ModuleLimit};

use crate::metastore::MetastoreError;

/// Errors of the plugin registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A plugin name breaks the name rule: 1 to 64 characters of `a-z 0-9 - _`.
    #[error("invalid plugin name {name:?}: {reason}; a name is 1 to 64 characters of a-z 0-9 - _")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it (its length, or the first character outside the rule).
        reason: narad_abi::ManifestError,
    },
    /// A chain entry is not `name` or `name@digest` with a digest of hex digits (at least
    /// [`super::MIN_DIGEST_PREFIX_HEX`] of them, at most 64).
    #[error("invalid plugin reference {spec:?}: {reason}")]
    InvalidSpec {
        /// The reference given.
        spec: String,
        /// What is wrong with it.
        reason: SpecProblem,
    },
    /// The module was refused by the deploy checks (not Wasm, a forbidden import, a missing
    /// export, a wrong ABI version, a bad manifest, a failure on the built-in test slab, ...).
    #[error("plugin refused: {0}{hint}", hint = limit_hint(.0))]
    Refused(#[source] LoadError),
    /// The upload is empty.
    #[error(
        "the upload is empty; send the .wasm file's bytes as the body (curl --data-binary @plugin.wasm)"
    )]
    Empty,
    /// No version of a plugin with this name exists.
    #[error("no plugin named {name:?}; known plugins: {}", list(known))]
    UnknownPlugin {
        /// The name asked for.
        name: String,
        /// The names that exist, sorted.
        known: Vec<String>,
    },
    /// The plugin exists, but no version of it has this digest.
    #[error(
        "plugin {name:?} has no version with digest {digest}; its versions: {}",
        list(versions)
    )]
    UnknownDigest {
        /// The plugin name.
        name: String,
        /// The digest (or prefix) asked for.
        digest: String,
        /// The digests of its versions, oldest first.
        versions: Vec<String>,
    },
    /// A digest prefix matches more than one version of the plugin.
    #[error("digest prefix {prefix} matches {} versions of plugin {name:?}: {}; give more digits", matches.len(), list(matches))]
    AmbiguousDigest {
        /// The plugin name.
        name: String,
        /// The prefix given.
        prefix: String,
        /// The digests it matches.
        matches: Vec<String>,
    },
    /// A built-in plugin cannot be removed, and no upload may take a built-in's name.
    #[error(
        "{name:?} is a built-in plugin: built-ins are always present, cannot be removed, and their name cannot be deployed to"
    )]
    Builtin {
        /// The built-in's name.
        name: String,
    },
    /// `load` was asked for a digest that is neither loaded, built in, nor stored on disk (nor,
    /// in cluster mode, held by any other live node).
    #[error("no module with digest {digest} is stored on this node or any other live node")]
    NotStored {
        /// The digest, hex.
        digest: String,
    },
    /// A module this node does not hold could not be fetched from another node.
    #[error(
        "the module with digest {digest} is not stored on this node and fetching it from the \
         other nodes failed: {reason}"
    )]
    Fetch {
        /// The digest, hex.
        digest: String,
        /// Why.
        reason: String,
    },
    /// A stored module's bytes no longer hash to its file name: the file was damaged or
    /// replaced on disk. It is never run.
    #[error("stored plugin module {} is damaged: its bytes hash to {found}; restore it by deploying the module again", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The sha256 of what it holds now, hex.
        found: String,
    },
    /// A stored module no longer passes the deploy checks (for example after an upgrade that
    /// tightened them).
    #[error(
        "stored plugin module {digest} no longer loads: {source}{}",
        limit_hint(source)
    )]
    StoredRefused {
        /// The digest, hex.
        digest: String,
        /// Why it was refused.
        #[source]
        source: LoadError,
    },
    /// The metastore refused or failed (a plugin in use, an unknown plugin, I/O).
    #[error(transparent)]
    Metastore(#[from] MetastoreError),
    /// The plugin runtime could not be created.
    #[error("cannot start the plugin runtime: {0}")]
    Engine(#[from] EngineError),
    /// A file-system operation on the content store failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A blocking task (validation, file I/O) panicked or was cancelled.
    #[error("plugin registry task failed: {0}")]
    Task(#[from] crate::blocking::BlockingError),
}

/// What is wrong with a plugin reference's digest (see [`RegistryError::InvalidSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecProblem {
    /// The digest after `@` holds a character that is not a hex digit.
    #[error("the digest after '@' must be hex, found {found:?}")]
    NotHex {
        /// The first such character.
        found: char,
    },
    /// The digest after `@` is too short to be unique or longer than a sha256.
    #[error(
        "the digest after '@' has {digits} hex digits; give {} to {}",
        super::MIN_DIGEST_PREFIX_HEX,
        super::spec::FULL_DIGEST_HEX
    )]
    DigestLength {
        /// How many hex digits it has.
        digits: usize,
    },
    /// A whole digest was expected (64 hex digits), and this is not one.
    #[error("a digest is {} hex digits", super::spec::FULL_DIGEST_HEX)]
    NotADigest,
}

/// The `narad serve` flag that raises a module limit; `None` for the limits the ABI fixes
/// (one memory, a few tables, the table size).
pub fn limit_flag(limit: ModuleLimit) -> Option<&'static str> {
    Some(match limit {
        ModuleLimit::Functions => "--plugin-max-functions",
        ModuleLimit::FunctionBodyBytes => "--plugin-max-function-bytes",
        ModuleLimit::CodeBytes => "--plugin-max-code-bytes",
        ModuleLimit::LocalsPerFunction => "--plugin-max-locals",
        ModuleLimit::DataBytes => "--plugin-max-data-bytes",
        ModuleLimit::MemoryMinimumBytes => "--plugin-memory-bytes",
        ModuleLimit::Types
        | ModuleLimit::Imports
        | ModuleLimit::Exports
        | ModuleLimit::Globals
        | ModuleLimit::DataSegments
        | ModuleLimit::ElementSegments
        | ModuleLimit::ElementItems => "--plugin-max-module-items",
        _ => return None,
    })
}

/// For a module-limit refusal, how the operator raises the limit (appended to the message).
fn limit_hint(error: &LoadError) -> String {
    match error {
        LoadError::ModuleLimit { limit, .. } => match limit_flag(*limit) {
            Some(flag) => {
                let key = flag.trim_start_matches("--");
                format!(
                    "; the node's operator can raise it with {flag} (environment NARAD_{}, config key {key})",
                    key.replace('-', "_").to_uppercase()
                )
            }
            None => "; this limit is fixed by the plugin ABI".to_owned(),
        },
        _ => String::new(),
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".to_owned()
    } else {
        items.join(", ")
    }
}
