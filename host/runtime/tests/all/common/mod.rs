//! Plugins written in WAT for the runtime's tests, and helpers to build slabs.
#![allow(dead_code)]

use narad_runtime::testkit::WatRouter;
use narad_runtime::{RecordInput, RouteContext, Runtime, RuntimeConfig};

/// What a generated plugin does with a record whose key starts with `X` (the poison marker),
/// or with every record when [`Spec::always`] is set.
#[derive(Clone, Copy, Debug)]
pub enum Poison {
    /// Nothing special: the record is decided like the others.
    None,
    /// `loop { }`: burns fuel forever.
    EndlessLoop,
    /// `loop { memory.grow 16 pages }`.
    GrowBomb,
    /// `unreachable`.
    Trap,
    /// What the SDK's panic handler does: logs [`PANIC_LINE`] at error level, then
    /// `unreachable`.
    Panic,
    /// Writes 99 in the record's slot and returns 0.
    OutOfRange,
    /// Returns the record count, as if the ABI wanted a length.
    ReturnCount,
    /// Returns -1 with a message from `narad_last_error`.
    ErrorReturn,
    /// Returns -1 with a message whose first character is `'A' + attempt` (the context's
    /// attempt, read at its fixed place in [`context`]'s encoding).
    ErrorNamingAttempt,
    /// Returns -3 (`ROUTE_ERR_BAD_CONFIG`) with a message.
    BadConfig,
    /// Returns -3 unless the link's config ends in `1` (the context's last byte).
    NeedsConfigEndingInOne,
    /// Leaves the record undecided.
    Skip,
    /// Calls `narad.log` 1,000 times, then decides the record.
    LogFlood,
    /// Decides the record to partition 0.
    PinZero,
    /// Unbounded recursion.
    Recurse,
}

/// The line [`Poison::Panic`] logs before it traps.
pub const PANIC_LINE: &str = "plugin panicked: no tier for key X at src/lib.rs:7:9";

/// A generated plugin.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: &'static str,
    pub poison: Poison,
    /// Apply the poison behaviour to every record, not only `X` keys.
    pub always: bool,
    /// What `narad_abi_version` returns.
    pub abi_version: i32,
    /// Extra import declarations (WAT).
    pub imports: &'static str,
    /// Exports left out by name.
    pub omit_export: Option<&'static str>,
    /// The manifest sections (raw JSON texts); default one valid manifest.
    pub manifests: Vec<String>,
    /// Decide every non-poison record (else leave them undecided).
    pub decides: bool,
    /// A WAT condition replacing "the key starts with X" (locals: `$b` first key byte or -1,
    /// `$e` the record's table entry address, `$i` its index).
    pub condition: Option<&'static str>,
}

impl Spec {
    pub fn new(name: &'static str) -> Self {
        Spec {
            name,
            poison: Poison::None,
            always: false,
            abi_version: 1,
            imports: "",
            omit_export: None,
            manifests: vec![manifest_json(name, 1)],
            decides: true,
            condition: None,
        }
    }

    pub fn when(mut self, condition: &'static str) -> Self {
        self.condition = Some(condition);
        self
    }

    pub fn poison(mut self, poison: Poison) -> Self {
        self.poison = poison;
        self
    }

    pub fn always(mut self) -> Self {
        self.always = true;
        self
    }

    pub fn undecided_by_default(mut self) -> Self {
        self.decides = false;
        self
    }

    pub fn wasm(&self) -> Vec<u8> {
        wat::parse_str(self.wat()).unwrap()
    }

    pub fn wat(&self) -> String {
        let poison = match self.poison {
            Poison::None => "",
            Poison::EndlessLoop => "(loop $spin (br $spin))",
            Poison::GrowBomb => "(loop $grow (drop (memory.grow (i32.const 16))) (br $grow))",
            Poison::Trap => "unreachable",
            Poison::Panic => {
                "(call $log (i32.const 0) (i32.const 64) (i32.const 52)) unreachable"
            }
            Poison::OutOfRange => {
                "(i32.store (local.get $slot) (i32.const 99)) (return (i32.const 0))"
            }
            Poison::ReturnCount => "(return (local.get $n))",
            Poison::ErrorReturn => "(return (i32.const -1))",
            // context(): "orders", 3, 4, "analytics", count: the attempt is byte 20.
            Poison::ErrorNamingAttempt => {
                "(i32.store8 (i32.const 16) (i32.add (i32.const 65)
                   (i32.load8_u offset=20 (i32.add (local.get $in) (i32.load offset=8 (local.get $in))))))
                 (return (i32.const -1))"
            }
            Poison::BadConfig => "(return (i32.const -3))",
            Poison::NeedsConfigEndingInOne => {
                "(if (i32.ne (i32.const 49) (i32.load8_u (i32.sub
                      (i32.add (i32.add (local.get $in) (i32.load offset=8 (local.get $in)))
                               (i32.load offset=12 (local.get $in)))
                      (i32.const 1))))
                   (then (return (i32.const -3))))"
            }
            Poison::Recurse => "(call $recurse)",
            Poison::PinZero => "(i32.store (local.get $slot) (i32.const 0))",
            Poison::Skip => "(local.set $i (i32.add (local.get $i) (i32.const 1))) (br $next)",
            Poison::LogFlood => {
                "(local.set $k (i32.const 0))
                 (block $flooded (loop $flood
                   (br_if $flooded (i32.ge_u (local.get $k) (i32.const 1000)))
                   (call $log (i32.const 2) (i32.const 16) (i32.const 24))
                   (local.set $k (i32.add (local.get $k) (i32.const 1)))
                   (br $flood)))"
            }
        };
        let condition = if self.always {
            "(i32.const 1)".to_owned()
        } else if let Some(condition) = self.condition {
            condition.to_owned()
        } else {
            "(i32.eq (local.get $b) (i32.const 88))".to_owned()
        };
        let decide = if self.decides {
            // Partition = first key byte & 1 (keyless and empty keys give 1).
            "(i32.store (local.get $slot) (i32.and (local.get $b) (i32.const 1)))"
        } else {
            ""
        };
        let log_import = if matches!(self.poison, Poison::LogFlood | Poison::Panic) {
            r#"(import "narad" "log" (func $log (param i32 i32 i32)))"#
        } else {
            ""
        };
        let mut router = WatRouter::new(self.name)
            .abi_version(self.abi_version)
            .imports(&format!("{log_import} {}", self.imports))
            .items(&format!(
                r#"(data (i32.const 16) "no route for this record") (data (i32.const 64) "{PANIC_LINE}")
                   (func $recurse (call $recurse))"#
            ))
            .last_error("(i64.const 0x1000000018)")
            .manifests(self.manifests.clone())
            .route(
                "(local $n i32) (local $i i32) (local $table i32) (local $arena i32) (local $e i32)
                 (local $klen i32) (local $b i32) (local $slot i32) (local $k i32)",
                &format!(
                    r#"(local.set $n (i32.load offset=4 (local.get $in)))
    (local.set $table (i32.add (local.get $in) (i32.load offset=16 (local.get $in))))
    (local.set $arena (i32.add (local.get $in) (i32.load offset=20 (local.get $in))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $e (i32.add (local.get $table) (i32.mul (local.get $i) (i32.const 40))))
        (local.set $slot (i32.add (local.get $out) (i32.mul (local.get $i) (i32.const 4))))
        (local.set $klen (i32.load offset=20 (local.get $e)))
        (local.set $b (i32.const -1))
        (if (i32.and (i32.ne (local.get $klen) (i32.const -1)) (i32.ne (local.get $klen) (i32.const 0)))
          (then (local.set $b (i32.load8_u (i32.add (local.get $arena) (i32.load offset=16 (local.get $e)))))))
        (if {condition} (then {poison}))
        {decide}
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))"#
                ),
            );
        if let Some(export) = self.omit_export {
            router = router.omit_export(export);
        }
        router.wat()
    }
}

pub fn manifest_json(name: &str, abi: u32) -> String {
    format!(
        r#"{{"name":"{name}","version":"1.0.0","abi":{abi},"needs":["keys"],"description":"a test plugin"}}"#
    )
}

pub fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig::default()).unwrap()
}

pub fn context(child_partitions: u32) -> RouteContext {
    RouteContext {
        parent_topic: "orders".into(),
        parent_partition: 3,
        parent_partition_count: 4,
        child_topic: "analytics".into(),
        child_partition_count: child_partitions,
        attempt: 0,
        config: Vec::new(),
    }
}

/// Owned records with keys, to borrow as `RecordInput`s.
pub struct Slab {
    pub keys: Vec<Option<Vec<u8>>>,
    pub first_offset: u64,
}

impl Slab {
    pub fn new(first_offset: u64, keys: &[Option<&[u8]>]) -> Self {
        Slab {
            keys: keys.iter().map(|k| k.map(<[u8]>::to_vec)).collect(),
            first_offset,
        }
    }

    pub fn records(&self) -> Vec<RecordInput<'_>> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, key)| RecordInput {
                parent_offset: self.first_offset + i as u64,
                committed_at_ms: 1_700_000_000_000 + i as i64,
                key: key.as_deref(),
                headers: &[],
                value: b"v",
            })
            .collect()
    }
}
