//! The broker's metrics, rendered as Prometheus text on `/metrics`.
//!
//! Each broker owns its own `PrometheusRecorder` and registers its handles
//! on it directly instead of installing a process-global recorder, so several
//! brokers in one test process keep separate numbers.

use malachi_supervision::SupervisorSnapshot;
use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

const METADATA: Metadata<'static> = Metadata::new("malachi_actors", Level::INFO, None);

/// Append latency buckets, in seconds: group commit sits in the
/// hundreds-of-microseconds to tens-of-milliseconds band.
const APPEND_LATENCY_BUCKETS: &[f64] = &[
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The health words `malachi_copies` counts copies by (issue 19): sealed
/// copies by their scrub verdict (`intact`, `short`, `damaged`,
/// `missing`), copies being filled toward their seal (`healing`), and open
/// copies of active segments `fenced` (by a failover not yet recorded) or
/// `failed` (their disk failed).
pub(crate) const COPY_HEALTH_WORDS: &[&str] = &[
    "intact", "short", "damaged", "missing", "healing", "fenced", "failed",
];

/// Where a shipped run's frames came from (`malachi_shipped_bytes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShippedFrom {
    Cache,
    Log,
}

/// Handles of every metric the broker updates.
pub(crate) struct BrokerMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pub records_produced: Counter,
    pub bytes_produced: Counter,
    pub records_consumed: Counter,
    pub bytes_consumed: Counter,
    pub append_latency_seconds: Histogram,
    pub open_segments: Gauge,
    pub connections: Gauge,
    /// The client port's bounds (`common::budget`, `serve::connection`).
    pub request_bytes_in_use: Gauge,
    pub response_bytes_in_use: Gauge,
    pub connections_refused: Counter,
    pub connections_idle_closed: Counter,
    pub connections_admission_timed_out: Counter,
    pub admin_probe_answered: Counter,
    /// `malachi_shipped_bytes_total{from="cache"}` and `{from="log"}`,
    /// registered once: every shipped run counts into one.
    shipped_from_cache: Counter,
    shipped_from_log: Counter,
    /// Requests refused `unauthorized` by the ACLs or for want of a login
    /// (ADR 0150).
    pub requests_unauthorized: Counter,
    /// Logins (SCRAM exchanges) that failed, lockout refusals included.
    pub logins_failed: Counter,
    /// Logins that succeeded.
    pub logins_succeeded: Counter,
    pub connections_frame_timed_out: Counter,
    /// Connections closed because a response was not read within
    /// `response_write_timeout_ms` (ADR 0145).
    pub connections_write_timed_out: Counter,
    /// Produces a quorum of copies acknowledged (replicated segments).
    pub replica_quorum_acks: Counter,
    /// Produces answered `no_quorum`: not on a quorum within the bound.
    pub replica_no_quorum: Counter,
    /// Segments this broker sealed without their primary (issue 19).
    pub failovers: Counter,
    /// From a failover's start (its primary found failed) to its seal
    /// recorded and the copies sealed.
    pub failover_seconds: Histogram,
    /// Sealed segment copies re-created on another broker (issue 19).
    pub heals: Counter,
    /// Bytes those heals copied.
    pub heal_bytes: Counter,
    /// Frame bytes of sealed segments this broker read from their holders
    /// to serve a fetch or subscription (ADR 0118).
    pub remote_read_bytes: Counter,
    /// Copies of this broker found damaged as a read met them (a frame
    /// failed its check); the read went to another holder (issue 36).
    pub read_damage: Counter,
    /// Bytes of sealed copies the scrubber re-read (ADR 0110).
    pub scrub_bytes: Counter,
    /// Sealed copies the scrubber found damaged, missing or short.
    pub scrub_broken: Counter,
    /// Broken copies rebuilt in place from an intact copy (ADR 0110).
    pub rebuilds: Counter,
    /// Index sidecars the scrubber found bad and rebuilt from their log.
    pub scrub_index_repairs: Counter,
    /// Copies this broker removed because the metadata no longer lists
    /// their segment: a deleted topic, retention, or an orphan (ADR 0115).
    pub copies_removed: Counter,
    /// Bytes those removals freed.
    pub copies_removed_bytes: Counter,
    /// Orphan sweeps skipped because a vnode did not answer or the ring
    /// moved while they were asked (ADR 0115).
    pub orphan_sweeps_skipped: Counter,
    /// Sealed segments retention expired (ADR 0115).
    pub segments_expired: Counter,
    /// Free bytes on the data volume at the last poll (ADR 0111).
    pub storage_free_bytes: Gauge,
    /// 1 while the data volume takes no records (`storage_full`), else 0.
    pub storage_full: Gauge,
    /// Active segments this broker writes, and the producer bytes per
    /// second it stored, smoothed: the load it gossips (ADR 0144).
    pub primaries: Gauge,
    pub write_bytes_per_second: Gauge,
    /// Ranges this broker's balancer moved to another broker.
    pub balancer_moves: Counter,
    /// Copies on this broker found damaged or missing records (ADR 0108),
    /// since the broker started.
    pub copies_lost: Gauge,
    /// Records those copies lost: with one copy, acknowledged records gone.
    pub data_loss_records: Counter,
    /// The copies counted in `copies_lost`, so each counts once.
    lost_copies: parking_lot::Mutex<std::collections::BTreeSet<u64>>,
    /// Records that copies of replicated segments on this broker were
    /// found short of (or lost to damage) while other copies hold them:
    /// repaired, never data loss (ADR 0127).
    pub copy_repair_records: Counter,
    /// The copies counted in `copy_repair_records`, so each counts once.
    repaired_copies: parking_lot::Mutex<std::collections::BTreeSet<u64>>,
}

impl std::fmt::Debug for BrokerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerMetrics").finish_non_exhaustive()
    }
}

/// Copies `copy_repaired` remembers, so each is counted once.
pub const REPAIRED_COPIES_TRACKED_MAX: usize = 65_536;

impl BrokerMetrics {
    /// Counts a copy of `segment` found to have lost `records` records;
    /// `false` if it was counted already (the copy was opened again).
    pub fn copy_lost(&self, segment: u64, records: u64) -> bool {
        let mut lost = self.lost_copies.lock();
        if !lost.insert(segment) {
            return false;
        }
        self.copies_lost.set(lost.len() as f64);
        self.data_loss_records.increment(records);
        true
    }

    /// Counts a copy of a replicated `segment` found short of `records`
    /// records that other copies hold; `false` if it was counted already.
    /// At most [`REPAIRED_COPIES_TRACKED_MAX`] copies are remembered; past
    /// it the memory starts over (a copy reopened then counts twice, which
    /// a repair counter can afford and a loss counter could not).
    pub fn copy_repaired(&self, segment: u64, records: u64) -> bool {
        let mut repaired = self.repaired_copies.lock();
        if repaired.len() >= REPAIRED_COPIES_TRACKED_MAX {
            repaired.clear();
        }
        if !repaired.insert(segment) {
            return false;
        }
        self.copy_repair_records.increment(records);
        true
    }

    pub fn new() -> BrokerMetrics {
        let builder = PrometheusBuilder::new();
        // The matcher is a fixed, valid name and the buckets are non-empty,
        // so this cannot fail; fall back to summaries rather than panic.
        let builder = match builder.set_buckets_for_metric(
            Matcher::Full("malachi_append_latency_seconds".into()),
            APPEND_LATENCY_BUCKETS,
        ) {
            Ok(builder) => builder,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let counter =
            |name: &'static str| recorder.register_counter(&Key::from_name(name), &METADATA);
        let gauge = |name: &'static str| recorder.register_gauge(&Key::from_name(name), &METADATA);
        let shipped_bytes = |from: &'static str| {
            recorder.register_counter(
                &Key::from_parts(
                    "malachi_shipped_bytes_total",
                    vec![Label::new("from", from)],
                ),
                &METADATA,
            )
        };
        BrokerMetrics {
            records_produced: counter("malachi_records_produced_total"),
            bytes_produced: counter("malachi_bytes_produced_total"),
            records_consumed: counter("malachi_records_consumed_total"),
            bytes_consumed: counter("malachi_bytes_consumed_total"),
            append_latency_seconds: recorder
                .register_histogram(&Key::from_name("malachi_append_latency_seconds"), &METADATA),
            open_segments: gauge("malachi_open_segments"),
            copies_lost: gauge("malachi_copies_lost"),
            data_loss_records: counter("malachi_data_loss_records_total"),
            lost_copies: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
            copy_repair_records: counter("malachi_copy_repair_records_total"),
            repaired_copies: parking_lot::Mutex::new(std::collections::BTreeSet::new()),
            connections: gauge("malachi_connections"),
            request_bytes_in_use: gauge("malachi_request_bytes_in_use"),
            response_bytes_in_use: gauge("malachi_response_bytes_in_use"),
            connections_refused: counter("malachi_connections_refused_total"),
            connections_idle_closed: counter("malachi_connections_idle_closed_total"),
            connections_admission_timed_out: counter(
                "malachi_connections_admission_timed_out_total",
            ),
            admin_probe_answered: counter("malachi_admin_probe_answered_total"),
            shipped_from_cache: shipped_bytes("cache"),
            shipped_from_log: shipped_bytes("log"),
            requests_unauthorized: counter("malachi_requests_unauthorized_total"),
            logins_failed: counter("malachi_logins_failed_total"),
            logins_succeeded: counter("malachi_logins_succeeded_total"),
            connections_frame_timed_out: counter("malachi_connections_frame_timed_out_total"),
            connections_write_timed_out: counter("malachi_connections_write_timed_out_total"),
            replica_quorum_acks: counter("malachi_replica_quorum_acks_total"),
            replica_no_quorum: counter("malachi_replica_no_quorum_total"),
            failovers: counter("malachi_failovers_total"),
            failover_seconds: recorder
                .register_histogram(&Key::from_name("malachi_failover_seconds"), &METADATA),
            heals: counter("malachi_heals_total"),
            heal_bytes: counter("malachi_heal_bytes_total"),
            remote_read_bytes: counter("malachi_remote_read_bytes_total"),
            read_damage: counter("malachi_read_damage_total"),
            scrub_bytes: counter("malachi_scrub_bytes_total"),
            scrub_broken: counter("malachi_scrub_broken_total"),
            rebuilds: counter("malachi_rebuilds_total"),
            scrub_index_repairs: counter("malachi_scrub_index_repairs_total"),
            copies_removed: counter("malachi_copies_removed_total"),
            copies_removed_bytes: counter("malachi_copies_removed_bytes_total"),
            orphan_sweeps_skipped: counter("malachi_orphan_sweeps_skipped_total"),
            segments_expired: counter("malachi_segments_expired_total"),
            storage_free_bytes: gauge("malachi_storage_free_bytes"),
            storage_full: gauge("malachi_storage_full"),
            primaries: gauge("malachi_primaries"),
            write_bytes_per_second: gauge("malachi_write_bytes_per_second"),
            balancer_moves: counter("malachi_balancer_moves_total"),
            recorder,
            handle,
        }
    }

    /// Sets `malachi_actor_restarts{actor="<path>"}` from a tree snapshot.
    pub fn record_restarts(&self, root: &SupervisorSnapshot) {
        fn walk(metrics: &BrokerMetrics, prefix: &str, snapshot: &SupervisorSnapshot) {
            for child in &snapshot.children {
                let path = format!("{prefix}/{}", child.name);
                let key = Key::from_parts(
                    "malachi_actor_restarts",
                    vec![Label::new("actor", path.clone())],
                );
                metrics
                    .recorder
                    .register_gauge(&key, &METADATA)
                    .set(f64::from(child.restarts));
                if let Some(nested) = &child.supervisor {
                    walk(metrics, &path, nested);
                }
            }
        }
        walk(self, &root.name, root);
    }

    /// `malachi_producer_state_fetches_total{from}`: a segment opened with
    /// no whole copy of a predecessor read its producer state from holders,
    /// by sealed tables alone (`sealed_table`) or with some log (`log`,
    /// ADR 0156).
    pub fn producer_state_fetched(&self, from: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_producer_state_fetches_total",
                    vec![Label::new("from", from)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_shipped_bytes_total{from}`: frame bytes a primary's
    /// shippers put in replica-appends, by where they came from: `cache`
    /// (a run another follower's shipper had just read) or `log` (read
    /// back from the primary's copy).
    pub fn shipped(&self, from: ShippedFrom, bytes: u64) {
        match from {
            ShippedFrom::Cache => self.shipped_from_cache.increment(bytes),
            ShippedFrom::Log => self.shipped_from_log.increment(bytes),
        }
    }

    /// `malachi_shipper_resumes_total{reason}`: a shipper dropped what it
    /// had in flight and resumed from the follower's end (`unreachable`,
    /// `not_at_end`, `refused`): everything in flight is read and sent
    /// again.
    pub fn shipper_resumed(&self, reason: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_shipper_resumes_total",
                    vec![Label::new("reason", reason)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_tls_handshake_failures_total{reason}`: a TLS port's
    /// connection closed before its handshake finished (ADR 0149).
    pub fn tls_handshake_failure(&self, reason: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_tls_handshake_failures_total",
                    vec![Label::new("reason", reason)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_cluster_tls_refusals_total{port, direction, reason}`: a
    /// connection between brokers refused by TLS (ADR 0151), on the
    /// `cluster` port or the `fabric`, `inbound` (accepted) or `outbound`
    /// (dialled).
    pub fn cluster_tls_refusal(
        &self,
        port: &'static str,
        direction: &'static str,
        reason: &'static str,
    ) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_cluster_tls_refusals_total",
                    vec![
                        Label::new("port", port),
                        Label::new("direction", direction),
                        Label::new("reason", reason),
                    ],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_plaintext_accepted_total{port}`: a plaintext connection
    /// taken on a TLS port in a rolling move's step that takes both (ADR
    /// 0162): `cluster` or `fabric` (`tls.cluster = "accept"|"send"`),
    /// `client` or `admin` (`tls.client_ports = "accept"`). Zero for long
    /// enough is the sign the next step may start.
    pub fn plaintext_accepted(&self, port: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_plaintext_accepted_total",
                    vec![Label::new("port", port)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_peer_cluster_port_reachable{peer}`: 1 while this broker
    /// counts on peer `peer`'s cluster port, 0 while it leaves the peer out
    /// of placement for it (ADR 0155). No line for a peer never dialled.
    pub fn peer_cluster_port_reachable(&self, peer: u64, reachable: bool) {
        self.recorder
            .register_gauge(
                &Key::from_parts(
                    "malachi_peer_cluster_port_reachable",
                    vec![Label::new("peer", peer.to_string())],
                ),
                &METADATA,
            )
            .set(if reachable { 1.0 } else { 0.0 });
    }

    /// `malachi_tls_reloads_total{outcome}`: changed certificate files
    /// loaded (`reloaded`) or kept out (`failed`, the old pair serving on).
    pub fn tls_reload(&self, outcome: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_tls_reloads_total",
                    vec![Label::new("outcome", outcome)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_tls_clients_on_plaintext_total`: a plaintext port's
    /// connection that opened with a TLS ClientHello, closed.
    /// `malachi_token_logins_refused_total{reason}`: a bearer token
    /// refused on the client port (ADR 0152), by `TokenError::code`.
    pub fn token_logins_refused(&self, reason: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_token_logins_refused_total",
                    vec![Label::new("reason", reason)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_sessions_ended_total{reason}`: a connection's session
    /// ended (ADR 0154) by its code: `session-expired`,
    /// `principal-removed`, `credential-changed`, `issuer-key-removed`
    /// (ADR 0157).
    pub fn session_ended(&self, reason: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_sessions_ended_total",
                    vec![Label::new("reason", reason)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    /// `malachi_admin_requests_refused_total{status}`: an admin HTTP
    /// request refused for its credential (`401`), its ACLs (`403`) or
    /// the lockout (`429`).
    pub fn admin_request_refused(&self, status: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    "malachi_admin_requests_refused_total",
                    vec![Label::new("status", status)],
                ),
                &METADATA,
            )
            .increment(1);
    }

    pub fn tls_client_on_plaintext(&self) {
        self.recorder
            .register_counter(
                &Key::from_name("malachi_tls_clients_on_plaintext_total"),
                &METADATA,
            )
            .increment(1);
    }

    /// A follower's lag behind the primary, as its last answer showed it:
    /// records the primary held durably beyond the follower's durable end,
    /// and the answer's round trip.
    pub fn replica_lag(
        &self,
        follower: malachi_core::model::NodeId,
        records: u64,
        rtt: std::time::Duration,
    ) {
        let labels = || vec![Label::new("follower", follower.0.to_string())];
        self.recorder
            .register_gauge(
                &Key::from_parts("malachi_replica_lag_records", labels()),
                &METADATA,
            )
            .set(records as f64);
        self.recorder
            .register_gauge(
                &Key::from_parts("malachi_replica_lag_ms", labels()),
                &METADATA,
            )
            .set(rtt.as_secs_f64() * 1_000.0);
    }

    /// A follower's lag behind the primary in bytes, as its last answer
    /// showed it: the primary's durable log bytes beyond the follower's
    /// (the copies hold the same frames, so byte positions agree).
    pub fn replica_lag_bytes(&self, follower: malachi_core::model::NodeId, bytes: u64) {
        self.recorder
            .register_gauge(
                &Key::from_parts(
                    "malachi_replica_lag_bytes",
                    vec![Label::new("follower", follower.0.to_string())],
                ),
                &METADATA,
            )
            .set(bytes as f64);
    }

    /// `malachi_coordinator_lease_held{vnode="N"}`: 1 while this broker's
    /// coordinator holds vnode N's lease on its continuous work, by the
    /// holder's own clock at this moment; 0 otherwise.
    pub fn coordinator_lease_held(&self, vnode: u32, held: bool) {
        self.recorder
            .register_gauge(
                &Key::from_parts(
                    "malachi_coordinator_lease_held",
                    vec![Label::new("vnode", vnode.to_string())],
                ),
                &METADATA,
            )
            .set(if held { 1.0 } else { 0.0 });
    }

    /// `malachi_copies{health="..."}`: this broker's copies by health,
    /// every word of [`COPY_HEALTH_WORDS`] set (0 when none), so a word
    /// that empties reads 0, not its last count.
    pub fn copy_health(&self, counts: &std::collections::BTreeMap<&'static str, u64>) {
        for word in COPY_HEALTH_WORDS {
            self.recorder
                .register_gauge(
                    &Key::from_parts("malachi_copies", vec![Label::new("health", *word)]),
                    &METADATA,
                )
                .set(counts.get(word).copied().unwrap_or(0) as f64);
        }
    }

    /// `malachi_topic_policy_unresolved{topic,policy}`: 1 while the topic
    /// names a policy no definition backs (it keeps all of its data), 0
    /// once it resolves (ADR 0115).
    pub fn policy_unresolved(&self, topic: &str, policy: &str, unresolved: bool) {
        self.recorder
            .register_gauge(
                &Key::from_parts(
                    "malachi_topic_policy_unresolved",
                    vec![
                        Label::new("topic", topic.to_owned()),
                        Label::new("policy", policy.to_owned()),
                    ],
                ),
                &METADATA,
            )
            .set(if unresolved { 1.0 } else { 0.0 });
    }

    /// Counts one restart of the vnode host's work `work` (a loop the
    /// `vnodes` actor restarted, or `raft_group` for a fatally stopped
    /// replica it reopened): `malachi_vnode_work_restarts_total{work}`.
    pub fn count_vnode_work_restart(&self, work: &'static str) {
        let key = Key::from_parts(
            "malachi_vnode_work_restarts_total",
            vec![Label::new("work", work)],
        );
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    /// `malachi_range_write_bytes_per_second{topic,range}` and
    /// `malachi_range_write_records_per_second{topic,range}`: a range's
    /// write rate at this primary, as the reshaper last read it (ADR 0143).
    /// A range this broker stops writing is set to 0 once.
    pub fn range_write_rate(&self, topic: &str, range: u64, bytes: u64, records: u64) {
        let labels = || {
            vec![
                Label::new("topic", topic.to_owned()),
                Label::new("range", range.to_string()),
            ]
        };
        for (name, value) in [
            ("malachi_range_write_bytes_per_second", bytes),
            ("malachi_range_write_records_per_second", records),
        ] {
            self.recorder
                .register_gauge(&Key::from_parts(name, labels()), &METADATA)
                .set(value as f64);
        }
    }

    /// Counts an automatic reshape this broker asked for and the
    /// coordinator made: `malachi_auto_reshapes_total{kind,reason}`.
    pub fn count_auto_reshape(&self, kind: &'static str, reason: &'static str) {
        let key = Key::from_parts(
            "malachi_auto_reshapes_total",
            vec![Label::new("kind", kind), Label::new("reason", reason)],
        );
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    /// Counts a check that found a range hot enough to split but carried
    /// by one key: `malachi_range_hot_key_unsplittable_total{topic}`.
    pub fn count_hot_key_unsplittable(&self, topic: &str) {
        let key = Key::from_parts(
            "malachi_range_hot_key_unsplittable_total",
            vec![Label::new("topic", topic.to_owned())],
        );
        self.recorder.register_counter(&key, &METADATA).increment(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}
