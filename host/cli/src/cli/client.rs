//! A small HTTP client for the daemon's API, used by the CLI commands and `narad demo`.
//!
//! A non-2xx answer becomes an [`ApiCallError`] carrying the server's `error` message, so the
//! CLI prints what the server said.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use narad_host::api::children::{AttachRequest, ChildList, LinkInfo, RouterChange};
use narad_host::api::types::{
    CreateTopicRequest, DeletedTopic, ErrorBody, FetchResponse, GrowPartitionsRequest,
    ProduceRecordJson, ProduceRequest, ProduceResponse, SetAsideList, TopicDescription, TopicInfo,
    TopicList,
};
use narad_host::topics::set_aside::SetAsideEntry;

/// Default daemon URL.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// A failed API call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiCallError {
    /// The daemon answered with an error status.
    #[error("{message} (HTTP {status})")]
    Status {
        /// The status.
        status: StatusCode,
        /// The server's `error` message (or the raw body when it is not our JSON).
        message: String,
        /// The whole answer when it is JSON (fields beside `error`, such as a produce's
        /// `committed_partitions`), else null.
        body: serde_json::Value,
    },
    /// Nothing accepted a connection at the daemon's address: most often no `narad serve`
    /// runs there, or `--url` points elsewhere.
    #[error("cannot reach narad at {base}: is `narad serve` running? (--url / NARAD_URL)")]
    Unreachable {
        /// The daemon's base URL.
        base: String,
    },
    /// The TLS handshake with the daemon failed: most often its certificate is signed by a
    /// CA this machine does not trust (`--tls-ca`), or it does not serve TLS at all.
    #[error(
        "TLS with {base} failed: {reason} (a certificate signed by a private CA needs that CA's \
         certificate: --tls-ca FILE / NARAD_TLS_CA; a daemon without --tls-cert is reached at \
         http://)"
    )]
    Tls {
        /// The daemon's base URL.
        base: String,
        /// What the TLS layer said, with its causes.
        reason: String,
    },
    /// `--login` cannot be used: its password file cannot be read, or `--token` is given too.
    #[error("cannot log in: {reason}")]
    Login {
        /// Why.
        reason: String,
    },
    /// A file given with `--tls-ca` or `--tls-client-cert`/`--tls-client-key` cannot be used.
    #[error("cannot use the TLS file {path}: {reason}")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// A plain-HTTP call was answered with bytes that are not HTTP: the daemon serves TLS.
    #[error(
        "{url} answered with something other than HTTP: if the daemon serves TLS \
         (--tls-cert), call it at https://"
    )]
    PlainToTls {
        /// The URL called.
        url: String,
    },
    /// The call was sent but failed on the way (a timeout, a reset connection, a cut answer).
    #[error("the call to {url} failed")]
    Transport {
        /// The URL called.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The answer was not the JSON expected.
    #[error("unexpected answer from {url}: {message}")]
    Decode {
        /// The URL called.
        url: String,
        /// What did not parse.
        message: String,
    },
}

impl ApiCallError {
    /// The HTTP status, when the daemon answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ApiCallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The TLS files of a client (`--tls-ca`, `--tls-client-cert`, `--tls-client-key`).
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM certificates of CAs to trust beside the system's.
    pub ca: Option<std::path::PathBuf>,
    /// PEM client certificate and its private key.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A client for one daemon.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
    /// A user's name and password, sent as Basic credentials (`--login`).
    login: Option<(String, String)>,
}

impl std::fmt::Debug for Client {
    // Never print the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("login", &self.login.as_ref().map(|(user, _)| user))
            .finish()
    }
}

impl Client {
    /// A client for the daemon at `base` (e.g. `http://127.0.0.1:7070`).
    pub fn new(base: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            token: None,
            login: None,
        }
    }

    /// The same client with `options`: also trusting the CA certificates (PEM) given, beside
    /// the system's (for a daemon whose certificate a private CA signed), and presenting the
    /// client certificate given (for a daemon that asks for one). Fails on a file that cannot
    /// be used, naming it.
    pub fn with_tls(mut self, options: &TlsOptions) -> Result<Client, ApiCallError> {
        if options.ca.is_none() && options.identity.is_none() {
            return Ok(self);
        }
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ApiCallError::TlsFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        };
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &options.ca {
            let failed = |reason: String| ApiCallError::TlsFile {
                path: path.clone(),
                reason,
            };
            let certificates = reqwest::Certificate::from_pem_bundle(&read(path)?)
                .map_err(|e| failed(narad_host::tls::error_chain(&e)))?;
            if certificates.is_empty() {
                return Err(failed("no PEM CERTIFICATE block in it".into()));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        if let Some((cert, key)) = &options.identity {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            let identity =
                reqwest::Identity::from_pem(&pem).map_err(|e| ApiCallError::TlsFile {
                    path: cert.clone(),
                    reason: format!(
                        "with the key {}: {}",
                        key.display(),
                        narad_host::tls::error_chain(&e)
                    ),
                })?;
            builder = builder.identity(identity);
        }
        self.http = builder.build().map_err(|e| ApiCallError::TlsFile {
            path: options.ca.clone().unwrap_or_default(),
            reason: narad_host::tls::error_chain(&e),
        })?;
        Ok(self)
    }

    /// The same client, sending `Authorization: Bearer <token>` on every call when `token` is
    /// set (the daemon requires it on mutating calls when it runs with `--auth-token-file`).
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Option<Duration>,
    ) -> Result<T, ApiCallError> {
        let mut req = self.request(method, path);
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        self.send(req, path).await
    }

    /// A call whose body is raw bytes of `content_type` (a plugin upload), with query
    /// parameters.
    pub async fn call_raw<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(Vec<u8>, &str)>,
    ) -> Result<T, ApiCallError> {
        let mut req = self.request(method, path).query(query);
        if let Some((bytes, content_type)) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes);
        }
        self.send(req, path).await
    }

    /// The same client, sending user `login`'s name and password as Basic credentials on
    /// every call (a daemon with `--auth-token-file` takes them over TLS and holds the user to
    /// the ACLs).
    pub fn with_login(mut self, login: Option<(String, String)>) -> Client {
        self.login = login;
        self
    }

    /// A request to `path`, with the token or the user's credentials when set.
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{}", self.base, path));
        match (&self.token, &self.login) {
            (Some(token), _) => req.bearer_auth(token),
            (None, Some((user, password))) => req.basic_auth(user, Some(password)),
            (None, None) => req,
        }
    }

    /// Sends `req`; a non-2xx answer becomes [`ApiCallError::Status`] with the server's
    /// message, a 2xx body is decoded as `T`.
    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        path: &str,
    ) -> Result<T, ApiCallError> {
        let url = format!("{}{}", self.base, path);
        let transport = |source: reqwest::Error| {
            let chain = narad_host::tls::error_chain(&source);
            let tls = self.base.starts_with("https://");
            if tls
                && (chain.contains("certificate")
                    || chain.contains("tls")
                    || chain.contains("TLS")
                    || chain.contains("peer")
                    || chain.contains("handshake")
                    || chain.contains("corrupt message"))
            {
                ApiCallError::Tls {
                    base: self.base.clone(),
                    reason: chain,
                }
            } else if source.is_connect() {
                ApiCallError::Unreachable {
                    base: self.base.clone(),
                }
            } else if !tls
                && (chain.contains("invalid HTTP version")
                    || chain.contains("connection closed before message completed"))
            {
                ApiCallError::PlainToTls { url: url.clone() }
            } else {
                ApiCallError::Transport {
                    url: url.clone(),
                    source,
                }
            }
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(transport)?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| b.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            return Err(ApiCallError::Status {
                status,
                message,
                body,
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ApiCallError::Decode {
            url,
            message: e.to_string(),
        })
    }

    /// `POST /v1/topics`.
    pub async fn create_topic(&self, req: &CreateTopicRequest) -> Result<TopicInfo, ApiCallError> {
        self.call(Method::POST, "/v1/topics", Some(req), None).await
    }

    /// `GET /v1/admin/set-aside`.
    pub async fn list_set_aside(&self) -> Result<SetAsideList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/admin/set-aside", None, None)
            .await
    }

    /// `POST /v1/admin/set-aside/{id}/adopt`.
    pub async fn adopt_set_aside(&self, id: &str) -> Result<TopicInfo, ApiCallError> {
        self.call::<(), _>(
            Method::POST,
            &format!("/v1/admin/set-aside/{id}/adopt"),
            None,
            None,
        )
        .await
    }

    /// `DELETE /v1/admin/set-aside/{id}`.
    pub async fn purge_set_aside(&self, id: &str) -> Result<SetAsideEntry, ApiCallError> {
        self.call::<(), _>(
            Method::DELETE,
            &format!("/v1/admin/set-aside/{id}"),
            None,
            None,
        )
        .await
    }

    /// `GET /v1/nodes`.
    pub async fn list_nodes(&self) -> Result<narad_host::api::types::NodeList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/nodes", None, None)
            .await
    }

    /// `GET /v1/acls`.
    pub async fn list_acls(&self) -> Result<narad_host::api::acls::AclList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/acls", None, None)
            .await
    }

    /// `POST /v1/acls`.
    pub async fn add_acl(
        &self,
        rule: &narad_host::acl::AclRule,
    ) -> Result<narad_host::acl::AclRule, ApiCallError> {
        self.call(Method::POST, "/v1/acls", Some(rule), None).await
    }

    /// `DELETE /v1/acls?...`.
    pub async fn remove_acl(
        &self,
        rule: &narad_host::acl::AclRule,
    ) -> Result<narad_host::acl::AclRule, ApiCallError> {
        let req = self.request(Method::DELETE, "/v1/acls").query(rule);
        self.send(req, "/v1/acls").await
    }

    /// `GET /v1/users`.
    pub async fn list_users(&self) -> Result<narad_host::api::users::UserList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/users", None, None)
            .await
    }

    /// `POST /v1/users`.
    pub async fn create_user(
        &self,
        user: &narad_host::api::users::CreateUser,
    ) -> Result<narad_host::api::users::UserInfo, ApiCallError> {
        self.call(Method::POST, "/v1/users", Some(user), None).await
    }

    /// `PUT /v1/users/{name}/credentials`.
    pub async fn set_user_credentials(
        &self,
        name: &str,
        secret: &narad_host::api::users::Secret,
    ) -> Result<narad_host::api::users::UserInfo, ApiCallError> {
        let path = format!("/v1/users/{name}/credentials");
        self.call(Method::PUT, &path, Some(secret), None).await
    }

    /// `DELETE /v1/users/{name}`.
    pub async fn delete_user(
        &self,
        name: &str,
    ) -> Result<narad_host::api::users::UserInfo, ApiCallError> {
        self.call::<(), _>(Method::DELETE, &format!("/v1/users/{name}"), None, None)
            .await
    }

    /// `GET /v1/groups`.
    pub async fn list_groups(&self) -> Result<narad_host::api::groups::GroupList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/groups", None, None)
            .await
    }

    /// `GET /v1/groups/{group}`.
    pub async fn describe_group(
        &self,
        group: &str,
    ) -> Result<narad_host::api::groups::GroupInfo, ApiCallError> {
        self.call::<(), _>(Method::GET, &format!("/v1/groups/{group}"), None, None)
            .await
    }

    /// `POST /v1/groups/{group}/reset-offsets`.
    pub async fn reset_group_offsets(
        &self,
        group: &str,
        request: &narad_host::api::groups::ResetOffsets,
    ) -> Result<narad_host::api::groups::ResetDone, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/groups/{group}/reset-offsets"),
            Some(request),
            None,
        )
        .await
    }

    /// `POST` (`on`) or `DELETE /v1/nodes/{id}/cordon`.
    pub async fn cordon(
        &self,
        node: &str,
        on: bool,
    ) -> Result<narad_host::api::types::Cordon, ApiCallError> {
        let method = if on { Method::POST } else { Method::DELETE };
        self.call::<(), _>(method, &format!("/v1/nodes/{node}/cordon"), None, None)
            .await
    }

    /// `GET /v1/topics`.
    pub async fn list_topics(&self) -> Result<TopicList, ApiCallError> {
        self.call::<(), _>(Method::GET, "/v1/topics", None, None)
            .await
    }

    /// `GET /v1/topics/{t}`.
    pub async fn describe_topic(&self, topic: &str) -> Result<TopicDescription, ApiCallError> {
        self.call::<(), _>(Method::GET, &format!("/v1/topics/{topic}"), None, None)
            .await
    }

    /// `DELETE /v1/topics/{t}`; `force` deletes a topic that has children or is a child
    /// (refused with 409 otherwise), removing those links.
    pub async fn delete_topic(
        &self,
        topic: &str,
        force: bool,
    ) -> Result<DeletedTopic, ApiCallError> {
        let path = if force {
            format!("/v1/topics/{topic}?force=true")
        } else {
            format!("/v1/topics/{topic}")
        };
        self.call::<(), _>(Method::DELETE, &path, None, None).await
    }

    /// `POST /v1/topics/{t}/partitions/{p}/move` to `to` (absent: the daemon picks), waiting
    /// for the move to finish.
    pub async fn move_partition(
        &self,
        topic: &str,
        partition: u32,
        to: Option<String>,
    ) -> Result<narad_host::operations::moves::MoveReport, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{topic}/partitions/{partition}/move"),
            Some(&narad_host::api::types::MoveRequest { to, cancel: false }),
            Some(narad_host::operations::moves::MOVE_TIMEOUT),
        )
        .await
    }

    /// `POST /v1/topics/{t}/partitions/{p}/recreate`: re-creates a dead node's partition,
    /// empty, on `on` (absent: the daemon picks), accepting the loss.
    pub async fn recreate_partition(
        &self,
        topic: &str,
        partition: u32,
        request: &narad_host::api::types::RecreateRequest,
    ) -> Result<narad_host::operations::recreate::RecreateReport, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{topic}/partitions/{partition}/recreate"),
            Some(request),
            Some(narad_host::operations::moves::MOVE_TIMEOUT),
        )
        .await
    }

    /// `POST /v1/topics/{t}/partitions/{p}/move` with `cancel`.
    pub async fn cancel_move(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<narad_host::api::types::MoveCancelled, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{topic}/partitions/{partition}/move"),
            Some(&narad_host::api::types::MoveRequest {
                to: None,
                cancel: true,
            }),
            None,
        )
        .await
    }

    /// `PATCH /v1/topics/{t}` with `change` (retention, `writable_as_child`).
    pub async fn change_topic(
        &self,
        topic: &str,
        change: &serde_json::Value,
    ) -> Result<TopicInfo, ApiCallError> {
        self.call(
            Method::PATCH,
            &format!("/v1/topics/{topic}"),
            Some(change),
            None,
        )
        .await
    }

    /// `POST /v1/topics/{t}/partitions`.
    pub async fn grow_partitions(
        &self,
        topic: &str,
        count: u32,
    ) -> Result<TopicInfo, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{topic}/partitions"),
            Some(&GrowPartitionsRequest { count }),
            None,
        )
        .await
    }

    /// `POST /v1/topics/{t}/records`.
    pub async fn produce(
        &self,
        topic: &str,
        records: Vec<ProduceRecordJson>,
    ) -> Result<ProduceResponse, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{topic}/records"),
            Some(&ProduceRequest { records }),
            None,
        )
        .await
    }

    /// `GET /v1/topics/{t}/partitions/{p}/records`.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: Option<u64>,
        max: Option<u32>,
        wait_ms: Option<u64>,
    ) -> Result<FetchResponse, ApiCallError> {
        let mut path = format!("/v1/topics/{topic}/partitions/{partition}/records?");
        if let Some(o) = offset {
            path.push_str(&format!("offset={o}&"));
        }
        if let Some(m) = max {
            path.push_str(&format!("max={m}&"));
        }
        if let Some(w) = wait_ms {
            path.push_str(&format!("wait_ms={w}&"));
        }
        let path = path.trim_end_matches(['&', '?']).to_owned();
        // A long-poll holds the request open: give it the wait plus a margin.
        let timeout = wait_ms.map(|w| Duration::from_millis(w) + Duration::from_secs(30));
        self.call::<(), _>(Method::GET, &path, None, timeout).await
    }

    /// `PUT /v1/topics/{parent}/children/{child}`: attaches a child.
    pub async fn attach_child(
        &self,
        parent: &str,
        child: &str,
        req: &AttachRequest,
    ) -> Result<LinkInfo, ApiCallError> {
        self.call(
            Method::PUT,
            &format!("/v1/topics/{parent}/children/{child}"),
            Some(req),
            None,
        )
        .await
    }

    /// `PATCH /v1/topics/{parent}/children/{child}`: swaps the router chain (and config).
    pub async fn set_child_router(
        &self,
        parent: &str,
        child: &str,
        req: &RouterChange,
    ) -> Result<LinkInfo, ApiCallError> {
        self.call(
            Method::PATCH,
            &format!("/v1/topics/{parent}/children/{child}"),
            Some(req),
            None,
        )
        .await
    }

    /// `DELETE /v1/topics/{parent}/children/{child}`: detaches a child (the topic stays).
    pub async fn detach_child(&self, parent: &str, child: &str) -> Result<LinkInfo, ApiCallError> {
        self.call::<(), _>(
            Method::DELETE,
            &format!("/v1/topics/{parent}/children/{child}"),
            None,
            None,
        )
        .await
    }

    /// `POST /v1/topics/{parent}/children/{child}/pause` (`paused`) or `/resume` (accepting
    /// the gaps halted cursors stand before, with `accept_gap`).
    pub async fn set_child_paused(
        &self,
        parent: &str,
        child: &str,
        partitions: Option<Vec<u32>>,
        paused: bool,
        accept_gap: bool,
    ) -> Result<narad_host::api::children::PauseInfo, ApiCallError> {
        let action = if paused { "pause" } else { "resume" };
        self.call(
            Method::POST,
            &format!("/v1/topics/{parent}/children/{child}/{action}"),
            Some(&narad_host::api::children::PauseRequest {
                partitions,
                accept_gap,
            }),
            None,
        )
        .await
    }

    /// `POST /v1/topics/{parent}/children/{child}/seek`.
    pub async fn seek_child(
        &self,
        parent: &str,
        child: &str,
        partition: u32,
        offset: u64,
    ) -> Result<narad_host::fanout::status::SeekDone, ApiCallError> {
        self.call(
            Method::POST,
            &format!("/v1/topics/{parent}/children/{child}/seek"),
            Some(&narad_host::api::children::SeekRequest { partition, offset }),
            None,
        )
        .await
    }

    /// `GET /v1/topics/{parent}/children/{child}/gaps`: what the link's cursors moved past
    /// without copying.
    pub async fn child_gaps(
        &self,
        parent: &str,
        child: &str,
        ranges: Option<usize>,
    ) -> Result<narad_host::api::gaps::LinkGaps, ApiCallError> {
        let query = ranges.map(|n| format!("?ranges={n}")).unwrap_or_default();
        self.call::<(), _>(
            Method::GET,
            &format!("/v1/topics/{parent}/children/{child}/gaps{query}"),
            None,
            None,
        )
        .await
    }

    /// `GET /v1/topics/{parent}/children`: every child with per-partition progress.
    pub async fn list_children(&self, parent: &str) -> Result<ChildList, ApiCallError> {
        self.call::<(), _>(
            Method::GET,
            &format!("/v1/topics/{parent}/children"),
            None,
            None,
        )
        .await
    }

    /// `GET /healthz`: Ok when the daemon answers.
    pub async fn health(&self) -> Result<(), ApiCallError> {
        self.call::<(), serde_json::Value>(Method::GET, "/healthz", None, None)
            .await
            .map(|_| ())
    }
}
