//! `header-route`: routes a record by the value of one header, through a map given in the
//! link's config. Shows the two opt-ins a plugin can make: headers (its manifest asks for
//! them, so the host copies them in) and config.
//!
//! Config (the SDK's `key=value` lines; `#` starts a comment):
//!
//! ```text
//! header = region      # required: the header to read (first occurrence, exact name)
//! us = 0               # records whose header value is "us" go to child partition 0
//! eu = 1
//! * = 2                # optional: any other value of the header
//! ```
//!
//! A record without the header, or with a value that is not mapped (and no `*`), is left
//! UNDECIDED for the next plugin of the chain (e.g. `header-route, key-hash, round-robin`).
//! Values are compared byte for byte after the config's whitespace trimming; the keys
//! `header` and `*` are reserved, so those two literal header values cannot be mapped on
//! their own (`*` still catches them). A partition at or past the child's partition count is
//! a config error, reported before any record is routed.
//!
//! Layout: this file only (config parsing, the router and its tests).
#![cfg_attr(not(test), no_std)]

extern crate alloc;

use alloc::format;
use alloc::vec::Vec;

use narad_guest::config::Config;
use narad_guest::{Decisions, RouteContext, RouteError, Slab};

/// Config key naming the header to route by.
const HEADER_KEY: &str = "header";
/// Config key of the partition for any other value of the header.
const FALLBACK_KEY: &str = "*";

/// The parsed routing table.
struct Table<'a> {
    header: &'a str,
    /// `(header value, partition)`, sorted by value for binary search.
    map: Vec<(&'a [u8], u32)>,
    fallback: Option<u32>,
}

impl<'a> Table<'a> {
    fn parse(config: &'a [u8], partitions: u32) -> Result<Self, RouteError> {
        if config.is_empty() {
            return Err(RouteError::bad_config(
                "header-route needs a config: `header=NAME` then `VALUE=PARTITION` lines",
            ));
        }
        let cfg = Config::parse(config)?;
        let header = cfg.require(HEADER_KEY)?;
        let mut map = Vec::with_capacity(cfg.len());
        let mut fallback = None;
        for (key, value) in cfg.entries() {
            if key == HEADER_KEY {
                continue;
            }
            let partition: u32 = value.parse().map_err(|_| {
                RouteError::bad_config(format!("{key:?}: partition {value:?} is not a number"))
            })?;
            if partition >= partitions {
                return Err(RouteError::bad_config(format!(
                    "{key:?} maps to partition {partition} but the child has {partitions}"
                )));
            }
            if key == FALLBACK_KEY {
                fallback = Some(partition);
            } else {
                map.push((key.as_bytes(), partition));
            }
        }
        map.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Ok(Self {
            header,
            map,
            fallback,
        })
    }

    fn lookup(&self, value: &[u8]) -> Option<u32> {
        match self.map.binary_search_by(|(v, _)| (*v).cmp(value)) {
            Ok(i) => self.map.get(i).map(|(_, p)| *p),
            Err(_) => self.fallback,
        }
    }
}

#[narad_guest::router(
    name = "header-route",
    description = "routes by a header's value through a map in the link's config",
    needs = [headers]
)]
fn route(ctx: &RouteContext, slab: &Slab, out: &mut Decisions) -> Result<(), RouteError> {
    let table = Table::parse(ctx.config, ctx.child_partition_count)?;
    for record in slab.records() {
        if let Some(value) = record.header(table.header)?
            && let Some(partition) = table.lookup(value)
        {
            out.decide(&record, partition);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use narad_guest::testing::{SlabBuilder, TestRecord};
    use narad_guest::{RouteError, UNDECIDED};

    use super::PLUGIN;

    const CONFIG: &str = "# by region\nheader = region\nus = 0\neu = 1\n";

    fn region(value: &str) -> TestRecord {
        TestRecord::keyed("k").header("region", value)
    }

    #[test]
    fn mapped_values_go_to_their_partitions() {
        let out = SlabBuilder::new()
            .child("c", 3)
            .config(CONFIG)
            .record(region("eu"))
            .record(region("us"))
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [1, 0]);
    }

    #[test]
    fn absent_or_unmapped_headers_are_left_undecided() {
        let out = SlabBuilder::new()
            .child("c", 3)
            .config(CONFIG)
            .keyed("no-headers")
            .record(region("apac"))
            .record(TestRecord::keyless().header("Region", "eu"))
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [UNDECIDED, UNDECIDED, UNDECIDED]);
    }

    #[test]
    fn the_fallback_catches_unmapped_values_but_not_absent_headers() {
        let out = SlabBuilder::new()
            .child("c", 3)
            .config(format!("{CONFIG}* = 2\n"))
            .record(region("apac"))
            .keyed("no-headers")
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [2, UNDECIDED]);
    }

    #[test]
    fn the_first_occurrence_of_a_repeated_header_wins() {
        let out = SlabBuilder::new()
            .child("c", 3)
            .config(CONFIG)
            .record(region("us").header("region", "eu"))
            .route(&PLUGIN)
            .unwrap();
        assert_eq!(out, [0]);
    }

    #[test]
    fn bad_configs_are_config_errors() {
        for config in [
            "",
            "us = 0\n",
            "header = region\nus = zero\n",
            "header = region\nus = 3\n",
            "header = region\nno equals sign\n",
        ] {
            let err = SlabBuilder::new()
                .child("c", 3)
                .config(config)
                .record(region("us"))
                .route(&PLUGIN)
                .unwrap_err();
            assert!(
                matches!(err, RouteError::BadConfig(_)),
                "{config:?}: {err:?}"
            );
        }
    }

    #[test]
    fn the_manifest_asks_for_headers_but_not_values() {
        assert!(PLUGIN.needs.headers());
        assert!(!PLUGIN.needs.values());
    }
}
