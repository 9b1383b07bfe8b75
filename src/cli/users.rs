//! `malachi user create|delete|list|passwd|unlock` and `malachi acl
//! add|remove|list` (ADR 0150): users and ACL entries, kept in the
//! cluster's ring group, through any broker (api keys 403 to 409).
//!
//! A new password is read from a file and turned into its SCRAM credential
//! here (PBKDF2, on the blocking pool): the password itself never leaves
//! this process.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use malachi_wire::Operation as WireOperation;
use malachi_wire::auth_admin::{
    AclEntryText, AddAclRequest, DeleteUserRequest, ListAclsRequest, ListUsersRequest,
    PutUserRequest, RemoveAclRequest, UnlockUserRequest, UserSummary,
};
use serde_json::json;

use super::OutputArgs;
use super::client::{connect, print_json, print_text, read_password_file};
use super::error::CliError;

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user with the password in --password-of-user's file.
    Create(UserPasswordArgs),
    /// Delete a user (its ACL entries stay, as Kafka's do).
    Delete(UserNameArgs),
    /// List the users (never their credentials).
    List(OutputArgs),
    /// Set a user's password: your own, or any user's with cluster alter.
    Passwd(UserPasswordArgs),
    /// Clear a user's lockout on every address.
    Unlock(UserNameArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "The password is the first line of the file; the CLI derives its SCRAM-SHA-256 credential\n(salt, iterations, keys) and sends only that. Log in with --user and --password-file.\nExample: malachi user create alice --new-password-file alice.pw --user admin --password-file admin.pw"
)]
pub struct UserPasswordArgs {
    /// The user's name (letters, digits, `.`, `_`, `-`, `@`).
    pub name: String,
    /// A file whose first line is the user's new password.
    #[arg(long, value_name = "FILE")]
    pub new_password_file: PathBuf,
    /// PBKDF2 iterations (the brokers' `security.scram_iterations`, 32768 by default).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u32>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct UserNameArgs {
    /// The user's name.
    pub name: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Add an entry: allow (or, with --deny, deny) an operation.
    Add(AclArgs),
    /// Remove an entry (the same flags that added it).
    Remove(AclArgs),
    /// List the entries, or one principal's.
    List(AclListArgs),
}

/// An operation an entry allows or denies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AclOperation {
    Produce,
    Consume,
    Create,
    Delete,
    Describe,
    Alter,
    Admin,
}

impl AclOperation {
    fn name(self) -> &'static str {
        match self {
            AclOperation::Produce => "produce",
            AclOperation::Consume => "consume",
            AclOperation::Create => "create",
            AclOperation::Delete => "delete",
            AclOperation::Describe => "describe",
            AclOperation::Alter => "alter",
            AclOperation::Admin => "admin",
        }
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "With authentication on, everything not allowed is denied, and a deny beats an allow.\nA literal name matches only itself; --prefixed matches names starting with it.\nAn allow of produce, consume, delete or alter implies describe.\nExample: malachi acl add --principal User:alice --topic orders --operation produce"
)]
pub struct AclArgs {
    /// `User:<name>`, or `User:*` for every user.
    #[arg(long, value_name = "PRINCIPAL")]
    pub principal: String,
    /// The topic (or, with --prefixed, the topic name prefix).
    #[arg(long, value_name = "NAME", group = "resource")]
    pub topic: Option<String>,
    /// The consumer group (or, with --prefixed, the prefix).
    #[arg(long, value_name = "NAME", group = "resource")]
    pub group: Option<String>,
    /// The cluster itself (members, vnodes, policies, features, users, ACLs).
    #[arg(long, group = "resource")]
    pub cluster: bool,
    /// Match names starting with --topic's or --group's value.
    #[arg(long)]
    pub prefixed: bool,
    /// The operation.
    #[arg(long, value_enum)]
    pub operation: AclOperation,
    /// A deny entry instead of an allow.
    #[arg(long)]
    pub deny: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl AclArgs {
    fn entry(&self) -> Result<AclEntryText, CliError> {
        let pattern = if self.prefixed { "prefixed" } else { "literal" };
        let (resource, pattern, name) = match (&self.topic, &self.group, self.cluster) {
            (Some(topic), None, false) => ("topic", pattern, topic.clone()),
            (None, Some(group), false) => ("group", pattern, group.clone()),
            (None, None, true) if !self.prefixed => ("cluster", "", String::new()),
            (None, None, true) => {
                return Err(CliError::Config(
                    "--prefixed needs --topic or --group".into(),
                ));
            }
            _ => {
                return Err(CliError::Config(
                    "name one resource: --topic, --group or --cluster".into(),
                ));
            }
        };
        Ok(AclEntryText {
            principal: self.principal.clone(),
            resource: resource.to_owned(),
            pattern: pattern.to_owned(),
            name,
            operation: self.operation.name().to_owned(),
            permission: if self.deny { "deny" } else { "allow" }.to_owned(),
        })
    }
}

#[derive(Debug, Args)]
pub struct AclListArgs {
    /// Only this principal's entries (`User:<name>` or `User:*`).
    #[arg(long, value_name = "PRINCIPAL")]
    pub principal: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

async fn call<O: WireOperation>(
    output: &OutputArgs,
    action: &'static str,
    request: &O,
) -> Result<O::Response, CliError> {
    let client = connect(output).await?;
    client
        .call(None, request)
        .await
        .map_err(|e| CliError::client(action, &output.broker_label(), e))
}

/// `put_user` with the credential of the password in `args`' file.
async fn put_user(args: &UserPasswordArgs, replace: bool) -> Result<(), CliError> {
    let password = read_password_file(&args.new_password_file)?;
    let iterations = args.iterations;
    let credential = tokio::task::spawn_blocking(move || {
        malachi_actors::scram_login::derive_credential(&password, iterations)
    })
    .await
    .map_err(|e| CliError::Config(format!("deriving the credential failed: {e}")))?
    .map_err(CliError::Config)?;
    let action = if replace {
        "user passwd"
    } else {
        "user create"
    };
    let request = PutUserRequest {
        name: args.name.clone(),
        credential,
        replace,
    };
    let response = call(&args.output, action, &request).await?;
    if args.output.json {
        print_json(&json!({"user": response.name, "changed": response.changed}))
    } else if replace {
        print_text(&format!("password of {} set\n", response.name))
    } else {
        print_text(&format!("user {} created\n", response.name))
    }
}

pub async fn user(command: UserCommand) -> Result<(), CliError> {
    match command {
        UserCommand::Create(args) => put_user(&args, false).await,
        UserCommand::Passwd(args) => put_user(&args, true).await,
        UserCommand::Delete(args) => {
            let request = DeleteUserRequest { name: args.name };
            let response = call(&args.output, "user delete", &request).await?;
            if args.output.json {
                print_json(&json!({"deleted": response.name}))
            } else {
                print_text(&format!("deleted user {}\n", response.name))
            }
        }
        UserCommand::Unlock(args) => {
            let request = UnlockUserRequest { name: args.name };
            let response = call(&args.output, "user unlock", &request).await?;
            if args.output.json {
                print_json(&json!({"unlocked": response.name}))
            } else {
                print_text(&format!("unlocked user {}\n", response.name))
            }
        }
        UserCommand::List(output) => {
            let response = call(&output, "user list", &ListUsersRequest {}).await?;
            if output.json {
                response.users.iter().try_for_each(|u| {
                    print_json(&json!({
                        "user": u.name,
                        "iterations": u.iterations,
                        "created_at_ms": u.created_at_ms,
                        "updated_at_ms": u.updated_at_ms,
                        "locked_sources": u.locked_sources,
                    }))
                })
            } else {
                print_text(&render_users(&response.users))
            }
        }
    }
}

pub async fn acl(command: AclCommand) -> Result<(), CliError> {
    match command {
        AclCommand::Add(args) => {
            let request = AddAclRequest {
                entry: args.entry()?,
            };
            let response = call(&args.output, "acl add", &request).await?;
            let line = render_entry(&request.entry);
            if args.output.json {
                print_json(&json!({"added": line, "changed": response.changed}))
            } else if response.changed {
                print_text(&format!("added {line}\n"))
            } else {
                print_text(&format!("already there: {line}\n"))
            }
        }
        AclCommand::Remove(args) => {
            let request = RemoveAclRequest {
                entry: args.entry()?,
            };
            call(&args.output, "acl remove", &request).await?;
            let line = render_entry(&request.entry);
            if args.output.json {
                print_json(&json!({"removed": line}))
            } else {
                print_text(&format!("removed {line}\n"))
            }
        }
        AclCommand::List(args) => {
            let request = ListAclsRequest {
                principal: args.principal,
            };
            let response = call(&args.output, "acl list", &request).await?;
            if args.output.json {
                response.entries.iter().try_for_each(|e| {
                    print_json(&json!({
                        "principal": e.principal,
                        "permission": e.permission,
                        "operation": e.operation,
                        "resource": e.resource,
                        "pattern": e.pattern,
                        "name": e.name,
                    }))
                })
            } else {
                print_text(&render_entries(&response.entries))
            }
        }
    }
}

/// `allow User:alice produce topic orders` (`topic prefix ord` for a prefix).
fn render_entry(e: &AclEntryText) -> String {
    let resource = match e.pattern.as_str() {
        "prefixed" => format!("{} prefix {}", e.resource, e.name),
        "" => e.resource.clone(),
        _ => format!("{} {}", e.resource, e.name),
    };
    format!(
        "{} {} {} {resource}",
        e.permission, e.principal, e.operation
    )
}

fn render_entries(entries: &[AclEntryText]) -> String {
    if entries.is_empty() {
        return "no acl entries\n".into();
    }
    entries
        .iter()
        .map(|e| format!("{}\n", render_entry(e)))
        .collect()
}

fn render_users(users: &[UserSummary]) -> String {
    let mut out = String::new();
    if users.is_empty() {
        out.push_str("no users\n");
    }
    for u in users {
        let _ = writeln!(
            out,
            "{}  iterations={}  created_at_ms={}  updated_at_ms={}  locked_sources={}",
            u.name, u.iterations, u.created_at_ms, u.updated_at_ms, u.locked_sources
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(permission: &str, resource: &str, pattern: &str, name: &str) -> AclEntryText {
        AclEntryText {
            principal: "User:alice".into(),
            resource: resource.into(),
            pattern: pattern.into(),
            name: name.into(),
            operation: "produce".into(),
            permission: permission.into(),
        }
    }

    #[test]
    fn entries_and_users_render_one_a_line() {
        let text = render_entries(&[
            entry("allow", "topic", "literal", "orders"),
            entry("deny", "topic", "prefixed", "ord"),
            entry("allow", "cluster", "", ""),
        ]);
        insta::assert_snapshot!(text);
        assert_eq!(render_entries(&[]), "no acl entries\n");
        let users = render_users(&[UserSummary {
            name: "alice".into(),
            iterations: 32_768,
            created_at_ms: 1_000,
            updated_at_ms: 2_000,
            locked_sources: 0,
        }]);
        insta::assert_snapshot!(users);
        assert_eq!(render_users(&[]), "no users\n");
    }
}
