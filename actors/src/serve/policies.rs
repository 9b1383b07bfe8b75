//! Storage policy administration (issue 21, ADR 0115): `put_policy`,
//! `list_policies` and `delete_policy`, kept in the ring's group
//! (`control::policies`).

use malachi_core::model::{Command, StoragePolicy};
use malachi_wire::messages as wire;

use super::context::MetaCtx;
use super::error::ServeError;
use super::reply::Failure;

fn to_wire(policy: StoragePolicy) -> wire::PolicyDescription {
    wire::PolicyDescription {
        name: policy.name,
        retention_age_ms: policy.retention_age_ms,
        retention_bytes: policy.retention_bytes,
        placement: policy.placement,
    }
}

pub(crate) async fn put_policy(
    meta: &MetaCtx,
    req: wire::PutPolicyRequest,
) -> Result<wire::PutPolicyResponse, Failure> {
    let policy = req.policy;
    if policy.retention_age_ms == Some(0) || policy.retention_bytes == Some(0) {
        return Err(ServeError::InvalidPolicy {
            name: policy.name,
            reason: "a retention bound of 0 would delete every sealed segment at once; leave it unset to keep data".into(),
        });
    }
    if let Err(e) = malachi_core::constraints::parse_all(&policy.placement) {
        return Err(ServeError::InvalidPolicy {
            name: policy.name,
            reason: e.to_string(),
        });
    }
    let name = policy.name.clone();
    meta.control
        .propose_policy(Command::PutPolicy {
            policy: StoragePolicy {
                name: policy.name,
                retention_age_ms: policy.retention_age_ms,
                retention_bytes: policy.retention_bytes,
                placement: policy.placement,
            },
        })
        .await?;
    Ok(wire::PutPolicyResponse { name })
}

pub(crate) async fn list_policies(
    meta: &MetaCtx,
    req: wire::ListPoliciesRequest,
) -> Result<wire::ListPoliciesResponse, Failure> {
    let mut all = meta.control.policies().await?;
    let policies: Vec<wire::PolicyDescription> = match &req.name {
        Some(name) => match all.remove(name) {
            Some(policy) => vec![to_wire(policy)],
            None => {
                return Err(ServeError::PolicyNotFound { name: name.clone() });
            }
        },
        None => all
            .into_values()
            .take(wire::POLICIES_MAX)
            .map(to_wire)
            .collect(),
    };
    Ok(wire::ListPoliciesResponse { policies })
}

pub(crate) async fn delete_policy(
    meta: &MetaCtx,
    req: wire::DeletePolicyRequest,
) -> Result<wire::DeletePolicyResponse, Failure> {
    meta.control
        .propose_policy(Command::RemovePolicy {
            name: req.name.clone(),
        })
        .await?;
    Ok(wire::DeletePolicyResponse { name: req.name })
}
