//! What subscribers see: members by node id, their liveness, and the events
//! between two views.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::identity::NodeIdentity;
use super::routing::VnodeLeader;

/// A broker's liveness as SWIM sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberState {
    /// Answers probes.
    Alive,
    /// Missed a probe and its indirect probes; it may still refute.
    Suspect,
    /// Declared down after the suspect timeout, or it left.
    Dead,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Dead => "dead",
        }
    }

    /// Alive or suspect: still counted as part of the cluster.
    pub fn is_live(self) -> bool {
        self != MemberState::Dead
    }
}

/// One broker, as the coordinators and the CLI see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub node_id: u64,
    /// Grows with every start of the broker and every rejoin after it was
    /// declared dead (this is not foca's refutation counter).
    pub incarnation: u64,
    pub client_addr: SocketAddr,
    pub raft_addr: Option<SocketAddr>,
    pub admin_addr: Option<SocketAddr>,
    pub cluster_addr: Option<SocketAddr>,
    pub attributes: BTreeMap<String, String>,
    pub state: MemberState,
    /// The ring version this broker last published (0 until it publishes).
    pub ring_version: u64,
    /// The vnodes this broker last said it leads, with their terms.
    pub vnodes_led: Vec<VnodeLeader>,
}

impl Member {
    pub(crate) fn from_identity(id: &NodeIdentity, state: MemberState) -> Member {
        Member {
            node_id: id.node_id,
            incarnation: id.incarnation,
            client_addr: id.client_addr,
            raft_addr: id.raft_addr,
            admin_addr: id.admin_addr,
            cluster_addr: id.cluster_addr,
            attributes: id.attributes.clone(),
            state,
            ring_version: 0,
            vnodes_led: Vec::new(),
        }
    }
}

/// What changed about a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemberEventKind {
    /// First seen alive.
    Joined,
    /// Came back with a higher incarnation (a restart, a rejoin after it
    /// was declared dead, or new attributes, which SWIM spreads as a new
    /// incarnation): anything learned about the old one is void.
    Restarted,
    /// Suspected of being down.
    Suspect,
    /// Refuted a suspicion, or came back from dead with the same incarnation.
    Alive,
    /// Declared down.
    Dead,
    /// Published a new ring version or vnode leaderships.
    Routing,
}

/// One change, with the member as it is after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberEvent {
    pub kind: MemberEventKind,
    pub member: Member,
}

/// Everything one broker knows about the cluster at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipView {
    /// This broker (always alive in its own view).
    pub local: Member,
    /// Every other broker ever seen, dead ones included, by node id.
    pub peers: BTreeMap<u64, Member>,
}

impl MembershipView {
    /// This broker first, then the others by node id.
    pub fn all(&self) -> impl Iterator<Item = &Member> {
        std::iter::once(&self.local).chain(self.peers.values())
    }

    /// Every broker alive or suspect, this one included.
    pub fn live(&self) -> impl Iterator<Item = &Member> {
        self.all().filter(|m| m.state.is_live())
    }

    pub fn get(&self, node_id: u64) -> Option<&Member> {
        if node_id == self.local.node_id {
            Some(&self.local)
        } else {
            self.peers.get(&node_id)
        }
    }
}
