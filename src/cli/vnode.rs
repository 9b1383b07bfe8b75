//! `malachi vnode list` and `malachi vnode split`: the ring as a broker
//! routes by it, and the operator's vnode split (ADR 0082). Both are one
//! request on the client port (api keys 22 and 23, beside `tree` and
//! `cluster status`) to any broker.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use malachi_wire::messages::{VnodeInfo, VnodeListResponse, VnodeSplitResponse};

use super::OutputArgs;
use super::client::{connect, print_json, print_text};
use super::error::CliError;

/// The least a split is waited for: it is a dozen replicated steps and an
/// election of the new group, and a client that gives up cannot tell how
/// far it got (the split goes on at the broker).
const SPLIT_TIMEOUT_MIN_MS: u64 = 120_000;

#[derive(Debug, Subcommand)]
pub enum VnodeCommand {
    /// The ring the broker routes by: its version, and each vnode's id, arc
    /// of the hash space, leader, replicas and lease holder.
    List(OutputArgs),
    /// Split a vnode into two raft groups, each taking half of its arc and the
    /// topics within. Any broker runs it; repeating it resumes an unfinished
    /// split of the same vnode.
    Split(VnodeSplitArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "The vnode keeps the lower half of its arc; a new vnode (the next unused id) takes \
    the upper half\nand the topics in it. Clients keep working: requests for moving topics are \
    answered after the split.\nThe answer is waited for at least 120 s, whatever --timeout-ms says.\nErrors: vnode_not_found (no such vnode on the ring), \
    split_in_progress (another vnode's split is\nunfinished: split that vnode again to resume it)."
)]
pub struct VnodeSplitArgs {
    /// The vnode to split, as `malachi vnode list` shows it.
    pub vnode: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn vnode(command: VnodeCommand) -> Result<(), CliError> {
    match command {
        VnodeCommand::List(output) => {
            let client = connect(&output).await?;
            let ring = client
                .vnode_list()
                .await
                .map_err(|e| CliError::client("vnode list", &output.broker_label(), e))?;
            if output.json {
                print_json(&ring)
            } else {
                print_text(&render_list(&ring))
            }
        }
        VnodeCommand::Split(args) => {
            let mut output = args.output;
            output.timeout_ms = output.timeout_ms.max(SPLIT_TIMEOUT_MIN_MS);
            let client = connect(&output).await?;
            let split = client
                .vnode_split(args.vnode)
                .await
                .map_err(|e| CliError::client("vnode split", &output.broker_label(), e))?;
            if output.json {
                print_json(&split)
            } else {
                print_text(&render_split(&split))
            }
        }
    }
}

const HEADER: [&str; 6] = ["vnode", "arc", "leader", "term", "replicas", "lease"];

fn row(out: &mut String, v: &VnodeInfo) {
    let or_dash = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let replicas = v
        .replicas
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let _ = writeln!(
        out,
        "{:<6} {:016x}..={:016x}  {:<7} {:<5} {:<9} {}",
        v.id,
        v.arc_start,
        v.arc_last,
        or_dash(v.leader),
        v.term,
        if replicas.is_empty() { "-" } else { &replicas },
        or_dash(v.lease_holder),
    );
}

fn header(out: &mut String) {
    let _ = writeln!(
        out,
        "{:<6} {:<36} {:<7} {:<5} {:<9} {}",
        HEADER[0], HEADER[1], HEADER[2], HEADER[3], HEADER[4], HEADER[5]
    );
}

/// The ring, one vnode a line, in arc order.
pub fn render_list(ring: &VnodeListResponse) -> String {
    let mut out = format!(
        "ring version {} ({} vnodes), answered by node {}\n",
        ring.ring_version,
        ring.vnodes.len(),
        ring.node_id
    );
    header(&mut out);
    let mut vnodes: Vec<&VnodeInfo> = ring.vnodes.iter().collect();
    vnodes.sort_by_key(|v| v.arc_start);
    for v in vnodes {
        row(&mut out, v);
    }
    out
}

/// The two halves of a finished split.
pub fn render_split(split: &VnodeSplitResponse) -> String {
    let mut out = format!(
        "split vnode {} into {} and {}: ring version {}\n",
        split.parent.id, split.parent.id, split.child.id, split.ring_version
    );
    header(&mut out);
    row(&mut out, &split.parent);
    row(&mut out, &split.child);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u32, arc_start: u64, arc_last: u64, leader: Option<u64>) -> VnodeInfo {
        VnodeInfo {
            id,
            arc_start,
            arc_last,
            leader,
            term: 4,
            replicas: vec![1, 2, 3],
            lease_holder: leader,
        }
    }

    #[test]
    fn the_ring_lists_each_vnode_on_a_line_in_arc_order() {
        let ring = VnodeListResponse {
            node_id: 2,
            ring_version: 3,
            vnodes: vec![
                info(0, 0, 0x3fff_ffff_ffff_ffff, Some(1)),
                info(1, 0x8000_0000_0000_0000, u64::MAX, Some(3)),
                info(2, 0x4000_0000_0000_0000, 0x7fff_ffff_ffff_ffff, None),
            ],
        };
        insta::assert_snapshot!(render_list(&ring));
    }

    #[test]
    fn a_split_shows_both_halves() {
        let split = VnodeSplitResponse {
            ring_version: 2,
            parent: info(0, 0, 0x3fff_ffff_ffff_ffff, Some(1)),
            child: info(2, 0x4000_0000_0000_0000, 0x7fff_ffff_ffff_ffff, None),
        };
        insta::assert_snapshot!(render_split(&split));
    }
}
