//! The client for another narad cluster: a remote child's target, and the check made when such
//! a link is created.

use std::time::Duration;

/// A client calling another cluster: trusting `roots` beside the system's CAs, connecting
/// within `connect` and giving up on a call after `timeout`. Unlike [`super::PeerClient`] it
/// honours the environment's proxy variables (`HTTPS_PROXY` and the like), since another
/// cluster may be reached only through one, and presents no certificate or node id of ours.
pub(crate) fn client(
    roots: &[reqwest::Certificate],
    connect: Duration,
    timeout: Duration,
) -> Result<reqwest::Client, reqwest::Error> {
    crate::tls::trusting(reqwest::Client::builder(), roots)
        .connect_timeout(connect)
        .timeout(timeout)
        .build()
}
