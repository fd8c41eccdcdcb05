//! Routing plugins written in WAT, for tests (feature `test-support`, and this crate's tests).
//!
//! Every hostile or odd plugin a test needs has the same shell: a memory, a bump allocator,
//! the five ABI exports and a `narad.manifest` section. [`WatRouter`] writes that shell once and
//! lets a test change only what it is about (the route body, an import, a missing export, the
//! ABI version, extra functions, the error message), so a change to the ABI is made here, not in
//! every test that builds a module.

/// A routing plugin in WAT. [`WatRouter::new`] gives one that decides nothing (which the deploy
/// check allows); the setters change one part each.
#[derive(Clone, Debug)]
pub struct WatRouter {
    name: String,
    version: String,
    abi_version: i32,
    needs: String,
    description: String,
    imports: String,
    items: String,
    heap_base: u32,
    memory_pages: u32,
    last_error: String,
    route_locals: String,
    route: String,
    omit_export: Option<String>,
    extra_functions: usize,
    manifests: Option<Vec<String>>,
}

/// The exports the ABI asks of a plugin, in the order the shell writes them.
const EXPORTS: [&str; 5] = [
    "narad_abi_version",
    "narad_alloc",
    "narad_dealloc",
    "narad_last_error",
    "narad_route",
];

impl WatRouter {
    /// A router named `name` (version 1.0.0, ABI 1, needing keys) that decides nothing.
    pub fn new(name: &str) -> WatRouter {
        WatRouter {
            name: name.to_owned(),
            version: "1.0.0".to_owned(),
            abi_version: 1,
            needs: r#"["keys"]"#.to_owned(),
            description: "a WAT test plugin".to_owned(),
            imports: String::new(),
            items: String::new(),
            heap_base: 1024,
            memory_pages: 2,
            last_error: "(i64.const 0)".to_owned(),
            route_locals: String::new(),
            route: String::new(),
            omit_export: None,
            extra_functions: 0,
            manifests: None,
        }
    }

    /// The manifest's `needs`, as the JSON list it is written as (e.g. `["key_hash"]`).
    pub fn needs(mut self, needs: &str) -> WatRouter {
        self.needs = needs.to_owned();
        self
    }

    /// The manifest's version.
    pub fn version(mut self, version: &str) -> WatRouter {
        self.version = version.to_owned();
        self
    }

    /// What `narad_abi_version` returns (the manifest keeps ABI 1).
    pub fn abi_version(mut self, version: i32) -> WatRouter {
        self.abi_version = version;
        self
    }

    /// The manifest's description.
    pub fn description(mut self, description: &str) -> WatRouter {
        self.description = description.to_owned();
        self
    }

    /// Imports (WAT text), written before the memory, e.g.
    /// `(import "narad" "log" (func $log (param i32 i32 i32)))`.
    pub fn imports(mut self, imports: &str) -> WatRouter {
        self.imports = imports.to_owned();
        self
    }

    /// More module fields (WAT text): data segments, helper functions.
    pub fn items(mut self, items: &str) -> WatRouter {
        self.items = items.to_owned();
        self
    }

    /// Where the allocator starts handing out memory (below it: the test's data segments).
    pub fn heap_base(mut self, base: u32) -> WatRouter {
        self.heap_base = base;
        self
    }

    /// Initial memory, in 64 KiB pages.
    pub fn memory_pages(mut self, pages: u32) -> WatRouter {
        self.memory_pages = pages;
        self
    }

    /// The body of `narad_last_error`, leaving an i64 (`ptr << 32 | len`).
    pub fn last_error(mut self, body: &str) -> WatRouter {
        self.last_error = body.to_owned();
        self
    }

    /// The body of `narad_route (param $in i32) (param $len i32) (param $out i32) (result i32)`
    /// after the `locals` it declares (e.g. `(local $i i32)`). The function returns 0 (routed)
    /// after the body; a body returns anything else with `return`.
    pub fn route(mut self, locals: &str, body: &str) -> WatRouter {
        self.route_locals = locals.to_owned();
        self.route = body.to_owned();
        self
    }

    /// Leaves out one of the ABI's exports (the function stays, unexported).
    pub fn omit_export(mut self, export: &str) -> WatRouter {
        self.omit_export = Some(export.to_owned());
        self
    }

    /// Adds `count` empty functions, to make the module bigger.
    pub fn extra_functions(mut self, count: usize) -> WatRouter {
        self.extra_functions = count;
        self
    }

    /// Replaces the manifest with these `narad.manifest` sections (JSON texts; none, or more
    /// than one, for the tests of those refusals).
    pub fn manifests(mut self, manifests: Vec<String>) -> WatRouter {
        self.manifests = Some(manifests);
        self
    }

    /// The manifest [`WatRouter::new`] and the setters describe, as JSON.
    pub fn manifest_json(&self) -> String {
        format!(
            r#"{{"name":"{}","version":"{}","abi":1,"needs":{},"description":"{}"}}"#,
            self.name, self.version, self.needs, self.description
        )
    }

    /// The module's WAT text.
    pub fn wat(&self) -> String {
        let exports: String = EXPORTS
            .iter()
            .filter(|name| self.omit_export.as_deref() != Some(**name))
            .map(|name| format!(r#"(export "{name}" (func ${name}))"#))
            .collect();
        let manifests = self
            .manifests
            .clone()
            .unwrap_or_else(|| vec![self.manifest_json()]);
        let manifests: String = manifests
            .iter()
            .map(|m| format!(r#"(@custom "narad.manifest" "{}")"#, m.replace('"', "\\\"")))
            .collect();
        format!(
            r#"(module
  {imports}
  (memory (export "memory") {pages})
  (global $bump (mut i32) (i32.const {heap_base}))
  {items}
  (func $narad_abi_version (result i32) (i32.const {abi}))
  (func $narad_alloc (param $size i32) (result i32)
    (local $p i32) (local $end i32) (local $have i32)
    (local.set $p (i32.and (i32.add (global.get $bump) (i32.const 7)) (i32.const -8)))
    (local.set $end (i32.add (local.get $p) (local.get $size)))
    (local.set $have (i32.mul (memory.size) (i32.const 65536)))
    (if (i32.gt_u (local.get $end) (local.get $have))
      (then
        (if (i32.lt_s
              (memory.grow (i32.add (i32.shr_u (i32.sub (local.get $end) (local.get $have)) (i32.const 16)) (i32.const 1)))
              (i32.const 0))
          (then (return (i32.const 0))))))
    (global.set $bump (local.get $end))
    (local.get $p))
  (func $narad_dealloc (param i32 i32))
  (func $narad_last_error (result i64) {last_error})
  (func $narad_route (param $in i32) (param $len i32) (param $out i32) (result i32)
    {locals}
    {route}
    (i32.const 0))
  {extra}
  {exports}
  {manifests}
)"#,
            imports = self.imports,
            pages = self.memory_pages,
            heap_base = self.heap_base,
            items = self.items,
            abi = self.abi_version,
            last_error = self.last_error,
            locals = self.route_locals,
            route = self.route,
            extra = "(func)".repeat(self.extra_functions),
        )
    }

    /// The module compiled to Wasm. Panics, with the text, on WAT that does not parse: the
    /// test that wrote it is wrong.
    pub fn wasm(&self) -> Vec<u8> {
        let text = self.wat();
        wat::parse_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }
}

/// `bytes` as the body of a WAT string, every byte hex-escaped (for data segments).
pub fn wat_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Plugin, Runtime, RuntimeConfig};

    #[test]
    fn the_default_router_loads_and_each_setter_changes_what_the_runtime_sees() {
        let runtime = Runtime::new(RuntimeConfig::default()).unwrap();
        let plugin = Plugin::load(&runtime, &WatRouter::new("plain").wasm());
        assert!(plugin.is_ok(), "{:?}", plugin.err());
        for (broken, why) in [
            (
                WatRouter::new("x").omit_export("narad_route"),
                "narad_route",
            ),
            (WatRouter::new("x").abi_version(9), "9"),
            (WatRouter::new("x").manifests(Vec::new()), "manifest"),
        ] {
            let err = Plugin::load(&runtime, &broken.wasm())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(why), "{why}: {err:?}");
        }
    }
}
