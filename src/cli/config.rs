//! The broker's configuration, layered from lowest to highest precedence: one
//! TOML file, `MALACHI_*` environment variables, then flags (decisions §10).
//!
//! clap reads each flag's environment variable when the flag is absent, so
//! "flags over environment" is clap's part; this module lays the result over
//! the file's table and deserializes the whole into the broker's own
//! configuration type, which refuses unknown keys. The file may set every
//! field of that type (`malachi broker --check` prints them all); `seeds` and
//! `attributes` are the command line's own keys until membership takes them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;

use super::BrokerArgs;
use super::error::CliError;

/// The default data directory, relative to the working directory (cli.md).
pub const DATA_DIR_DEFAULT: &str = "malachi-data";
/// Seeds a broker may be given: a bound on what a config can ask for.
pub const SEEDS_MAX: usize = 64;
/// Attributes a broker may carry (the wire's cluster status carries them all).
pub const ATTRIBUTES_MAX: usize = 32;
/// The largest config file read, in bytes.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// A layered configuration: the broker's own type plus the command line's keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Layered<T> {
    pub broker: T,
    /// Brokers whose SWIM addresses lead to the cluster, to form it or join it (ADR 0102).
    pub seeds: Vec<String>,
    /// Operator-given attributes (zone, rack, ...) for placement.
    pub attributes: BTreeMap<String, String>,
}

/// Read the file named by `--config` (if any) and layer `args` over it.
pub fn load<T: DeserializeOwned>(args: &BrokerArgs) -> Result<Layered<T>, CliError> {
    let text = match &args.config {
        Some(path) => Some(read_file(path)?),
        None => None,
    };
    layer(text.as_deref(), args)
}

/// Layer `args` over `file_text` (TOML) and deserialize.
pub fn layer<T: DeserializeOwned>(
    file_text: Option<&str>,
    args: &BrokerArgs,
) -> Result<Layered<T>, CliError> {
    let mut table: toml::Table = match file_text {
        Some(text) => {
            toml::from_str(text).map_err(|e| CliError::Config(one_line(&e.to_string())))?
        }
        None => toml::Table::new(),
    };
    let mut seeds = match table.remove("seeds") {
        None => Vec::new(),
        Some(value) => value.try_into::<Vec<String>>().map_err(|_| {
            CliError::Config("seeds must be a list of \"host:port\" strings".into())
        })?,
    };
    let mut attributes = match table.remove("attributes") {
        None => BTreeMap::new(),
        Some(value) => value
            .try_into::<BTreeMap<String, String>>()
            .map_err(|_| CliError::Config("attributes must be a table of string values".into()))?,
    };
    if let Some(node_id) = args.node_id {
        let node_id = i64::try_from(node_id)
            .map_err(|_| CliError::Config(format!("node_id {node_id} is too large")))?;
        table.insert("node_id".into(), toml::Value::Integer(node_id));
    }
    if let Some(listen) = &args.listen {
        check_host_port("--listen", listen)?;
        table.insert("listen_addr".into(), toml::Value::String(listen.clone()));
    }
    if let Some(admin) = &args.admin_listen {
        check_host_port("--admin-listen", admin)?;
        table.insert("admin_addr".into(), toml::Value::String(admin.clone()));
    }
    if let Some(dir) = &args.data_dir {
        let dir = dir.to_str().ok_or_else(|| {
            CliError::Config(format!("data_dir {} is not valid UTF-8", dir.display()))
        })?;
        table.insert("data_dir".into(), toml::Value::String(dir.to_owned()));
    } else if !table.contains_key("data_dir") {
        table.insert(
            "data_dir".into(),
            toml::Value::String(DATA_DIR_DEFAULT.to_owned()),
        );
    }
    if !args.seeds.is_empty() {
        seeds = args.seeds.clone();
    }
    for attr in &args.attrs {
        let (key, value) = parse_attr(attr)?;
        attributes.insert(key, value);
    }
    if seeds.len() > SEEDS_MAX {
        return Err(CliError::Config(format!(
            "{} seeds given, at most {SEEDS_MAX} allowed",
            seeds.len()
        )));
    }
    for seed in &seeds {
        check_host_port("seed", seed)?;
    }
    if attributes.len() > ATTRIBUTES_MAX {
        return Err(CliError::Config(format!(
            "{} attributes given, at most {ATTRIBUTES_MAX} allowed",
            attributes.len()
        )));
    }
    for key in attributes.keys() {
        check_attr_key(key)?;
    }
    let broker = T::deserialize(toml::Value::Table(table))
        .map_err(|e| CliError::Config(one_line(&e.to_string())))?;
    Ok(Layered {
        broker,
        seeds,
        attributes,
    })
}

fn read_file(path: &Path) -> Result<String, CliError> {
    let io = |source| CliError::ConfigRead {
        path: path.display().to_string(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > CONFIG_FILE_BYTES_MAX {
        return Err(CliError::Config(format!(
            "{} is {len} bytes, more than the {CONFIG_FILE_BYTES_MAX} a config file may have",
            path.display()
        )));
    }
    std::fs::read_to_string(path).map_err(io)
}

/// TOML errors span several lines (a caret under the culprit); keep one.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('|')
                && !l.starts_with('^')
                && !l.chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect::<Vec<_>>()
        .join(": ")
}

/// `KEY=VALUE` into its halves.
pub fn parse_attr(attr: &str) -> Result<(String, String), CliError> {
    let (key, value) = attr
        .split_once('=')
        .ok_or_else(|| CliError::Config(format!("attribute {attr:?} is not KEY=VALUE")))?;
    check_attr_key(key)?;
    Ok((key.to_owned(), value.to_owned()))
}

fn check_attr_key(key: &str) -> Result<(), CliError> {
    let valid = !key.is_empty()
        && key.len() <= 64
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        Ok(())
    } else {
        Err(CliError::Config(format!(
            "attribute key {key:?} must be 1 to 64 letters, digits, '_', '-' or '.'"
        )))
    }
}

fn check_host_port(field: &str, value: &str) -> Result<(), CliError> {
    let valid = value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if valid {
        Ok(())
    } else {
        Err(CliError::Config(format!(
            "{field} {value:?} is not host:port (for example 127.0.0.1:4040)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::net::SocketAddr;
    use std::path::PathBuf;

    /// The shape of the broker's configuration: the same key names and the
    /// same refusal of unknown keys.
    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Shape {
        node_id: u64,
        listen_addr: SocketAddr,
        admin_addr: SocketAddr,
        data_dir: PathBuf,
        segment_bytes_max: u64,
    }

    impl Default for Shape {
        fn default() -> Shape {
            Shape {
                node_id: 1,
                listen_addr: SocketAddr::from(([127, 0, 0, 1], 4040)),
                admin_addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
                data_dir: PathBuf::from("data"),
                segment_bytes_max: 1,
            }
        }
    }

    fn args(flags: &[&str]) -> BrokerArgs {
        let mut argv = vec!["malachi", "broker"];
        argv.extend_from_slice(flags);
        match super::super::Cli::try_parse_from(argv).unwrap().command {
            super::super::Command::Broker(args) => args,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn with_nothing_given_the_data_dir_is_malachi_data() {
        let layered: Layered<Shape> = layer(None, &args(&[])).unwrap();
        assert_eq!(layered.broker.data_dir, PathBuf::from("malachi-data"));
        assert_eq!(layered.broker.listen_addr.to_string(), "127.0.0.1:4040");
    }

    #[test]
    fn flags_override_the_file_and_the_file_fills_the_rest() {
        let file = "node_id = 7\nlisten_addr = \"127.0.0.1:5000\"\ndata_dir = \"/tmp/a\"\nsegment_bytes_max = 9\n";
        let layered: Layered<Shape> =
            layer(Some(file), &args(&["--listen", "127.0.0.1:6000"])).unwrap();
        assert_eq!(layered.broker.node_id, 7);
        assert_eq!(layered.broker.listen_addr.to_string(), "127.0.0.1:6000");
        assert_eq!(layered.broker.data_dir, PathBuf::from("/tmp/a"));
        assert_eq!(layered.broker.segment_bytes_max, 9);
    }

    #[test]
    fn seeds_and_attributes_come_from_the_file_and_repeated_flags() {
        let file = "seeds = [\"10.0.0.9:4040\"]\n[attributes]\nzone = \"b\"\nrack = \"r0\"\n";
        let layered: Layered<Shape> = layer(
            Some(file),
            &args(&[
                "--seed",
                "10.0.0.1:4040",
                "--seed",
                "10.0.0.2:4040",
                "--attr",
                "zone=a",
            ]),
        )
        .unwrap();
        assert_eq!(layered.seeds, vec!["10.0.0.1:4040", "10.0.0.2:4040"]);
        assert_eq!(
            layered.attributes.get("zone").map(String::as_str),
            Some("a")
        );
        assert_eq!(
            layered.attributes.get("rack").map(String::as_str),
            Some("r0")
        );
    }

    #[test]
    fn an_unknown_file_key_is_refused_on_one_line_with_its_name() {
        let err = layer::<Shape>(Some("lisen = \"x:1\"\n"), &args(&[])).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("lisen"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn a_file_that_is_not_toml_is_refused_on_one_line() {
        let err = layer::<Shape>(Some("node_id = = 3\n"), &args(&[])).unwrap_err();
        assert!(
            err.to_string().starts_with("invalid configuration"),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    #[test]
    fn a_listen_address_without_port_is_refused() {
        let err = layer::<Shape>(None, &args(&["--listen", "localhost"])).unwrap_err();
        assert!(err.to_string().contains("host:port"), "{err}");
    }

    #[test]
    fn an_attribute_without_equals_is_refused() {
        let err = layer::<Shape>(None, &args(&["--attr", "zone"])).unwrap_err();
        assert!(err.to_string().contains("KEY=VALUE"), "{err}");
    }

    #[test]
    fn a_bad_seed_is_refused() {
        let err = layer::<Shape>(None, &args(&["--seed", "nowhere"])).unwrap_err();
        assert!(err.to_string().contains("seed"), "{err}");
    }
}
