//! The command line's error type: every failure becomes one line on stderr
//! and a non-zero exit code.

use malachi_wire::{ClientError, ErrorCode};

/// What a `malachi` command can fail with. Messages are one line, lowercase,
/// and say what to do where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The configuration (file, environment or flags) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A configuration file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ConfigRead {
        path: String,
        source: std::io::Error,
    },
    /// The broker could not be reached at all.
    #[error(
        "cannot reach a broker at {addr}: {detail} (is one running? start one with `malachi dev`)"
    )]
    Unreachable { addr: String, detail: String },
    /// The broker asked answered, but the broker it pointed to (the host of
    /// the topic's records) could not be reached: the asked one is fine.
    #[error(
        "{action}: the broker at {asked} sent this request to {host}, which cannot be reached: {detail} (is that broker down? `malachi cluster status` shows which brokers are alive)"
    )]
    HostUnreachable {
        action: &'static str,
        asked: String,
        host: String,
        detail: String,
    },
    /// The broker answered with an error, or the exchange failed. An
    /// `outcome_unknown` refusal says so in words: the change may exist.
    #[error("{action}: {source}{}", outcome_note(source))]
    Client {
        action: &'static str,
        source: ClientError,
    },
    /// Input on stdin could not be understood.
    #[error("stdin line {line}: {detail}")]
    Input { line: u64, detail: String },
    /// Reading stdin or writing stdout failed.
    #[error("{action}: {source}")]
    Io {
        action: &'static str,
        source: std::io::Error,
    },
    /// The command exists but what it needs is not built yet.
    #[error("{0}")]
    NotImplemented(&'static str),
    /// The broker failed to start or stopped with an error.
    #[error("broker: {0}")]
    Broker(String),
    /// A benchmark failed.
    #[error("bench: {0}")]
    Bench(String),
    /// `bench scale` could not set up a broker's cgroup (the error names
    /// the path).
    #[error("bench scale: {0}")]
    Cgroup(#[from] super::bench::scale::cgroup::CgroupError),
    /// The client config file cannot be used (the error names it and the key).
    #[error("{0}")]
    ClientFile(#[from] super::client_file::ClientFileError),
    /// A wait for the cluster to settle ran out; the work goes on.
    #[error("{0}")]
    WaitedOut(String),
}

impl CliError {
    /// Wrap a client error, turning connection failures into the
    /// "cannot reach a broker" message a newcomer can act on.
    pub fn client(action: &'static str, addr: &str, source: ClientError) -> CliError {
        match &source {
            ClientError::Connect { addr: to, .. }
            | ClientError::ConnectTimeout { addr: to, .. }
                if !addr.split(',').any(|a| a.trim() == to) =>
            {
                CliError::HostUnreachable {
                    action,
                    asked: addr.to_owned(),
                    host: to.clone(),
                    detail: source.to_string(),
                }
            }
            ClientError::Connect { .. }
            | ClientError::ConnectTimeout { .. }
            | ClientError::Unreachable { .. }
            | ClientError::NoAddress => CliError::Unreachable {
                addr: addr.to_owned(),
                detail: source.to_string(),
            },
            _ => CliError::Client { action, source },
        }
    }
}

/// What the command line adds to a broker's refusal whose code needs
/// explaining: `outcome_unknown` is not a refusal, the change may exist.
fn outcome_note(source: &ClientError) -> &'static str {
    match source.code() {
        Some(ErrorCode::OutcomeUnknown) => {
            " (the change may or may not have been applied: check with `malachi topic describe` or `malachi vnode list` before retrying)"
        }
        _ => "",
    }
}

impl From<malachi_bench::BenchError> for CliError {
    fn from(e: malachi_bench::BenchError) -> CliError {
        CliError::Bench(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: ErrorCode, message: &str) -> CliError {
        CliError::Client {
            action: "create topic orders",
            source: ClientError::Server {
                api: "create_topic",
                code,
                message: message.to_owned(),
                leader_hint: None,
                retry_after_ms: Some(10),
            },
        }
    }

    #[test]
    fn an_unknown_outcome_says_the_change_may_or_may_not_have_been_applied() {
        let line = refused(
            ErrorCode::OutcomeUnknown,
            "metadata change outcome unknown: vnode 3: the proposal timed out",
        )
        .to_string();
        assert!(
            line.starts_with("create topic orders: broker refused create_topic: outcome_unknown:")
        );
        assert!(line.contains("may or may not have been applied"), "{line}");
    }

    #[test]
    fn an_unreachable_host_does_not_blame_the_broker_asked_nor_suggest_dev() {
        let source = ClientError::Connect {
            addr: "127.0.0.1:4041".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let line = CliError::client("produce", "127.0.0.1:4040", source).to_string();
        assert!(
            line.contains("sent this request to 127.0.0.1:4041"),
            "{line}"
        );
        assert!(!line.contains("malachi dev"), "{line}");
        let source = ClientError::Connect {
            addr: "127.0.0.1:4040".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let line = CliError::client("produce", "127.0.0.1:4040", source).to_string();
        assert!(
            line.contains("cannot reach a broker at 127.0.0.1:4040"),
            "{line}"
        );
    }

    #[test]
    fn every_dead_bootstrap_broker_is_named_with_the_hint() {
        let refused = |addr: &str| ClientError::Connect {
            addr: addr.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let source = ClientError::Unreachable {
            tried: vec![
                ("127.0.0.1:1".into(), refused("127.0.0.1:1")),
                ("127.0.0.1:2".into(), refused("127.0.0.1:2")),
            ],
        };
        let line = CliError::client("connect", "127.0.0.1:1,127.0.0.1:2", source).to_string();
        insta::assert_snapshot!(line, @"cannot reach a broker at 127.0.0.1:1,127.0.0.1:2: no bootstrap broker could be reached: cannot connect to 127.0.0.1:1: connection refused; cannot connect to 127.0.0.1:2: connection refused (is one running? start one with `malachi dev`)");
    }

    #[test]
    fn a_refusal_is_not_told_it_may_have_been_applied() {
        let line = refused(ErrorCode::TopicExists, "topic orders exists").to_string();
        assert!(!line.contains("may or may not"), "{line}");
    }
}
