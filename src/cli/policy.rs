//! `malachi policy create|list|describe|delete`: storage policies (issue
//! 21, ADR 0115), kept in the cluster's ring group. Each is one request on
//! the client port (api keys 25 to 27) to any broker.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use malachi_wire::messages::{PolicyDescription, PolicyReshape};
use serde_json::json;

use super::OutputArgs;
use super::bench::number_and_unit;
use super::client::{connect, print_json, print_text};
use super::error::CliError;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Define a storage policy, or redefine one (topics naming it follow).
    Create(PolicyCreateArgs),
    /// List the cluster's storage policies.
    List(OutputArgs),
    /// Show one storage policy.
    Describe(PolicyNameArgs),
    /// Remove a policy definition. Topics naming it keep the name, and all
    /// of their data, until it is defined again.
    Delete(PolicyNameArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Retention deletes a topic's sealed segments oldest first along each range's \
    history; active\nsegments are never deleted. Unset bounds keep data for ever.\n\
    Example: malachi policy create week --retention-age 7d --retention-bytes 50GiB"
)]
pub struct PolicyCreateArgs {
    /// The policy's name (what `topic create --policy` names).
    pub name: String,
    /// Delete a sealed segment once it has been sealed this long (500ms, 30s, 15m, 12h, 7d).
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    pub retention_age: Option<u64>,
    /// Delete the oldest sealed segments while a topic's sealed bytes exceed this (512MiB, 10GiB, 1TB).
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub retention_bytes: Option<u64>,
    /// A placement constraint over broker attributes; repeat for more.
    #[arg(long, value_name = "EXPR")]
    pub placement: Vec<String>,
    #[command(flatten)]
    pub reshape: ReshapeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Automatic reshaping's settings for the policy's topics (ADR 0143);
/// each unset one keeps the brokers' `[reshape]` default.
#[derive(Debug, Args, Default)]
pub struct ReshapeArgs {
    /// Whether the policy's topics split and merge themselves (true or false).
    #[arg(long, value_name = "BOOL")]
    pub auto_reshape: Option<bool>,
    /// Split a range written faster than this per second (4MiB) ...
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub split_write_rate: Option<u64>,
    /// ... for this long (10s).
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    pub split_after: Option<u64>,
    /// Merge two buddies both written slower than this per second (256KiB) ...
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub merge_write_rate: Option<u64>,
    /// ... for this long (5m).
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    pub merge_after: Option<u64>,
    /// No split this soon after a merge or a refusal, no merge after a split (20s).
    #[arg(long, value_parser = parse_age, value_name = "DURATION")]
    pub reshape_interval: Option<u64>,
    /// Never merge below this many active ranges (1).
    #[arg(long, value_name = "N")]
    pub ranges_min: Option<u32>,
    /// Never split above this many active ranges (64).
    #[arg(long, value_name = "N")]
    pub ranges_max: Option<u32>,
}

impl ReshapeArgs {
    /// The wire's form; `None` when no flag was given.
    pub(crate) fn to_wire(&self) -> Option<PolicyReshape> {
        let reshape = PolicyReshape {
            auto_reshape: self.auto_reshape,
            split_write_bytes_per_second: self.split_write_rate,
            split_after_ms: self.split_after,
            merge_write_bytes_per_second: self.merge_write_rate,
            merge_after_ms: self.merge_after,
            reshape_interval_ms: self.reshape_interval,
            ranges_min: self.ranges_min,
            ranges_max: self.ranges_max,
        };
        (reshape != PolicyReshape::default()).then_some(reshape)
    }
}

#[derive(Debug, Args)]
pub struct PolicyNameArgs {
    /// The policy's name.
    pub name: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Parses `500ms`, `30s`, `15m`, `12h`, `7d` (a bare number is seconds)
/// into milliseconds; 0 is refused (it would delete every sealed segment).
pub fn parse_age(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (n, unit) = number_and_unit(text)
        .ok_or_else(|| format!("{text:?} is not a duration like 30s, 12h or 7d"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use ms, s, m, h or d"
            ));
        }
    };
    let ms = n
        .checked_mul(unit_ms)
        .ok_or_else(|| format!("{text:?} is too long"))?;
    if ms == 0 {
        return Err(
            "a retention age of 0 would delete every sealed segment; leave it unset to keep data"
                .into(),
        );
    }
    Ok(ms)
}

/// Parses `4096`, `512KiB`, `10GiB`, `1TB` (binary `KiB`..`TiB`, decimal
/// `KB`..`TB`, `B`) into bytes; 0 is refused.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (n, unit) = number_and_unit(text)
        .ok_or_else(|| format!("{text:?} is not a size like 512MiB or 10GB"))?;
    let unit_bytes: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
            ));
        }
    };
    let bytes = n
        .checked_mul(unit_bytes)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err(
            "a retention size of 0 would delete every sealed segment; leave it unset to keep data"
                .into(),
        );
    }
    Ok(bytes)
}

pub async fn policy(command: PolicyCommand) -> Result<(), CliError> {
    match command {
        PolicyCommand::Create(args) => {
            let client = connect(&args.output).await?;
            let response = client
                .put_policy(PolicyDescription {
                    name: args.name,
                    retention_age_ms: args.retention_age,
                    retention_bytes: args.retention_bytes,
                    placement: args.placement,
                    reshape: args.reshape.to_wire(),
                })
                .await
                .map_err(|e| CliError::client("policy create", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&json!({"policy": response.name}))
            } else {
                print_text(&format!("policy {} defined\n", response.name))
            }
        }
        PolicyCommand::List(output) => {
            let client = connect(&output).await?;
            let listing = client
                .list_policies(None)
                .await
                .map_err(|e| CliError::client("policy list", &output.broker_label(), e))?;
            if output.json {
                listing.policies.iter().try_for_each(print_json)
            } else {
                print_text(&render(&listing.policies))
            }
        }
        PolicyCommand::Describe(args) => {
            let client = connect(&args.output).await?;
            let listing = client
                .list_policies(Some(&args.name))
                .await
                .map_err(|e| CliError::client("policy describe", &args.output.broker_label(), e))?;
            if args.output.json {
                listing.policies.iter().try_for_each(print_json)
            } else {
                print_text(&render(&listing.policies))
            }
        }
        PolicyCommand::Delete(args) => {
            let client = connect(&args.output).await?;
            let response = client
                .delete_policy(&args.name)
                .await
                .map_err(|e| CliError::client("policy delete", &args.output.broker_label(), e))?;
            if args.output.json {
                print_json(&json!({"deleted": response.name}))
            } else {
                print_text(&format!("deleted policy {}\n", response.name))
            }
        }
    }
}

/// A millisecond count in the largest unit that divides it.
fn age(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// One line a policy: its name, retention and placement.
fn render(policies: &[PolicyDescription]) -> String {
    let mut out = String::new();
    if policies.is_empty() {
        out.push_str("no policies\n");
    }
    for p in policies {
        let retention_age = p.retention_age_ms.map_or_else(|| "-".to_owned(), age);
        let retention_bytes = p
            .retention_bytes
            .map_or_else(|| "-".to_owned(), |b| b.to_string());
        let placement = if p.placement.is_empty() {
            "-".to_owned()
        } else {
            p.placement.join("; ")
        };
        let _ = write!(
            out,
            "{}  retention_age={retention_age}  retention_bytes={retention_bytes}  placement={placement}",
            p.name
        );
        if let Some(r) = &p.reshape {
            reshape_fields(&mut out, r);
        }
        out.push('\n');
    }
    out
}

/// The reshaping settings a policy sets, `name=value` each.
fn reshape_fields(out: &mut String, r: &PolicyReshape) {
    let durations = [
        ("split_after", r.split_after_ms),
        ("merge_after", r.merge_after_ms),
        ("reshape_interval", r.reshape_interval_ms),
    ];
    let counts = [
        (
            "split_write_bytes_per_second",
            r.split_write_bytes_per_second,
        ),
        (
            "merge_write_bytes_per_second",
            r.merge_write_bytes_per_second,
        ),
        ("ranges_min", r.ranges_min.map(u64::from)),
        ("ranges_max", r.ranges_max.map(u64::from)),
    ];
    if let Some(on) = r.auto_reshape {
        let _ = write!(out, "  auto_reshape={on}");
    }
    for (name, value) in counts {
        if let Some(v) = value {
            let _ = write!(out, "  {name}={v}");
        }
    }
    for (name, value) in durations {
        if let Some(v) = value {
            let _ = write!(out, "  {name}={}", age(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_sizes_parse_with_their_units_and_refuse_zero_and_garbage() {
        assert_eq!(parse_age("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_age("90"), Ok(90_000));
        assert_eq!(parse_age("500ms"), Ok(500));
        assert!(parse_age("0s").is_err());
        assert!(parse_age("3w").is_err());
        assert!(parse_age("99999999999999999d").is_err());
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("5 bananas").is_err());
    }

    #[test]
    fn policies_render_one_a_line() {
        let text = render(&[
            PolicyDescription {
                name: "week".into(),
                retention_age_ms: Some(7 * 86_400_000),
                retention_bytes: Some(50 << 30),
                placement: vec!["distinct(zone) >= 2".into()],
                reshape: None,
            },
            PolicyDescription {
                name: "forever".into(),
                retention_age_ms: None,
                retention_bytes: None,
                placement: Vec::new(),
                reshape: None,
            },
            PolicyDescription {
                name: "elastic".into(),
                retention_age_ms: None,
                retention_bytes: None,
                placement: Vec::new(),
                reshape: Some(PolicyReshape {
                    auto_reshape: Some(true),
                    split_write_bytes_per_second: Some(4 << 20),
                    split_after_ms: Some(30_000),
                    ranges_max: Some(16),
                    ..PolicyReshape::default()
                }),
            },
        ]);
        insta::assert_snapshot!(text);
        assert_eq!(render(&[]), "no policies\n");
    }
}
