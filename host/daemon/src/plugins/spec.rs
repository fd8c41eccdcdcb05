//! Resolving a chain entry (`name` or `name@digest`) to one stored version: pure functions
//! over the metastore's list of versions, so the rules are tested without a runtime.
//!
//! - `name`: the newest version of that name (the last one recorded; versions are kept oldest
//!   first).
//! - `name@digest`: exactly that version. The digest is the full 64-hex sha256 or a prefix of
//!   at least [`MIN_DIGEST_PREFIX_HEX`] hex digits that matches one version of the name; an
//!   optional `sha256:` before it is accepted (it is how digests are displayed), and upper-case
//!   hex is read as lower-case.

use crate::metastore::{PluginRef, PluginVersion};

use super::error::{RegistryError, SpecProblem};

/// Fewest hex digits a digest prefix may have: 12 (48 bits), enough that a prefix copied from
/// a listing stays unique among any realistic number of versions, short enough to type.
pub const MIN_DIGEST_PREFIX_HEX: usize = 12;

/// Hex digits of a full sha256 digest: 32 bytes, two digits each.
pub(crate) const FULL_DIGEST_HEX: usize = 64;

/// Checks the registry's name rule: 1 to 64 characters of `a-z 0-9 - _` (the ABI's manifest
/// name rule, so any manifest name is also a valid registry name).
pub fn validate_name(name: &str) -> Result<(), RegistryError> {
    narad_abi::validate_plugin_name(name).map_err(|reason| RegistryError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// Resolves `spec` against `versions` (oldest first).
pub(crate) fn resolve(versions: &[PluginVersion], spec: &str) -> Result<PluginRef, RegistryError> {
    let (name, digest) = match spec.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (spec, None),
    };
    validate_name(name)?;
    let of_name: Vec<&PluginVersion> = versions.iter().filter(|v| v.name == name).collect();
    let Some(newest) = of_name.last() else {
        let mut known: Vec<String> = versions.iter().map(|v| v.name.clone()).collect();
        known.sort();
        known.dedup();
        return Err(RegistryError::UnknownPlugin {
            name: name.to_owned(),
            known,
        });
    };
    let Some(digest) = digest else {
        return Ok(PluginRef {
            name: name.to_owned(),
            digest: newest.digest.clone(),
        });
    };
    let prefix = parse_digest(spec, digest)?;
    let mut matches: Vec<&str> = of_name
        .iter()
        .map(|v| v.digest.as_str())
        .filter(|d| d.starts_with(&prefix))
        .collect();
    matches.dedup();
    match matches.as_slice() {
        [one] => Ok(PluginRef {
            name: name.to_owned(),
            digest: (*one).to_owned(),
        }),
        [] => Err(RegistryError::UnknownDigest {
            name: name.to_owned(),
            digest: prefix,
            versions: of_name.iter().map(|v| v.digest.clone()).collect(),
        }),
        many => Err(RegistryError::AmbiguousDigest {
            name: name.to_owned(),
            prefix,
            matches: many.iter().map(|d| (*d).to_owned()).collect(),
        }),
    }
}

/// The lower-case hex of a digest or digest prefix, checked.
fn parse_digest(spec: &str, digest: &str) -> Result<String, RegistryError> {
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or(digest)
        .to_ascii_lowercase();
    let invalid = |reason: SpecProblem| RegistryError::InvalidSpec {
        spec: spec.to_owned(),
        reason,
    };
    if let Some(found) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(invalid(SpecProblem::NotHex { found }));
    }
    if hex.len() < MIN_DIGEST_PREFIX_HEX || hex.len() > FULL_DIGEST_HEX {
        return Err(invalid(SpecProblem::DigestLength { digits: hex.len() }));
    }
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, digest_byte: char) -> PluginVersion {
        PluginVersion {
            name: name.into(),
            digest: digest_byte.to_string().repeat(64),
            size_bytes: 1,
            version: "1".into(),
            description: String::new(),
            uploaded_at_ms: 0,
        }
    }

    #[test]
    fn a_bare_name_resolves_to_its_newest_version() {
        let versions = [version("a", '1'), version("b", '2'), version("a", '3')];
        let r = resolve(&versions, "a").unwrap();
        assert_eq!(r.digest, "3".repeat(64));
        assert_eq!(r.name, "a");
    }

    #[test]
    fn a_digest_or_unique_prefix_pins_the_exact_version() {
        let versions = [version("a", '1'), version("a", '3')];
        let full = "1".repeat(64);
        assert_eq!(
            resolve(&versions, &format!("a@{full}")).unwrap().digest,
            full
        );
        assert_eq!(resolve(&versions, "a@111111111111").unwrap().digest, full);
        assert_eq!(
            resolve(&versions, &format!("a@sha256:{}", "1".repeat(20)))
                .unwrap()
                .digest,
            full
        );
    }

    #[test]
    fn short_non_hex_unknown_and_ambiguous_digests_are_refused() {
        let mut twin = version("a", '1');
        twin.digest = format!("{}{}", "1".repeat(12), "f".repeat(52));
        let versions = [version("a", '1'), twin, version("b", 'c')];
        assert!(matches!(
            resolve(&versions, "a@11111111111"),
            Err(RegistryError::InvalidSpec {
                reason: SpecProblem::DigestLength { digits: 11 },
                ..
            })
        ));
        assert!(matches!(
            resolve(&versions, "a@11111111111z"),
            Err(RegistryError::InvalidSpec {
                reason: SpecProblem::NotHex { found: 'z' },
                ..
            })
        ));
        assert!(matches!(
            resolve(&versions, "a@111111111111"),
            Err(RegistryError::AmbiguousDigest { ref matches, .. }) if matches.len() == 2
        ));
        // b's digest is not a version of a.
        assert!(matches!(
            resolve(&versions, &format!("a@{}", "c".repeat(64))),
            Err(RegistryError::UnknownDigest { ref versions, .. }) if versions.len() == 2
        ));
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let versions = [version("b", '1'), version("a", '2'), version("b", '3')];
        match resolve(&versions, "c") {
            Err(RegistryError::UnknownPlugin { name, known }) => {
                assert_eq!(name, "c");
                assert_eq!(known, ["a", "b"]);
            }
            other => panic!("expected UnknownPlugin, got {other:?}"),
        }
        assert!(matches!(
            resolve(&versions, "Bad Name"),
            Err(RegistryError::InvalidName {
                reason: narad_abi::ManifestError::NameCharacter { found: 'B' },
                ..
            })
        ));
    }
}
