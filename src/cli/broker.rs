//! `malachi broker` and `malachi dev`: run one broker (or, for `dev`, a local
//! cluster of them in this process) in the foreground until SIGINT or
//! SIGTERM, then shut each down in order (stop accepting, finish in-flight
//! requests, sync segments, leave the cluster, stop the tree) and exit 0.

use std::path::Path;

use malachi_actors::{Broker, BrokerConfig, BrokerHandle};
use tokio::signal::unix::{SignalKind, signal};

use super::config::{self, Layered};
use super::error::CliError;
use super::{BrokerArgs, DevArgs};

/// `malachi dev`'s first client port (cli.md: 4040, 4041, ...).
pub const DEV_CLIENT_PORT: u16 = 4040;
/// `malachi dev`'s first admin port (cli.md: 8080, 8081, ...).
pub const DEV_ADMIN_PORT: u16 = 8080;
/// Brokers `malachi dev` runs at most (their ports must stay in a small band).
pub const DEV_NODES_MAX: u32 = 9;
/// How long a starting broker may take to become ready before we say so.
const READY_TIMEOUT_MS: u64 = 30_000;
/// How long `malachi dev`'s brokers may take to see each other live before
/// we say so.
const FORMED_TIMEOUT_MS: u64 = 15_000;

/// The cluster keys of the layered configuration belong to the broker's own
/// configuration too: the command line and the file layer them, the broker
/// gossips them.
fn into_broker(mut layered: Layered<BrokerConfig>, args: &BrokerArgs) -> Layered<BrokerConfig> {
    layered.broker.seeds = layered.seeds.clone();
    layered.broker.attributes = layered.attributes.clone();
    if let Some(cookie) = &args.cluster_cookie {
        layered.broker.membership.cluster_cookie = Some(cookie.clone());
    }
    if let Some(expect) = args.bootstrap_expect {
        layered.broker.cluster.bootstrap_expect = Some(expect);
    }
    layered
}

pub async fn broker(args: BrokerArgs) -> Result<(), CliError> {
    let layered: Layered<BrokerConfig> = into_broker(config::load(&args)?, &args);
    layered
        .broker
        .validate()
        .map_err(|e| CliError::Config(strip_prefix(&e.to_string())))?;
    if args.check {
        let text = toml::to_string(&layered.broker).map_err(|e| CliError::Config(e.to_string()))?;
        print!("{text}");
        return Ok(());
    }
    run(vec![layered], None).await
}

pub async fn dev(args: DevArgs) -> Result<(), CliError> {
    if args.nodes == 0 || args.nodes > DEV_NODES_MAX {
        return Err(CliError::Config(format!(
            "--nodes must be between 1 and {DEV_NODES_MAX}"
        )));
    }
    let client = |i: u32| format!("127.0.0.1:{}", DEV_CLIENT_PORT + i as u16);
    let secure = if args.secure {
        Some(super::secure::ensure_nodes(
            &args.data_dir,
            u64::from(args.nodes),
        )?)
    } else {
        None
    };
    let mut brokers = Vec::new();
    for i in 0..args.nodes {
        let node_id = u64::from(i) + 1;
        let broker_args = BrokerArgs {
            action: None,
            config: None,
            node_id: Some(node_id),
            listen: Some(client(i)),
            admin_listen: Some(format!("127.0.0.1:{}", DEV_ADMIN_PORT + i as u16)),
            data_dir: Some(args.data_dir.join(format!("node-{node_id}"))),
            // Every other broker is a seed: any one of them that is up lets
            // this one in.
            seeds: (0..args.nodes).filter(|j| *j != i).map(client).collect(),
            attrs: Vec::new(),
            cluster_cookie: None,
            bootstrap_expect: None,
            check: false,
        };
        let mut layered: Layered<BrokerConfig> =
            into_broker(config::layer(None, &broker_args)?, &broker_args);
        // One metadata cluster: every broker knows every node id, so all
        // compute the same voters for each vnode (ADR 0081).
        layered.broker.cluster.nodes = (1..=u64::from(args.nodes)).collect();
        // The development cookie, on purpose: nothing to warn of.
        layered.broker.membership.cluster_cookie =
            Some(malachi_actors::DEV_CLUSTER_COOKIE.to_owned());
        if let Some(files) = &secure {
            secure_broker(&mut layered.broker, files, node_id);
        }
        layered
            .broker
            .validate()
            .map_err(|e| CliError::Config(strip_prefix(&e.to_string())))?;
        brokers.push(layered);
    }
    let extra = secure
        .as_ref()
        .map(super::secure::banner)
        .unwrap_or_default();
    run(brokers, Some(extra)).await
}

/// `dev --secure`'s brokers: TLS with the throwaway pair (client
/// certificates verified when sent) on every port, mutual between brokers
/// (ADR 0151), each showing the others a certificate naming its node and
/// requiring theirs to name theirs (ADR 0155), SCRAM logins, `admin` a
/// superuser created at the first start.
fn secure_broker(broker: &mut BrokerConfig, files: &super::secure::SecureFiles, node_id: u64) {
    let (cluster_cert, cluster_key) = files.node_pair(node_id);
    broker.tls = malachi_actors::TlsSettings {
        cert_path: Some(files.broker_cert.clone()),
        key_path: Some(files.broker_key.clone()),
        client_ca_path: Some(files.ca.clone()),
        client_auth: malachi_actors::ClientAuth::Optional,
        cluster: Some(malachi_actors::ClusterTls::Required),
        cluster_ca_path: Some(files.ca.clone()),
        cluster_cert_path: Some(cluster_cert),
        cluster_key_path: Some(cluster_key),
        cluster_node_identity: malachi_actors::NodeIdentity::Required,
        ..malachi_actors::TlsSettings::default()
    };
    let superuser = super::secure::DEV_SUPERUSER;
    broker.security = malachi_actors::SecuritySettings {
        authentication: malachi_actors::Authentication::Scram,
        superusers: vec![format!("User:{superuser}")],
        bootstrap_user: Some(superuser.to_owned()),
        bootstrap_password_file: Some(files.password.clone()),
        ..malachi_actors::SecuritySettings::default()
    };
}

/// The broker's own error already says "invalid configuration: ".
fn strip_prefix(message: &str) -> String {
    message
        .strip_prefix("invalid configuration: ")
        .unwrap_or(message)
        .to_owned()
}

fn dev_banner(nodes: &[(u64, String, String)], data_dir: &Path) -> String {
    let mut out = format!(
        "malachi dev: {} broker{} serving, one cluster\n",
        nodes.len(),
        if nodes.len() == 1 { "" } else { "s" }
    );
    for (node_id, client, admin) in nodes {
        out.push_str(&format!(
            "  node {node_id}  client {client}  admin http://{admin}/\n"
        ));
    }
    // The default replication factor: 3, or every broker when fewer.
    let copies = nodes.len().min(3);
    let quorum = copies / 2 + 1;
    out.push_str(&format!(
        "  data          {0}/node-<id>\n\
         \x20 logs          {0}/dev.log (warnings also here)\n\
         (metadata is shared: any broker creates, lists and describes any topic; a\n\
         \x20topic's records have {copies} cop{1}, a produce is acknowledged once {quorum} hold it)\n\
         try, in another terminal:\n\
         \x20 malachi cluster status\n\
         \x20 malachi topic create demo\n\
         \x20 printf 'k1\\thello\\nk2\\tworld\\n' | malachi produce demo\n\
         \x20 malachi consume demo --from-start\n\
         \x20 malachi tree --all\n\
         stop with Ctrl-C.",
        data_dir.display(),
        if copies == 1 { "y" } else { "ies" }
    ));
    out
}

/// Waits (bounded) until every broker in `handles` sees all of them live;
/// whether they did.
async fn wait_formed(handles: &[(u64, BrokerHandle)], timeout_ms: u64) -> bool {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
    let formed = || {
        handles
            .iter()
            .all(|(_, handle)| handle.membership().view().live().count() >= handles.len())
    };
    while !formed() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    true
}

/// Runs `brokers` until a signal; `dev` is `malachi dev`'s extra banner
/// text (`None`: a lone `malachi broker`, no banner).
async fn run(brokers: Vec<Layered<BrokerConfig>>, dev: Option<String>) -> Result<(), CliError> {
    // Signals are hooked before the brokers start, so a SIGTERM that arrives
    // during start-up still leads to an ordered shutdown.
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| CliError::Broker(format!("cannot handle SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| CliError::Broker(format!("cannot handle SIGINT: {e}")))?;
    let data_root = brokers
        .first()
        .and_then(|b| b.broker.data_dir.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let mut handles = Vec::new();
    let mut serving = Vec::new();
    for layered in brokers {
        let data_dir = layered.broker.data_dir.clone();
        let node_id = layered.broker.node_id;
        // The admin port speaks TLS whenever the broker has a certificate.
        let admin_scheme = if layered.broker.tls.enabled() {
            "https"
        } else {
            "http"
        };
        let handle = match Broker::start(layered.broker).await {
            Ok(handle) => handle,
            Err(e) => {
                for (_, started) in handles.drain(..).rev() {
                    let _ = BrokerHandle::shutdown(started).await;
                }
                return Err(CliError::Broker(e.to_string()));
            }
        };
        if !handle.wait_ready(READY_TIMEOUT_MS).await {
            tracing::warn!(
                node_id,
                timeout_ms = READY_TIMEOUT_MS,
                "broker not ready yet; serving anyway"
            );
        }
        let (client, admin) = (
            handle.client_addr().to_string(),
            handle.admin_addr().to_string(),
        );
        // One stable line on stdout per broker that scripts and tests wait
        // for (with the real ports when port 0 was asked for).
        println!(
            "malachi broker: node {node_id} serving clients on {client}, admin on {admin_scheme}://{admin}/, data in {}",
            data_dir.display()
        );
        tracing::info!(
            node_id,
            client = %client,
            admin = %admin,
            attributes = ?layered.attributes,
            seeds = layered.seeds.len(),
            "broker serving"
        );
        serving.push((node_id, client, admin));
        handles.push((node_id, handle));
    }
    if let Some(extra) = dev {
        // The banner promises each topic its copies: a coordinator places
        // them on the brokers its membership shows live, so a topic created
        // before the brokers see each other got fewer (and a warning).
        if !wait_formed(&handles, FORMED_TIMEOUT_MS).await {
            tracing::warn!(
                brokers = handles.len(),
                timeout_ms = FORMED_TIMEOUT_MS,
                "the brokers do not all see each other yet; a topic created now gets fewer copies"
            );
        }
        println!("{}", dev_banner(&serving, &data_root));
        if !extra.is_empty() {
            println!("{}", extra.trim_end());
        }
    }
    let failed = {
        let stopped = futures::future::select_all(
            handles
                .iter_mut()
                .map(|(_, handle)| Box::pin(handle.stopped())),
        );
        tokio::select! {
            _ = term.recv() => { tracing::info!("sigterm: shutting down"); false }
            _ = int.recv() => { tracing::info!("sigint: shutting down"); false }
            _ = stopped => true,
        }
    };
    if failed {
        for (_, handle) in handles.into_iter().rev() {
            let _ = handle.shutdown().await;
        }
        return Err(CliError::Broker(
            "the supervision tree gave up (restart intensity exceeded); see the log above".into(),
        ));
    }
    for (node_id, handle) in handles.into_iter().rev() {
        handle
            .shutdown()
            .await
            .map_err(|e| CliError::Broker(format!("shutdown: {e}")))?;
        println!("malachi broker: node {node_id} stopped");
    }
    Ok(())
}
