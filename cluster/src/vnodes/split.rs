//! The operator's vnode split, run from any broker (ADR 0082).
//!
//! Order, each step a replicated command or a read that repeats safely:
//! 1. `BeginSplit` in the ring's group fixes the child's id and arcs, and
//!    makes the split resumable (one split at a time).
//! 2. `AssignArc` then `FenceArc` in the parent: from here on the parent
//!    refuses commands and reads in the moving half with `Moved`, so that
//!    half stops changing.
//! 3. The fenced half is exported from the parent's leader (a linearizable
//!    read, so it holds every acknowledged command), the child's group is
//!    opened on its voters and seeded with exactly that metadata.
//! 4. `CommitSplit` in the ring's group: the ring names the child. Clients
//!    refused with `Moved` re-read the ring and land on the child.
//! 5. `NarrowArc` in the parent drops the moved topics; `FinishSplit` ends
//!    the split in the ring's group.
//!
//! A split interrupted anywhere is resumed by calling `split_vnode` again
//! (the pending split in the ring's group says where it stood) or, before
//! step 4, rolled back by `abort_split`.

use super::{Query, RouteError, VnodeHost, encode_request};
use crate::group::FORWARD_QUERY_API_KEY;
use malachi_core::model::{Command, ModelError, Outcome, PendingSplit, VnodeSeed};
use malachi_core::ring::VnodeId;

/// Why a split (or its rollback) stopped. Every step before it is kept, and
/// calling `split_vnode` again resumes from there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// A step could not reach its group's leader.
    #[error("split step {step}: {source}")]
    Route {
        step: &'static str,
        #[source]
        source: RouteError,
    },
    /// A group refused a step.
    #[error("split step {step} was refused: {error}")]
    Refused {
        step: &'static str,
        error: ModelError,
    },
    /// A step got an answer of the wrong kind.
    #[error("split step {step} answered {outcome:?}")]
    Unexpected {
        step: &'static str,
        outcome: Outcome,
    },
    /// Too few of the child's voters opened its replica for it to elect.
    #[error("only {opened} of the voters {voters:?} of {vnode} opened its replica: {last}")]
    NoQuorum {
        vnode: VnodeId,
        voters: Vec<u64>,
        opened: usize,
        last: String,
    },
    /// The split was committed to the ring and can only go forward.
    #[error("the split of {parent} into {child} is committed; resume it instead")]
    Committed { parent: VnodeId, child: VnodeId },
}

fn verdict(
    step: &'static str,
    answer: Result<Result<Outcome, ModelError>, RouteError>,
) -> Result<Outcome, SplitError> {
    answer
        .map_err(|source| SplitError::Route { step, source })?
        .map_err(|error| SplitError::Refused { step, error })
}

impl VnodeHost {
    /// Splits `parent` into two raft groups, each taking half of its arc and
    /// the metadata within, and returns `(parent, child)`. Resumes a split
    /// of `parent` that an earlier call left unfinished. Nothing
    /// acknowledged is lost: commands for the moving half are refused with
    /// the retriable `Moved` from the fence until the ring names the child.
    pub async fn split_vnode(&self, parent: VnodeId) -> Result<(VnodeId, VnodeId), SplitError> {
        // The ring group creates its ring on first read; a split asked
        // for before anything read it (a cluster just formed) must not be
        // refused for want of one.
        self.ring_record()
            .await
            .map_err(|source| SplitError::Route {
                step: "begin",
                source,
            })?;
        let begun = verdict(
            "begin",
            self.propose_ring(Command::BeginSplit { parent }).await,
        )?;
        let Outcome::SplitBegun { split } = begun else {
            return Err(SplitError::Unexpected {
                step: "begin",
                outcome: begun,
            });
        };
        tracing::info!(%parent, child = %split.child, committed = split.committed, "vnode split running");
        if !split.committed {
            self.fence_and_seed(&split).await?;
            verdict(
                "commit",
                self.propose_ring(Command::CommitSplit {
                    parent,
                    child: split.child,
                })
                .await,
            )?;
        }
        // Route by the new ring at once rather than on the first refusal,
        // and tell the other brokers, so the child's leader starts its
        // coordinator without waiting for gossip.
        match self.refresh_ring().await {
            Ok(ring) => self.announce_ring(ring.version()).await,
            Err(source) => {
                tracing::warn!(%parent, error = %source, "split committed; the ring will be fetched later")
            }
        }
        verdict(
            "narrow",
            self.propose_to(parent, Command::NarrowArc { keep: split.lower })
                .await,
        )?;
        verdict(
            "finish",
            self.propose_ring(Command::FinishSplit {
                parent,
                child: split.child,
            })
            .await,
        )?;
        tracing::info!(%parent, child = %split.child, lower = %split.lower, upper = %split.upper, "vnode split done");
        Ok((parent, split.child))
    }

    /// Steps 2 and 3: fence the moving half in the parent, export it, and
    /// seed the child's group with it.
    async fn fence_and_seed(&self, split: &PendingSplit) -> Result<(), SplitError> {
        let parent = split.parent;
        let whole = malachi_core::model::RingArc {
            start: split.lower.start,
            end: split.upper.end,
        };
        // The parent may never have recorded its arc (no topic command yet);
        // the fence needs it. Repeating it is harmless.
        verdict(
            "assign_arc",
            self.propose_to(
                parent,
                Command::AssignArc {
                    arc: whole,
                    id_base: parent.id_base(),
                },
            )
            .await,
        )?;
        verdict(
            "fence",
            self.propose_to(
                parent,
                Command::FenceArc {
                    moving: split.upper,
                },
            )
            .await,
        )?;
        let query = encode_request(
            &Query::Export {
                arc: split.upper,
                id_base: split.child.id_base(),
            },
            parent,
        )
        .map_err(|source| SplitError::Route {
            step: "export",
            source,
        })?;
        let seed: VnodeSeed = self
            .route_group(parent, FORWARD_QUERY_API_KEY, &query)
            .await
            .map_err(|source| SplitError::Route {
                step: "export",
                source,
            })?;
        tracing::info!(%parent, child = %split.child, topics = seed.topics.len(), "fenced half exported");
        self.open_on_voters(split.child).await?;
        verdict(
            "seed",
            self.propose_to(
                split.child,
                Command::SeedVnode {
                    seed: Box::new(seed),
                },
            )
            .await,
        )?;
        Ok(())
    }

    /// Opens the child's replica on each of its voters; a majority must
    /// succeed for the group to elect. The others open theirs when they
    /// learn the ring that names the child.
    async fn open_on_voters(&self, vnode: VnodeId) -> Result<(), SplitError> {
        // The child's voters travel with the request, so every voter
        // initializes the same membership whatever ring it holds (ADR 0104).
        let voters = self.target_voters(vnode);
        let mut opened = 0usize;
        let mut last = String::new();
        for voter in &voters {
            match self.ask_open(*voter, vnode, Some(voters.clone())).await {
                Ok(()) => opened += 1,
                Err(e) => {
                    tracing::warn!(%vnode, voter, error = %e, "a voter did not open the new vnode");
                    last = e.to_string();
                }
            }
        }
        if opened * 2 <= voters.len() {
            return Err(SplitError::NoQuorum {
                vnode,
                voters,
                opened,
                last,
            });
        }
        Ok(())
    }

    /// Rolls back a split of `parent` that has not committed its ring:
    /// forgets it in the ring's group (its child id is never reused), then
    /// lifts the parent's fence. Refused once the ring names the child.
    /// Returns whether a pending split was forgotten.
    pub async fn abort_split(&self, parent: VnodeId) -> Result<bool, SplitError> {
        let record = self
            .ring_record()
            .await
            .map_err(|source| SplitError::Route {
                step: "abort",
                source,
            })?;
        let mut forgotten = false;
        if let Some(pending) = record.pending.filter(|p| p.parent == parent) {
            if pending.committed {
                return Err(SplitError::Committed {
                    parent,
                    child: pending.child,
                });
            }
            // Forget first: a fence lifted while the split is still pending
            // could be resumed into a child seeded before the lift.
            verdict(
                "abort",
                self.propose_ring(Command::AbortSplit {
                    parent,
                    child: pending.child,
                })
                .await,
            )?;
            forgotten = true;
        }
        let Some(moving) = record
            .ring
            .vnode(parent)
            .and_then(|v| v.arc.halves())
            .map(|(_, upper)| upper)
        else {
            return Ok(forgotten);
        };
        verdict(
            "lift_fence",
            self.propose_to(parent, Command::LiftFence { moving }).await,
        )?;
        Ok(forgotten)
    }

    /// The split in progress, if any, as the ring's group records it.
    pub async fn pending_split(&self) -> Result<Option<PendingSplit>, SplitError> {
        self.ring_record()
            .await
            .map(|r| r.pending)
            .map_err(|source| SplitError::Route {
                step: "read",
                source,
            })
    }
}
