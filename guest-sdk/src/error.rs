//! [`RouteError`]: how a router says it failed, mapped onto the ABI's return codes.

use alloc::string::String;
use core::fmt;

use narad_abi::{LayoutError, RouteStatus};

use crate::config::ConfigError;

/// Why a router could not route a slab. The host counts it, keeps the slab uncommitted and
/// retries with backoff; the message reaches it through `narad_last_error`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    /// A plugin-defined failure (`ROUTE_ERR_PLUGIN`), e.g. a child with no partitions.
    Plugin(String),
    /// The input buffer could not be decoded (`ROUTE_ERR_BAD_INPUT`); `?` on a record
    /// accessor produces it.
    BadInput(LayoutError),
    /// The link's config is not valid for this plugin (`ROUTE_ERR_BAD_CONFIG`); `?` on a
    /// [`crate::config::Config`] call produces it.
    BadConfig(String),
}

impl RouteError {
    /// A plugin-defined failure with `message`.
    pub fn plugin(message: impl Into<String>) -> Self {
        Self::Plugin(message.into())
    }

    /// A config error with `message`.
    pub fn bad_config(message: impl Into<String>) -> Self {
        Self::BadConfig(message.into())
    }

    /// The `narad_route` return code for this error.
    pub fn status(&self) -> RouteStatus {
        match self {
            Self::Plugin(_) => RouteStatus::Plugin,
            Self::BadInput(_) => RouteStatus::BadInput,
            Self::BadConfig(_) => RouteStatus::BadConfig,
        }
    }
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plugin(m) => f.write_str(m),
            Self::BadInput(e) => write!(f, "bad input: {e}"),
            Self::BadConfig(m) => write!(f, "bad config: {m}"),
        }
    }
}

impl core::error::Error for RouteError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::BadInput(e) => Some(e),
            _ => None,
        }
    }
}

impl From<LayoutError> for RouteError {
    fn from(e: LayoutError) -> Self {
        Self::BadInput(e)
    }
}

impl From<ConfigError> for RouteError {
    fn from(e: ConfigError) -> Self {
        use alloc::string::ToString;
        Self::BadConfig(e.to_string())
    }
}
