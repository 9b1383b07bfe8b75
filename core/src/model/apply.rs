//! Applying commands: validate everything first, then mutate.
//!
//! Each handler reads the state to check the command and to compute every id
//! and offset it will need, and only then writes. No write can fail, so a
//! refused command leaves the state exactly as it was, with no rollback.

use super::arc::RingArc;
use super::command::{
    ACTIVE_RANGES_PER_TOPIC_MAX, Command, INITIAL_RANGES_MAX, IdKind, ModelError, NAME_BYTES_MAX,
    NameRule, Outcome, POLICY_CONSTRAINT_BYTES_MAX, POLICY_CONSTRAINTS_MAX, REPLICA_SET_SIZE_MAX,
};
use super::keyspace::Band;
use super::state::{
    Incarnation, MetadataState, NodeId, Range, RangeId, RangeState, SealRecord, Segment, SegmentId,
    SegmentState, StoragePolicy, Topic, TopicState,
};
use std::collections::{BTreeMap, BTreeSet};

/// What sealing a range's newest segment at a given record needs.
#[derive(Debug, Clone, Copy)]
struct SealStep {
    /// The segment to seal now, or `None` when it already carries exactly this seal.
    seal_now: Option<SegmentId>,
    /// The offset the range's next segment starts at.
    end_offset: u64,
}

/// Checks a topic or policy name: non-empty, at most `NAME_BYTES_MAX` bytes, of
/// ASCII letters, digits, `.`, `_` and `-`.
pub fn validate_name(name: &str) -> Result<(), ModelError> {
    let rule = if name.is_empty() {
        Some(NameRule::Empty)
    } else if name.len() > NAME_BYTES_MAX {
        Some(NameRule::TooLong)
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some(NameRule::BadCharacter)
    } else {
        None
    };
    match rule {
        Some(reason) => Err(ModelError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn validate_replicas(replicas: &[NodeId]) -> Result<(), ModelError> {
    if replicas.is_empty() {
        return Err(ModelError::EmptyReplicaSet);
    }
    if replicas.len() > REPLICA_SET_SIZE_MAX {
        return Err(ModelError::TooManyReplicas {
            count: replicas.len(),
            max: REPLICA_SET_SIZE_MAX,
        });
    }
    let mut seen = BTreeSet::new();
    for node in replicas {
        if !seen.insert(node) {
            return Err(ModelError::DuplicateReplica { node: *node });
        }
    }
    Ok(())
}

/// The first `count` ids of a counter, or a refusal if it would run out.
fn reserve(next: u64, count: u64, what: IdKind) -> Result<u64, ModelError> {
    next.checked_add(count)
        .ok_or(ModelError::IdSpaceExhausted { what })
}

impl MetadataState {
    /// Applies one command. On `Err` the state is unchanged, byte for byte.
    pub fn apply(&mut self, command: Command) -> Result<Outcome, ModelError> {
        if let Some(topic) = command.topic() {
            self.check_topic_route(topic)?;
        }
        let outcome = match command {
            Command::CreateTopic {
                topic,
                initial_ranges,
                policy,
                replicas,
                at_ms,
            } => self.create_topic(topic, initial_ranges, policy, replicas, at_ms),
            Command::SealTopic { topic, at_ms } => self.seal_topic(&topic, at_ms),
            Command::DeleteTopic { topic } => self.delete_topic(&topic),
            Command::RollSegment {
                topic,
                segment,
                seal,
                next_replicas,
                at_ms,
            } => self.roll_segment(&topic, segment, seal, next_replicas, at_ms),
            Command::SealSegment {
                topic,
                segment,
                seal,
                at_ms,
            } => self.seal_segment(&topic, segment, seal, at_ms),
            Command::SplitRange {
                topic,
                range,
                seal,
                lower_replicas,
                upper_replicas,
                at_ms,
                segment,
            } => self.split_range(
                &topic,
                range,
                (segment, seal),
                lower_replicas,
                upper_replicas,
                at_ms,
            ),
            Command::MergeRanges {
                topic,
                lower,
                upper,
                lower_seal,
                upper_seal,
                replicas,
                at_ms,
                lower_segment,
                upper_segment,
            } => self.merge_ranges(
                &topic,
                [lower, upper],
                [(lower_segment, lower_seal), (upper_segment, upper_seal)],
                replicas,
                at_ms,
            ),
            Command::ReplaceReplica {
                topic,
                segment,
                old,
                new,
            } => self.replace_replica(&topic, segment, old, new),
            Command::PutPolicy { policy } => self.put_policy(policy),
            Command::RemovePolicy { name } => self.remove_policy(&name),
            Command::AssignArc { arc, id_base } => self.assign_arc(arc, id_base),
            Command::FenceArc { moving } => self.fence_arc(moving),
            Command::LiftFence { moving } => self.lift_fence(moving),
            Command::SeedVnode { seed } => self.seed_vnode(*seed),
            Command::NarrowArc { keep } => self.narrow_arc(keep),
            Command::AcquireLease {
                holder,
                duration_ms,
                at_ms,
            } => self.acquire_lease_stamped(holder, duration_ms, at_ms),
            Command::AcquireLeaseWaited {
                holder,
                duration_ms,
                at_ms,
                waited_for,
            } => self.acquire_lease(holder, duration_ms, at_ms, waited_for),
            Command::ReleaseLease { holder, epoch } => self.release_lease(holder, epoch, None),
            Command::ReleaseLeaseGeneration {
                holder,
                epoch,
                generation,
            } => self.release_lease(holder, epoch, Some(generation)),
            Command::InitRing { vnodes } => self.init_ring(vnodes),
            Command::BeginSplit { parent } => self.begin_split(parent),
            Command::CommitSplit { parent, child } => self.commit_split(parent, child),
            Command::FinishSplit { parent, child } => self.finish_split(parent, child),
            Command::AbortSplit { parent, child } => self.abort_split(parent, child),
            Command::CreateCursorKey { secret, at_ms } => self.create_cursor_key(secret, at_ms),
            Command::RotateCursorKey {
                after,
                secret,
                at_ms,
            } => self.rotate_cursor_key(after, secret, at_ms),
            Command::AdmitNode { node, formed } => self.admit_node(node, &formed),
            Command::DecommissionNode {
                node,
                formed,
                replicas,
            } => self.decommission_node(node, &formed, replicas),
            Command::ExpireSegments { topic, segments } => self.expire_segments(&topic, &segments),
            Command::SetMemberAttributes { node, attributes } => {
                self.set_member_attributes(node, attributes)
            }
            Command::AddReplica {
                topic,
                segment,
                new,
                factor,
            } => self.add_replica(&topic, segment, new, factor),
            Command::AdvertiseFeatures {
                node,
                binary,
                logical,
                supported,
            } => self.advertise_features(
                node,
                super::features::Advertised {
                    binary,
                    logical,
                    supported: supported.into_iter().collect(),
                },
            ),
            Command::ActivateFeature { feature } => self.activate_feature(&feature),
            Command::FinalizeFeatures => self.finalize_features(),
            Command::PutUser {
                name,
                credential,
                replace,
                at_ms,
            } => self.put_user(name, credential, replace, at_ms),
            Command::DeleteUser { name } => self.delete_user(&name),
            Command::AddAcl { entry } => self.add_acl(entry),
            Command::RemoveAcl { entry } => self.remove_acl(entry),
            Command::RecordLoginFailure { key, policy, at_ms } => {
                self.record_login_failure(key, policy, at_ms)
            }
            Command::RecordLoginSuccess { key } => self.record_login_success(&key),
            Command::UnlockUser { name } => self.unlock_user(&name),
            Command::AddTokenKey { key } => self.add_token_key(key),
            Command::RemoveTokenKey { kid } => self.remove_token_key(&kid),
        }?;
        // Linear in the state, so only in debug builds; restore checks the same in release.
        debug_assert_eq!(
            self.check_invariants(),
            Ok(()),
            "after applying, outcome {outcome:?}"
        );
        Ok(outcome)
    }

    fn existing_topic(&self, topic: &str) -> Result<&Topic, ModelError> {
        self.topics
            .get(topic)
            .ok_or_else(|| ModelError::NoSuchTopic {
                topic: topic.to_owned(),
            })
    }

    /// The topic, refusing a sealed one: only an active topic can be reshaped or rolled.
    fn active_topic(&self, topic: &str) -> Result<&Topic, ModelError> {
        let found = self.existing_topic(topic)?;
        match found.state {
            TopicState::Active => Ok(found),
            TopicState::Sealed { .. } => Err(ModelError::TopicSealed {
                topic: topic.to_owned(),
            }),
        }
    }

    fn range_of_topic(&self, topic: &str, range: RangeId) -> Result<&Range, ModelError> {
        self.ranges
            .get(&range)
            .filter(|r| r.topic == topic)
            .ok_or_else(|| ModelError::NoSuchRange {
                topic: topic.to_owned(),
                range,
            })
    }

    fn active_range_of_topic(&self, topic: &str, range: RangeId) -> Result<&Range, ModelError> {
        let found = self.range_of_topic(topic, range)?;
        if found.is_active() {
            Ok(found)
        } else {
            Err(ModelError::RangeNotActive { range })
        }
    }

    fn segment_of_topic(&self, topic: &str, segment: SegmentId) -> Result<&Segment, ModelError> {
        self.segments
            .get(&segment)
            .filter(|s| self.ranges.get(&s.range).is_some_and(|r| r.topic == topic))
            .ok_or_else(|| ModelError::NoSuchSegment {
                topic: topic.to_owned(),
                segment,
            })
    }

    /// What sealing `segment` at `seal` takes: the first recorded seal wins,
    /// the same seal again is a no-op, a different one is refused.
    fn seal_step(segment: &Segment, seal: SealRecord) -> Result<SealStep, ModelError> {
        let end_offset =
            segment
                .start_offset
                .checked_add(seal.length)
                .ok_or(ModelError::OffsetOverflow {
                    range: segment.range,
                    length: seal.length,
                })?;
        match segment.state {
            SegmentState::Active => Ok(SealStep {
                seal_now: Some(segment.id),
                end_offset,
            }),
            SegmentState::Sealed { seal: recorded, .. } if recorded == seal => Ok(SealStep {
                seal_now: None,
                end_offset,
            }),
            SegmentState::Sealed { seal: recorded, .. } => Err(ModelError::AlreadySealed {
                segment: segment.id,
                recorded,
            }),
        }
    }

    /// The seal step for the newest segment of an active range, which must
    /// be `frozen` when the command names the segment its seal was computed
    /// from: a seal is recorded only for the segment it was taken from
    /// (chaos finding F6: a failover rolled the range between a split's
    /// freeze and its proposal, and the split sealed the successor, which
    /// holds nothing, at its predecessor's length). `None` (a command
    /// logged before commands named it) seals the newest, as it always did.
    fn seal_step_of_range(
        &self,
        range: &Range,
        frozen: Option<SegmentId>,
        seal: SealRecord,
    ) -> Result<SealStep, ModelError> {
        let segment = range.last_segment().and_then(|id| self.segments.get(&id));
        // Every range is created with a segment and segments leave only with their topic.
        assert!(
            segment.is_some(),
            "range {} has no newest segment",
            range.id
        );
        let Some(segment) = segment else {
            return Err(ModelError::RangeNotActive { range: range.id });
        };
        if let Some(frozen) = frozen
            && frozen != segment.id
        {
            if !range.segments.contains(&frozen) {
                return Err(ModelError::NoSuchSegment {
                    topic: range.topic.clone(),
                    segment: frozen,
                });
            }
            return Err(ModelError::AlreadyRolled {
                segment: frozen,
                successor: segment.id,
            });
        }
        let step = Self::seal_step(segment, seal)?;
        // The negative space: whatever the command named, the seal lands
        // on the segment it was computed from.
        assert!(
            frozen.is_none_or(|frozen| step.seal_now.is_none_or(|sealed| sealed == frozen)),
            "a seal computed from {frozen:?} would be recorded for {:?}",
            step.seal_now
        );
        Ok(step)
    }

    fn apply_seal(&mut self, step: SealStep, seal: SealRecord, at_ms: u64) {
        if let Some(id) = step.seal_now
            && let Some(segment) = self.segments.get_mut(&id)
        {
            assert!(
                matches!(segment.state, SegmentState::Active),
                "sealing sealed segment {id}"
            );
            segment.state = SegmentState::Sealed { seal, at_ms };
        }
    }

    fn issue_range_id(&mut self) -> RangeId {
        let id = RangeId(self.next_range_id);
        // Reserved by the handler's validation, so this cannot overflow.
        self.next_range_id += 1;
        id
    }

    /// The writer epoch of a segment opened now: the group's lease epoch
    /// (0 in a group that never granted one, such as a lone broker's).
    fn writer_epoch(&self) -> u64 {
        self.lease.map_or(0, |lease| lease.epoch)
    }

    fn issue_segment_id(&mut self) -> SegmentId {
        let id = SegmentId(self.next_segment_id);
        self.next_segment_id += 1;
        id
    }

    /// Opens a new active range with its first segment and files it everywhere.
    fn open_range(
        &mut self,
        topic: &str,
        band: Band,
        parents: Vec<RangeId>,
        replicas: Vec<NodeId>,
        at_ms: u64,
    ) -> (RangeId, SegmentId) {
        let range_id = self.issue_range_id();
        let segment_id = self.issue_segment_id();
        let segment = Segment {
            id: segment_id,
            range: range_id,
            start_offset: 0,
            replicas,
            state: SegmentState::Active,
            created_at_ms: at_ms,
            epoch: self.writer_epoch(),
        };
        let range = Range {
            id: range_id,
            topic: topic.to_owned(),
            band,
            state: RangeState::Active,
            parents,
            children: Vec::new(),
            segments: vec![segment_id],
            created_at_ms: at_ms,
            expired: None,
        };
        self.segments.insert(segment_id, segment);
        self.ranges.insert(range_id, range);
        if let Some(t) = self.topics.get_mut(topic) {
            t.ranges.push(range_id);
            let previous = t.active_by_start.insert(band.start(), range_id);
            assert!(
                previous.is_none(),
                "routing slot {:#x} of topic {topic} was taken",
                band.start()
            );
        }
        (range_id, segment_id)
    }

    /// Seals an active range whose newest segment is already sealed, naming its successors.
    fn retire_range(&mut self, id: RangeId, children: Vec<RangeId>, at_ms: u64) {
        let Some(range) = self.ranges.get_mut(&id) else {
            return;
        };
        assert!(range.is_active(), "retiring sealed range {id}");
        range.state = RangeState::Sealed { at_ms };
        range.children = children;
        let start = range.band.start();
        if let Some(topic) = self.topics.get_mut(&range.topic) {
            let removed = topic.active_by_start.remove(&start);
            assert_eq!(
                removed,
                Some(id),
                "routing slot {start:#x} did not hold {id}"
            );
        }
    }

    fn create_topic(
        &mut self,
        topic: String,
        initial_ranges: u64,
        policy: Option<String>,
        replicas: Vec<Vec<NodeId>>,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        validate_name(&topic)?;
        if let Some(policy) = &policy {
            validate_name(policy)?;
        }
        if self.topics.contains_key(&topic) {
            return Err(ModelError::TopicExists { topic });
        }
        if initial_ranges > INITIAL_RANGES_MAX {
            return Err(ModelError::TooManyInitialRanges {
                count: initial_ranges,
                max: INITIAL_RANGES_MAX,
            });
        }
        let bands = Band::tiling(initial_ranges).ok_or(ModelError::NotPowerOfTwo {
            count: initial_ranges,
        })?;
        if replicas.len() as u64 != initial_ranges {
            return Err(ModelError::ReplicaSetCount {
                expected: initial_ranges,
                found: replicas.len(),
            });
        }
        for set in &replicas {
            validate_replicas(set)?;
        }
        reserve(self.next_incarnation, 1, IdKind::Incarnation)?;
        reserve(self.next_range_id, initial_ranges, IdKind::Range)?;
        reserve(self.next_segment_id, initial_ranges, IdKind::Segment)?;

        let incarnation = Incarnation(self.next_incarnation);
        self.next_incarnation += 1;
        self.topics.insert(
            topic.clone(),
            Topic {
                name: topic.clone(),
                incarnation,
                policy,
                state: TopicState::Active,
                created_at_ms: at_ms,
                ranges: Vec::new(),
                active_by_start: BTreeMap::new(),
            },
        );
        let mut ranges = Vec::with_capacity(bands.len());
        let mut segments = Vec::with_capacity(bands.len());
        for (band, set) in bands.into_iter().zip(replicas) {
            let (range, segment) = self.open_range(&topic, band, Vec::new(), set, at_ms);
            ranges.push(range);
            segments.push(segment);
        }
        Ok(Outcome::TopicCreated {
            incarnation,
            ranges,
            segments,
        })
    }

    fn seal_topic(&mut self, topic: &str, at_ms: u64) -> Result<Outcome, ModelError> {
        if matches!(self.existing_topic(topic)?.state, TopicState::Sealed { .. }) {
            return Ok(Outcome::Unchanged);
        }
        let active_segments = self.unsealed_segments(topic);
        if let Some(t) = self.topics.get_mut(topic) {
            t.state = TopicState::Sealed { at_ms };
        }
        Ok(Outcome::TopicSealed { active_segments })
    }

    fn delete_topic(&mut self, topic: &str) -> Result<Outcome, ModelError> {
        self.existing_topic(topic)?;
        let Some(removed) = self.topics.remove(topic) else {
            return Err(ModelError::NoSuchTopic {
                topic: topic.to_owned(),
            });
        };
        let mut segments = Vec::new();
        for range_id in &removed.ranges {
            if let Some(range) = self.ranges.remove(range_id) {
                for segment_id in range.segments {
                    self.segments.remove(&segment_id);
                    segments.push(segment_id);
                }
            }
        }
        segments.sort_unstable();
        Ok(Outcome::TopicDeleted {
            incarnation: removed.incarnation,
            segments,
        })
    }

    fn roll_segment(
        &mut self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
        next_replicas: Vec<NodeId>,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        self.active_topic(topic)?;
        let current = self.segment_of_topic(topic, segment)?;
        let range = self.active_range_of_topic(topic, current.range)?;
        let position = range.segments.iter().position(|id| *id == segment);
        if let Some(&successor) = position.and_then(|i| range.segments.get(i + 1)) {
            return Err(ModelError::AlreadyRolled { segment, successor });
        }
        let step = Self::seal_step(current, seal)?;
        validate_replicas(&next_replicas)?;
        reserve(self.next_segment_id, 1, IdKind::Segment)?;
        let range_id = range.id;

        self.apply_seal(step, seal, at_ms);
        let next = self.issue_segment_id();
        self.segments.insert(
            next,
            Segment {
                id: next,
                range: range_id,
                start_offset: step.end_offset,
                replicas: next_replicas,
                state: SegmentState::Active,
                created_at_ms: at_ms,
                epoch: self.writer_epoch(),
            },
        );
        if let Some(range) = self.ranges.get_mut(&range_id) {
            range.segments.push(next);
        }
        Ok(Outcome::SegmentRolled {
            sealed: segment,
            next,
        })
    }

    fn seal_segment(
        &mut self,
        topic: &str,
        segment: SegmentId,
        seal: SealRecord,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        // A sealed topic still takes this command: it is how its last segments close.
        self.existing_topic(topic)?;
        let found = self.segment_of_topic(topic, segment)?;
        let step = Self::seal_step(found, seal)?;
        if step.seal_now.is_none() {
            return Ok(Outcome::Unchanged);
        }
        self.apply_seal(step, seal, at_ms);
        Ok(Outcome::SegmentSealed { segment })
    }

    fn split_range(
        &mut self,
        topic: &str,
        range: RangeId,
        (frozen, seal): (Option<SegmentId>, SealRecord),
        lower_replicas: Vec<NodeId>,
        upper_replicas: Vec<NodeId>,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        let found_topic = self.active_topic(topic)?;
        let active_count = found_topic.active_by_start.len();
        let parent = self.active_range_of_topic(topic, range)?;
        let (lower_band, upper_band) = parent
            .band
            .halves()
            .ok_or(ModelError::RangeTooSmall { range })?;
        if active_count >= ACTIVE_RANGES_PER_TOPIC_MAX {
            return Err(ModelError::TooManyActiveRanges {
                topic: topic.to_owned(),
                max: ACTIVE_RANGES_PER_TOPIC_MAX,
            });
        }
        let step = self.seal_step_of_range(parent, frozen, seal)?;
        validate_replicas(&lower_replicas)?;
        validate_replicas(&upper_replicas)?;
        reserve(self.next_range_id, 2, IdKind::Range)?;
        reserve(self.next_segment_id, 2, IdKind::Segment)?;

        // Seal-first: the parent and its write head are sealed in the same
        // step that opens the children, so no state has both taking writes.
        self.apply_seal(step, seal, at_ms);
        let lower_id = RangeId(self.next_range_id);
        let upper_id = RangeId(self.next_range_id + 1);
        self.retire_range(range, vec![lower_id, upper_id], at_ms);
        let (lower, lower_segment) =
            self.open_range(topic, lower_band, vec![range], lower_replicas, at_ms);
        let (upper, upper_segment) =
            self.open_range(topic, upper_band, vec![range], upper_replicas, at_ms);
        assert_eq!(
            (lower, upper),
            (lower_id, upper_id),
            "split issued unexpected range ids"
        );
        Ok(Outcome::RangeSplit {
            parent: range,
            lower,
            upper,
            lower_segment,
            upper_segment,
        })
    }

    fn merge_ranges(
        &mut self,
        topic: &str,
        pair: [RangeId; 2],
        seals: [(Option<SegmentId>, SealRecord); 2],
        replicas: Vec<NodeId>,
        at_ms: u64,
    ) -> Result<Outcome, ModelError> {
        let [lower_id, upper_id] = pair;
        self.active_topic(topic)?;
        let lower = self.active_range_of_topic(topic, lower_id)?;
        let upper = self.active_range_of_topic(topic, upper_id)?;
        // Buddies in the buddy-allocator sense: the lower and upper halves of
        // one aligned band. Anything else would leave a band no split made.
        let merged_band = lower
            .band
            .parent()
            .filter(|parent| parent.halves() == Some((lower.band, upper.band)));
        let Some(merged_band) = merged_band else {
            return Err(ModelError::NotBuddies {
                lower: lower_id,
                upper: upper_id,
            });
        };
        let [(lower_frozen, lower_seal), (upper_frozen, upper_seal)] = seals;
        let lower_step = self.seal_step_of_range(lower, lower_frozen, lower_seal)?;
        let upper_step = self.seal_step_of_range(upper, upper_frozen, upper_seal)?;
        validate_replicas(&replicas)?;
        reserve(self.next_range_id, 1, IdKind::Range)?;
        reserve(self.next_segment_id, 1, IdKind::Segment)?;

        self.apply_seal(lower_step, lower_seal, at_ms);
        self.apply_seal(upper_step, upper_seal, at_ms);
        let merged_id = RangeId(self.next_range_id);
        self.retire_range(lower_id, vec![merged_id], at_ms);
        self.retire_range(upper_id, vec![merged_id], at_ms);
        let (merged, segment) = self.open_range(
            topic,
            merged_band,
            vec![lower_id, upper_id],
            replicas,
            at_ms,
        );
        assert_eq!(merged, merged_id, "merge issued an unexpected range id");
        Ok(Outcome::RangesMerged {
            lower: lower_id,
            upper: upper_id,
            merged,
            segment,
        })
    }

    fn replace_replica(
        &mut self,
        topic: &str,
        segment: SegmentId,
        old: NodeId,
        new: NodeId,
    ) -> Result<Outcome, ModelError> {
        self.existing_topic(topic)?;
        let found = self.segment_of_topic(topic, segment)?;
        let Some(index) = found.replicas.iter().position(|n| *n == old) else {
            return Err(ModelError::WrongReplica { segment, node: old });
        };
        if found.replicas.contains(&new) {
            return Err(ModelError::ReplicaPresent { segment, node: new });
        }
        if let Some(found) = self.segments.get_mut(&segment)
            && let Some(slot) = found.replicas.get_mut(index)
        {
            // In place, so the order placement chose (and the primary) is kept.
            *slot = new;
        }
        Ok(Outcome::ReplicaReplaced { segment })
    }

    /// Appends `new` to a sealed segment's replica set (ADR 0117), while
    /// it has fewer than `factor` copies. At the end, so the primary and
    /// the order placement chose are kept; only sealed, so no writer ever
    /// sees its followers change.
    fn add_replica(
        &mut self,
        topic: &str,
        segment: SegmentId,
        new: NodeId,
        factor: u32,
    ) -> Result<Outcome, ModelError> {
        self.existing_topic(topic)?;
        let found = self.segment_of_topic(topic, segment)?;
        if !matches!(found.state, SegmentState::Sealed { .. }) {
            return Err(ModelError::SegmentNotSealed { segment });
        }
        if new.0 == 0 {
            return Err(ModelError::InvalidNode);
        }
        let wanted = usize::try_from(factor).unwrap_or(usize::MAX);
        if wanted > REPLICA_SET_SIZE_MAX {
            return Err(ModelError::TooManyReplicas {
                count: wanted,
                max: REPLICA_SET_SIZE_MAX,
            });
        }
        if found.replicas.contains(&new) {
            return Err(ModelError::ReplicaPresent { segment, node: new });
        }
        if found.replicas.len() >= wanted {
            return Err(ModelError::AtFactor { segment, factor });
        }
        if let Some(found) = self.segments.get_mut(&segment) {
            found.replicas.push(new);
        }
        Ok(Outcome::ReplicaAdded { segment })
    }

    fn put_policy(&mut self, policy: StoragePolicy) -> Result<Outcome, ModelError> {
        validate_name(&policy.name)?;
        let count = policy.placement.len();
        if count > POLICY_CONSTRAINTS_MAX
            || policy
                .placement
                .iter()
                .any(|c| c.len() > POLICY_CONSTRAINT_BYTES_MAX)
        {
            return Err(ModelError::InvalidPolicy {
                name: policy.name,
                count,
                max: POLICY_CONSTRAINTS_MAX,
                bytes_max: POLICY_CONSTRAINT_BYTES_MAX,
            });
        }
        if self.policies.get(&policy.name) == Some(&policy) {
            return Ok(Outcome::Unchanged);
        }
        self.policies.insert(policy.name.clone(), policy);
        self.sync_vnode_placement();
        Ok(Outcome::PolicyPut)
    }

    fn remove_policy(&mut self, name: &str) -> Result<Outcome, ModelError> {
        match self.policies.remove(name) {
            Some(_) => {
                self.sync_vnode_placement();
                Ok(Outcome::PolicyRemoved)
            }
            None => Err(ModelError::NoSuchPolicy {
                name: name.to_owned(),
            }),
        }
    }

    fn assign_arc(&mut self, arc: RingArc, id_base: u64) -> Result<Outcome, ModelError> {
        // A split in progress fixes the arc until it narrows or lifts.
        if let Some(fence) = self.fence
            && (!arc.covers(&fence) || arc == fence)
        {
            return Err(ModelError::FenceInPlace { fence });
        }
        if let Some(topic) = self.topics.keys().find(|name| !arc.holds_topic(name)) {
            return Err(ModelError::ArcExcludesTopic {
                topic: topic.clone(),
                arc,
            });
        }
        self.arc = Some(arc);
        // Only ever raised: ids already issued are never issued again.
        self.next_range_id = self.next_range_id.max(id_base);
        self.next_segment_id = self.next_segment_id.max(id_base);
        Ok(Outcome::ArcAssigned)
    }
}
