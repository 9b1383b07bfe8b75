//! `malachi bench metadata`: control-plane operations per second and their
//! latency against a running cluster (issue 6's benchmark).
//!
//! `--clients` callers, each on its own connection to one of the `--broker`
//! addresses (round-robin), each with one request at a time (a closed loop),
//! run three phases one after the other:
//!
//! 1. **create**: `create_topic` of fresh names `PREFIX-cC-I`;
//! 2. **describe**: `describe_topic` of the topics the create phase made,
//!    spread so that each caller reads topics other callers created;
//! 3. **delete** (with `--cleanup`, the default): `delete_topic` of every
//!    created topic, so a run leaves nothing behind.
//!
//! Any broker answers a metadata request by forwarding it to the leader of
//! the topic's vnode, so most requests cross one broker hop: that is the
//! cost being measured. Latency runs from the call to its answer, the
//! client's own retries (of `not_leader`, say) included; a failed operation
//! counts as an error and not in the latencies. Connections are opened, and
//! warmed by one describe of a missing topic per client, before the clock
//! starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use malachi_wire::{Client, ClientError};
use serde::Serialize;
use tracing::warn;

use super::super::client::print_json;
use super::super::error::CliError;
use super::super::{BenchMetadataArgs, OutputArgs};
use super::{CLIENTS_MAX, bench_client, histogram, micros, progress};

/// Operations per client and phase when neither `--ops` nor `--duration` is
/// given: 1,600 topics with the default 32 clients, as the first runs of
/// this benchmark (`cluster/tests/metadata_bench.rs`) did.
pub const OPS_DEFAULT: u64 = 50;
/// Operations one client may do in one phase, with `--ops` or within a
/// `--duration`: the created names are kept in memory for the later phases.
pub const OPS_MAX: u64 = 1_000_000;
/// Distinct broker addresses one run may spread its clients over.
pub const BROKERS_MAX: usize = 64;
/// The longest `--prefix`: a topic name is at most 255 bytes, and the
/// suffix `-cCCCC-IIIIIII` needs the rest.
pub const PREFIX_BYTES_MAX: usize = 200;
/// After a failed operation, a client waits this long: a cluster that
/// refuses everything must not be hammered in a tight loop.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// How often the progress bar is brought up to date.
const TICK: Duration = Duration::from_millis(100);

/// Why the command line does not describe a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("--clients must be 1 to {max}, not {clients}")]
    Clients { clients: usize, max: usize },
    #[error("--ops must be 1 to {max}, not {ops}")]
    Ops { ops: u64, max: u64 },
    #[error("--broker needs at least one address")]
    NoBroker,
    #[error("--broker lists {addr} twice")]
    DuplicateBroker { addr: String },
    #[error("--broker lists {count} addresses, more than {max}")]
    TooManyBrokers { count: usize, max: usize },
    #[error(
        "--prefix {prefix:?} is invalid: use 1 to {max} ASCII letters, digits, '.', '_' or '-'",
        max = PREFIX_BYTES_MAX
    )]
    Prefix { prefix: String },
}

impl From<PlanError> for CliError {
    fn from(error: PlanError) -> CliError {
        CliError::Bench(error.to_string())
    }
}

/// When a phase ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// After this many operations per client.
    Ops(u64),
    /// Once this much time has passed (the operation in flight completes).
    Elapsed(Duration),
}

/// A validated run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub brokers: Vec<String>,
    pub clients: usize,
    pub until: Until,
    pub prefix: String,
    pub cleanup: bool,
    pub timeout_ms: u64,
}

impl Plan {
    /// Checks the command line; `run_id` names the run when no prefix is given.
    pub fn new(args: &BenchMetadataArgs, run_id: &str) -> Result<Plan, PlanError> {
        if args.clients == 0 || args.clients > CLIENTS_MAX {
            return Err(PlanError::Clients {
                clients: args.clients,
                max: CLIENTS_MAX,
            });
        }
        let until = match (args.ops, args.duration) {
            (Some(ops), _) if ops == 0 || ops > OPS_MAX => {
                return Err(PlanError::Ops { ops, max: OPS_MAX });
            }
            (Some(ops), _) => Until::Ops(ops),
            (None, Some(duration)) => Until::Elapsed(duration),
            (None, None) => Until::Ops(OPS_DEFAULT),
        };
        let mut brokers: Vec<String> = Vec::new();
        for addr in args
            .brokers
            .iter()
            .map(|a| a.trim())
            .filter(|a| !a.is_empty())
        {
            if brokers.iter().any(|b| b == addr) {
                return Err(PlanError::DuplicateBroker {
                    addr: addr.to_owned(),
                });
            }
            brokers.push(addr.to_owned());
        }
        if brokers.is_empty() {
            return Err(PlanError::NoBroker);
        }
        if brokers.len() > BROKERS_MAX {
            return Err(PlanError::TooManyBrokers {
                count: brokers.len(),
                max: BROKERS_MAX,
            });
        }
        let prefix = args.prefix.clone().unwrap_or_else(|| run_id.to_owned());
        let valid = !prefix.is_empty()
            && prefix.len() <= PREFIX_BYTES_MAX
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(PlanError::Prefix { prefix });
        }
        Ok(Plan {
            brokers,
            clients: args.clients,
            until,
            prefix,
            cleanup: args.cleanup,
            timeout_ms: args.timeout_ms,
        })
    }

    /// The broker client `client` talks to: round-robin over the list.
    pub fn broker_of(&self, client: usize) -> &str {
        &self.brokers[client % self.brokers.len()]
    }

    /// The name client `client` creates as its `op`-th topic.
    pub fn topic(&self, client: usize, op: u64) -> String {
        format!("{}-c{client}-{op}", self.prefix)
    }
}

/// A run id unique enough that two runs never share topic names: the time
/// in milliseconds and the process id, e.g. `mbench-19a1f3c2b4d-4242`.
pub fn run_id() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("mbench-{ms:x}-{}", std::process::id())
}

/// The phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Create,
    Describe,
    Delete,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Describe => "describe",
            Phase::Delete => "delete",
        }
    }
}

/// One result line per phase. The field names are those of the other bench
/// lines (`docs/cli.md`): `records` and `records_per_s` repeat `ops` and
/// `ops_per_s` so scripts that read every bench line the same way work, and
/// `mb_per_s` is null because metadata requests carry no payload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetadataResult {
    pub system: &'static str,
    /// `metadata PHASE clients=N brokers=M`.
    pub scenario: String,
    /// `create`, `describe` or `delete`.
    pub phase: &'static str,
    pub clients: usize,
    pub brokers: usize,
    /// The topic name prefix of the run (its topics are `PREFIX-cC-I`).
    pub prefix: String,
    pub seconds: f64,
    /// Operations that succeeded.
    pub ops: u64,
    pub ops_per_s: f64,
    pub records: u64,
    pub records_per_s: f64,
    pub mb_per_s: Option<f64>,
    /// Latency of the successful operations, in microseconds; null when none
    /// succeeded.
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    pub p999_us: Option<u64>,
    /// Operations that failed (refused, timed out, or a describe that
    /// answered for another topic).
    pub errors: u64,
}

impl MetadataResult {
    fn new(plan: &Plan, phase: Phase, outcome: &PhaseOutcome) -> MetadataResult {
        let ops_per_s = outcome.ops as f64 / outcome.seconds.max(1e-9);
        let at = |q: f64| (outcome.ops > 0).then(|| outcome.hist.value_at_quantile(q));
        MetadataResult {
            system: "malachi",
            scenario: format!(
                "metadata {} clients={} brokers={}",
                phase.name(),
                plan.clients,
                plan.brokers.len()
            ),
            phase: phase.name(),
            clients: plan.clients,
            brokers: plan.brokers.len(),
            prefix: plan.prefix.clone(),
            seconds: outcome.seconds,
            ops: outcome.ops,
            ops_per_s,
            records: outcome.ops,
            records_per_s: ops_per_s,
            mb_per_s: None,
            p50_us: at(0.50),
            p99_us: at(0.99),
            p999_us: at(0.999),
            errors: outcome.errors,
        }
    }

    /// The text line: the produce and consume lines' layout, in ops/s.
    pub fn text(&self) -> String {
        let us = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        format!(
            "{:<9} {:<52} {:>11.0} ops/s  p50 {} us  p99 {} us  p999 {} us  errors {}",
            self.system,
            self.scenario,
            self.ops_per_s,
            us(self.p50_us),
            us(self.p99_us),
            us(self.p999_us),
            self.errors
        )
    }
}

/// What one phase measured.
#[derive(Debug)]
struct PhaseOutcome {
    ops: u64,
    errors: u64,
    seconds: f64,
    hist: Histogram<u64>,
    /// Create: the topics created, in client order. Empty otherwise.
    created: Vec<String>,
    /// The first failure, to say why errors happened.
    first_error: Option<String>,
}

/// What one client did in one phase.
#[derive(Debug)]
struct ClientOutcome {
    hist: Histogram<u64>,
    errors: u64,
    created: Vec<String>,
    first_error: Option<String>,
    /// When the client's last operation ended: the phase lasts until the
    /// last client is done, measured here rather than by the progress
    /// loop, which notices only at its next tick.
    finished: Instant,
}

pub async fn metadata(args: BenchMetadataArgs) -> Result<(), CliError> {
    let plan = Plan::new(&args, &run_id())?;
    let json = args.json;
    // Every connection is opened before the clock starts, so an unreachable
    // broker fails the run at once, by name.
    let mut clients = Vec::with_capacity(plan.clients);
    for client in 0..plan.clients {
        let output = OutputArgs {
            credentials: super::super::CredentialArgs::default(),
            client_config: super::super::ClientConfigArgs::internal(),
            broker: vec![plan.broker_of(client).to_owned()],
            json,
            timeout_ms: plan.timeout_ms,
            tls: Default::default(),
        };
        clients.push(bench_client(&output).await?);
    }
    let clients: Arc<[Client]> = clients.into();
    warm_up(&plan, &clients).await;
    if !json {
        // The names are the only handle on the topics of an interrupted run
        // or of one with --cleanup=false.
        println!(
            "topics {}-cC-I, {}",
            plan.prefix,
            if plan.cleanup {
                "deleted at the end"
            } else {
                "kept (--cleanup=false)"
            }
        );
    }

    let created = run_phase(&plan, &clients, Phase::Create, Arc::new(Vec::new()), json).await?;
    emit(&MetadataResult::new(&plan, Phase::Create, &created), json)?;
    if created.created.is_empty() {
        return Err(CliError::Bench(format!(
            "no topic was created ({} errors; the first: {})",
            created.errors,
            created.first_error.as_deref().unwrap_or("none")
        )));
    }
    let topics = Arc::new(created.created);
    let described = run_phase(&plan, &clients, Phase::Describe, topics.clone(), json).await?;
    emit(
        &MetadataResult::new(&plan, Phase::Describe, &described),
        json,
    )?;
    if plan.cleanup {
        let deleted = run_phase(&plan, &clients, Phase::Delete, topics, json).await?;
        emit(&MetadataResult::new(&plan, Phase::Delete, &deleted), json)?;
    }
    Ok(())
}

/// One untimed describe per client, of a name no run creates, before the
/// clock starts: the first request between two brokers opens their
/// forwarding connection, which would otherwise land in the first phase's
/// tail latency (32 slow first calls are 2% of a default run). The answer,
/// `topic_not_found` or an error, does not matter.
async fn warm_up(plan: &Plan, clients: &[Client]) {
    let calls = clients.iter().enumerate().map(|(index, client)| {
        let name = format!("{}-warmup-{index}", plan.prefix);
        async move {
            let _ = client.describe_topic(&name).await;
        }
    });
    futures::future::join_all(calls).await;
}

fn emit(result: &MetadataResult, json: bool) -> Result<(), CliError> {
    if json {
        print_json(result)
    } else {
        println!("{}", result.text());
        Ok(())
    }
}

/// The topic client `client` works on as its `op`-th operation of `phase`,
/// or `None` once it has no more. `topics` are the created ones.
fn target(plan: &Plan, phase: Phase, topics: &[String], client: usize, op: u64) -> Option<String> {
    let planned = match plan.until {
        Until::Ops(ops) => ops,
        Until::Elapsed(_) => OPS_MAX,
    };
    match phase {
        Phase::Create => (op < planned).then(|| plan.topic(client, op)),
        // Striding by the client count from the client's own index makes
        // each client read topics that the others created, through its own
        // broker.
        Phase::Describe => {
            if op >= planned || topics.is_empty() {
                return None;
            }
            let index = usize::try_from(op)
                .ok()?
                .wrapping_mul(plan.clients)
                .wrapping_add(client)
                .wrapping_add(1)
                % topics.len();
            topics.get(index).cloned()
        }
        // Every created topic once, whatever `until` says: cleanup is
        // complete or it is not cleanup.
        Phase::Delete => {
            let index = usize::try_from(op)
                .ok()?
                .checked_mul(plan.clients)?
                .checked_add(client)?;
            topics.get(index).cloned()
        }
    }
}

/// One operation of `phase` on `topic`.
async fn operate(client: &Client, phase: Phase, topic: &str) -> Result<(), String> {
    let error = |e: ClientError| e.to_string();
    match phase {
        Phase::Create => client
            .create_topic(topic, None, None)
            .await
            .map(|_| ())
            .map_err(error),
        Phase::Describe => {
            let description = client.describe_topic(topic).await.map_err(error)?;
            if description.name == topic {
                Ok(())
            } else {
                Err(format!(
                    "describe of {topic} answered for {}",
                    description.name
                ))
            }
        }
        Phase::Delete => client.delete_topic(topic).await.map(|_| ()).map_err(error),
    }
}

async fn run_phase(
    plan: &Plan,
    clients: &Arc<[Client]>,
    phase: Phase,
    topics: Arc<Vec<String>>,
    quiet: bool,
) -> Result<PhaseOutcome, CliError> {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = match (phase, plan.until) {
        (Phase::Create | Phase::Describe, Until::Elapsed(duration)) => Some(started + duration),
        _ => None,
    };
    let bar = phase_progress(plan, phase, topics.len(), quiet);
    let mut tasks = Vec::with_capacity(clients.len());
    for index in 0..clients.len() {
        let (plan, clients, topics, done) =
            (plan.clone(), clients.clone(), topics.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let client = &clients[index];
            let mut outcome = ClientOutcome {
                hist: histogram()?,
                errors: 0,
                created: Vec::new(),
                first_error: None,
                finished: started,
            };
            let mut op = 0;
            while deadline.is_none_or(|d| Instant::now() < d) {
                let Some(topic) = target(&plan, phase, &topics, index, op) else {
                    break;
                };
                op += 1;
                let at = Instant::now();
                match operate(client, phase, &topic).await {
                    Ok(()) => {
                        outcome.hist.saturating_record(micros(at.elapsed()));
                        if phase == Phase::Create {
                            outcome.created.push(topic);
                        }
                    }
                    Err(e) => {
                        outcome.errors += 1;
                        outcome.first_error.get_or_insert(e);
                        tokio::time::sleep(ERROR_BACKOFF).await;
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            outcome.finished = Instant::now();
            Ok::<_, CliError>(outcome)
        }));
    }
    while !tasks.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(TICK).await;
        let elapsed = started.elapsed();
        let ops = done.load(Ordering::Relaxed);
        match deadline {
            Some(_) => bar.set_position(elapsed.as_secs()),
            None => bar.set_position(ops),
        }
        bar.set_message(format!(
            "{} {:.0} ops/s",
            phase.name(),
            ops as f64 / elapsed.as_secs_f64().max(1e-3)
        ));
    }
    bar.finish_and_clear();
    let mut finished = started;
    let mut total = PhaseOutcome {
        ops: 0,
        errors: 0,
        seconds: 0.0,
        hist: histogram()?,
        created: Vec::new(),
        first_error: None,
    };
    for task in tasks {
        let outcome = task
            .await
            .map_err(|e| CliError::Bench(format!("a {} client failed: {e}", phase.name())))??;
        finished = finished.max(outcome.finished);
        total.ops += outcome.hist.len();
        let _ = total.hist.add(&outcome.hist);
        total.errors += outcome.errors;
        total.created.extend(outcome.created);
        if total.first_error.is_none() {
            total.first_error = outcome.first_error;
        }
    }
    total.seconds = finished.duration_since(started).as_secs_f64();
    if let Some(first) = &total.first_error {
        warn!(
            phase = phase.name(),
            errors = total.errors,
            first = %first,
            "metadata operations failed"
        );
    }
    Ok(total)
}

/// A progress bar on a terminal: seconds for a timed phase, operations
/// otherwise; hidden when quiet or piped.
fn phase_progress(plan: &Plan, phase: Phase, topics: usize, quiet: bool) -> ProgressBar {
    let total = match (phase, plan.until) {
        (Phase::Delete, _) => topics as u64,
        (_, Until::Ops(ops)) => ops.saturating_mul(plan.clients as u64),
        (_, Until::Elapsed(duration)) => return progress(duration, quiet),
    };
    let bar = progress(Duration::ZERO, quiet);
    if bar.is_hidden() {
        return bar;
    }
    bar.set_length(total);
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:40}] {pos}/{len} ops {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(clients: usize, ops: Option<u64>, brokers: &[&str]) -> BenchMetadataArgs {
        BenchMetadataArgs {
            brokers: brokers.iter().map(|b| (*b).to_owned()).collect(),
            clients,
            ops,
            duration: None,
            prefix: None,
            cleanup: true,
            json: true,
            timeout_ms: 10_000,
        }
    }

    fn plan(clients: usize, ops: u64) -> Plan {
        Plan::new(&args(clients, Some(ops), &["a:1", "b:1", "c:1"]), "run").unwrap()
    }

    fn fixed_result() -> MetadataResult {
        let plan = plan(32, 50);
        let mut hist = histogram().unwrap();
        for us in [800, 1_000, 1_200, 9_000] {
            hist.record(us).unwrap();
        }
        let outcome = PhaseOutcome {
            ops: 4,
            errors: 1,
            seconds: 0.5,
            hist,
            created: Vec::new(),
            first_error: None,
        };
        MetadataResult::new(&plan, Phase::Create, &outcome)
    }

    #[test]
    fn a_phase_line_in_json_has_the_bench_field_names_and_ops() {
        let line = serde_json::to_string(&fixed_result()).unwrap();
        insta::assert_snapshot!(line);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["scenario"], "metadata create clients=32 brokers=3");
        assert_eq!(value["ops_per_s"], value["records_per_s"]);
        assert_eq!(value["ops"], value["records"]);
        assert!(value["mb_per_s"].is_null());
    }

    #[test]
    fn a_phase_line_in_text_shows_ops_per_second_latencies_and_errors() {
        insta::assert_snapshot!(fixed_result().text());
    }

    #[test]
    fn a_phase_where_nothing_succeeded_has_no_latencies() {
        let outcome = PhaseOutcome {
            ops: 0,
            errors: 3,
            seconds: 1.0,
            hist: histogram().unwrap(),
            created: Vec::new(),
            first_error: Some("refused".into()),
        };
        let result = MetadataResult::new(&plan(2, 5), Phase::Describe, &outcome);
        assert_eq!(result.p50_us, None);
        assert_eq!(result.p999_us, None);
        assert_eq!(result.ops_per_s, 0.0);
        assert!(result.text().contains("p50 - us"), "{}", result.text());
    }

    #[test]
    fn zero_or_too_many_clients_are_refused() {
        let refused = Plan::new(&args(0, None, &["a:1"]), "run").unwrap_err();
        assert_eq!(
            refused,
            PlanError::Clients {
                clients: 0,
                max: CLIENTS_MAX
            }
        );
        assert!(refused.to_string().starts_with("--clients must be 1 to"));
        assert!(Plan::new(&args(CLIENTS_MAX + 1, None, &["a:1"]), "run").is_err());
    }

    #[test]
    fn zero_ops_no_broker_and_a_repeated_broker_are_refused() {
        assert_eq!(
            Plan::new(&args(1, Some(0), &["a:1"]), "run"),
            Err(PlanError::Ops {
                ops: 0,
                max: OPS_MAX
            })
        );
        assert_eq!(
            Plan::new(&args(1, None, &[" ", ""]), "run"),
            Err(PlanError::NoBroker)
        );
        assert_eq!(
            Plan::new(&args(1, None, &["a:1", "a:1"]), "run"),
            Err(PlanError::DuplicateBroker { addr: "a:1".into() })
        );
    }

    #[test]
    fn a_prefix_that_cannot_name_a_topic_is_refused() {
        let mut bad = args(1, None, &["a:1"]);
        bad.prefix = Some("has space".into());
        assert!(matches!(
            Plan::new(&bad, "run"),
            Err(PlanError::Prefix { .. })
        ));
        bad.prefix = Some("x".repeat(PREFIX_BYTES_MAX + 1));
        assert!(matches!(
            Plan::new(&bad, "run"),
            Err(PlanError::Prefix { .. })
        ));
    }

    #[test]
    fn without_ops_or_duration_a_run_does_the_default_ops_under_its_run_id() {
        let plan = Plan::new(&args(4, None, &["a:1"]), "mbench-1-2").unwrap();
        assert_eq!(plan.until, Until::Ops(OPS_DEFAULT));
        assert_eq!(plan.topic(3, 7), "mbench-1-2-c3-7");
        assert!(plan.cleanup);
    }

    fn parse(flags: &[&str]) -> BenchMetadataArgs {
        use clap::Parser as _;
        let argv = ["malachi", "bench", "metadata"].iter().chain(flags);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Bench(crate::cli::BenchCommand::Metadata(args)) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn brokers_may_be_repeated_or_comma_separated_and_cleanup_turned_off() {
        let args = parse(&["--broker", "a:1,b:1", "--broker", "c:1", "--cleanup=false"]);
        assert_eq!(args.brokers, ["a:1", "b:1", "c:1"]);
        assert!(!args.cleanup);
        let plan = Plan::new(&args, "run").unwrap();
        assert_eq!(plan.brokers.len(), 3);
        assert!(parse(&["--cleanup"]).cleanup);
        assert!(parse(&[]).cleanup);
    }

    #[test]
    fn ops_and_duration_exclude_each_other() {
        use clap::Parser as _;
        let both = [
            "malachi",
            "bench",
            "metadata",
            "--ops",
            "5",
            "--duration",
            "1s",
        ];
        assert!(crate::cli::Cli::try_parse_from(both).is_err());
        let timed = parse(&["--duration", "2s"]);
        let plan = Plan::new(&timed, "run").unwrap();
        assert_eq!(plan.until, Until::Elapsed(Duration::from_secs(2)));
    }

    #[test]
    fn two_runs_get_different_ids() {
        let first = run_id();
        std::thread::sleep(Duration::from_millis(2));
        assert_ne!(first, run_id());
    }

    #[test]
    fn clients_are_spread_round_robin_over_the_brokers() {
        let plan = plan(5, 1);
        let spread: Vec<&str> = (0..5).map(|c| plan.broker_of(c)).collect();
        assert_eq!(spread, ["a:1", "b:1", "c:1", "a:1", "b:1"]);
    }

    #[test]
    fn each_client_creates_its_ops_then_stops() {
        let plan = plan(2, 3);
        let names: Vec<String> = (0..4)
            .filter_map(|op| target(&plan, Phase::Create, &[], 1, op))
            .collect();
        assert_eq!(names, ["run-c1-0", "run-c1-1", "run-c1-2"]);
    }

    #[test]
    fn describes_read_topics_other_clients_created() {
        let plan = plan(2, 3);
        let topics: Vec<String> = (0..2)
            .flat_map(|c| (0..3).map(move |op| (c, op)))
            .map(|(c, op)| plan.topic(c, op))
            .collect();
        for client in 0..2 {
            let read: Vec<String> = (0..4)
                .filter_map(|op| target(&plan, Phase::Describe, &topics, client, op))
                .collect();
            assert_eq!(read.len(), 3);
            let own = format!("run-c{client}-");
            assert!(read.iter().any(|t| !t.starts_with(&own)), "{read:?}");
        }
        // Nothing created, nothing to describe.
        assert_eq!(target(&plan, Phase::Describe, &[], 0, 0), None);
    }

    #[test]
    fn deletes_cover_every_created_topic_exactly_once() {
        // 7 topics over 3 clients with --ops 1: cleanup ignores --ops.
        let plan = plan(3, 1);
        let topics: Vec<String> = (0..7).map(|i| format!("t{i}")).collect();
        let mut deleted: Vec<String> = (0..3)
            .flat_map(|client| {
                let (plan, topics) = (&plan, &topics);
                (0..10).filter_map(move |op| target(plan, Phase::Delete, topics, client, op))
            })
            .collect();
        deleted.sort();
        assert_eq!(deleted, topics);
    }
}
