//! The group's decoders of untrusted bytes, callable from outside the crate
//! (the fuzz bodies in `fuzz/bodies` drive them; nothing in the product calls
//! this module).
//!
//! Each function runs the product's own decoder on `bytes` and, when it
//! decodes, returns the canonical re-encoding of what it decoded, so a caller
//! can check the round trip: feeding that re-encoding back must decode and
//! re-encode to the same bytes. None of them panics on any input.

use super::error::Corruption;
use super::fsio::{encode_frame, encode_tagged};
use super::log_store::{LOG_MAGIC, VOTE_MAGIC, decode_log, decode_vote};
use super::network::FullSnapshotRequest;
use super::state_machine::{SNAPSHOT_MAGIC, decode_snapshot_file};
use super::types::TypeConfig;
use super::{RaftRpcKind, raft_kind_of};
use malachi_core::model::{MetadataState, SnapshotError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;

/// Why untrusted bytes were refused, or their decoding did not re-encode.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedError {
    /// A group file is damaged (`offset` is 0 for the vote and snapshot files).
    #[error("corrupt at {offset}: {problem}")]
    Corrupt { offset: usize, problem: Corruption },
    /// The model refused the state a snapshot holds.
    #[error("snapshot state: {0}")]
    SnapshotState(#[source] SnapshotError),
    /// A raft message body did not decode.
    #[error("{0}")]
    Decode(#[from] rmp_serde::decode::Error),
    #[error("re-encode: {0}")]
    Reencode(#[from] rmp_serde::encode::Error),
    /// A frame or tagged file could not be written back.
    #[error("re-encode {what}: {source}")]
    Frame {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("api key {api_key} is not a raft api key")]
    NotRaft { api_key: u16 },
    #[error("api key {api_key} is not a forwarded request")]
    NotForwarded { api_key: u16 },
}

fn corrupt(problem: Corruption) -> UntrustedError {
    UntrustedError::Corrupt { offset: 0, problem }
}

fn frame(what: &'static str) -> impl FnOnce(std::io::Error) -> UntrustedError {
    move |source| UntrustedError::Frame { what, source }
}

fn reencode<T: Serialize>(value: &T) -> Result<Vec<u8>, UntrustedError> {
    Ok(rmp_serde::to_vec(value)?)
}

fn decode_then_reencode<T: Serialize + DeserializeOwned>(
    bytes: &[u8],
) -> Result<Vec<u8>, UntrustedError> {
    let value: T = rmp_serde::from_slice(bytes)?;
    reencode(&value)
}

/// A group's `log` file, as `LogStore::open` reads it: the re-encoding holds
/// the header and every whole entry, without the torn tail recovery drops.
pub fn raft_log(
    bytes: &[u8],
    group_id: u64,
    entry_bytes_max: u64,
) -> Result<Vec<u8>, UntrustedError> {
    let log = decode_log(bytes, group_id, entry_bytes_max, Path::new("fuzz"))
        .map_err(|(offset, problem)| UntrustedError::Corrupt { offset, problem })?;
    let mut out =
        super::log_store::header_bytes(group_id, log.last_purged).map_err(frame("header"))?;
    for (entry, _) in log.entries.values() {
        let body = reencode(entry)?;
        encode_frame(&body, &mut out).map_err(frame("entry"))?;
    }
    Ok(out)
}

/// A group's `vote` file, as `LogStore::open` reads it.
pub fn raft_vote(bytes: &[u8]) -> Result<Vec<u8>, UntrustedError> {
    let vote = decode_vote(bytes).map_err(corrupt)?;
    encode_tagged(VOTE_MAGIC, &reencode(&vote)?).map_err(frame("vote"))
}

/// A group's `snapshot` file, as `StateMachine::open` reads it, including
/// the model's check of the state it holds (`MetadataState::restore`).
pub fn snapshot_file(bytes: &[u8], bytes_max: u64) -> Result<Vec<u8>, UntrustedError> {
    let file = decode_snapshot_file(bytes, bytes_max).map_err(corrupt)?;
    MetadataState::restore(&file.data).map_err(UntrustedError::SnapshotState)?;
    encode_tagged(SNAPSHOT_MAGIC, &reencode(&file)?).map_err(frame("snapshot"))
}

/// The body of a raft request (api keys 200 to 204, after the group id), as
/// the group decodes it before handing it to openraft.
pub fn raft_request(api_key: u16, body: &[u8]) -> Result<Vec<u8>, UntrustedError> {
    match raft_kind_of(api_key).ok_or(UntrustedError::NotRaft { api_key })? {
        RaftRpcKind::AppendEntries => {
            decode_then_reencode::<AppendEntriesRequest<TypeConfig>>(body)
        }
        RaftRpcKind::Vote | RaftRpcKind::PreVote => {
            decode_then_reencode::<VoteRequest<TypeConfig>>(body)
        }
        RaftRpcKind::FullSnapshot => decode_then_reencode::<FullSnapshotRequest>(body),
        RaftRpcKind::TransferLeader => {
            decode_then_reencode::<openraft::raft::TransferLeaderRequest<TypeConfig>>(body)
        }
    }
}

/// The body of a raft answer (api keys 200 to 204), as the sending side
/// decodes it.
pub fn raft_response(api_key: u16, body: &[u8]) -> Result<Vec<u8>, UntrustedError> {
    match raft_kind_of(api_key).ok_or(UntrustedError::NotRaft { api_key })? {
        RaftRpcKind::AppendEntries => {
            decode_then_reencode::<AppendEntriesResponse<TypeConfig>>(body)
        }
        RaftRpcKind::Vote | RaftRpcKind::PreVote => {
            decode_then_reencode::<VoteResponse<TypeConfig>>(body)
        }
        RaftRpcKind::FullSnapshot => decode_then_reencode::<SnapshotResponse<TypeConfig>>(body),
        RaftRpcKind::TransferLeader => {
            decode_then_reencode::<openraft::raft::TransferLeaderResponse<TypeConfig>>(body)
        }
    }
}

/// The magic tags of the group's files, so a caller can build valid samples.
pub const LOG_FILE_MAGIC: &[u8; 8] = LOG_MAGIC;
pub const VOTE_FILE_MAGIC: &[u8; 8] = VOTE_MAGIC;
pub const SNAPSHOT_FILE_MAGIC: &[u8; 8] = SNAPSHOT_MAGIC;

/// Valid encodings the product writes, for fuzzers and property tests to
/// start from (mutating a valid sample reaches deeper than random bytes).
pub mod samples {
    use super::super::log_store::header_bytes;
    use super::super::types::{Entry, LogId, Request, Vote};
    use super::*;
    use malachi_core::model::Command;
    use openraft::entry::RaftEntry;
    use openraft::vote::leader_id_adv::LeaderId;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(LeaderId { term, node_id: 1 }, index)
    }

    fn entries() -> Vec<Entry> {
        vec![
            Entry::new_blank(log_id(1, 3)),
            Entry::new_normal(
                log_id(1, 4),
                Request(Command::DeleteTopic {
                    topic: "orders".to_owned(),
                }),
            ),
        ]
    }

    /// A log of group `group_id` purged up to index 2, holding two entries.
    pub fn raft_log(group_id: u64) -> Vec<u8> {
        let mut out = header_bytes(group_id, Some(log_id(1, 2))).unwrap_or_default();
        for entry in entries() {
            if let Ok(body) = rmp_serde::to_vec(&entry) {
                let _ = encode_frame(&body, &mut out);
            }
        }
        out
    }

    /// A vote file.
    pub fn raft_vote() -> Vec<u8> {
        let vote = Vote::new(3, 2);
        let body = rmp_serde::to_vec(&vote).unwrap_or_default();
        encode_tagged(VOTE_MAGIC, &body).unwrap_or_default()
    }

    /// A snapshot file holding the empty metadata state.
    pub fn snapshot_file() -> Vec<u8> {
        let data = MetadataState::default().snapshot().unwrap_or_default();
        let file = super::super::state_machine::SnapshotFile {
            meta: openraft::storage::SnapshotMeta {
                last_log_id: Some(log_id(1, 7)),
                last_membership: Default::default(),
            },
            data,
        };
        let body = rmp_serde::to_vec(&file).unwrap_or_default();
        encode_tagged(SNAPSHOT_MAGIC, &body).unwrap_or_default()
    }

    /// A raft request body for `api_key` (200 to 204); empty for another key.
    pub fn raft_request(api_key: u16) -> Vec<u8> {
        let encoded = match raft_kind_of(api_key) {
            Some(RaftRpcKind::AppendEntries) => {
                let request: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
                    vote: Vote::new_committed(1, 1),
                    prev_log_id: Some(log_id(1, 2)),
                    entries: entries(),
                    leader_commit: Some(log_id(1, 2)),
                };
                rmp_serde::to_vec(&request)
            }
            Some(RaftRpcKind::Vote | RaftRpcKind::PreVote) => {
                let request: VoteRequest<TypeConfig> =
                    VoteRequest::new(Vote::new(2, 1), Some(log_id(1, 4)));
                rmp_serde::to_vec(&request)
            }
            Some(RaftRpcKind::TransferLeader) => {
                let request: openraft::raft::TransferLeaderRequest<TypeConfig> =
                    openraft::raft::TransferLeaderRequest::new(
                        Vote::new_committed(2, 1),
                        2,
                        Some(log_id(2, 9)),
                    );
                rmp_serde::to_vec(&request)
            }
            Some(RaftRpcKind::FullSnapshot) => {
                let file = super::super::state_machine::SnapshotFile {
                    meta: openraft::storage::SnapshotMeta {
                        last_log_id: Some(log_id(1, 7)),
                        last_membership: Default::default(),
                    },
                    data: MetadataState::default().snapshot().unwrap_or_default(),
                };
                rmp_serde::to_vec(&FullSnapshotRequest {
                    vote: Vote::new_committed(1, 1),
                    meta: file.meta,
                    data: file.data,
                })
            }
            None => return Vec::new(),
        };
        encoded.unwrap_or_default()
    }

    /// A raft answer body for `api_key` (200 to 204); empty for another key.
    pub fn raft_response(api_key: u16) -> Vec<u8> {
        let encoded = match raft_kind_of(api_key) {
            Some(RaftRpcKind::AppendEntries) => {
                rmp_serde::to_vec(&AppendEntriesResponse::<TypeConfig>::Success)
            }
            Some(RaftRpcKind::Vote | RaftRpcKind::PreVote) => {
                let response: VoteResponse<TypeConfig> =
                    VoteResponse::new(Vote::new(2, 1), Some(log_id(1, 4)), true);
                rmp_serde::to_vec(&response)
            }
            Some(RaftRpcKind::FullSnapshot) => rmp_serde::to_vec(&SnapshotResponse::<TypeConfig> {
                vote: Vote::new_committed(1, 1),
            }),
            Some(RaftRpcKind::TransferLeader) => {
                let accepted: openraft::raft::TransferLeaderResponse<TypeConfig> = Ok(());
                rmp_serde::to_vec(&accepted)
            }
            None => return Vec::new(),
        };
        encoded.unwrap_or_default()
    }
}
