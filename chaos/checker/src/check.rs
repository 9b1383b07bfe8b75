//! The checker proper: one pass over the history, line by line, deciding
//! each anomaly at the line that shows it. The rules are in the crate doc;
//! this module says how the state that judges them is kept.
//!
//! Every decision can be taken at the line it concerns because a history is
//! in the order things happened: a record's `produce` line precedes any read
//! of it, and if write A was acknowledged before write B was sent, A's
//! `produce_ok` line precedes B's `produce` line. "Before" below always
//! means "on an earlier line", never a comparison of `t_ms`, so two events in
//! the same millisecond are still ordered.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::io::BufRead;
use std::ops::Bound;

use crate::anomaly::Anomaly;
use crate::error::CheckError;
use crate::event::Event;
use crate::report::{Config, FinalRead, Recovery, Report, Vacuity, Verdict, WriteCounts};
use crate::seqset::SeqSet;

/// Index of an interned key or consumer name.
type Id = u32;

/// A 64-bit digest of a value or cursor. Values and cursors are kept as
/// digests so the checker's memory is a fixed few words per record, however
/// long the strings are. `DefaultHasher::new()` is the same in every call,
/// which is all a single run needs; digests are never stored.
fn digest(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    InFlight,
    Acked { line: u64, t_ms: u64 },
    Failed { line: u64 },
    Unknown,
}

/// One sent write: (key, seq) is its identity.
#[derive(Debug)]
struct Write {
    sent_line: u64,
    value: u64,
    outcome: Outcome,
    /// The first delivery of it with its value: line and consumer.
    first_read: Option<(u64, Id)>,
}

impl Write {
    fn acked_line(&self) -> Option<u64> {
        match self.outcome {
            Outcome::Acked { line, .. } => Some(line),
            _ => None,
        }
    }
}

/// A record that must come before a later one a pass already delivered.
#[derive(Debug, Clone, Copy)]
struct Pending {
    later_seq: u64,
    line: u64,
    t_ms: u64,
}

/// One pass's view of one key.
#[derive(Debug, Default)]
struct KeyPass {
    delivered: SeqSet,
    /// The highest seq delivered in order (not counting late or repeated
    /// deliveries).
    max_seq: Option<u64>,
    /// Acknowledged records the pass went past without delivering, by seq.
    pending: BTreeMap<u64, Pending>,
}

/// A consumer reading forward from one starting point.
#[derive(Debug)]
struct Pass {
    number: u32,
    /// Pass 0 begins at the start of the log; a resumed pass at a cursor.
    from_start: bool,
    cursor: String,
    /// For a resumed pass: per key, the seqs that precede its cursor.
    floor: HashMap<Id, SeqSet>,
    keys: HashMap<Id, KeyPass>,
    /// Per key, the seqs delivered, in delivery order: what precedes each
    /// cursor the pass is given (`CursorAt::count`).
    order: HashMap<Id, Vec<u64>>,
    delivered: u64,
}

impl Pass {
    fn new(number: u32, from_start: bool, cursor: String, floor: HashMap<Id, SeqSet>) -> Pass {
        Pass {
            number,
            from_start,
            cursor,
            floor,
            keys: HashMap::new(),
            order: HashMap::new(),
            delivered: 0,
        }
    }
}

/// What precedes a cursor, per key, as the pass that was given it saw it:
/// the pass's floor and its first `count` deliveries of the key.
#[derive(Debug, Clone, Copy)]
struct CursorAt {
    consumer: Id,
    pass: u32,
    count: usize,
}

/// A finished pass, kept for the cursors it was given.
#[derive(Debug, Default)]
struct PassRecord {
    floor: HashMap<Id, SeqSet>,
    order: HashMap<Id, Vec<u64>>,
}

#[derive(Debug, Default)]
struct Consumer {
    pass: Option<Pass>,
    passes: u32,
    finished: bool,
    /// Every finished pass, by number.
    history: Vec<PassRecord>,
}

impl Consumer {
    /// Keeps what a finished pass saw, for a later resume from one of its
    /// cursors.
    fn keep(&mut self, pass: &mut Pass) {
        let index = pass.number as usize;
        if self.history.len() <= index {
            self.history.resize_with(index + 1, PassRecord::default);
        }
        self.history[index] = PassRecord {
            floor: std::mem::take(&mut pass.floor),
            order: std::mem::take(&mut pass.order),
        };
    }

    /// The seqs of `key` that precede the cursor `at` names: from the
    /// pass that was given it, finished or still reading (another
    /// consumer's pass at the same position is given the same cursor).
    fn before(&self, at: CursorAt, key: Id) -> SeqSet {
        let (floor, order) = match &self.pass {
            Some(pass) if pass.number == at.pass => (pass.floor.get(&key), pass.order.get(&key)),
            _ => match self.history.get(at.pass as usize) {
                Some(record) => (record.floor.get(&key), record.order.get(&key)),
                None => return SeqSet::default(),
            },
        };
        let mut before = floor.cloned().unwrap_or_default();
        if let Some(order) = order {
            for &seq in &order[..at.count.min(order.len())] {
                before.insert(seq);
            }
        }
        before
    }
}

#[derive(Debug)]
struct OpenNemesis {
    target: String,
    t_ms: u64,
}

#[derive(Debug)]
struct LostEntry {
    acked_ms: u64,
    acked_line: u64,
    missed_by: Vec<String>,
    line: u64,
}

/// What one final read delivered, kept to compare the final reads at the
/// end: a few ranges per key.
#[derive(Debug)]
struct FinalSet {
    consumer: String,
    broker: Option<String>,
    line: u64,
    keys: HashMap<Id, SeqSet>,
}

/// Examples of missing records an anomaly names.
const EXAMPLES_MAX: usize = 5;

/// Judges a history fed to it line by line; [`Checker::finish`] gives the
/// report. [`check`] and [`check_path`](crate::check_path) drive it over a
/// reader or a file.
#[derive(Debug)]
pub struct Checker {
    config: Config,
    line: u64,
    last_t_ms: u64,

    key_ids: HashMap<String, Id>,
    keys: Vec<String>,
    /// Per key id: its writes by seq.
    writes: Vec<BTreeMap<u64, Write>>,
    consumer_ids: HashMap<String, Id>,
    consumers: Vec<(String, Consumer)>,
    /// (cursor digest, key) to where the cursor was given: the seqs of the
    /// key that precede it are those its pass delivered up to then and
    /// those before the cursor that pass resumed from. Not merely the
    /// highest seq read: a record of unknown outcome may land after higher
    /// seqs of its key, and a cursor given before it landed is rightly
    /// followed by it.
    cursors: BTreeMap<(u64, Id), CursorAt>,

    counts: WriteCounts,
    records_read: u64,
    passes: u64,
    resumes_from_unknown_cursor: u64,
    final_reads: Vec<FinalRead>,
    final_sets: Vec<FinalSet>,
    copies_checked: u64,
    lost: BTreeMap<(Id, u64), LostEntry>,

    nemesis_events: BTreeMap<String, u64>,
    nemesis_total: u64,
    open_nemeses: HashMap<String, Vec<OpenNemesis>>,
    recoveries: Vec<Recovery>,
    /// Heals (indices into `recoveries`) waiting for an acknowledgement.
    awaiting_ack: Vec<usize>,
    /// Heals waiting for a `reconverged`, per kind, oldest first.
    awaiting_reconverged: HashMap<String, Vec<usize>>,

    anomalies: Vec<Anomaly>,
}

/// Checks a whole history read from `reader`, one line at a time.
pub fn check<R: BufRead>(mut reader: R, config: &Config) -> Result<Report, CheckError> {
    let mut checker = Checker::new(config.clone());
    let mut text = String::new();
    loop {
        text.clear();
        let line = checker.line + 1;
        let read = reader
            .read_line(&mut text)
            .map_err(|source| CheckError::Read { line, source })?;
        if read == 0 {
            break;
        }
        checker.observe_line(&text)?;
    }
    Ok(checker.finish())
}

impl Checker {
    pub fn new(config: Config) -> Self {
        Checker {
            config,
            line: 0,
            last_t_ms: 0,
            key_ids: HashMap::new(),
            keys: Vec::new(),
            writes: Vec::new(),
            consumer_ids: HashMap::new(),
            consumers: Vec::new(),
            cursors: BTreeMap::new(),
            counts: WriteCounts::default(),
            records_read: 0,
            passes: 0,
            resumes_from_unknown_cursor: 0,
            final_reads: Vec::new(),
            final_sets: Vec::new(),
            copies_checked: 0,
            lost: BTreeMap::new(),
            nemesis_events: BTreeMap::new(),
            nemesis_total: 0,
            open_nemeses: HashMap::new(),
            recoveries: Vec::new(),
            awaiting_ack: Vec::new(),
            awaiting_reconverged: HashMap::new(),
            anomalies: Vec::new(),
        }
    }

    /// Takes the next line of the history (with or without its newline).
    /// Blank lines count as lines but hold no event.
    pub fn observe_line(&mut self, text: &str) -> Result<(), CheckError> {
        self.line += 1;
        if text.trim().is_empty() {
            return Ok(());
        }
        let event: Event = serde_json::from_str(text).map_err(|source| CheckError::Malformed {
            line: self.line,
            source,
        })?;
        self.apply(event)
    }

    /// Takes the next event, as if it were the next line.
    pub fn observe(&mut self, event: Event) -> Result<(), CheckError> {
        self.line += 1;
        self.apply(event)
    }

    fn apply(&mut self, event: Event) -> Result<(), CheckError> {
        let line = self.line;
        let t_ms = event.t_ms();
        if t_ms < self.last_t_ms {
            return Err(CheckError::TimeBackwards {
                line,
                t_ms,
                previous_ms: self.last_t_ms,
            });
        }
        self.last_t_ms = t_ms;
        match event {
            Event::Produce {
                key, seq, value, ..
            } => self.on_produce(key, seq, &value),
            Event::ProduceOk {
                key, seq, value, ..
            } => self.on_outcome("produce_ok", key, seq, Some(value), t_ms),
            Event::ProduceFail { key, seq, .. } => {
                self.on_outcome("produce_fail", key, seq, None, t_ms)
            }
            Event::ProduceUnknown { key, seq, .. } => {
                self.on_outcome("produce_unknown", key, seq, None, t_ms)
            }
            Event::Read {
                consumer,
                key,
                seq,
                value,
                cursor,
                ..
            } => self.on_read(t_ms, &consumer, &key, seq, value, &cursor),
            Event::Resume {
                consumer, cursor, ..
            } => {
                self.on_resume(&consumer, cursor);
                Ok(())
            }
            Event::FinalRead {
                consumer, broker, ..
            } => self.on_final_read(&consumer, broker),
            Event::Copies {
                topic,
                segment,
                seal_len,
                digests,
                ..
            } => {
                if digests.is_empty() {
                    return Err(CheckError::NoCopies {
                        line,
                        topic,
                        segment,
                    });
                }
                self.copies_checked += 1;
                let mut full = BTreeMap::new();
                for (broker, copy) in digests {
                    if copy.valid_len >= seal_len {
                        full.insert(broker, copy.crc32);
                    } else {
                        self.anomalies.push(Anomaly::ShortCopy {
                            topic: topic.clone(),
                            segment,
                            broker,
                            valid_len: copy.valid_len,
                            seal_len,
                            line,
                            t_ms,
                        });
                    }
                }
                let mut crcs: Vec<u32> = full.values().copied().collect();
                crcs.sort_unstable();
                crcs.dedup();
                if crcs.len() > 1 {
                    self.anomalies.push(Anomaly::CopiesDiverge {
                        topic,
                        segment,
                        seal_len,
                        crc32_by_broker: full,
                        line,
                        t_ms,
                    });
                }
                Ok(())
            }
            Event::Nemesis { event, target, .. } => {
                *self.nemesis_events.entry(event.clone()).or_insert(0) += 1;
                self.nemesis_total += 1;
                self.open_nemeses
                    .entry(event)
                    .or_default()
                    .push(OpenNemesis { target, t_ms });
                Ok(())
            }
            Event::Heal { event, .. } => {
                let open = self
                    .open_nemeses
                    .get_mut(&event)
                    .filter(|open| !open.is_empty())
                    .map(|open| open.remove(0));
                let Some(open) = open else {
                    return Err(CheckError::HealWithoutNemesis { line, event });
                };
                let index = self.recoveries.len();
                self.recoveries.push(Recovery {
                    event: event.clone(),
                    target: open.target,
                    nemesis_ms: open.t_ms,
                    heal_ms: t_ms,
                    heal_line: line,
                    recovery_ms: None,
                    reconverged_ms: None,
                });
                self.awaiting_ack.push(index);
                self.awaiting_reconverged
                    .entry(event)
                    .or_default()
                    .push(index);
                Ok(())
            }
            Event::Reconverged { event, .. } => {
                let waiting = self
                    .awaiting_reconverged
                    .get_mut(&event)
                    .filter(|waiting| !waiting.is_empty())
                    .map(|waiting| waiting.remove(0));
                let Some(index) = waiting else {
                    return Err(CheckError::ReconvergedWithoutHeal { line, event });
                };
                if let Some(recovery) = self.recoveries.get_mut(index) {
                    recovery.reconverged_ms = Some(t_ms.saturating_sub(recovery.heal_ms));
                }
                Ok(())
            }
        }
    }

    fn key_id(&mut self, key: &str) -> Id {
        if let Some(&id) = self.key_ids.get(key) {
            return id;
        }
        let id = Id::try_from(self.keys.len()).unwrap_or(Id::MAX);
        self.key_ids.insert(key.to_owned(), id);
        self.keys.push(key.to_owned());
        self.writes.push(BTreeMap::new());
        id
    }

    fn consumer_id(&mut self, consumer: &str) -> Id {
        if let Some(&id) = self.consumer_ids.get(consumer) {
            return id;
        }
        let id = Id::try_from(self.consumers.len()).unwrap_or(Id::MAX);
        self.consumer_ids.insert(consumer.to_owned(), id);
        self.consumers
            .push((consumer.to_owned(), Consumer::default()));
        id
    }

    fn on_produce(&mut self, key: String, seq: u64, value: &str) -> Result<(), CheckError> {
        let line = self.line;
        let id = self.key_id(&key);
        let writes = &mut self.writes[id as usize];
        if let Some((&previous_seq, _)) = writes.last_key_value()
            && seq <= previous_seq
        {
            return Err(CheckError::SeqNotIncreasing {
                line,
                key,
                seq,
                previous_seq,
            });
        }
        writes.insert(
            seq,
            Write {
                sent_line: line,
                value: digest(value),
                outcome: Outcome::InFlight,
                first_read: None,
            },
        );
        self.counts.sent += 1;
        Ok(())
    }

    fn on_outcome(
        &mut self,
        kind: &'static str,
        key: String,
        seq: u64,
        value: Option<String>,
        t_ms: u64,
    ) -> Result<(), CheckError> {
        let line = self.line;
        let write = self
            .key_ids
            .get(&key)
            .and_then(|&id| self.writes[id as usize].get_mut(&seq));
        let Some(write) = write else {
            return Err(CheckError::OutcomeWithoutSend {
                line,
                kind,
                key,
                seq,
            });
        };
        if write.outcome != Outcome::InFlight {
            return Err(CheckError::SecondOutcome {
                line,
                kind,
                key,
                seq,
            });
        }
        match value {
            Some(value) => {
                if digest(&value) != write.value {
                    return Err(CheckError::AckedValueDiffers {
                        line,
                        key,
                        seq,
                        value,
                    });
                }
                write.outcome = Outcome::Acked { line, t_ms };
                self.counts.acknowledged += 1;
                // Availability is back for every heal still waiting.
                for index in self.awaiting_ack.drain(..) {
                    let Some(recovery) = self.recoveries.get_mut(index) else {
                        continue;
                    };
                    let recovery_ms = t_ms.saturating_sub(recovery.heal_ms);
                    recovery.recovery_ms = Some(recovery_ms);
                    if recovery_ms > self.config.recovery_bound_ms {
                        self.anomalies.push(Anomaly::SlowRecovery {
                            event: recovery.event.clone(),
                            target: recovery.target.clone(),
                            heal_line: recovery.heal_line,
                            heal_ms: recovery.heal_ms,
                            recovery_ms: Some(recovery_ms),
                            bound_ms: self.config.recovery_bound_ms,
                        });
                    }
                }
            }
            None if kind == "produce_fail" => {
                write.outcome = Outcome::Failed { line };
                self.counts.failed += 1;
                if let Some((read_line, consumer)) = write.first_read {
                    self.anomalies.push(Anomaly::ReadOfFailedWrite {
                        consumer: self.consumers[consumer as usize].0.clone(),
                        key,
                        seq,
                        read_line,
                        failed_line: line,
                        line,
                    });
                }
            }
            None => {
                write.outcome = Outcome::Unknown;
                self.counts.unknown += 1;
            }
        }
        Ok(())
    }

    fn on_read(
        &mut self,
        t_ms: u64,
        consumer: &str,
        key: &str,
        seq: u64,
        value: String,
        cursor: &str,
    ) -> Result<(), CheckError> {
        let line = self.line;
        self.records_read += 1;
        let consumer_id = self.consumer_id(consumer);
        let key_id = self.key_id(key);

        // The consumer's pass: its first read opens pass 0, from the start.
        let state = &mut self.consumers[consumer_id as usize].1;
        if state.pass.is_none() {
            if state.finished {
                return Err(CheckError::ReadAfterFinal {
                    line,
                    consumer: consumer.to_owned(),
                });
            }
            state.pass = Some(Pass::new(state.passes, true, String::new(), HashMap::new()));
            state.passes += 1;
            self.passes += 1;
        }

        // What was written under this key and seq.
        let writes = &mut self.writes[key_id as usize];
        let Some(write) = writes.get_mut(&seq) else {
            self.anomalies.push(Anomaly::NeverWritten {
                consumer: consumer.to_owned(),
                key: key.to_owned(),
                seq,
                value,
                seq_was_written: false,
                line,
                t_ms,
            });
            // A record no one sent has no place in the key's order.
            return Ok(());
        };
        if write.value == digest(&value) {
            if let Outcome::Failed { line: failed_line } = write.outcome {
                self.anomalies.push(Anomaly::ReadOfFailedWrite {
                    consumer: consumer.to_owned(),
                    key: key.to_owned(),
                    seq,
                    read_line: line,
                    failed_line,
                    line,
                });
            }
            if write.first_read.is_none() {
                write.first_read = Some((line, consumer_id));
            }
        } else {
            self.anomalies.push(Anomaly::NeverWritten {
                consumer: consumer.to_owned(),
                key: key.to_owned(),
                seq,
                value,
                seq_was_written: true,
                line,
                t_ms,
            });
        }

        let Some(pass) = self.consumers[consumer_id as usize].1.pass.as_mut() else {
            return Ok(());
        };
        pass.delivered += 1;
        // Remember what this cursor comes after, for a later resume from it.
        let order = pass.order.entry(key_id).or_default();
        order.push(seq);
        let at = CursorAt {
            consumer: consumer_id,
            pass: pass.number,
            count: order.len(),
        };
        self.cursors.insert((digest(cursor), key_id), at);
        let floor = pass.floor.get(&key_id);
        let key_pass = pass.keys.entry(key_id).or_default();
        let writes = &self.writes[key_id as usize];
        if let Some(found) = place(key_pass, pass.from_start, floor, writes, seq, line, t_ms) {
            self.anomalies
                .push(found.into_anomaly(consumer, key, pass, line, t_ms));
        }
        Ok(())
    }

    fn on_resume(&mut self, consumer: &str, cursor: String) {
        let consumer_id = self.consumer_id(consumer);
        if let Some(old) = self.consumers[consumer_id as usize].1.pass.take() {
            self.end_pass(consumer_id, old);
        }
        let cursor_digest = digest(&cursor);
        let floor: HashMap<Id, SeqSet> = self
            .cursors
            .range((cursor_digest, 0)..=(cursor_digest, Id::MAX))
            .map(|(&(_, key_id), &at)| {
                let giver = &self.consumers[at.consumer as usize].1;
                (key_id, giver.before(at, key_id))
            })
            .collect();
        if floor.is_empty() {
            self.resumes_from_unknown_cursor += 1;
        }
        let state = &mut self.consumers[consumer_id as usize].1;
        state.pass = Some(Pass::new(state.passes, false, cursor, floor));
        state.passes += 1;
        state.finished = false;
        self.passes += 1;
    }

    /// Ends a pass that is not a final read: records it went past and never
    /// delivered are order anomalies.
    fn end_pass(&mut self, consumer_id: Id, mut pass: Pass) {
        self.consumers[consumer_id as usize].1.keep(&mut pass);
        let consumer = &self.consumers[consumer_id as usize].0;
        let mut keys: Vec<_> = pass.keys.iter().collect();
        keys.sort_by_key(|(id, _)| **id);
        for (&key_id, key_pass) in keys {
            for (&seq, pending) in &key_pass.pending {
                self.anomalies.push(Anomaly::OrderBroken {
                    consumer: consumer.clone(),
                    pass: pass.number,
                    key: self.keys[key_id as usize].clone(),
                    earlier_seq: seq,
                    later_seq: pending.later_seq,
                    earlier_delivered: false,
                    line: pending.line,
                    t_ms: pending.t_ms,
                });
            }
        }
    }

    fn on_final_read(&mut self, consumer: &str, broker: Option<String>) -> Result<(), CheckError> {
        let line = self.line;
        let consumer_id = self.consumer_id(consumer);
        let state = &mut self.consumers[consumer_id as usize].1;
        // A read from the start that found nothing delivered nothing: its
        // pass is empty, not missing.
        let pass = match state.pass.take() {
            Some(pass) => pass,
            None if state.finished => {
                return Err(CheckError::FinalReadAgain {
                    line,
                    consumer: consumer.to_owned(),
                });
            }
            None => {
                let number = state.passes;
                state.passes += 1;
                self.passes += 1;
                Pass::new(number, true, String::new(), HashMap::new())
            }
        };
        if !pass.from_start {
            return Err(CheckError::FinalReadAfterResume {
                line,
                consumer: consumer.to_owned(),
            });
        }
        let state = &mut self.consumers[consumer_id as usize].1;
        state.finished = true;
        // Every write acknowledged so far must be in this pass. Records the
        // pass went past without delivering (its pending entries) are among
        // them, so they are reported once, as lost, not as order anomalies.
        for (key_id, writes) in self.writes.iter().enumerate() {
            let key_pass = Id::try_from(key_id).ok().and_then(|id| pass.keys.get(&id));
            for (&seq, write) in writes {
                let Outcome::Acked {
                    line: acked_line,
                    t_ms: acked_ms,
                } = write.outcome
                else {
                    continue;
                };
                if key_pass.is_some_and(|kp| kp.delivered.contains(seq)) {
                    continue;
                }
                let id = Id::try_from(key_id).unwrap_or(Id::MAX);
                self.lost
                    .entry((id, seq))
                    .or_insert(LostEntry {
                        acked_ms,
                        acked_line,
                        missed_by: Vec::new(),
                        line,
                    })
                    .missed_by
                    .push(consumer.to_owned());
            }
        }
        self.final_reads.push(FinalRead {
            consumer: consumer.to_owned(),
            broker: broker.clone(),
            line,
            records: pass.delivered,
        });
        self.final_sets.push(FinalSet {
            consumer: consumer.to_owned(),
            broker,
            line,
            keys: pass
                .keys
                .into_iter()
                .map(|(id, key_pass)| (id, key_pass.delivered))
                .collect(),
        });
        Ok(())
    }

    /// Every final read must hold what every other one delivered: the
    /// producers stopped and drained before the first of them began, so
    /// they all read one log to its end, wherever they started. A reader
    /// short of the others is one anomaly, with how many records it lacks
    /// and which readers delivered them.
    fn compare_final_reads(&mut self) {
        let sets = std::mem::take(&mut self.final_sets);
        for (j, short) in sets.iter().enumerate() {
            let mut missing: BTreeMap<Id, SeqSet> = BTreeMap::new();
            let mut seen_by = Vec::new();
            for (i, other) in sets.iter().enumerate() {
                if i == j {
                    continue;
                }
                let mut lacked = false;
                for (&key_id, seqs) in &other.keys {
                    let have = short.keys.get(&key_id);
                    for seq in seqs.iter() {
                        if !have.is_some_and(|have| have.contains(seq))
                            && !self.known_only_after(key_id, seq, short.line)
                        {
                            missing.entry(key_id).or_default().insert(seq);
                            lacked = true;
                        }
                    }
                }
                if lacked {
                    seen_by.push(other.consumer.clone());
                }
            }
            if missing.is_empty() {
                continue;
            }
            let (count, acked, examples) = self.describe_missing(&missing);
            self.anomalies.push(Anomaly::ReadDiffersByBroker {
                consumer: short.consumer.clone(),
                broker: short.broker.clone(),
                missing: count,
                missing_acked: acked,
                examples,
                seen_by,
                line: short.line,
            });
        }
    }

    /// Whether nothing in the history shows `key_id`'s `seq` in the log
    /// before `line`: it was neither acknowledged nor delivered to anyone
    /// before it. A reader that ended at `line` may then rightly lack it: a
    /// write of unknown outcome can be committed after the reader's last
    /// poll (a slow quorum, a failover's seal), and a reader cannot have
    /// missed what was not there yet.
    fn known_only_after(&self, key_id: Id, seq: u64, line: u64) -> bool {
        let Some(write) = self.writes[key_id as usize].get(&seq) else {
            return false;
        };
        let acked = write.acked_line();
        let read = write.first_read.map(|(read_line, _)| read_line);
        match (acked, read) {
            (None, None) => false,
            (a, r) => a
                .into_iter()
                .chain(r)
                .min()
                .is_some_and(|known| known > line),
        }
    }

    /// Records missing from a final read: how many, how many of them were
    /// acknowledged, and the first few as `key:seq` in key and seq order.
    fn describe_missing(&self, missing: &BTreeMap<Id, SeqSet>) -> (u64, u64, Vec<String>) {
        let mut keys: Vec<(Id, &SeqSet)> = missing.iter().map(|(&id, set)| (id, set)).collect();
        keys.sort_by(|a, b| self.keys[a.0 as usize].cmp(&self.keys[b.0 as usize]));
        let (mut count, mut acked) = (0, 0);
        let mut examples = Vec::new();
        for (key_id, seqs) in keys {
            count += seqs.len();
            let writes = &self.writes[key_id as usize];
            for seq in seqs.iter() {
                if writes.get(&seq).and_then(Write::acked_line).is_some() {
                    acked += 1;
                }
                if examples.len() < EXAMPLES_MAX {
                    examples.push(format!("{}:{seq}", self.keys[key_id as usize]));
                }
            }
        }
        (count, acked, examples)
    }

    /// Ends the history and judges what could only be judged at its end.
    pub fn finish(mut self) -> Report {
        for consumer_id in 0..self.consumers.len() {
            let Ok(id) = Id::try_from(consumer_id) else {
                continue;
            };
            if let Some(pass) = self.consumers[consumer_id].1.pass.take() {
                self.end_pass(id, pass);
            }
        }
        for index in std::mem::take(&mut self.awaiting_ack) {
            let Some(recovery) = self.recoveries.get(index) else {
                continue;
            };
            self.anomalies.push(Anomaly::SlowRecovery {
                event: recovery.event.clone(),
                target: recovery.target.clone(),
                heal_line: recovery.heal_line,
                heal_ms: recovery.heal_ms,
                recovery_ms: None,
                bound_ms: self.config.recovery_bound_ms,
            });
        }
        self.compare_final_reads();
        for ((key_id, seq), entry) in std::mem::take(&mut self.lost) {
            self.anomalies.push(Anomaly::Lost {
                key: self.keys[key_id as usize].clone(),
                seq,
                acked_ms: entry.acked_ms,
                acked_line: entry.acked_line,
                missed_by: entry.missed_by,
                line: entry.line,
            });
        }
        self.anomalies.sort_by_key(Anomaly::line);

        self.counts.in_flight =
            self.counts.sent - self.counts.acknowledged - self.counts.failed - self.counts.unknown;
        let mut vacuity = Vec::new();
        if self.counts.acknowledged < self.config.min_acked {
            vacuity.push(Vacuity::TooFewAcknowledged {
                acknowledged: self.counts.acknowledged,
                min_acked: self.config.min_acked,
            });
        }
        if self.nemesis_total < self.config.min_events {
            vacuity.push(Vacuity::TooFewEvents {
                events: self.nemesis_total,
                min_events: self.config.min_events,
            });
        }
        if self.final_reads.is_empty() {
            vacuity.push(Vacuity::NoFinalRead);
        }
        let verdict = if !self.anomalies.is_empty() {
            Verdict::Anomalous
        } else if !vacuity.is_empty() {
            Verdict::Vacuous
        } else {
            Verdict::Clean
        };
        let mut anomaly_counts = BTreeMap::new();
        for anomaly in &self.anomalies {
            *anomaly_counts.entry(anomaly.kind().to_owned()).or_insert(0) += 1;
        }
        Report {
            verdict,
            lines: self.line,
            config: self.config,
            writes: self.counts,
            records_read: self.records_read,
            passes: self.passes,
            resumes_from_unknown_cursor: self.resumes_from_unknown_cursor,
            final_reads: self.final_reads,
            copies_checked: self.copies_checked,
            nemesis_events: self.nemesis_events,
            recoveries: self.recoveries,
            vacuity,
            anomaly_counts,
            anomalies: self.anomalies,
        }
    }
}

/// A position anomaly found for one delivery, before names are attached.
#[derive(Debug)]
enum Found {
    CursorBackwards { delivered_seq: u64, cursor_seq: u64 },
    Duplicate { seq: u64 },
    Order { earlier: u64, later: u64 },
}

impl Found {
    fn into_anomaly(self, consumer: &str, key: &str, pass: &Pass, line: u64, t_ms: u64) -> Anomaly {
        match self {
            Found::CursorBackwards {
                delivered_seq,
                cursor_seq,
            } => Anomaly::CursorBackwards {
                consumer: consumer.to_owned(),
                pass: pass.number,
                cursor: pass.cursor.clone(),
                key: key.to_owned(),
                cursor_seq,
                delivered_seq,
                line,
                t_ms,
            },
            Found::Duplicate { seq } => Anomaly::Duplicate {
                consumer: consumer.to_owned(),
                pass: pass.number,
                key: key.to_owned(),
                seq,
                line,
                t_ms,
            },
            Found::Order { earlier, later } => Anomaly::OrderBroken {
                consumer: consumer.to_owned(),
                pass: pass.number,
                key: key.to_owned(),
                earlier_seq: earlier,
                later_seq: later,
                earlier_delivered: true,
                line,
                t_ms,
            },
        }
    }
}

/// Places the delivery of `seq` of one key in its pass and says what, if
/// anything, is wrong with its position. At most one position anomaly per
/// delivery, tried in this order: behind the resume cursor, a repeat within
/// the pass, out of order.
fn place(
    key_pass: &mut KeyPass,
    from_start: bool,
    floor: Option<&SeqSet>,
    writes: &BTreeMap<u64, Write>,
    seq: u64,
    line: u64,
    t_ms: u64,
) -> Option<Found> {
    if let Some(before) = floor
        && before.contains(seq)
    {
        key_pass.delivered.insert(seq);
        return Some(Found::CursorBackwards {
            delivered_seq: seq,
            cursor_seq: before.max().unwrap_or(seq),
        });
    }
    let floor = floor.and_then(SeqSet::max);
    if key_pass.delivered.contains(seq) {
        return Some(Found::Duplicate { seq });
    }
    key_pass.delivered.insert(seq);
    // A record the pass went past earlier arrives late.
    if let Some(pending) = key_pass.pending.remove(&seq) {
        return Some(Found::Order {
            earlier: seq,
            later: pending.later_seq,
        });
    }
    match key_pass.max_seq {
        Some(max) if seq < max => {
            // Behind the pass's front: out of order if this record was
            // acknowledged before the front record was sent.
            let acked = writes.get(&seq).and_then(Write::acked_line);
            let front_sent = writes.get(&max).map(|w| w.sent_line);
            match (acked, front_sent) {
                (Some(acked), Some(sent)) if acked < sent => Some(Found::Order {
                    earlier: seq,
                    later: max,
                }),
                _ => None,
            }
        }
        _ => {
            // Forward: note every record that had to come between the last
            // one this pass holds for the key and this one.
            let behind = match (key_pass.max_seq, floor) {
                (Some(delivered), Some(floor)) => Some(delivered.max(floor)),
                (delivered, floor) => delivered.or(floor),
            };
            // Below the cursor's highest seq yet not before it: a record of
            // unknown outcome that landed after the cursor was given.
            // Nothing had to come between it and anything.
            if behind.is_some_and(|b| seq < b) {
                return None;
            }
            if (behind.is_some() || from_start)
                && let Some(this) = writes.get(&seq)
            {
                let behind_acked = behind.and_then(|b| writes.get(&b).and_then(Write::acked_line));
                let range = match behind {
                    Some(b) => (Bound::Excluded(b), Bound::Excluded(seq)),
                    None => (Bound::Unbounded, Bound::Excluded(seq)),
                };
                for (&between, write) in writes.range(range) {
                    let Some(acked) = write.acked_line() else {
                        continue;
                    };
                    let after_behind = match (behind, behind_acked) {
                        (None, _) => true,
                        (Some(_), Some(behind_acked)) => behind_acked < write.sent_line,
                        (Some(_), None) => false,
                    };
                    if acked < this.sent_line && after_behind {
                        key_pass.pending.insert(
                            between,
                            Pending {
                                later_seq: seq,
                                line,
                                t_ms,
                            },
                        );
                    }
                }
            }
            key_pass.max_seq = Some(seq);
            None
        }
    }
}
