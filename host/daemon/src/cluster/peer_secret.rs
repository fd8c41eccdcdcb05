//! The secret nodes of one cluster present to each other's internal routes (child commits,
//! the steps of a move or a re-creation, module bytes, seeks).
//!
//! It is 32 random bytes made by the first node that starts and kept in etcd under
//! `{prefix}peer-secret` (created only if absent, so nodes starting together agree on one).
//! Every node reads it when it joins. A client of the HTTP API or the Kafka listener never
//! holds it: it is not derived from the API token (a token holder could compute such a secret
//! and forge copies into children), and the internal routes require it whether or not the
//! cluster has a token. Whoever can read the cluster's keys in etcd can read it, as they can
//! rewrite the metadata itself: etcd is the cluster's root of trust.

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

/// Name of the key under the cluster prefix.
const KEY: &str = "peer-secret";

/// Random bytes in a new secret.
const SECRET_BYTES: usize = 32;

/// Why the peer secret could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerSecretError {
    /// etcd did not answer or refused.
    #[error("etcd: reading or creating {key}: {source}")]
    Etcd {
        /// The key.
        key: String,
        /// The client's error (boxed: it is large).
        source: Box<etcd_client::Error>,
    },
    /// The key holds something that is not a secret this module made.
    #[error(
        "{key} holds {bytes} bytes that are not a peer secret (64 hex digits); restore it or delete it while every node is stopped"
    )]
    Damaged {
        /// The key.
        key: String,
        /// Its length.
        bytes: usize,
    },
}

/// The cluster's peer secret under `prefix` (64 hex digits), made and stored if no node made
/// one yet.
pub(crate) async fn load_or_create(
    client: &Client,
    prefix: &str,
) -> Result<String, PeerSecretError> {
    let key = format!("{prefix}{KEY}");
    let fresh = hex::encode(rand::random::<[u8; SECRET_BYTES]>());
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), fresh.clone(), None)])
        .or_else([TxnOp::get(key.clone(), None)]);
    let mut kv = client.kv_client();
    let response = kv.txn(txn).await.map_err(|source| PeerSecretError::Etcd {
        key: key.clone(),
        source: Box::new(source),
    })?;
    if response.succeeded() {
        tracing::info!("made this cluster's peer secret (the first node to start)");
        return Ok(fresh);
    }
    let stored = response
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .unwrap_or_default();
    let valid = stored.len() == 2 * SECRET_BYTES && stored.iter().all(u8::is_ascii_hexdigit);
    match (valid, String::from_utf8(stored.clone())) {
        (true, Ok(secret)) => Ok(secret),
        _ => Err(PeerSecretError::Damaged {
            key,
            bytes: stored.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::etcd::connect_client;
    use crate::metastore::test_etcd::TestEtcd;

    #[tokio::test]
    async fn nodes_of_one_cluster_share_one_random_secret_and_other_clusters_get_their_own() {
        let etcd = TestEtcd::start();
        let client = connect_client(&[etcd.endpoint()]).await.unwrap();
        let (a, b) = tokio::join!(
            load_or_create(&client, "/narad-test/a/"),
            load_or_create(&client, "/narad-test/a/")
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        let other = load_or_create(&client, "/narad-test/b/").await.unwrap();
        assert_ne!(a, other);
    }
}
