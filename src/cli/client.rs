//! The client commands: topics, produce, consume, tree and cluster status,
//! each one request (or stream) through `malachi_wire::Client`.

use std::io::{BufRead, Write};

use malachi_wire::client::{ConsumeOptions, ProducerIdentity, StartAt};
use malachi_wire::{BatchBuilder, Client, ClientConfig, Record};
use serde::Serialize;
use serde_json::json;

use super::error::CliError;
use super::records::{format_text, parse_json_line, parse_text_line, to_json};
use super::render::{self, Volatile};
use super::{
    ClusterCommand, ConsumeArgs, OutputArgs, ProduceArgs, TopicCommand, TopicCreateArgs, TreeArgs,
};

/// The largest produce request the command line builds, in block bytes.
const PRODUCE_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How much of stdin is read at once; a batch never waits for more than this.
const STDIN_BUFFER_BYTES: usize = 1024 * 1024;
/// The longest stdin line accepted, in bytes (a record larger than this is a mistake).
const INPUT_LINE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Retries of one request within its deadline: the deadline
/// (`--timeout-ms`) is what bounds a command, so a retriable refusal (a
/// topic created before every broker is seen live, a failover under way)
/// is retried until it runs out.
const CLI_RETRIES_MAX: u32 = 10_000;

/// Open a client on `output.broker` (one address, or several: the
/// bootstrap brokers, tried in order) with its timeout: connecting, over
/// every bootstrap broker, and each call, its retries included, take at
/// most `--timeout-ms` each.
pub async fn connect(output: &OutputArgs) -> Result<Client, CliError> {
    let (tls, credentials) = output.security()?;
    let config = ClientConfig {
        client_name: concat!("malachi-cli/", env!("CARGO_PKG_VERSION")).to_owned(),
        request_timeout_ms: output.timeout_ms,
        connect_timeout_ms: output.timeout_ms.min(5_000),
        retries_max: CLI_RETRIES_MAX,
        tls: tls.client_tls()?,
        login: login(&credentials)?,
        ..ClientConfig::default()
    };
    Client::connect_with(output.brokers()?, config)
        .await
        .map_err(|e| CliError::client("connect", &output.broker_label(), e))
}

/// The login `credentials` ask for: none without a user; a user needs
/// its password file.
pub fn login(
    credentials: &super::CredentialArgs,
) -> Result<Option<malachi_wire::client::Login>, CliError> {
    if let Some(file) = &credentials.token_file {
        return super::token::token_login(file).map(Some);
    }
    let Some(user) = &credentials.user else {
        return Ok(None);
    };
    let Some(file) = &credentials.password_file else {
        return Err(CliError::Config(format!(
            "--user {user} needs --password-file (or MALACHI_PASSWORD_FILE)"
        )));
    };
    let password = read_password_file(file)?;
    Ok(Some(
        malachi_actors::scram_login::ScramLogin::new(user, &password).into_login(),
    ))
}

/// The largest password file read, in bytes.
const PASSWORD_FILE_BYTES_MAX: u64 = 4096;

/// The first line of `path`: a password (never echoed or logged).
pub fn read_password_file(path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    use std::io::Read;
    let io = |source| CliError::Io {
        action: "read the password file",
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(PASSWORD_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(io)?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err(CliError::Config(format!(
            "{}: the first line (the password) is empty",
            path.display()
        )));
    }
    Ok(line.as_bytes().to_vec())
}

/// Print one JSON object on its own line.
pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let line = serde_json::to_string(value).map_err(|e| CliError::Io {
        action: "encode json",
        source: std::io::Error::other(e),
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").map_err(|source| CliError::Io {
        action: "write stdout",
        source,
    })
}

/// Writes `text` to stdout as it is (the text forms of the client commands).
pub fn print_text(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|source| CliError::Io {
            action: "write stdout",
            source,
        })
}

pub async fn topic(command: TopicCommand) -> Result<(), CliError> {
    match command {
        TopicCommand::Create(args) => topic_create(args).await,
        TopicCommand::List(output) => {
            let client = connect(&output).await?;
            let listing = client
                .list_topics()
                .await
                .map_err(|e| CliError::client("topic list", &output.broker_label(), e))?;
            if output.json {
                listing.topics.iter().try_for_each(print_json)
            } else {
                print_text(&render::topic_list(&listing.topics))
            }
        }
        TopicCommand::Describe(args) => {
            let client = connect(&args.output).await?;
            let topic = client
                .describe_topic_live(&args.name)
                .await
                .map_err(|e| CliError::client("topic describe", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&topic)
            } else {
                print_text(&render::describe(&topic, Volatile(true)))
            }
        }
        TopicCommand::Delete(args) => {
            let client = connect(&args.output).await?;
            let response = client
                .delete_topic(&args.name)
                .await
                .map_err(|e| CliError::client("topic delete", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&json!({"deleted": response.name}))
            } else {
                print_text(&format!("deleted topic {}\n", response.name))
            }
        }
        TopicCommand::Split(args) => {
            let client = connect(&args.output).await?;
            let response = client
                .split_range(&args.name, args.range_id)
                .await
                .map_err(|e| CliError::client("topic split", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&json!({
                    "topic": args.name, "range_id": response.range_id, "children": response.children
                }))
            } else {
                print_text(&format!(
                    "split range {} of {} into {:?}\n",
                    response.range_id, args.name, response.children
                ))
            }
        }
        TopicCommand::Merge(args) => {
            let client = connect(&args.output).await?;
            let response = client
                .merge_range(&args.name, args.range_id)
                .await
                .map_err(|e| CliError::client("topic merge", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&json!({
                    "topic": args.name, "range_id": response.range_id, "parents": response.parents
                }))
            } else {
                print_text(&format!(
                    "merged ranges {:?} of {} into range {}\n",
                    response.parents, args.name, response.range_id
                ))
            }
        }
    }
}

async fn topic_create(args: TopicCreateArgs) -> Result<(), CliError> {
    let client = connect(&args.output).await?;
    let response = client
        .create_topic(&args.name, args.replication_factor, args.policy.clone())
        .await
        .map_err(|e| CliError::client("topic create", &args.output.broker_label(), e))?;
    if args.output.json {
        print_json(&json!({"created": response.name, "incarnation": response.incarnation}))
    } else {
        print_text(&format!(
            "created topic {} (incarnation {})\n",
            response.name, response.incarnation
        ))
    }
}

/// What `produce` prints at the end (and, with `--json`, when it fails).
#[derive(Debug, Serialize)]
struct ProduceSummary<'a> {
    topic: &'a str,
    records_sent: u64,
    records_acknowledged: u64,
    /// The input lines whose records were acknowledged, as inclusive
    /// `[first, last]` line-number intervals (1-based).
    acknowledged_lines: Vec<[u64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Input line numbers by record ordinal, run-length encoded: each run is
/// (first ordinal, its line), and the following ordinals take the following
/// lines until the next run (a skipped line starts a new one).
#[derive(Debug, Default)]
struct LineMap {
    runs: Vec<(u64, u64)>,
    next_ordinal: u64,
    next_line: u64,
}

impl LineMap {
    fn push(&mut self, line: u64) {
        if self.runs.is_empty() || line != self.next_line {
            self.runs.push((self.next_ordinal, line));
        }
        self.next_ordinal += 1;
        self.next_line = line + 1;
    }

    fn line(&self, ordinal: u64) -> u64 {
        let at = self.runs.partition_point(|(start, _)| *start <= ordinal);
        let (start, line) = self.runs[at.saturating_sub(1)];
        line + (ordinal - start)
    }

    /// Ordinal intervals (end exclusive) as inclusive line intervals.
    fn lines(&self, ordinals: &[(u64, u64)]) -> Vec<[u64; 2]> {
        let mut out: Vec<[u64; 2]> = Vec::new();
        for &(start, end) in ordinals {
            let mut ordinal = start;
            while ordinal < end {
                // Cut at run boundaries, where lines jump.
                let at = self.runs.partition_point(|(s, _)| *s <= ordinal);
                let run_end = self.runs.get(at).map_or(end, |(s, _)| (*s).min(end));
                let first = self.line(ordinal);
                let last = self.line(run_end - 1);
                match out.last_mut() {
                    Some(prev) if prev[1] + 1 == first => prev[1] = last,
                    _ => out.push([first, last]),
                }
                ordinal = run_end;
            }
        }
        out
    }
}

pub async fn produce(args: ProduceArgs) -> Result<(), CliError> {
    let client = connect(&args.output).await?;
    let identity = match &args.producer_id {
        Some(name) => ProducerIdentity::named(name),
        None => ProducerIdentity::fresh(),
    };
    let mut producer = client.producer_as(&args.topic, args.window.max(1), identity);
    let batch_records = args.batch_records.max(1);
    let stdin = std::io::stdin();
    let mut reader = std::io::BufReader::with_capacity(STDIN_BUFFER_BYTES, stdin.lock());
    let mut line = String::new();
    let mut line_no: u64 = 0;
    let mut lines = LineMap::default();
    let mut builder = BatchBuilder::new(PRODUCE_BATCH_BYTES_MAX);
    let json = args.output.json;
    let topic = args.topic.clone();
    let broker = args.output.broker_label();
    // A failure says how much was acknowledged (and, with --json, which lines).
    let fail = |producer: &malachi_wire::client::Producer,
                lines: &LineMap,
                error: malachi_wire::client::ClientError| {
        let acknowledged = producer.records_acknowledged();
        let sent = producer.records_sent();
        let error = CliError::client("produce", &broker, error);
        if json {
            let _ = print_json(&ProduceSummary {
                topic: &topic,
                records_sent: sent,
                records_acknowledged: acknowledged,
                acknowledged_lines: lines.lines(&producer.acknowledged_ordinals()),
                error: Some(error.to_string()),
            });
        }
        eprintln!("malachi: {acknowledged} of {sent} records were acknowledged before the error");
        error
    };
    loop {
        line.clear();
        let read = reader.read_line(&mut line).map_err(|source| CliError::Io {
            action: "read stdin",
            source,
        })?;
        if read == 0 {
            break;
        }
        line_no += 1;
        if line.len() > INPUT_LINE_BYTES_MAX {
            return Err(CliError::Input {
                line: line_no,
                detail: format!("longer than {INPUT_LINE_BYTES_MAX} bytes"),
            });
        }
        let text = line.strip_suffix('\n').unwrap_or(&line);
        let text = text.strip_suffix('\r').unwrap_or(text);
        if text.is_empty() && args.output.json {
            continue;
        }
        let record: Record = if args.output.json {
            parse_json_line(text, args.key.as_deref())
        } else {
            parse_text_line(text, args.key.as_deref())
        }
        .map_err(|detail| CliError::Input {
            line: line_no,
            detail,
        })?;
        if builder.count() >= batch_records
            || builder.encoded_bytes() + record.encoded_bytes() + 64 > PRODUCE_BATCH_BYTES_MAX
        {
            let full = std::mem::replace(&mut builder, BatchBuilder::new(PRODUCE_BATCH_BYTES_MAX));
            producer
                .send(full.finish())
                .await
                .map_err(|e| fail(&producer, &lines, e))?;
        }
        builder.push(&record).map_err(|e| CliError::Input {
            line: line_no,
            detail: e.to_string(),
        })?;
        lines.push(line_no);
        // Nothing more buffered means the writer has paused (a person
        // typing, a slow pipe): send what we have rather than hold the
        // records while the next read blocks. The send alone puts them on
        // the wire; waiting for the acknowledgement too reports a refusal
        // (an unknown topic, say) to the writer now instead of at the end.
        if reader.buffer().is_empty() {
            let pending =
                std::mem::replace(&mut builder, BatchBuilder::new(PRODUCE_BATCH_BYTES_MAX));
            producer
                .send(pending.finish())
                .await
                .map_err(|e| fail(&producer, &lines, e))?;
            producer
                .flush()
                .await
                .map_err(|e| fail(&producer, &lines, e))?;
        }
    }
    if builder.count() > 0 {
        producer
            .send(builder.finish())
            .await
            .map_err(|e| fail(&producer, &lines, e))?;
    }
    let acknowledged = producer
        .flush()
        .await
        .map_err(|e| fail(&producer, &lines, e))?;
    let sent = producer.records_sent();
    if args.output.json {
        print_json(&ProduceSummary {
            topic: &args.topic,
            records_sent: sent,
            records_acknowledged: acknowledged,
            acknowledged_lines: lines.lines(&producer.acknowledged_ordinals()),
            error: None,
        })
    } else {
        print_text(&format!(
            "{acknowledged} of {sent} records acknowledged by {}\n",
            args.topic
        ))
    }
}

pub async fn consume(args: ConsumeArgs) -> Result<(), CliError> {
    if args.group.is_some() {
        return Err(CliError::NotImplemented(
            "consumer groups are not implemented yet: consume without --group and keep the printed cursor",
        ));
    }
    let client = connect(&args.output).await?;
    let start = match (&args.cursor, args.from_start) {
        (Some(cursor), _) => StartAt::Cursor(cursor.clone()),
        (None, true) => StartAt::Start,
        (None, false) => StartAt::Tail,
    };
    let options = ConsumeOptions {
        follow: args.follow,
        records_total_max: args.max,
        ..ConsumeOptions::default()
    };
    let mut consumer = client.consume(&args.topic, start, options);
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let write_err = |source| CliError::Io {
        action: "write stdout",
        source,
    };
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut interrupted = false;
    // Whether the last record printed ended its fetched batch: only then is
    // the consumer's cursor exactly after it.
    let mut at_batch_end = true;
    loop {
        let next = if interrupted {
            if at_batch_end {
                break;
            }
            // Finish the batch already in memory (no network) so the cursor
            // printed is right after the last record printed.
            consumer.next().await
        } else {
            tokio::select! {
                next = consumer.next() => next,
                _ = &mut interrupt => {
                    interrupted = true;
                    continue;
                }
            }
        };
        let Some(item) = next else { break };
        let consumed =
            item.map_err(|e| CliError::client("consume", &args.output.broker_label(), e))?;
        at_batch_end = consumed.cursor_after.is_some();
        if args.output.json {
            let line =
                serde_json::to_string(&to_json(&consumed.record)).map_err(|e| CliError::Io {
                    action: "encode json",
                    source: std::io::Error::other(e),
                })?;
            writeln!(stdout, "{line}").map_err(write_err)?;
        } else {
            writeln!(stdout, "{}", format_text(&consumed.record)).map_err(write_err)?;
        }
        if args.follow && at_batch_end {
            stdout.flush().map_err(write_err)?;
        }
    }
    let cursor = consumer.cursor().unwrap_or_default().to_owned();
    if args.output.json {
        let line =
            serde_json::to_string(&json!({ "cursor": cursor })).map_err(|e| CliError::Io {
                action: "encode json",
                source: std::io::Error::other(e),
            })?;
        writeln!(stdout, "{line}").map_err(write_err)?;
        stdout.flush().map_err(write_err)?;
    } else {
        stdout.flush().map_err(write_err)?;
        eprintln!("cursor: {cursor}");
    }
    Ok(())
}

pub async fn tree(args: TreeArgs) -> Result<(), CliError> {
    let output = args.output;
    let client = connect(&output).await?;
    let snapshot = client
        .call(
            None,
            &malachi_wire::messages::TreeSnapshotRequest { all: args.all },
        )
        .await
        .map_err(|e| CliError::client("tree", &output.broker_label(), e))?;
    if args.all {
        // A broker that cannot be reached is part of the answer, not a
        // failure of the command.
        return if output.json {
            snapshot.brokers.iter().try_for_each(print_json)
        } else {
            print_text(&render::tree_all(&snapshot.brokers))
        };
    }
    if output.json {
        print_json(&snapshot)
    } else {
        let mut text = render::tree(&snapshot, Volatile(true));
        text.push_str(&format!(
            "restarts in total: {}\n",
            render::restarts_total(&snapshot.root)
        ));
        print_text(&text)
    }
}

pub async fn cluster(command: ClusterCommand) -> Result<(), CliError> {
    match command {
        ClusterCommand::Members(output) => {
            let client = connect(&output).await?;
            let members = client
                .cluster_members(Default::default())
                .await
                .map_err(|e| CliError::client("cluster members", &output.broker_label(), e))?;
            if output.json {
                print_json(&members)
            } else {
                print_text(&render::cluster_members(&members))
            }
        }
        ClusterCommand::Version(output) => super::feature::cluster_version(output).await,
        ClusterCommand::Status(output) => {
            let client = connect(&output).await?;
            let status = client
                .cluster_status()
                .await
                .map_err(|e| CliError::client("cluster status", &output.broker_label(), e))?;
            if output.json {
                status.brokers.iter().try_for_each(print_json)
            } else {
                print_text(&render::cluster_status(&status))
            }
        }
    }
}

/// How often a waiting decommission reads the members again.
const DECOMMISSION_POLL_MS: u64 = 1_000;

/// `malachi broker decommission`: records the decommission, then waits
/// until no vnode group lists the broker and nothing moves (ADR 0104),
/// its segment copies included (ADR 0112: it keeps a learner of a vnode
/// while one of its topics' segments names it).
pub async fn decommission(args: crate::cli::DecommissionArgs) -> Result<(), CliError> {
    use malachi_wire::messages::ClusterMembersRequest;
    let output = args.output;
    let client = connect(&output).await?;
    let request = ClusterMembersRequest {
        decommission: Some(args.node),
        admit: None,
    };
    let mut members = client
        .cluster_members(request)
        .await
        .map_err(|e| CliError::client("broker decommission", &output.broker_label(), e))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(args.wait_ms);
    let left = |m: &malachi_wire::messages::ClusterMembersResponse| {
        m.members
            .iter()
            .find(|i| i.node_id == args.node)
            .map_or(0, |i| i.vnode_replicas)
    };
    let copies_of = |m: &malachi_wire::messages::ClusterMembersResponse| {
        m.members
            .iter()
            .find(|i| i.node_id == args.node)
            .map_or(0, |i| i.vnode_learners)
    };
    if !output.json {
        eprintln!(
            "node {} is decommissioned; its vnode replicas move to the other brokers",
            args.node
        );
    }
    while !args.no_wait
        && (left(&members) > 0
            || copies_of(&members) > 0
            || members.groups_moving > 0
            || members.groups_unreachable > 0)
    {
        if std::time::Instant::now() >= deadline {
            return Err(CliError::WaitedOut(format!(
                "node {} still holds {} vnode replicas and segment copies of the topics of {} vnodes after {} ms ({} groups moving, {} unreachable); they go on moving: run `malachi cluster members` to follow them",
                args.node,
                left(&members),
                copies_of(&members),
                args.wait_ms,
                members.groups_moving,
                members.groups_unreachable
            )));
        }
        if !output.json {
            eprintln!(
                "node {}: {} vnode replicas left, segment copies of {} vnodes' topics left, {} groups moving",
                args.node,
                left(&members),
                copies_of(&members),
                members.groups_moving
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(DECOMMISSION_POLL_MS)).await;
        members = client
            .cluster_members(Default::default())
            .await
            .map_err(|e| CliError::client("cluster members", &output.broker_label(), e))?;
    }
    if output.json {
        return print_json(&members);
    }
    let mut text = render::cluster_members(&members);
    if args.no_wait {
        text.push_str(&format!(
            "node {} is decommissioned; `malachi cluster members` shows its replicas leaving\n",
            args.node
        ));
    } else {
        let learners = members
            .members
            .iter()
            .find(|i| i.node_id == args.node)
            .map_or(0, |i| i.vnode_learners);
        if learners == 0 {
            text.push_str(&format!(
                "node {} holds no vnode replicas and takes no new segment copies: it may stop\n",
                args.node
            ));
        } else {
            text.push_str(&format!(
                "node {} votes in no vnode group and takes no new segment copies. It still holds segment copies of the topics of {learners} vnodes (it keeps their metadata as a learner); they are moving: its active segments roll onto the other brokers and its sealed copies are re-created there. It may stop once `malachi cluster members` shows it with no vnode learners\n",
                args.node
            ));
        }
    }
    print_text(&text)
}
