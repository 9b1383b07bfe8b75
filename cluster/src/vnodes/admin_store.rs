//! The admin stores in the ring's group (ADR 0148): proposing the user,
//! ACL and lockout commands to its leader from any broker, reading what a
//! broker decides by (`AuthView`), and a cache that never answers from a
//! read older than its bound.
//!
//! The commands and the `AuthView` query exist only while the feature
//! `admin_store` is active: an older broker leading the ring's group could
//! decode neither, so a broker asks for them only once every member
//! advertised the feature and it was activated (ADR 0134).

use super::*;
use malachi_core::model::{AuthView, Feature, FeatureInactive};

/// Why an admin store request was not answered.
#[derive(Debug, thiserror::Error)]
pub enum AdminStoreError {
    /// Some broker cannot decode the admin stores' commands yet.
    #[error(transparent)]
    Inactive(#[from] FeatureInactive),
    /// The ring's group was not reached, or the answer was lost.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The command is not one of the admin stores'.
    #[error("{0} is not an admin store command")]
    NotAdmin(&'static str),
}

/// Whether `cmd` is one of the admin stores' commands.
pub fn is_admin_command(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::PutUser { .. }
            | Command::DeleteUser { .. }
            | Command::AddAcl { .. }
            | Command::RemoveAcl { .. }
            | Command::RecordLoginFailure { .. }
            | Command::RecordLoginSuccess { .. }
            | Command::UnlockUser { .. }
            | Command::AddTokenKey { .. }
            | Command::RemoveTokenKey { .. }
    )
}

impl VnodeHost {
    /// Applies an admin store command in the ring's group, through its
    /// leader wherever it is. Refused before proposing unless `admin_store`
    /// is active in the table this broker last read.
    pub async fn propose_admin(
        &self,
        cmd: Command,
    ) -> Result<Result<Outcome, ModelError>, AdminStoreError> {
        if !is_admin_command(&cmd) {
            return Err(AdminStoreError::NotAdmin("the command"));
        }
        self.require(Feature::AdminStore)?;
        if matches!(
            cmd,
            Command::AddTokenKey { .. } | Command::RemoveTokenKey { .. }
        ) {
            // An older broker with the admin store could not decode them.
            self.require(Feature::TokenKeys)?;
        }
        Ok(self.propose_ring(cmd).await?)
    }

    /// The admin stores' view, read linearizably from the ring group's
    /// leader: it holds every change acknowledged before the read began.
    pub async fn auth_view(&self) -> Result<AuthView, AdminStoreError> {
        self.require(Feature::AdminStore)?;
        let query = encode_request(&Query::AuthView, RING_VNODE)?;
        Ok(self
            .route_group(RING_VNODE, FORWARD_QUERY_API_KEY, &query)
            .await?)
    }
}

/// A broker's cached `AuthView`: answered from the cache while the read it
/// came from began less than `max_age` ago, read again otherwise. A read's
/// age counts from when it began (what it holds was acknowledged by then),
/// so a change acknowledged anywhere is seen here within `max_age` plus one
/// read. One read at a time: concurrent callers wait for it.
#[derive(Debug)]
pub struct AuthViewCache {
    max_age: Duration,
    cached: tokio::sync::Mutex<Option<(Instant, Arc<AuthView>)>>,
}

impl AuthViewCache {
    pub fn new(max_age: Duration) -> AuthViewCache {
        AuthViewCache {
            max_age,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// The view, from the cache if it is young enough.
    pub async fn get(&self, host: &VnodeHost) -> Result<Arc<AuthView>, AdminStoreError> {
        let mut cached = self.cached.lock().await;
        if let Some((read_at, view)) = cached.as_ref()
            && read_at.elapsed() < self.max_age
        {
            return Ok(Arc::clone(view));
        }
        let began = Instant::now();
        let view = Arc::new(host.auth_view().await?);
        *cached = Some((began, Arc::clone(&view)));
        Ok(view)
    }

    /// Forgets the cached view: the next `get` reads (after a change made
    /// through this broker, say).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }
}
