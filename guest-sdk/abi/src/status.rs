//! `narad_route` return codes. Negative values are errors, like the `#[repr(i32)]` codes
//! other Wasm plugin ABIs use, so a C guest can return them as plain integers.

/// The slab was routed; the output slots hold the decisions.
pub const ROUTE_OK: i32 = 0;
/// Plugin-defined failure; `narad_last_error` describes it.
pub const ROUTE_ERR_PLUGIN: i32 = -1;
/// The guest could not decode the input buffer.
pub const ROUTE_ERR_BAD_INPUT: i32 = -2;
/// The link's config bytes are not valid for this plugin.
pub const ROUTE_ERR_BAD_CONFIG: i32 = -3;

/// A `narad_route` return value that the ABI defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum RouteStatus {
    /// [`ROUTE_OK`].
    Ok = ROUTE_OK,
    /// [`ROUTE_ERR_PLUGIN`].
    Plugin = ROUTE_ERR_PLUGIN,
    /// [`ROUTE_ERR_BAD_INPUT`].
    BadInput = ROUTE_ERR_BAD_INPUT,
    /// [`ROUTE_ERR_BAD_CONFIG`].
    BadConfig = ROUTE_ERR_BAD_CONFIG,
}

impl RouteStatus {
    /// The status for a raw return value, or `None` for a value the ABI does not define (a
    /// protocol violation the host reports as such).
    pub const fn from_code(code: i32) -> Option<Self> {
        match code {
            ROUTE_OK => Some(Self::Ok),
            ROUTE_ERR_PLUGIN => Some(Self::Plugin),
            ROUTE_ERR_BAD_INPUT => Some(Self::BadInput),
            ROUTE_ERR_BAD_CONFIG => Some(Self::BadConfig),
            _ => None,
        }
    }

    /// The raw return value.
    pub const fn code(self) -> i32 {
        self as i32
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed test
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_its_code() {
        for s in [
            RouteStatus::Ok,
            RouteStatus::Plugin,
            RouteStatus::BadInput,
            RouteStatus::BadConfig,
        ] {
            assert_eq!(RouteStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(RouteStatus::from_code(1), None);
        assert_eq!(RouteStatus::from_code(-4), None);
    }
}
