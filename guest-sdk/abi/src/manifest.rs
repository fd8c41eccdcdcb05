//! The plugin manifest: UTF-8 JSON in the `narad.manifest` custom section, e.g.
//! `{"name":"key-hash","version":"1.0.0","abi":1,"needs":["keys"],"description":"..."}`.
//!
//! JSON rather than postcard so any language can emit it as a string literal. This crate only
//! defines the type and its rules (with serde derives under the `serde` feature); the host
//! parses the JSON, and the guest SDK's macro writes it at compile time.

use alloc::string::String;

use crate::error::ManifestError;
use crate::layout::Needs;

/// Longest plugin name in bytes (ABI v1 contract).
pub const MAX_NAME_BYTES: usize = 64;
/// Longest plugin version string in bytes (our rule: room for any semver with build metadata).
pub const MAX_VERSION_BYTES: usize = 64;
/// Longest one-line description in bytes (our rule: fits one line of `narad plugin list`).
pub const MAX_DESCRIPTION_BYTES: usize = 200;

/// A plugin's manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct Manifest {
    /// The plugin name: 1..=64 bytes of `[a-z0-9-_]`.
    pub name: String,
    /// The plugin's own version (free-form, e.g. semver).
    pub version: String,
    /// The ABI version the plugin speaks; must be [`crate::ABI_VERSION`].
    pub abi: u32,
    /// What the plugin needs to see of each record; JSON: a list of `"keys"`, `"headers"`,
    /// `"values"`, `"key_hash"`, or `["key_hash_only"]`. Key bytes are given whether `"keys"`
    /// is listed or not, except to a list with `"key_hash"` and without `"keys"`: that plugin
    /// gets the key hashes (and each record's key length, so it knows which have a key) but
    /// no key bytes. `"key_hash_only"`, listed alone, gives the key hashes and no record
    /// table at all (no parent offsets, commit times or key lengths).
    #[cfg_attr(feature = "serde", serde(default))]
    pub needs: Needs,
    /// One line saying what the plugin decides. Optional in the JSON (an absent key is an
    /// empty description): it is only shown in listings.
    #[cfg_attr(feature = "serde", serde(default))]
    pub description: String,
    /// The config the deploy check hands the plugin with its test slab, instead of empty
    /// bytes: a config the plugin accepts, so the check exercises its routing. Optional in
    /// the JSON (absent: empty config); a plugin that declares it must route the test slab
    /// without any error return, `ROUTE_ERR_BAD_CONFIG` included.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub probe_config: Option<String>,
}

impl Manifest {
    /// Checks every rule of ABI v1: name, ABI version, version string, description.
    pub fn validate(&self) -> Result<(), ManifestError> {
        validate_plugin_name(&self.name)?;
        if self.abi != crate::ABI_VERSION {
            return Err(ManifestError::UnsupportedAbi { found: self.abi });
        }
        if self.version.is_empty()
            || self.version.len() > MAX_VERSION_BYTES
            || self
                .version
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ManifestError::BadVersion);
        }
        if self.description.len() > MAX_DESCRIPTION_BYTES
            || self.description.chars().any(char::is_control)
        {
            return Err(ManifestError::BadDescription);
        }
        Ok(())
    }
}

/// Checks a plugin name: 1..=64 bytes of `[a-z0-9-_]` (also the registry's name rule).
pub fn validate_plugin_name(name: &str) -> Result<(), ManifestError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(ManifestError::NameLength { len: name.len() });
    }
    match name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '_'))
    {
        Some(found) => Err(ManifestError::NameCharacter { found }),
        None => Ok(()),
    }
}

#[cfg(feature = "serde")]
mod needs_serde {
    //! `Needs` as a JSON list of names; keys are implied unless `key_hash` comes without them.
    use alloc::vec::Vec;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::layout::Needs;

    // An unknown name is refused by serde with the list of known ones ("unknown variant
    // `payload`, expected one of `keys`, `headers`, `values`, `key_hash`, `key_hash_only`");
    // a host older than a need refuses a module that lists it in the same words.
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Need {
        Keys,
        Headers,
        Values,
        KeyHash,
        KeyHashOnly,
    }

    impl Serialize for Needs {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if !self.table() {
                return [Need::KeyHashOnly].serialize(s);
            }
            let mut list = Vec::with_capacity(4);
            if self.keys() {
                list.push(Need::Keys);
            }
            if self.headers() {
                list.push(Need::Headers);
            }
            if self.values() {
                list.push(Need::Values);
            }
            if self.key_hash() {
                list.push(Need::KeyHash);
            }
            list.serialize(s)
        }
    }

    impl<'de> Deserialize<'de> for Needs {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let list = Vec::<Need>::deserialize(d)?;
            let has = |need: fn(&Need) -> bool| list.iter().any(need);
            if has(|n| matches!(n, Need::KeyHashOnly)) {
                if list.iter().any(|n| !matches!(n, Need::KeyHashOnly)) {
                    return Err(serde::de::Error::custom(
                        "`key_hash_only` is a need of its own: list it alone",
                    ));
                }
                return Ok(Needs::KEY_HASH_ONLY);
            }
            let key_hash = has(|n| matches!(n, Need::KeyHash));
            // ABI v1 gave keys whether listed or not; only a list that asks for the hashes
            // instead can leave the bytes out.
            let keys = has(|n| matches!(n, Need::Keys)) || !key_hash;
            Ok(Needs::from_flags(
                keys,
                has(|n| matches!(n, Need::Headers)),
                has(|n| matches!(n, Need::Values)),
                key_hash,
            ))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        Manifest {
            name: "key-hash".into(),
            version: "1.0.0".into(),
            abi: 1,
            needs: Needs::KEYS,
            description: "Kafka's default partitioner for keyed records".into(),
            probe_config: None,
        }
    }

    #[test]
    fn a_well_formed_manifest_is_valid() {
        assert_eq!(manifest().validate(), Ok(()));
    }

    #[test]
    fn plugin_names_follow_the_abi_rule() {
        assert_eq!(validate_plugin_name("header_route-2"), Ok(()));
        assert_eq!(
            validate_plugin_name(""),
            Err(ManifestError::NameLength { len: 0 })
        );
        assert_eq!(
            validate_plugin_name(&"a".repeat(65)),
            Err(ManifestError::NameLength { len: 65 })
        );
        assert_eq!(
            validate_plugin_name("Key"),
            Err(ManifestError::NameCharacter { found: 'K' })
        );
        assert_eq!(
            validate_plugin_name("a/b"),
            Err(ManifestError::NameCharacter { found: '/' })
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn description_and_probe_config_are_optional_keys() {
        let bare: Manifest =
            serde_json::from_str(r#"{"name":"bare","version":"1","abi":1}"#).unwrap();
        assert_eq!(bare.description, "");
        assert_eq!(bare.probe_config, None);
        assert_eq!(bare.validate(), Ok(()));
        let probed: Manifest = serde_json::from_str(
            r#"{"name":"p","version":"1","abi":1,"probe_config":"partition = 0"}"#,
        )
        .unwrap();
        assert_eq!(probed.probe_config.as_deref(), Some("partition = 0"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn key_hash_alone_leaves_the_key_bytes_out_and_with_keys_keeps_them() {
        let parse = |needs: &str| -> Needs {
            let json = alloc::format!(r#"{{"name":"n","version":"1","abi":1,"needs":{needs}}}"#);
            serde_json::from_str::<Manifest>(&json).unwrap().needs
        };
        assert_eq!(parse(r#"["key_hash"]"#), Needs::KEY_HASH);
        assert_eq!(parse(r#"["keys","key_hash"]"#), Needs::KEYS.with_key_hash());
        assert_eq!(parse(r#"[]"#), Needs::KEYS);
        assert_eq!(parse(r#"["values"]"#), Needs::VALUES);
        for needs in [Needs::KEY_HASH, Needs::ALL.with_key_hash(), Needs::HEADERS] {
            let json = serde_json::to_string(&needs).unwrap();
            assert_eq!(parse(&json), needs, "{json}");
        }
        assert_eq!(
            serde_json::to_string(&Needs::KEY_HASH).unwrap(),
            r#"["key_hash"]"#
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn key_hash_only_stands_alone() {
        use alloc::string::ToString;
        let parse = |needs: &str| {
            let json = alloc::format!(r#"{{"name":"n","version":"1","abi":1,"needs":{needs}}}"#);
            serde_json::from_str::<Manifest>(&json).map(|m| m.needs)
        };
        assert_eq!(parse(r#"["key_hash_only"]"#).unwrap(), Needs::KEY_HASH_ONLY);
        assert_eq!(
            serde_json::to_string(&Needs::KEY_HASH_ONLY).unwrap(),
            r#"["key_hash_only"]"#
        );
        for mixed in [
            r#"["key_hash_only","keys"]"#,
            r#"["values","key_hash_only"]"#,
        ] {
            let err = parse(mixed).unwrap_err().to_string();
            assert!(err.contains("list it alone"), "{mixed}: {err}");
        }
    }

    #[cfg(feature = "serde")]
    #[test]
    fn an_unknown_need_is_refused_naming_the_known_ones() {
        use alloc::string::ToString;
        let err = serde_json::from_str::<Manifest>(
            r#"{"name":"n","version":"1","abi":1,"needs":["payload"]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown variant `payload`"), "{err}");
        assert!(err.contains("`key_hash`"), "{err}");
    }

    #[test]
    fn another_abi_version_is_refused() {
        let m = Manifest {
            abi: 2,
            ..manifest()
        };
        assert_eq!(
            m.validate(),
            Err(ManifestError::UnsupportedAbi { found: 2 })
        );
    }

    #[test]
    fn multi_line_descriptions_and_blank_versions_are_refused() {
        let m = Manifest {
            description: "one\ntwo".into(),
            ..manifest()
        };
        assert_eq!(m.validate(), Err(ManifestError::BadDescription));
        let m = Manifest {
            version: "1 0".into(),
            ..manifest()
        };
        assert_eq!(m.validate(), Err(ManifestError::BadVersion));
    }
}
