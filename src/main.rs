//! The `malachi` binary: the broker daemon (`malachi broker`, `malachi dev`),
//! the client commands and the benchmarks. Everything lives in [`cli`]; this
//! file parses the command line, runs the command on a tokio runtime and turns
//! its outcome into an exit code, printing any error as one line on stderr.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use malachi_bench::storage::{self as bench, BenchOptions, ScenarioResult};

use cli::error::CliError;
use cli::{BenchCommand, Cli, Command, StorageArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Both rustls providers are in the build: choose aws-lc-rs for the
    // process, before any TLS config is built (ADR 0146 §5, ADR 0149).
    malachi_wire::tls::install_default_provider();
    init_logging(&cli.command);
    if let Command::Bench(BenchCommand::Storage(args)) = cli.command {
        // The storage benchmark runs its own threads; it needs no runtime.
        return bench_storage(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("malachi: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("malachi: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Brokers log at info by default; client commands only warn, so their
/// stdout and stderr stay what scripts parse. `malachi dev` shows its banner
/// and warnings on the terminal and writes its info log to
/// `DATA_DIR/dev.log`. `RUST_LOG` overrides the levels, and
/// `MALACHI_LOG_FORMAT=json` switches to JSON lines.
fn init_logging(command: &Command) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // openraft narrates every vote and log read at info, and warns of
    // conditions raft rides out (a peer not yet reachable while membership
    // forms, an election's race); ractor_cluster warns of every node session
    // that ends, an ordered shutdown's included. Their errors stay; the raft
    // transport warns itself when a peer's calls fail for seconds, and
    // membership reports a lost broker (ADR 0100).
    //
    // Filtered rather than avoided: openraft warns of every failed vote or
    // heartbeat call whatever its cause, and a group must keep electing
    // while one of its voters is down or not yet gossiped (two of three
    // elect), so no way of calling it keeps those lines away. Whether a
    // peer's failures are unexpected is judged by the transport instead.
    // One openraft warning is never a ridden-out condition and stays: a log
    // read that returned nothing (`replication::stream_state`: our log
    // store broke openraft's contract).
    const QUIET: &str =
        "openraft=error,openraft::replication::stream_state=warn,ractor_cluster=error";
    let filter = |default: &str| {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new(format!("{default},{QUIET}")))
    };
    let json = std::env::var("MALACHI_LOG_FORMAT").is_ok_and(|v| v == "json");
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (terminal, file) = match command {
        Command::Broker(args) if args.action.is_none() => ("info", None),
        Command::Dev(args) => ("warn", dev_log(&args.data_dir)),
        _ => ("warn", None),
    };
    let file_layer = file.map(|file| {
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file));
        if json {
            layer.json().with_filter(filter("info")).boxed()
        } else {
            layer.with_filter(filter("info")).boxed()
        }
    });
    let terminal_layer = {
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr);
        if json {
            layer.json().with_filter(filter(terminal)).boxed()
        } else {
            layer.with_filter(filter(terminal)).boxed()
        }
    };
    // A second initialisation cannot happen here; ignoring the error is safe.
    let _ = tracing_subscriber::registry()
        .with(terminal_layer)
        .with(file_layer)
        .try_init();
}

/// `malachi dev`'s log file, appended to; none (the terminal only) when it
/// cannot be opened, which the start then reports.
fn dev_log(data_dir: &std::path::Path) -> Option<std::fs::File> {
    std::fs::create_dir_all(data_dir).ok()?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("dev.log"))
        .ok()
}

async fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Broker(cli::BrokerArgs {
            action: Some(cli::BrokerAction::Decommission(args)),
            ..
        }) => cli::client::decommission(args).await,
        Command::Broker(args) => cli::broker::broker(args).await,
        Command::Dev(args) => cli::broker::dev(args).await,
        Command::Topic(command) => cli::client::topic(command).await,
        Command::Produce(args) => cli::client::produce(args).await,
        Command::Consume(args) => cli::client::consume(args).await,
        Command::Tree(output) => cli::client::tree(output).await,
        Command::Cluster(command) => cli::client::cluster(command).await,
        Command::Vnode(command) => cli::vnode::vnode(command).await,
        Command::Policy(command) => cli::policy::policy(command).await,
        Command::Feature(command) => cli::feature::feature(command).await,
        Command::User(command) => cli::users::user(command).await,
        Command::Acl(command) => cli::users::acl(command).await,
        Command::Token(command) => cli::token::token(command).await,
        Command::Bench(BenchCommand::Produce(args)) => cli::bench::produce(args).await,
        Command::Bench(BenchCommand::Consume(args)) => cli::bench::consume(args).await,
        Command::Bench(BenchCommand::Compare(args)) => cli::bench::compare::compare(args).await,
        Command::Bench(BenchCommand::Metadata(args)) => cli::bench::metadata::metadata(args).await,
        Command::Bench(BenchCommand::Idle(args)) => cli::bench::idle::idle(args).await,
        Command::Bench(BenchCommand::Failover(args)) => cli::bench::failover::failover(args).await,
        Command::Bench(BenchCommand::Heal(args)) => cli::bench::heal::heal(args).await,
        Command::Bench(BenchCommand::Scale(args)) => cli::bench::scale::scale(args).await,
        Command::Bench(BenchCommand::Maintenance(args)) => {
            cli::bench::maintenance::maintenance(args).await
        }
        Command::Bench(BenchCommand::Storage(_)) => Err(CliError::NotImplemented(
            "bench storage runs outside the runtime",
        )),
    }
}

fn bench_storage(args: StorageArgs) -> ExitCode {
    let (dir, remove) = match args.dir {
        Some(dir) => (dir, false),
        None => (
            PathBuf::from(format!("malachi-bench-{}", std::process::id())),
            true,
        ),
    };
    let opts = BenchOptions {
        dir: dir.clone(),
        quick: args.quick,
        flush_interval_ms: args.flush_interval_ms,
        sync_threads: args.sync_threads,
        flush_pipeline_depth: args.pipeline_depth,
        direct_io: !args.buffered,
        filter: args.filter,
    };
    if !args.json {
        println!(
            "storage benchmark in {} (record frame {} bytes, flush_interval_ms {}, sync_threads {}, pipeline_depth {}, {}{})",
            dir.display(),
            bench::frame_bytes(),
            args.flush_interval_ms,
            args.sync_threads,
            args.pipeline_depth,
            if args.buffered {
                "buffered"
            } else {
                "direct i/o"
            },
            if args.quick { ", quick" } else { "" }
        );
        println!(
            "{:<58} {:>9} {:>11} {:>8} {:>8} {:>8} {:>10} {:>8} {:>6} {:>7}",
            "scenario",
            "MB/s",
            "records/s",
            "p50 us",
            "p99 us",
            "p999 us",
            "bytes/sync",
            "raw MB/s",
            "ratio",
            "r_batch"
        );
    }
    let json = args.json;
    let outcome = bench::run(&opts, |r| print_result(r, json));
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("malachi: bench storage failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_result(r: &ScenarioResult, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("malachi: cannot encode a result: {e}"),
        }
        return;
    }
    let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    let mut line = format!(
        "{:<58} {:>9.1} {:>11.0} {:>8} {:>8} {:>8} {:>10.0} {:>8} {:>6} {:>7}",
        r.scenario,
        r.mb_per_s,
        r.records_per_s,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.write_bytes_mean,
        r.raw_mb_per_s
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
        ratio(r.ratio_to_raw),
        ratio(r.ratio_to_raw_batch)
    );
    if let Some(target) = r.p99_target_us {
        let verdict = if r.p99_us <= target { "met" } else { "missed" };
        line.push_str(&format!("  p99 target {target} us: {verdict}"));
    }
    if let (Some(offered), Some(lag)) = (r.offered_records_per_s, r.send_lag_p99_us) {
        line.push_str(&format!(
            "  offered {offered:.0} records/s, send lag p99 {lag} us"
        ));
    }
    if r.busy_retries > 0 {
        line.push_str(&format!("  busy retries {}", r.busy_retries));
    }
    if r.flushes_overlapped > 0 {
        line.push_str(&format!("  overlapped flushes {}", r.flushes_overlapped));
    }
    println!("{line}");
}
