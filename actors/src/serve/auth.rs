//! Who a connection is and what it may do (ADR 0150): the SCRAM-SHA-256
//! login on api keys 400 and 401, and the one place a request is
//! authorized ([`need`], then [`ConnAuth::gate`]).
//!
//! - A connection starts unauthenticated, or authenticated as the
//!   principal its transport proved (the mTLS seam:
//!   [`ConnAuth::new`]'s `principal`). With `security.authentication =
//!   "none"` nothing is checked.
//! - A login reads the users and the lockout table linearizably (a
//!   password changed or a failure counted on another broker is seen),
//!   refuses a (principal, source) pair the lockout delays or locks
//!   without trying it, and records a failure in the ring's group, so the
//!   delay holds on every broker. Unknown users get the core's fake
//!   credential and fail exactly like a wrong password, with the same
//!   raft write. The HMACs run on the blocking pool.
//! - A login's session holds as long as what it rests on (ADR 0154,
//!   `session.rs`): a token until its `exp`, a SCRAM login while its user
//!   exists with the same password; every request checks it first.
//! - A request is authorized against an `AuthView` no older than
//!   `security.auth_view_max_age_ms` (`AuthViewCache`); superusers bypass
//!   the entries. A refusal is `unauthorized`, naming the principal, the
//!   operation and the resource; it is logged and counted, and nothing of
//!   the request runs.

use std::net::SocketAddr;
use std::sync::Arc;

use malachi_cluster::vnodes::{AuthViewCache, VnodeHost};
use malachi_core::auth::acl::{
    Authorizer, Decision, Operation, Principal, Resource, refusal_message,
};
use malachi_core::auth::lockout::{LockoutKey, LockoutPolicy};
use malachi_core::auth::scram::{self, Key, MECHANISM, ScramError};
use malachi_core::auth::scram_server::{
    NonceLedger, ServerConfig, ServerExchange, server_error_message,
};
use malachi_core::auth::session::{Basis, Ended};
use malachi_core::auth::token::TokenPolicy;
use malachi_core::model::AuthView;
use malachi_wire::auth::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use malachi_wire::messages::Request;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::error::ServeError;
use crate::common::clock::Clock;
use crate::common::metrics::BrokerMetrics;
use crate::control::memory::ControlMemory;
use crate::control::registry::ActorRegistry;

/// The label the fake-credential secret is derived under from the
/// cluster's first cursor key: cluster-wide and secret, like the key.
const FAKE_SECRET_LABEL: &[u8] = b"malachi-scram-fake-secret\0";
/// Random bytes in a server nonce (base64: 32 printable bytes).
const SERVER_NONCE_RANDOM_BYTES: usize = 24;

/// The broker's side of authentication, shared by its connections.
pub(crate) struct AuthCtx {
    pub enabled: bool,
    superusers: Vec<Principal>,
    pub iterations: u32,
    pub(super) policy: LockoutPolicy,
    /// How bearer tokens are judged (ADR 0152).
    pub token: TokenPolicy,
    cache: AuthViewCache,
    /// The authorizer built from the cached view it came from.
    authorizer: Mutex<Option<(Arc<AuthView>, Arc<Authorizer>)>>,
    ledger: Mutex<NonceLedger>,
    actors: Arc<ActorRegistry>,
    memory: Arc<ControlMemory>,
    clock: Arc<dyn Clock>,
    pub metrics: Arc<BrokerMetrics>,
}

impl std::fmt::Debug for AuthCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthCtx")
            .field("enabled", &self.enabled)
            .field("superusers", &self.superusers)
            .finish_non_exhaustive()
    }
}

/// What [`AuthCtx::new`] is built from.
pub(crate) struct AuthSettings {
    pub enabled: bool,
    pub superusers: Vec<Principal>,
    pub iterations: u32,
    pub policy: LockoutPolicy,
    pub view_max_age_ms: u64,
    /// How bearer tokens are judged (ADR 0152).
    pub token: TokenPolicy,
}

impl AuthCtx {
    pub fn new(
        settings: AuthSettings,
        actors: Arc<ActorRegistry>,
        memory: Arc<ControlMemory>,
        clock: Arc<dyn Clock>,
        metrics: Arc<BrokerMetrics>,
    ) -> AuthCtx {
        AuthCtx {
            enabled: settings.enabled,
            superusers: settings.superusers,
            iterations: settings.iterations,
            policy: settings.policy,
            token: settings.token,
            cache: AuthViewCache::new(std::time::Duration::from_millis(settings.view_max_age_ms)),
            authorizer: Mutex::new(None),
            ledger: Mutex::new(NonceLedger::default()),
            actors,
            memory,
            clock,
            metrics,
        }
    }

    /// The ring group's host, through which users and ACLs are read and
    /// changed.
    pub fn host(&self) -> Result<Arc<VnodeHost>, ServeError> {
        let plane = self.actors.plane().map_err(super::reply::not_serving)?;
        plane.host().cloned().ok_or_else(|| {
            ServeError::InvalidAdmin(
                "this broker's metadata backend keeps no users or ACLs (use metadata_backend = \"raft\")"
                    .into(),
            )
        })
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.wall_ms()
    }

    /// A change was made through this broker: the next decision reads again.
    pub async fn invalidate(&self) {
        self.cache.invalidate().await;
    }

    /// The users, entries and token keys, from a view no older than the
    /// cache's bound (`auth_view_max_age_ms`).
    pub async fn cached_view(&self) -> Result<Arc<AuthView>, ServeError> {
        let host = self.host()?;
        self.cache.get(&host).await.map_err(ServeError::AdminStore)
    }

    /// Whether `principal` is one of the configured superusers.
    pub fn is_superuser(&self, principal: &Principal) -> bool {
        self.superusers.contains(principal)
    }

    /// The authorizer over a view no older than the cache's bound.
    async fn authorizer(&self) -> Result<Arc<Authorizer>, ServeError> {
        let host = self.host()?;
        let view = self
            .cache
            .get(&host)
            .await
            .map_err(ServeError::AdminStore)?;
        let mut held = self.authorizer.lock();
        if let Some((from, authorizer)) = held.as_ref()
            && Arc::ptr_eq(from, &view)
        {
            return Ok(Arc::clone(authorizer));
        }
        let built = Arc::new(
            view.authorizer(self.superusers.iter().cloned())
                .map_err(ServeError::AdminRefused)?,
        );
        *held = Some((view, Arc::clone(&built)));
        Ok(built)
    }

    /// Decides `operation` on `resource` for `principal`; a refusal is
    /// logged and counted here.
    pub async fn authorize(
        &self,
        principal: &Principal,
        operation: Operation,
        resource: Resource<'_>,
    ) -> Result<(), ServeError> {
        if self.superusers.contains(principal) {
            return Ok(());
        }
        let decision = self
            .authorizer()
            .await?
            .decide(principal, operation, resource);
        match decision {
            Decision::Allowed(_) => Ok(()),
            Decision::Denied(reason) => {
                self.metrics.requests_unauthorized.increment(1);
                warn!(
                    %principal,
                    operation = operation.name(),
                    %resource,
                    ?reason,
                    "request refused by the ACLs"
                );
                Err(ServeError::Unauthorized {
                    message: refusal_message(principal, operation, resource, &reason),
                })
            }
        }
    }

    /// The SCRAM settings: unknown users' fake credentials come from a
    /// secret derived from the cluster's first cursor key, the same on
    /// every broker.
    fn server_config(&self) -> Result<ServerConfig, ServeError> {
        let keys = self
            .memory
            .cursor_keys
            .known()
            .ok_or(ServeError::CursorKeyPending)?;
        let key = keys
            .ids()
            .min()
            .and_then(|id| keys.key(id))
            .ok_or(ServeError::CursorKeyPending)?;
        let secret = key.derive(FAKE_SECRET_LABEL);
        ServerConfig::new(&secret)
            .and_then(|c| c.with_iterations(self.iterations))
            .map_err(|e| internal("configure scram", e.to_string()))
    }
}

fn internal(what: &'static str, reason: String) -> ServeError {
    ServeError::Internal { what, reason }
}

/// What a request needs before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need<'a> {
    /// Nothing: version negotiation and the login itself.
    Open,
    /// A logged-in connection (it acts on what it already holds, or learns
    /// where brokers are).
    Login,
    /// A logged-in connection the ACLs allow `Operation` on `Resource`.
    Acl(Operation, Resource<'a>),
}

/// The one table from a request to what it needs (ADR 0150).
pub(crate) fn need(request: &Request) -> Need<'_> {
    use Operation::{Admin, Alter, Consume, Create, Delete, Describe, Produce};
    use Resource::{Cluster, Topic};
    match request {
        Request::ApiVersions(_)
        | Request::SaslHandshake(_)
        | Request::SaslAuthenticate(_)
        | Request::TokenAuthenticate(_) => Need::Open,
        Request::CreateTopic(r) => Need::Acl(Create, Topic(&r.name)),
        Request::DeleteTopic(r) => Need::Acl(Delete, Topic(&r.name)),
        Request::DescribeTopic(r) => Need::Acl(Describe, Topic(&r.name)),
        Request::SplitRange(r) => Need::Acl(Alter, Topic(&r.topic)),
        Request::MergeRange(r) => Need::Acl(Alter, Topic(&r.topic)),
        Request::Produce(r) => Need::Acl(Produce, Topic(&r.topic)),
        Request::Fetch(r) => Need::Acl(Consume, Topic(&r.topic)),
        Request::Subscribe(r) => Need::Acl(Consume, Topic(&r.topic)),
        // Its answer is filtered to the topics the principal may describe.
        Request::ListTopics(_) => Need::Login,
        // Credit for a subscription this connection opened; the brokers'
        // addresses every client routes by.
        Request::SubscribeCredit(_) | Request::ClusterStatus(_) => Need::Login,
        // A user changing its own password is checked by the handler.
        Request::PutUser(r) if r.replace => Need::Login,
        Request::TreeSnapshot(_)
        | Request::VnodeList(_)
        | Request::ListPolicies(_)
        | Request::ListUsers(_)
        | Request::ListAcls(_)
        | Request::ListTokenKeys(_) => Need::Acl(Describe, Cluster),
        Request::ClusterMembers(r) if r.admit.is_none() && r.decommission.is_none() => {
            Need::Acl(Describe, Cluster)
        }
        Request::Features(r) if r.activate.is_none() && !r.finalize => Need::Acl(Describe, Cluster),
        // An issuer key can mint a token for any principal, superusers
        // included: adding or removing one is a cluster admin's act.
        Request::ClusterMembers(_)
        | Request::Features(_)
        | Request::VnodeSplit(_)
        | Request::PutTokenKey(_)
        | Request::DeleteTokenKey(_) => Need::Acl(Admin, Cluster),
        Request::PutPolicy(_)
        | Request::DeletePolicy(_)
        | Request::PutUser(_)
        | Request::DeleteUser(_)
        | Request::AddAcl(_)
        | Request::RemoveAcl(_)
        | Request::UnlockUser(_) => Need::Acl(Alter, Cluster),
    }
}

/// Where a login stands on one connection.
enum Exchange {
    /// No handshake yet, or the last login ended.
    Idle,
    /// `sasl_handshake` accepted SCRAM: the client-first message is next.
    Mechanism,
    /// The server-first message was sent: the client-final message is next.
    Started {
        exchange: Box<ServerExchange>,
        /// Whether the pair had failures to clear on success.
        had_failures: bool,
        /// The `StoredKey` of the credential the exchange runs against
        /// (`None` for an unknown user's fake one, which never verifies).
        stored_key: Option<Key>,
    },
}

/// Who a connection is logged in as, and what the login rests on (ADR
/// 0154: how long it holds).
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub principal: Principal,
    pub basis: Basis,
}

/// One connection's authentication state.
pub(crate) struct ConnAuth {
    broker: Arc<AuthCtx>,
    /// The peer's IP: the lockout's source.
    source: String,
    pub(super) session: Mutex<Option<Session>>,
    /// Why the session ended, once it did: every later request is refused
    /// with it, and the connection closes after its answers.
    pub(super) ended: Mutex<Option<Ended>>,
    /// Cancelled when the session ends: the read loop stops reading, the
    /// answers already due are written, then the socket closes.
    pub(super) closing: CancellationToken,
    exchange: tokio::sync::Mutex<Exchange>,
}

impl std::fmt::Debug for ConnAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnAuth")
            .field("source", &self.source)
            .field("session", &*self.session.lock())
            .field("ended", &*self.ended.lock())
            .finish_non_exhaustive()
    }
}

impl ConnAuth {
    /// A connection from `peer`, authenticated from the start as
    /// `principal` when its transport proved one (mTLS: a session for the
    /// connection's life).
    pub fn new(
        broker: Arc<AuthCtx>,
        peer: Option<SocketAddr>,
        principal: Option<Principal>,
    ) -> ConnAuth {
        ConnAuth {
            broker,
            source: peer.map_or_else(
                || "unknown".to_owned(),
                |p| super::lockout::lockout_source(p.ip()),
            ),
            session: Mutex::new(principal.map(|principal| Session {
                principal,
                basis: Basis::Certificate,
            })),
            ended: Mutex::new(None),
            closing: CancellationToken::new(),
            exchange: tokio::sync::Mutex::new(Exchange::Idle),
        }
    }

    /// The peer's IP: the lockout's source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn broker(&self) -> &Arc<AuthCtx> {
        &self.broker
    }

    /// Whether requests on this connection are checked at all.
    pub fn enforced(&self) -> bool {
        self.broker.enabled
    }

    /// Who the connection proved it is.
    pub fn principal(&self) -> Option<Principal> {
        self.session.lock().as_ref().map(|s| s.principal.clone())
    }

    /// The connection's session, if it logged in.
    pub fn session(&self) -> Option<Session> {
        self.session.lock().clone()
    }

    /// Whether `request` may run on this connection.
    pub async fn gate(&self, request: &Request) -> Result<(), ServeError> {
        if !self.broker.enabled {
            return Ok(());
        }
        let need = need(request);
        if need == Need::Open {
            return Ok(());
        }
        let Some(principal) = self.principal() else {
            self.broker.metrics.requests_unauthorized.increment(1);
            warn!(
                source = %self.source,
                api = request.api_key().name(),
                "request refused before a login"
            );
            return Err(ServeError::NotAuthenticated {
                api: request.api_key().name(),
            });
        };
        // The session must still stand: a token not past its `exp`, a
        // SCRAM user not deleted (ADR 0154).
        self.session_live().await?;
        match need {
            Need::Open | Need::Login => Ok(()),
            Need::Acl(operation, resource) => {
                self.broker.authorize(&principal, operation, resource).await
            }
        }
    }

    /// A second login on this connection: refused, naming why.
    pub(super) fn login_again(&self) -> Option<ServeError> {
        if let Some(ended) = self.ended.lock().clone() {
            return Some(ServeError::SessionEnded(ended));
        }
        self.principal()
            .is_some()
            .then(|| self.refuse("the connection is already authenticated".into(), None))
    }

    /// Whether this connection may describe `topic` (to filter a listing).
    pub async fn may_describe(&self, topic: &str) -> bool {
        if !self.broker.enabled {
            return true;
        }
        let Some(principal) = self.principal() else {
            return false;
        };
        if self.broker.superusers.contains(&principal) {
            return true;
        }
        match self.broker.authorizer().await {
            Ok(a) => a
                .decide(&principal, Operation::Describe, Resource::Topic(topic))
                .is_allowed(),
            Err(_) => false,
        }
    }

    /// 400 `sasl_handshake`.
    pub async fn handshake(
        &self,
        req: SaslHandshakeRequest,
    ) -> Result<SaslHandshakeResponse, ServeError> {
        if !self.broker.enabled {
            return Ok(SaslHandshakeResponse {
                accepted: false,
                mechanisms: Vec::new(),
            });
        }
        if let Some(refused) = self.login_again() {
            return Err(refused);
        }
        let accepted = req.mechanism == MECHANISM;
        *self.exchange.lock().await = if accepted {
            Exchange::Mechanism
        } else {
            Exchange::Idle
        };
        Ok(SaslHandshakeResponse {
            accepted,
            mechanisms: vec![MECHANISM.to_owned()],
        })
    }

    /// 401 `sasl_authenticate`: the client-first message, then the
    /// client-final one. Any failure ends the login: a new one starts with
    /// `sasl_handshake`.
    pub async fn authenticate(
        &self,
        req: SaslAuthenticateRequest,
    ) -> Result<SaslAuthenticateResponse, ServeError> {
        let mut held = self.exchange.lock().await;
        match std::mem::replace(&mut *held, Exchange::Idle) {
            Exchange::Idle => Err(self.refuse(
                "sasl_authenticate needs an accepted sasl_handshake first".into(),
                None,
            )),
            Exchange::Mechanism => {
                let (exchange, had_failures, stored_key, server_first) =
                    self.first(req.auth_bytes).await?;
                *held = Exchange::Started {
                    exchange,
                    had_failures,
                    stored_key,
                };
                Ok(SaslAuthenticateResponse {
                    auth_bytes: server_first,
                    complete: false,
                    principal: None,
                    session_lifetime_ms: None,
                })
            }
            Exchange::Started {
                exchange,
                had_failures,
                stored_key,
            } => {
                self.last(*exchange, had_failures, stored_key, req.auth_bytes)
                    .await
            }
        }
    }

    pub(super) fn refuse(&self, reason: String, retry_after_ms: Option<u32>) -> ServeError {
        self.broker.metrics.logins_failed.increment(1);
        ServeError::AuthFailed {
            reason,
            retry_after_ms,
        }
    }

    pub(super) fn key(&self, username: &str) -> LockoutKey {
        LockoutKey {
            principal: username.to_owned(),
            source: self.source.clone(),
        }
    }

    /// The client-first message: the user looked up in a fresh view, the
    /// lockout checked, the server-first message built. Answers the
    /// exchange, whether the pair has failures to clear, the `StoredKey`
    /// the exchange runs against (the session rests on it) and the
    /// server-first message.
    async fn first(
        &self,
        client_first: String,
    ) -> Result<(Box<ServerExchange>, bool, Option<Key>, String), ServeError> {
        let host = self.broker.host()?;
        let view = Arc::new(host.auth_view().await.map_err(ServeError::AdminStore)?);
        let config = self.broker.server_config()?;
        let nonce = server_nonce()?;
        let broker = Arc::clone(&self.broker);
        let looked_up = Arc::clone(&view);
        let started = tokio::task::spawn_blocking(move || {
            let mut ledger = broker.ledger.lock();
            ServerExchange::start(
                &config,
                &client_first,
                |name| looked_up.credential(name).cloned(),
                &nonce,
                &mut ledger,
            )
        })
        .await
        .map_err(|e| internal("start a login", e.to_string()))?;
        let (exchange, server_first) = match started {
            Ok(started) => started,
            Err(e) => return Err(self.refuse(server_error_message(&e), None)),
        };
        let claimed = exchange.claimed_username();
        let stored_key = view.credential(claimed).map(|c| c.stored_key);
        let key = self.key(claimed);
        let had_failures = self.admit(&view, &key)?;
        Ok((Box::new(exchange), had_failures, stored_key, server_first))
    }

    /// Refuses a (principal, source) pair the lockout delays or locks,
    /// without trying it; answers whether the pair has failures to clear
    /// on success (`serve::lockout`, shared with the admin port).
    pub(super) fn admit(&self, view: &AuthView, key: &LockoutKey) -> Result<bool, ServeError> {
        self.broker
            .admission(view, key)
            .map_err(|t| self.refuse(t.message, Some(t.retry_after_ms)))
    }

    /// A login succeeded: the pair's failures are cleared (if it had any)
    /// and the connection acts as `session.principal` from now on, for as
    /// long as `session.basis` holds (ADR 0154).
    pub(super) async fn logged_in(
        &self,
        host: &VnodeHost,
        key: LockoutKey,
        had_failures: bool,
        session: Session,
        how: &'static str,
    ) {
        self.broker.clear_failures(host, key, had_failures).await;
        info!(principal = %session.principal, source = %self.source, how, basis = ?session.basis, "logged in");
        self.broker.metrics.logins_succeeded.increment(1);
        *self.session.lock() = Some(session);
    }

    /// The client-final message: the proof verified on the blocking pool,
    /// a failure counted in the ring's group before the answer.
    async fn last(
        &self,
        exchange: ServerExchange,
        had_failures: bool,
        stored_key: Option<Key>,
        client_final: String,
    ) -> Result<SaslAuthenticateResponse, ServeError> {
        let key = self.key(exchange.claimed_username());
        let verified = tokio::task::spawn_blocking(move || exchange.finish(&client_final))
            .await
            .map_err(|e| internal("verify a login", e.to_string()))?;
        let host = self.broker.host()?;
        match verified {
            Ok(done) => {
                let principal = Principal::user(&done.username);
                let stored_key = stored_key.ok_or_else(|| {
                    internal(
                        "log in",
                        "a proof verified without a stored credential".into(),
                    )
                })?;
                let session = Session {
                    principal: principal.clone(),
                    basis: Basis::Password {
                        user: done.username.clone(),
                        stored_key,
                    },
                };
                self.logged_in(&host, key, had_failures, session, "scram")
                    .await;
                Ok(SaslAuthenticateResponse {
                    auth_bytes: done.server_final,
                    complete: true,
                    principal: Some(principal.to_string()),
                    session_lifetime_ms: None,
                })
            }
            Err(e) => Err(self.failed(&host, key, &e).await),
        }
    }

    /// Counts a failed proof cluster-wide; the answer names the delay the
    /// next attempt of this user from this address must wait.
    async fn failed(&self, host: &VnodeHost, key: LockoutKey, e: &ScramError) -> ServeError {
        warn!(user = %key.principal, source = %self.source, error = %e, "login failed");
        self.failed_with(host, key, server_error_message(e)).await
    }

    /// Counts a failed login cluster-wide before the answer `message`.
    pub(super) async fn failed_with(
        &self,
        host: &VnodeHost,
        key: LockoutKey,
        message: String,
    ) -> ServeError {
        let retry_after_ms = self.broker.record_failure(host, key).await;
        self.refuse(message, retry_after_ms)
    }
}

/// A fresh server nonce: 24 random bytes in base64 (printable, no `,`).
fn server_nonce() -> Result<String, ServeError> {
    use base64::Engine;
    let mut bytes = [0u8; SERVER_NONCE_RANDOM_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| internal("draw a nonce", e.to_string()))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The credential for `password` under a fresh random salt, derived on
/// the blocking pool (PBKDF2 is CPU work on purpose).
pub(crate) async fn derive_credential(
    password: Vec<u8>,
    iterations: u32,
) -> Result<scram::StoredCredential, ServeError> {
    let mut salt = [0u8; scram::SALT_BYTES];
    getrandom::fill(&mut salt).map_err(|e| internal("draw a salt", e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        scram::StoredCredential::from_password(&password, &salt, iterations)
    })
    .await
    .map_err(|e| internal("derive a credential", e.to_string()))?
    .map_err(|e| ServeError::InvalidAdmin(e.to_string()))
}
