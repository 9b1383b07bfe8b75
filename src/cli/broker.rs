//! `malachi broker` and `malachi dev`: run a broker in the foreground until
//! SIGINT or SIGTERM, then shut it down in order.

use super::config::{self, Layered};
use super::error::CliError;
use super::{BrokerArgs, DevArgs};

/// Brokers `malachi dev` can run today: multi-broker clusters need membership.
pub const DEV_NODES_SUPPORTED: u32 = 1;

type BrokerConfig = BrokerConfigStandIn;

/// Until `malachi-actors` lands, the command line validates against this
/// stand-in of its configuration type.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfigStandIn {
    pub node_id: u64,
    pub listen_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub data_dir: std::path::PathBuf,
}

impl Default for BrokerConfigStandIn {
    fn default() -> Self {
        BrokerConfigStandIn {
            node_id: 1,
            listen_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 4040)),
            admin_addr: std::net::SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: "malachi-data".into(),
        }
    }
}

pub async fn broker(args: BrokerArgs) -> Result<(), CliError> {
    let layered: Layered<BrokerConfig> = config::load(&args)?;
    if args.check {
        let text = toml::to_string(&layered.broker).map_err(|e| CliError::Config(e.to_string()))?;
        print!("{text}");
        return Ok(());
    }
    run(layered, None).await
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
        admin_listen: Some(config_admin_default().to_owned()),
        data_dir: Some(args.data_dir.join("node-1")),
        seeds: Vec::new(),
        attrs: Vec::new(),
        check: false,
    };
    let layered: Layered<BrokerConfig> = config::layer(None, &broker_args)?;
    run(layered, Some(DevBanner)).await
}

fn config_admin_default() -> &'static str {
    "127.0.0.1:8080"
}

/// `malachi dev` prints where things are and how to use them once serving.
#[derive(Debug, Clone, Copy)]
struct DevBanner;

fn dev_banner(client: &str, admin: &str, data_dir: &std::path::Path) -> String {
    format!(
        "malachi dev: 1 broker serving\n\
         \x20 client port   {client}\n\
         \x20 admin (HTTP)  http://{admin}/  (health, metrics, supervision tree)\n\
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

async fn run(layered: Layered<BrokerConfig>, banner: Option<DevBanner>) -> Result<(), CliError> {
    if !layered.seeds.is_empty() {
        eprintln!(
            "malachi broker: --seed is accepted but not used yet: cluster membership arrives with a later issue; this broker runs alone"
        );
    }
    let _ = (
        banner,
        dev_banner(
            &layered.broker.listen_addr.to_string(),
            &layered.broker.admin_addr.to_string(),
            &layered.broker.data_dir,
        ),
    );
    Err(CliError::NotImplemented(
        "the broker is not in this build yet (malachi-actors)",
    ))
}
