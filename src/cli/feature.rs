//! `malachi feature list|activate|finalize` and `malachi cluster version`:
//! versions and feature gates (ADR 0134), kept in the cluster's ring group.
//! Each is one `features` request on the client port (api key 28) to any
//! broker.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use malachi_wire::messages::{FeaturesRequest, FeaturesResponse};

use super::OutputArgs;
use super::client::{connect, print_json, print_text};
use super::error::CliError;

#[derive(Debug, Subcommand)]
pub enum FeatureCommand {
    /// Each feature and where it stands: unavailable (some broker does not
    /// support it), available, active (in use) or finalized.
    List(OutputArgs),
    /// Activate an available feature (every broker supports it). Features
    /// that activate by themselves need not be.
    Activate(FeatureNameArgs),
    /// Finalize every active feature: from then on a broker whose binary
    /// lacks one is refused, so the upgrade can no longer be rolled back.
    Finalize(OutputArgs),
}

#[derive(Debug, Args)]
pub struct FeatureNameArgs {
    /// The feature's name, as `feature list` prints it.
    pub name: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

async fn call(
    what: &'static str,
    output: &OutputArgs,
    request: FeaturesRequest,
) -> Result<FeaturesResponse, CliError> {
    let client = connect(output).await?;
    client
        .features(request)
        .await
        .map_err(|e| CliError::client(what, &output.broker_label(), e))
}

pub async fn feature(command: FeatureCommand) -> Result<(), CliError> {
    let (what, output, request) = match command {
        FeatureCommand::List(output) => ("feature list", output, FeaturesRequest::default()),
        FeatureCommand::Activate(args) => (
            "feature activate",
            args.output,
            FeaturesRequest {
                activate: Some(args.name),
                finalize: false,
            },
        ),
        FeatureCommand::Finalize(output) => (
            "feature finalize",
            output,
            FeaturesRequest {
                activate: None,
                finalize: true,
            },
        ),
    };
    let response = call(what, &output, request).await?;
    if output.json {
        response.features.iter().try_for_each(print_json)
    } else {
        print_text(&render_features(&response))
    }
}

/// `malachi cluster version`.
pub async fn cluster_version(output: OutputArgs) -> Result<(), CliError> {
    let response = call("cluster version", &output, FeaturesRequest::default()).await?;
    if output.json {
        print_json(&serde_json::json!({
            "cluster_version": response.cluster_version,
            "brokers": response.brokers,
            "waiting_for": response.waiting_for,
        }))
    } else {
        print_text(&render_version(&response))
    }
}

/// One line a feature: its name, state and the brokers lacking it.
pub fn render_features(response: &FeaturesResponse) -> String {
    let mut out = String::new();
    let width = response
        .features
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(0);
    for f in &response.features {
        let _ = write!(out, "{:<width$}  {}", f.name, f.state);
        if !f.missing.is_empty() {
            let missing: Vec<String> = f.missing.iter().map(u64::to_string).collect();
            let _ = write!(out, "  (not on brokers {})", missing.join(", "));
        }
        out.push('\n');
    }
    if response.features.is_empty() {
        out.push_str("no features\n");
    }
    push_wait(&mut out, &response.waiting_for);
    out
}

/// The line saying the table is held back, and by whom, if it is.
fn push_wait(out: &mut String, waiting_for: &[u64]) {
    if !waiting_for.is_empty() {
        let _ = writeln!(
            out,
            "advertising waits for brokers {}: they do not gossip that they read the feature table (binaries from before ADR 0134); upgrade or decommission them",
            joined(waiting_for)
        );
    }
}

/// The cluster version, then one line a broker: its binary and logical
/// versions and the features it supports.
pub fn render_version(response: &FeaturesResponse) -> String {
    let mut out = String::new();
    match response.cluster_version {
        0 => out.push_str("cluster version: not finalized (a downgrade is still possible)\n"),
        v => {
            let _ = writeln!(out, "cluster version: {v} (finalized)");
        }
    }
    for b in &response.brokers {
        let _ = writeln!(
            out,
            "node {}  binary {}  logical {}  features {}",
            b.node_id,
            b.binary,
            b.logical,
            if b.supported.is_empty() {
                "-".to_owned()
            } else {
                b.supported.join(",")
            }
        );
    }
    if response.brokers.is_empty() {
        out.push_str("no broker has advertised its version yet\n");
    }
    push_wait(&mut out, &response.waiting_for);
    out
}

/// Node ids, comma separated.
fn joined(nodes: &[u64]) -> String {
    nodes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use malachi_wire::messages::{BrokerVersion, FeatureInfo};

    fn sample() -> FeaturesResponse {
        FeaturesResponse {
            node_id: 1,
            cluster_version: 0,
            brokers: vec![
                BrokerVersion {
                    node_id: 1,
                    binary: "0.2.0".into(),
                    logical: 2,
                    supported: vec!["split_merge_segments".into(), "users".into()],
                },
                BrokerVersion {
                    node_id: 2,
                    binary: "0.1.0".into(),
                    logical: 1,
                    supported: vec!["split_merge_segments".into()],
                },
            ],
            features: vec![
                FeatureInfo {
                    name: "split_merge_segments".into(),
                    state: "finalized".into(),
                    missing: Vec::new(),
                },
                FeatureInfo {
                    name: "users".into(),
                    state: "unavailable".into(),
                    missing: vec![2],
                },
            ],
            waiting_for: Vec::new(),
        }
    }

    #[test]
    fn features_render_one_a_line_with_the_brokers_lacking_them() {
        insta::assert_snapshot!(render_features(&sample()));
    }

    #[test]
    fn the_cluster_version_renders_each_brokers_versions() {
        insta::assert_snapshot!(render_version(&sample()));
        let finalized = FeaturesResponse {
            cluster_version: 2,
            ..sample()
        };
        assert!(render_version(&finalized).starts_with("cluster version: 2 (finalized)\n"));
    }

    #[test]
    fn a_table_held_back_names_the_brokers_it_waits_for() {
        let waiting = FeaturesResponse {
            brokers: Vec::new(),
            waiting_for: vec![2, 3],
            ..sample()
        };
        let text = render_version(&waiting);
        assert!(
            text.ends_with(
                "advertising waits for brokers 2, 3: they do not gossip that they read the feature table (binaries from before ADR 0134); upgrade or decommission them\n"
            ),
            "{text}"
        );
        assert!(render_features(&waiting).contains("advertising waits for brokers 2, 3"));
        assert!(!render_version(&sample()).contains("waits"));
    }
}
