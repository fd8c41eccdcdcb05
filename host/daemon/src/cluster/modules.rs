//! Plugin modules across nodes: a module is uploaded to one node, and a node whose link needs
//! a digest it does not hold fetches the bytes from the others
//! (`POST /internal/v1/plugins/{digest}/bytes`). The registry checks what arrives against the
//! digest before storing or running it, so a peer can make a fetch fail but never change what
//! runs.

use std::time::Duration;

use super::ClusterContext;

/// Longest wait for one node's answer to a module fetch.
pub(crate) const MODULE_FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The internal route that answers a module's bytes, or 404 when the node does not hold it.
pub(crate) fn module_path(digest: &str) -> String {
    format!("/internal/v1/plugins/{digest}/bytes")
}

/// Asks every other live node, in turn, for the module with `digest` (hex): the first one that
/// has it answers. `Ok(None)` when every node answered that it does not hold it; `Err` when
/// none had it and at least one could not answer (so absence is not known).
///
/// Blocking: it runs its calls on a runtime of its own, on a thread of its own, because a
/// plugin load is blocking work that may run anywhere (the blocking pool, a test's thread).
pub(crate) fn fetch_module_blocking(
    context: &ClusterContext,
    digest: &str,
) -> Result<Option<Vec<u8>>, String> {
    let me = context.node_id().to_owned();
    let nodes: Vec<(String, String)> = context
        .peers
        .live()
        .into_iter()
        .filter(|n| n.id != me)
        .map(|n| (n.id, n.advertise))
        .collect();
    let (bearer, digest) = (context.peer_bearer.clone(), digest.to_owned());
    let tls = std::sync::Arc::clone(&context.peer_tls);
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start a runtime for the fetch: {e}"))?;
                runtime.block_on(fetch(nodes, bearer, digest, &tls))
            })
            .join()
            .unwrap_or_else(|_| Err("the module fetch panicked".to_owned()))
    })
}

async fn fetch(
    nodes: Vec<(String, String)>,
    bearer: String,
    digest: String,
    tls: &crate::tls::PeerTls,
) -> Result<Option<Vec<u8>>, String> {
    // A client of this runtime's own: connections must not outlive the runtime that made them.
    let http = crate::peer::PeerClient::new(tls)
        .map_err(|e| e.to_string())?
        .with_secret(&bearer);
    let mut failures = Vec::new();
    for (node, base) in nodes {
        let call = http.call(
            reqwest::Method::POST,
            &format!("{base}{}", module_path(&digest)),
            MODULE_FETCH_TIMEOUT,
        );
        match call.send().await {
            Ok(answer) if answer.status() == reqwest::StatusCode::NOT_FOUND => {}
            Ok(answer) if answer.status().is_success() => match answer.bytes().await {
                Ok(bytes) => return Ok(Some(bytes.to_vec())),
                Err(e) => failures.push(format!("node {node} stopped sending: {e}")),
            },
            Ok(answer) => failures.push(format!("node {node} answered {}", answer.status())),
            Err(e) => failures.push(format!(
                "node {node} did not answer: {}",
                crate::tls::error_chain(&e)
            )),
        }
    }
    if failures.is_empty() {
        Ok(None)
    } else {
        Err(failures.join("; "))
    }
}
