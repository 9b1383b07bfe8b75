//! Storage policy administration (issue 21, ADR 0115): `put_policy`,
//! `list_policies` and `delete_policy`, kept in the ring's group
//! (`control::policies`).

use malachi_core::model::{Command, Feature, ModelError, ReshapePolicy, StoragePolicy};
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
        reshape: policy.reshape.map(|r| wire::PolicyReshape {
            auto_reshape: r.auto_reshape,
            split_write_bytes_per_second: r.split_write_bytes_per_second,
            split_after_ms: r.split_after_ms,
            merge_write_bytes_per_second: r.merge_write_bytes_per_second,
            merge_after_ms: r.merge_after_ms,
            reshape_interval_ms: r.reshape_interval_ms,
            ranges_min: r.ranges_min,
            ranges_max: r.ranges_max,
        }),
    }
}

/// A policy's reshaping settings, checked (ADR 0143); `None` when it sets
/// none, so the policy encodes as before the field existed.
fn reshape_of(
    name: &str,
    r: Option<wire::PolicyReshape>,
) -> Result<Option<ReshapePolicy>, ServeError> {
    let Some(r) = r else {
        return Ok(None);
    };
    let policy = ReshapePolicy {
        auto_reshape: r.auto_reshape,
        split_write_bytes_per_second: r.split_write_bytes_per_second,
        split_after_ms: r.split_after_ms,
        merge_write_bytes_per_second: r.merge_write_bytes_per_second,
        merge_after_ms: r.merge_after_ms,
        reshape_interval_ms: r.reshape_interval_ms,
        ranges_min: r.ranges_min,
        ranges_max: r.ranges_max,
    };
    let invalid = |reason: &str| ServeError::InvalidPolicy {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if policy.ranges_min == Some(0) || policy.ranges_max == Some(0) {
        return Err(invalid(
            "a topic always has at least one active range: ranges_min and ranges_max must be at least 1",
        ));
    }
    if let (Some(min), Some(max)) = (policy.ranges_min, policy.ranges_max)
        && min > max
    {
        return Err(invalid("ranges_min is above ranges_max"));
    }
    if let (Some(merge), Some(split)) = (
        policy.merge_write_bytes_per_second,
        policy.split_write_bytes_per_second,
    ) && merge >= split
    {
        return Err(invalid(
            "the merge rate must be below the split rate, or ranges would split and merge in turn",
        ));
    }
    Ok((!policy.is_empty()).then_some(policy))
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
    let reshape = reshape_of(&policy.name, policy.reshape)?;
    // Older brokers cannot decode a policy with reshaping settings: it is
    // written only once every broker reads it (ADR 0134).
    if reshape.is_some() {
        let plane = meta.plane().map_err(super::reply::not_serving)?;
        if plane.require(Feature::ReshapePolicy).is_err() {
            return Err(ServeError::FeatureRefused(ModelError::FeatureUnavailable {
                feature: Feature::ReshapePolicy.name().to_owned(),
                missing: Vec::new(),
            }));
        }
    }
    let name = policy.name.clone();
    meta.control
        .propose_policy(Command::PutPolicy {
            policy: StoragePolicy {
                name: policy.name,
                retention_age_ms: policy.retention_age_ms,
                retention_bytes: policy.retention_bytes,
                placement: policy.placement,
                reshape,
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
