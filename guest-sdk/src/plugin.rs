//! [`Plugin`]: what `#[router]` generates from the author's function, used by the wasm
//! exports and by the native test harness alike.

use narad_abi::{Needs, RouteContextRef, SlabView};

use crate::decisions::Decisions;
use crate::error::RouteError;

/// The signature every router is adapted to: per-instance state, context, slab, decisions.
pub type RouteFn<S> = for<'c, 's, 'd> fn(
    &mut S,
    &RouteContextRef<'c>,
    &SlabView<'s>,
    &mut Decisions<'d>,
) -> Result<(), RouteError>;

/// A router and its manifest. `#[narad_guest::router]` defines one as `pub static PLUGIN`.
///
/// `S` is the router's per-instance state (`()` for a stateless router). The host keeps one
/// instance per plugin per link, so state such as a round-robin counter belongs to the link.
pub struct Plugin<S: 'static = ()> {
    /// Plugin name (`[a-z0-9-_]`, 1..=64 bytes).
    pub name: &'static str,
    /// Plugin version.
    pub version: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// What the router needs to see of each record.
    pub needs: Needs,
    /// The manifest JSON, byte for byte what the `narad.manifest` section holds.
    pub manifest_json: &'static str,
    route: RouteFn<S>,
}

impl<S> Plugin<S> {
    /// A plugin descriptor (called by the macro's generated code).
    pub const fn new(
        name: &'static str,
        version: &'static str,
        description: &'static str,
        needs: Needs,
        manifest_json: &'static str,
        route: RouteFn<S>,
    ) -> Self {
        Self {
            name,
            version,
            description,
            needs,
            manifest_json,
            route,
        }
    }

    /// Routes a parsed slab into `out` (one slot per record, pre-filled with `UNDECIDED`).
    pub fn route_slab(
        &self,
        state: &mut S,
        slab: &SlabView<'_>,
        out: &mut [u32],
    ) -> Result<(), RouteError> {
        if out.len() != slab.len() {
            return Err(RouteError::plugin(alloc::format!(
                "{} output slots for {} records",
                out.len(),
                slab.len()
            )));
        }
        let ctx = slab.context()?;
        let mut decisions = Decisions::new(out);
        (self.route)(state, &ctx, slab, &mut decisions)
    }
}

impl<S> core::fmt::Debug for Plugin<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("needs", &self.needs)
            .finish_non_exhaustive()
    }
}
