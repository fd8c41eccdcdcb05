//! A link as this node's cursors see it: its metadata, its router chain and its shadow, shared
//! by the link's cursors and swapped by the reconciler.

use std::sync::{Arc, RwLock};

use super::route::SharedRouter;
use super::shadow::Shadow;
use crate::metastore::link::LinkMeta;

/// A link as the cursors of this node see it: its metadata, swapped when the link changes,
/// and its router chain, shared by its cursors.
pub struct LinkRuntime {
    meta: RwLock<Arc<LinkMeta>>,
    /// The router chain; replacing what it holds takes effect at every cursor's next slab.
    pub router: SharedRouter,
    /// The link's shadow on this node, if one is set: offered every slab once it is routed.
    shadow: RwLock<Option<Arc<Shadow>>>,
    /// Wakes the link's paused cursors when its metadata is replaced (a resume, say).
    pub(super) changed: tokio::sync::Notify,
}

impl LinkRuntime {
    /// A link runtime for `meta` routing through `router`, with no shadow.
    pub fn new(meta: LinkMeta, router: SharedRouter) -> LinkRuntime {
        LinkRuntime {
            meta: RwLock::new(Arc::new(meta)),
            router,
            shadow: RwLock::new(None),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The link's shadow, if one runs.
    pub fn shadow(&self) -> Option<Arc<Shadow>> {
        match self.shadow.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the link's shadow (`None`: no shadow); cursors offer their next routed slab
    /// to the new one. The link's own chain is not touched.
    pub(crate) fn set_shadow(&self, shadow: Option<Arc<Shadow>>) {
        match self.shadow.write() {
            Ok(mut guard) => *guard = shadow,
            Err(poisoned) => *poisoned.into_inner() = shadow,
        }
    }

    /// The link's current metadata.
    pub fn meta(&self) -> Arc<LinkMeta> {
        match self.meta.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the link's metadata (router change, topic change, pause or resume) and wakes
    /// the cursors waiting on it.
    pub fn set_meta(&self, meta: LinkMeta) {
        match self.meta.write() {
            Ok(mut guard) => *guard = Arc::new(meta),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(meta),
        }
        self.changed.notify_waiters();
    }
}
