//! The API bearer token (`--auth-token-file`): the secret itself, how it is read from its
//! file, and how a presented token is compared with it.
//!
//! It sits below both its users so that neither imports the other: [`crate::config`] loads it,
//! [`crate::api::auth`] requires it on every mutating request.
//!
//! The comparison runs in constant time: both sides are hashed with SHA-256 and the digests
//! compared with no early exit, so neither the content nor the length of the token leaks
//! through response timing.

use std::path::Path;

use sha2::{Digest as _, Sha256};

/// Longest token file read, in bytes: a token is a short secret, and a bigger file is
/// certainly the wrong one.
pub(crate) const MAX_TOKEN_FILE_BYTES: u64 = 4_096;

/// The secret a mutating request must present. Its `Debug` never shows it.
#[derive(Clone)]
pub struct AuthToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

impl PartialEq for AuthToken {
    fn eq(&self, other: &AuthToken) -> bool {
        constant_time_eq(&self.digest, &other.digest)
    }
}

impl Eq for AuthToken {}

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is empty (after trimming whitespace), too long, or not UTF-8 text.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl AuthToken {
    /// A token from its text (surrounding whitespace, such as a trailing newline, is not part
    /// of it). `None` for empty text.
    pub fn new(text: &str) -> Option<AuthToken> {
        let text = text.trim();
        (!text.is_empty()).then(|| AuthToken {
            digest: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// Reads the token from a file holding it (a trailing newline is fine).
    pub fn from_file(path: &Path) -> Result<AuthToken, TokenFileError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|source| TokenFileError::Read {
            path: shown.clone(),
            source,
        })?;
        if meta.len() > MAX_TOKEN_FILE_BYTES {
            return Err(TokenFileError::Invalid {
                path: shown,
                message: format!(
                    "{} bytes is too long for a token file (at most {MAX_TOKEN_FILE_BYTES})",
                    meta.len()
                ),
            });
        }
        let bytes = std::fs::read(path).map_err(|source| TokenFileError::Read {
            path: shown.clone(),
            source,
        })?;
        let text = String::from_utf8(bytes).map_err(|_| TokenFileError::Invalid {
            path: shown.clone(),
            message: "the token is not UTF-8 text".into(),
        })?;
        AuthToken::new(&text).ok_or(TokenFileError::Invalid {
            path: shown,
            message: "the file holds no token".into(),
        })
    }

    /// Whether `given` is the token, in time independent of where they differ.
    pub fn matches(&self, given: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        constant_time_eq(&self.digest, &digest)
    }
}

/// Compares two digests touching every byte, with no data-dependent branch.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_itself_only() {
        let token = AuthToken::new("s3cret\n").unwrap();
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cre"));
        assert!(!token.matches("s3cret2"));
        assert!(!token.matches(""));
    }

    #[test]
    fn an_empty_token_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(
            AuthToken::from_file(&path),
            Err(TokenFileError::Invalid { .. })
        ));
        std::fs::write(&path, "abc\n").unwrap();
        assert_eq!(
            AuthToken::from_file(&path).unwrap(),
            AuthToken::new("abc").unwrap()
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let token = AuthToken::new("hunter2").unwrap();
        assert!(!format!("{token:?}").contains("hunter2"));
    }
}
