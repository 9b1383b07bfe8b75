//! `malachi token create` and `malachi token key add|remove|list` (ADR
//! 0152): bearer tokens (JWT) and the issuer's public keys the brokers
//! verify them under, kept in the cluster's ring group (api keys 410 to
//! 412). A client logs in with a token through `--token-file`
//! (`MALACHI_TOKEN_FILE`) and api key 402.
//!
//! `token create` signs locally with a private key file: for operators
//! and tests. A production issuer (an identity provider) mints its own
//! tokens; the brokers need only its public keys.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use malachi_core::auth::token::{self, MintRequest, TOKEN_BYTES_MAX, TokenAlgorithm};
use malachi_wire::Operation as WireOperation;
use malachi_wire::token_keys::{
    DeleteTokenKeyRequest, ListTokenKeysRequest, PutTokenKeyRequest, TokenKeyText,
};
use serde_json::json;

use super::OutputArgs;
use super::client::{connect, print_json, print_text};
use super::error::CliError;

/// The largest key file read, in bytes.
const KEY_FILE_BYTES_MAX: u64 = 16 * 1024;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Mint a token for a principal, signed with a private key file.
    Create(TokenCreateArgs),
    /// The issuer's public keys the brokers verify tokens under.
    #[command(subcommand)]
    Key(TokenKeyCommand),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Prints the token (a JWT) on stdout. Its header names --kid; add the matching public key\nwith `malachi token key add` first. Log in with it through --token-file.\nExample: openssl genpkey -algorithm ed25519 -out issuer.key\n         malachi token create --private-key issuer.key --kid k1 --subject alice > alice.jwt"
)]
pub struct TokenCreateArgs {
    /// The issuer's private key (PKCS#8 PEM; EC and RSA PEM as well).
    #[arg(long, value_name = "FILE")]
    pub private_key: PathBuf,
    /// The key id the token's header names (the brokers' key for it).
    #[arg(long, value_name = "ID")]
    pub kid: String,
    /// The user the token logs in as (`sub`).
    #[arg(long, value_name = "NAME")]
    pub subject: String,
    /// The signature algorithm: EdDSA, ES256, ES384, RS256, RS384, RS512, PS256, PS384 or PS512.
    #[arg(long, default_value = "EdDSA", value_name = "ALG")]
    pub algorithm: String,
    /// How long the token is valid, from now.
    #[arg(long, default_value_t = 3_600_000, value_name = "MS")]
    pub lifetime_ms: u64,
    /// The audience (`aud`), for brokers with `security.token_audience`.
    #[arg(long, value_name = "AUD")]
    pub audience: Option<String>,
    /// Print one JSON object with the token and its expiry instead.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenKeyCommand {
    /// Add an issuer public key under a key id (needs admin on the cluster).
    Add(TokenKeyAddArgs),
    /// Remove an issuer key: tokens naming it are refused from then on,
    /// and the sessions they opened end on every broker within about a
    /// second (ADR 0157).
    Remove(TokenKeyIdArgs),
    /// List the issuer keys.
    List(OutputArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Rotation: add the new key under a new key id, move the issuer to it, then remove the old one.\nExample: openssl pkey -in issuer.key -pubout -out issuer.pub\n         malachi token key add --kid k1 --public-key issuer.pub --user admin --password-file admin.pw"
)]
pub struct TokenKeyAddArgs {
    /// The key id tokens name in their header (letters, digits, `.`, `_`, `-`).
    #[arg(long, value_name = "ID")]
    pub kid: String,
    /// The public key (PEM, `BEGIN PUBLIC KEY`).
    #[arg(long, value_name = "FILE")]
    pub public_key: PathBuf,
    /// The algorithm tokens under this key are signed with.
    #[arg(long, default_value = "EdDSA", value_name = "ALG")]
    pub algorithm: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct TokenKeyIdArgs {
    /// The key id.
    #[arg(long, value_name = "ID")]
    pub kid: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn read_small(path: &Path, action: &'static str, max: u64) -> Result<String, CliError> {
    use std::io::Read;
    let io = |source| CliError::Io { action, source };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(max)
        .read_to_string(&mut text)
        .map_err(io)?;
    Ok(text)
}

fn algorithm(name: &str) -> Result<TokenAlgorithm, CliError> {
    TokenAlgorithm::from_name(name).ok_or_else(|| {
        CliError::Config(format!(
            "--algorithm {name}: use EdDSA, ES256, ES384, RS256, RS384, RS512, PS256, PS384 or PS512"
        ))
    })
}

/// The login a `--token-file` asks for: the file's first line, checked
/// now and read again at every login, so a command that outlives its
/// token picks up the renewed file when the broker ends the session
/// (ADR 0154).
pub fn token_login(path: &Path) -> Result<malachi_wire::client::Login, CliError> {
    let text = read_small(path, "read the token file", TOKEN_BYTES_MAX as u64 + 2)?;
    let line = text.lines().next().unwrap_or_default().trim();
    if line.is_empty() {
        return Err(CliError::Config(format!(
            "{}: the first line (the token) is empty",
            path.display()
        )));
    }
    Ok(malachi_wire::client::TokenLogin::from_file(path).into_login())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn create(args: &TokenCreateArgs) -> Result<(), CliError> {
    let key = read_small(
        &args.private_key,
        "read the private key",
        KEY_FILE_BYTES_MAX,
    )?;
    let now_ms = now_ms();
    let request = MintRequest {
        algorithm: algorithm(&args.algorithm)?,
        kid: &args.kid,
        subject: &args.subject,
        now_ms,
        lifetime_ms: args.lifetime_ms,
        not_before_ms: None,
        audience: args.audience.as_deref(),
    };
    let token =
        token::mint(key.as_bytes(), &request).map_err(|e| CliError::Config(e.to_string()))?;
    let expires_at_ms = now_ms.saturating_add(args.lifetime_ms) / 1000 * 1000;
    if args.json {
        print_json(&json!({
            "token": token,
            "subject": args.subject,
            "kid": args.kid,
            "expires_at_ms": expires_at_ms,
        }))
    } else {
        print_text(&format!("{token}\n"))
    }
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

fn render_keys(keys: &[TokenKeyText]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("KID                              ALGORITHM  ADDED_AT_MS\n");
    for key in keys {
        let _ = writeln!(
            out,
            "{:<32} {:<10} {}",
            key.kid, key.algorithm, key.added_at_ms
        );
    }
    out
}

pub async fn token(command: TokenCommand) -> Result<(), CliError> {
    match command {
        TokenCommand::Create(args) => create(&args),
        TokenCommand::Key(TokenKeyCommand::Add(args)) => {
            let pem = read_small(&args.public_key, "read the public key", KEY_FILE_BYTES_MAX)?;
            let request = PutTokenKeyRequest {
                key: TokenKeyText {
                    kid: args.kid.clone(),
                    algorithm: algorithm(&args.algorithm)?.name().to_owned(),
                    public_key_pem: pem,
                    added_at_ms: 0,
                },
            };
            let response = call(&args.output, "token key add", &request).await?;
            if args.output.json {
                print_json(&json!({"kid": response.kid, "changed": response.changed}))
            } else if response.changed {
                print_text(&format!("token key {} added\n", response.kid))
            } else {
                print_text(&format!("token key {} was already there\n", response.kid))
            }
        }
        TokenCommand::Key(TokenKeyCommand::Remove(args)) => {
            let request = DeleteTokenKeyRequest { kid: args.kid };
            let response = call(&args.output, "token key remove", &request).await?;
            if args.output.json {
                print_json(&json!({"removed": response.kid}))
            } else {
                print_text(&format!("token key {} removed\n", response.kid))
            }
        }
        TokenCommand::Key(TokenKeyCommand::List(output)) => {
            let response = call(&output, "token key list", &ListTokenKeysRequest {}).await?;
            if output.json {
                response.keys.iter().try_for_each(|k| {
                    print_json(&json!({
                        "kid": k.kid,
                        "algorithm": k.algorithm,
                        "added_at_ms": k.added_at_ms,
                    }))
                })
            } else {
                print_text(&render_keys(&response.keys))
            }
        }
    }
}
