//! Versions and feature gates on the client port (api key 28 `features`,
//! ADR 0134): the cluster version, each broker's advertisement and each
//! feature's state, read from the ring's group; `activate` and `finalize`
//! change them first. Any broker answers.

use malachi_core::model::FeatureTable;
use malachi_wire::messages as wire;

use super::error::ServeError;
use super::reply::Failure;
use crate::control::registry::ActorRegistry;

/// Answers a `features` request through this broker's metadata plane
/// (`actors`); `node_id` is this broker's, for the advertisement it shows.
pub(crate) async fn features(
    actors: &ActorRegistry,
    node_id: u64,
    request: wire::FeaturesRequest,
) -> Result<wire::FeaturesResponse, Failure> {
    let plane = actors.plane().map_err(ServeError::Metadata)?;
    let Some(host) = plane.host().cloned() else {
        return Err(ServeError::SingleVnode);
    };
    let change = match (&request.activate, request.finalize) {
        (Some(name), _) => Some(host.activate_feature(name).await),
        (None, true) => Some(host.finalize_features().await),
        (None, false) => None,
    };
    if let Some(change) = change {
        change
            .map_err(ServeError::from)?
            .map_err(ServeError::FeatureRefused)?;
    }
    let table = host.feature_table().await.map_err(ServeError::from)?;
    let mut response = to_wire(node_id, &table, &host.decommissioned());
    response.waiting_for = host
        .feature_table_held_back_by(&table)
        .into_iter()
        .take(malachi_wire::limits::BROKERS_MAX)
        .collect();
    Ok(response)
}

fn to_wire(
    node_id: u64,
    table: &FeatureTable,
    gone: &std::collections::BTreeSet<u64>,
) -> wire::FeaturesResponse {
    let brokers = table
        .members()
        .iter()
        .take(malachi_wire::limits::BROKERS_MAX)
        .map(|(node, a)| wire::BrokerVersion {
            node_id: *node,
            binary: a.binary.clone(),
            logical: a.logical,
            supported: a
                .supported
                .iter()
                .take(malachi_wire::limits::FEATURES_MAX)
                .cloned()
                .collect(),
        })
        .collect();
    let features = table
        .states(gone)
        .into_iter()
        .take(malachi_wire::limits::FEATURES_MAX)
        .map(|(name, state)| wire::FeatureInfo {
            missing: table.missing(&name, gone),
            state: state.name().to_owned(),
            name,
        })
        .collect();
    wire::FeaturesResponse {
        node_id,
        cluster_version: table.version(),
        brokers,
        features,
        waiting_for: Vec::new(),
    }
}
