//! `malachi broker` and `malachi dev`: run a broker in the foreground until
//! SIGINT or SIGTERM, then shut it down in order (stop accepting, finish
//! in-flight requests, sync segments, stop the tree) and exit 0.

use std::path::Path;

use malachi_actors::{Broker, BrokerConfig};
use tokio::signal::unix::{SignalKind, signal};

use super::config::{self, Layered};
use super::error::CliError;
use super::{BrokerArgs, DevArgs};

/// Brokers `malachi dev` can run today: a multi-broker cluster needs
/// membership, which a later issue brings. A larger `--nodes` runs one broker
/// and says so, so that the cli.md default (`--nodes 3`) still starts.
pub const DEV_NODES_SUPPORTED: u32 = 1;
/// `malachi dev`'s admin port (cli.md: 8080, 8081, ...).
pub const DEV_ADMIN_ADDR: &str = "127.0.0.1:8080";
/// How long a starting broker may take to become ready before we say so.
const READY_TIMEOUT_MS: u64 = 30_000;

pub async fn broker(args: BrokerArgs) -> Result<(), CliError> {
    let layered: Layered<BrokerConfig> = config::load(&args)?;
    layered
        .broker
        .validate()
        .map_err(|e| CliError::Config(strip_prefix(&e.to_string())))?;
    if args.check {
        let text = toml::to_string(&layered.broker).map_err(|e| CliError::Config(e.to_string()))?;
        print!("{text}");
        return Ok(());
    }
    run(layered, false).await
}

pub async fn dev(args: DevArgs) -> Result<(), CliError> {
    if args.nodes == 0 {
        return Err(CliError::Config("--nodes must be at least 1".into()));
    }
    if args.nodes > DEV_NODES_SUPPORTED {
        eprintln!(
            "malachi dev: multi-broker dev arrives with cluster membership; running 1 broker instead of {}",
            args.nodes
        );
    }
    let broker_args = BrokerArgs {
        config: None,
        node_id: Some(1),
        listen: Some(super::BROKER_ADDR_DEFAULT.to_owned()),
        admin_listen: Some(DEV_ADMIN_ADDR.to_owned()),
        data_dir: Some(args.data_dir.join("node-1")),
        seeds: Vec::new(),
        attrs: Vec::new(),
        check: false,
    };
    let layered: Layered<BrokerConfig> = config::layer(None, &broker_args)?;
    layered
        .broker
        .validate()
        .map_err(|e| CliError::Config(strip_prefix(&e.to_string())))?;
    run(layered, true).await
}

/// The broker's own error already says "invalid configuration: ".
fn strip_prefix(message: &str) -> String {
    message
        .strip_prefix("invalid configuration: ")
        .unwrap_or(message)
        .to_owned()
}

fn dev_banner(client: &str, admin: &str, data_dir: &Path) -> String {
    format!(
        "malachi dev: 1 broker serving\n\
         \x20 client port   {client}\n\
         \x20 admin (HTTP)  http://{admin}/  (health, ready, metrics, supervision tree)\n\
         \x20 data          {data}\n\
         try, in another terminal:\n\
         \x20 malachi topic create demo\n\
         \x20 printf 'k1\\thello\\nk2\\tworld\\n' | malachi produce demo\n\
         \x20 malachi consume demo --from-start\n\
         \x20 malachi tree\n\
         stop with Ctrl-C.",
        data = data_dir.display()
    )
}

async fn run(layered: Layered<BrokerConfig>, dev: bool) -> Result<(), CliError> {
    if !layered.seeds.is_empty() {
        eprintln!(
            "malachi broker: --seed is accepted but not used yet (cluster membership arrives with a later issue); this broker runs alone"
        );
    }
    // Signals are hooked before the broker starts, so a SIGTERM that arrives
    // during start-up still leads to an ordered shutdown.
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| CliError::Broker(format!("cannot handle SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| CliError::Broker(format!("cannot handle SIGINT: {e}")))?;
    let data_dir = layered.broker.data_dir.clone();
    let node_id = layered.broker.node_id;
    let mut handle = Broker::start(layered.broker)
        .await
        .map_err(|e| CliError::Broker(e.to_string()))?;
    if !handle.wait_ready(READY_TIMEOUT_MS).await {
        tracing::warn!(
            timeout_ms = READY_TIMEOUT_MS,
            "broker not ready yet; serving anyway"
        );
    }
    let (client, admin) = (
        handle.client_addr().to_string(),
        handle.admin_addr().to_string(),
    );
    // One stable line on stdout that scripts and tests wait for (with the
    // real ports when port 0 was asked for).
    println!(
        "malachi broker: node {node_id} serving clients on {client}, admin on http://{admin}/, data in {}",
        data_dir.display()
    );
    if dev {
        println!("{}", dev_banner(&client, &admin, &data_dir));
    }
    tracing::info!(
        node_id,
        client = %client,
        admin = %admin,
        attributes = ?layered.attributes,
        "broker serving"
    );
    let failed = tokio::select! {
        _ = term.recv() => { tracing::info!("sigterm: shutting down"); false }
        _ = int.recv() => { tracing::info!("sigint: shutting down"); false }
        _ = handle.stopped() => true,
    };
    if failed {
        return Err(CliError::Broker(
            "the supervision tree gave up (restart intensity exceeded); see the log above".into(),
        ));
    }
    handle
        .shutdown()
        .await
        .map_err(|e| CliError::Broker(format!("shutdown: {e}")))?;
    println!("malachi broker: node {node_id} stopped");
    Ok(())
}
