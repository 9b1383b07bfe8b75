//! The client config file (issue 39): where a client command finds its CA,
//! client certificate, user and password file when no flag or environment
//! variable names them. `--client-config PATH`, else
//! `MALACHI_CLIENT_CONFIG`, else `$XDG_CONFIG_HOME/malachi/client.toml`
//! (`~/.config/malachi/client.toml`) if it exists. Each setting is taken
//! from the flag, else its environment variable, else the file.
//!
//! ```toml
//! tls_ca = "ca.pem"            # relative paths are from this file's directory
//! tls_cert = "alice.pem"       # with tls_key: the client certificate (mTLS)
//! tls_key = "alice.key"
//! user = "alice"
//! password_file = "alice.pw"   # used only when logging in as this file's user
//! token_file = "alice.jwt"     # or a bearer token (ADR 0152), never beside `user`
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{CredentialArgs, TlsArgs};

/// The largest client config file read, in bytes.
pub const CLIENT_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Why a client config file cannot be used. Each names the file, and the
/// key where one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ClientFileError {
    #[error("client config {path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("client config {path}: larger than {CLIENT_FILE_BYTES_MAX} bytes")]
    TooLarge { path: PathBuf },
    #[error("client config {path}: {key}: {reason}")]
    Key {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("client config {path}: not valid TOML: {reason}")]
    Syntax { path: PathBuf, reason: String },
}

/// The file's keys, as written (paths not yet resolved).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKeys {
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
}

/// A loaded client config file, its paths resolved against its directory.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ClientFile {
    pub path: PathBuf,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
}

/// The default file: `$XDG_CONFIG_HOME/malachi/client.toml`, else
/// `$HOME/.config/malachi/client.toml`; none without either variable.
pub fn default_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".config"),
    };
    Some(base.join("malachi").join("client.toml"))
}

/// The file to read: the one named (flag or environment), which must
/// exist, else the default one if it exists, else none.
pub fn load(named: Option<&Path>) -> Result<Option<ClientFile>, ClientFileError> {
    match named {
        Some(path) => read(path).map(Some),
        None => match default_path() {
            Some(path) if path.is_file() => read(&path).map(Some),
            _ => Ok(None),
        },
    }
}

/// Reads and checks one file.
pub fn read(path: &Path) -> Result<ClientFile, ClientFileError> {
    use std::io::Read;
    let fail = |source| ClientFileError::Read {
        path: path.to_owned(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(fail)?
        .take(CLIENT_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(fail)?;
    if text.len() as u64 > CLIENT_FILE_BYTES_MAX {
        return Err(ClientFileError::TooLarge {
            path: path.to_owned(),
        });
    }
    parse(path, &text)
}

/// Parses `text` as the file at `path`.
pub fn parse(path: &Path, text: &str) -> Result<ClientFile, ClientFileError> {
    let keys: FileKeys = toml::from_str(text).map_err(|e| syntax_or_key(path, text, &e))?;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let key = |key: &str, reason: &str| ClientFileError::Key {
        path: path.to_owned(),
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    let resolve = |name: &str, value: Option<PathBuf>| match value {
        Some(p) if p.as_os_str().is_empty() => Err(key(name, "an empty path")),
        Some(p) if p.is_relative() => Ok(Some(dir.join(p))),
        other => Ok(other),
    };
    if keys.tls_cert.is_some() != keys.tls_key.is_some() {
        let missing = if keys.tls_cert.is_some() {
            "tls_key"
        } else {
            "tls_cert"
        };
        return Err(key(
            missing,
            "missing: a client certificate needs both tls_cert and tls_key",
        ));
    }
    if keys.user.as_deref() == Some("") {
        return Err(key("user", "an empty user name"));
    }
    if keys.password_file.is_some() && keys.user.is_none() {
        return Err(key(
            "password_file",
            "set without user: whose password is it?",
        ));
    }
    Ok(ClientFile {
        path: path.to_owned(),
        tls_ca: resolve("tls_ca", keys.tls_ca)?,
        tls_cert: resolve("tls_cert", keys.tls_cert)?,
        tls_key: resolve("tls_key", keys.tls_key)?,
        user: keys.user,
        password_file: resolve("password_file", keys.password_file)?,
        token_file: resolve("token_file", keys.token_file)?,
    })
}

/// A serde error as the key it is about (a wrong type, an unknown key),
/// or as bad TOML.
fn syntax_or_key(path: &Path, text: &str, e: &toml::de::Error) -> ClientFileError {
    let message = e.message().replace('\n', " ");
    if let Some(unknown) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        return ClientFileError::Key {
            path: path.to_owned(),
            key: unknown.to_owned(),
            reason: "not a client config key (known: tls_ca, tls_cert, tls_key, user, password_file, token_file)".into(),
        };
    }
    let key = e
        .span()
        .and_then(|span| key_at(text, span.start))
        .filter(|k| !k.is_empty());
    match key {
        Some(key) => ClientFileError::Key {
            path: path.to_owned(),
            key,
            reason: message,
        },
        None => ClientFileError::Syntax {
            path: path.to_owned(),
            reason: message,
        },
    }
}

/// The key of the `key = value` line holding byte `at` of `input`.
fn key_at(input: &str, at: usize) -> Option<String> {
    let start = input.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = input.get(start..)?.lines().next()?;
    let (key, _) = line.split_once('=')?;
    Some(key.trim().trim_matches('"').to_owned())
}

/// The settings a client command connects with: each from its flag or
/// environment variable if given, else from the file. The client
/// certificate and key come as a pair from one place; the file's password
/// file is used only to log in as the file's own user.
pub fn merge(
    tls: &TlsArgs,
    credentials: &CredentialArgs,
    file: Option<&ClientFile>,
) -> Result<(TlsArgs, CredentialArgs), ClientFileError> {
    let Some(file) = file else {
        return Ok((tls.clone(), credentials.clone()));
    };
    if file.token_file.is_some() && file.user.is_some() {
        return Err(ClientFileError::Key {
            path: file.path.clone(),
            key: "token_file".into(),
            reason: "a token and a user are two logins: keep one".into(),
        });
    }
    let (tls_cert, tls_key) = if tls.tls_cert.is_some() || tls.tls_key.is_some() {
        (tls.tls_cert.clone(), tls.tls_key.clone())
    } else {
        (file.tls_cert.clone(), file.tls_key.clone())
    };
    // A login named by a flag or the environment wins whole: the file's
    // token is not used beside a given user, nor its user beside a token.
    let token_file = credentials.token_file.clone().or_else(|| {
        credentials
            .user
            .is_none()
            .then(|| file.token_file.clone())
            .flatten()
    });
    let user = credentials
        .user
        .clone()
        .or_else(|| token_file.is_none().then(|| file.user.clone()).flatten());
    let password_file = credentials.password_file.clone().or_else(|| {
        (user.is_some() && user == file.user)
            .then(|| file.password_file.clone())
            .flatten()
    });
    Ok((
        TlsArgs {
            tls_ca: tls.tls_ca.clone().or_else(|| file.tls_ca.clone()),
            tls_cert,
            tls_key,
        },
        CredentialArgs {
            user,
            password_file,
            token_file,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Result<ClientFile, ClientFileError> {
        parse(Path::new("/etc/malachi/client.toml"), text)
    }

    #[test]
    fn relative_paths_are_read_from_the_files_directory() {
        let file =
            at("tls_ca = \"ca.pem\"\nuser = \"alice\"\npassword_file = \"/run/pw\"\n").unwrap();
        assert_eq!(file.tls_ca, Some(PathBuf::from("/etc/malachi/ca.pem")));
        assert_eq!(file.password_file, Some(PathBuf::from("/run/pw")));
        assert_eq!(file.user.as_deref(), Some("alice"));
    }

    #[test]
    fn an_unknown_key_is_named() {
        let e = at("tls_ca = \"ca.pem\"\npasword_file = \"pw\"\n").unwrap_err();
        assert!(
            matches!(&e, ClientFileError::Key { key, .. } if key == "pasword_file"),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("client config /etc/malachi/client.toml: pasword_file:"),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_type_names_its_key() {
        let e = at("user = 7\n").unwrap_err();
        assert!(
            matches!(&e, ClientFileError::Key { key, .. } if key == "user"),
            "{e}"
        );
    }

    #[test]
    fn half_a_client_certificate_names_the_missing_key() {
        let e = at("tls_cert = \"c.pem\"\n").unwrap_err();
        assert!(
            matches!(&e, ClientFileError::Key { key, .. } if key == "tls_key"),
            "{e}"
        );
    }

    #[test]
    fn flags_beat_the_file_and_a_password_file_stays_with_its_user() {
        let file =
            at("tls_ca = \"ca.pem\"\nuser = \"alice\"\npassword_file = \"alice.pw\"\n").unwrap();
        let flags = CredentialArgs {
            user: Some("bob".into()),
            password_file: None,
            token_file: None,
        };
        let (tls, creds) = merge(&TlsArgs::default(), &flags, Some(&file)).unwrap();
        assert_eq!(tls.tls_ca, Some(PathBuf::from("/etc/malachi/ca.pem")));
        assert_eq!(creds.user.as_deref(), Some("bob"));
        // alice's password is never sent as bob's.
        assert_eq!(creds.password_file, None);
        let (_, creds) =
            merge(&TlsArgs::default(), &CredentialArgs::default(), Some(&file)).unwrap();
        assert_eq!(
            creds.password_file,
            Some(PathBuf::from("/etc/malachi/alice.pw"))
        );
    }

    #[test]
    fn the_files_token_logs_in_unless_a_user_is_given_and_never_beside_its_user() {
        let file = at("token_file = \"t.jwt\"\n").unwrap();
        let (_, creds) =
            merge(&TlsArgs::default(), &CredentialArgs::default(), Some(&file)).unwrap();
        assert_eq!(creds.token_file, Some(PathBuf::from("/etc/malachi/t.jwt")));
        assert_eq!(creds.user, None);
        let given = CredentialArgs {
            user: Some("bob".into()),
            ..CredentialArgs::default()
        };
        let (_, creds) = merge(&TlsArgs::default(), &given, Some(&file)).unwrap();
        assert_eq!(
            (creds.user.as_deref(), creds.token_file),
            (Some("bob"), None)
        );
        let both = at("token_file = \"t.jwt\"\nuser = \"alice\"\n").unwrap();
        let e = merge(&TlsArgs::default(), &CredentialArgs::default(), Some(&both)).unwrap_err();
        assert!(
            matches!(&e, ClientFileError::Key { key, .. } if key == "token_file"),
            "{e}"
        );
    }
}
