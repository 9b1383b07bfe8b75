//! `bench compare`'s TLS rows (issue 39): one broker whose client port
//! speaks TLS and whose clients log in with SCRAM-SHA-256, beside a
//! plaintext broker of the same config, both started by this run. Each row
//! runs in [`TLS_ROUNDS`] slices, a plaintext slice then a TLS slice, so
//! both see the same disk and the same machine in the same minutes; the
//! plaintext slices added up are the row's baseline
//! (`plaintext_mb_per_s`), and `ratio_to_plaintext` divides by it.
//!
//! Clients connect and log in before a slice's clock starts
//! (`produce_load`, `consume_load`): the rows measure serving, not the
//! login's PBKDF2, which a client pays once per connection.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use super::super::super::error::CliError;
use super::super::super::secure::{self, DEV_SUPERUSER, SecureFiles};
use super::super::super::{ClientConfigArgs, CredentialArgs, OutputArgs, TlsArgs};
use super::super::{AtTail, LoadOutcome, ProduceLoad, consume_load, histogram, produce_load};
use super::{
    CLUSTER_READY_MAX, CLUSTER_READY_POLL, FETCH_BYTES, MALACHI_BATCH_RECORDS, MALACHI_TIMEOUT_MS,
    MALACHI_WINDOW, Notes, Plan, RECORD_BYTES, absorb, fresh_dir, human_duration, loopback,
    malachi_config, row, scenario, start_server,
};
use malachi_bench::peers::{self, Mode, ServerGuard};
use malachi_bench::report::{MALACHI_TLS, Row};

/// Slices of each TLS row, each a plaintext slice followed by a TLS one.
pub const TLS_ROUNDS: u32 = 4;

/// The TLS broker's config: [`malachi_config`]'s store settings, `[tls]`
/// with the throwaway pair and SCRAM logins with `admin` a superuser (as
/// `malachi dev --secure` runs it, without client certificates).
pub fn tls_config(files: &SecureFiles) -> String {
    let quoted = |path: &Path| toml::Value::String(path.display().to_string()).to_string();
    format!(
        "{}\n[tls]\ncert_path = {}\nkey_path = {}\n# One broker, no peers: no TLS between brokers to set up (ADR 0151).\ncluster = \"off\"\n\n[security]\nauthentication = \"scram\"\nsuperusers = [\"User:{DEV_SUPERUSER}\"]\nbootstrap_user = \"{DEV_SUPERUSER}\"\nbootstrap_password_file = {}\n",
        malachi_config(),
        quoted(&files.broker_cert),
        quoted(&files.broker_key),
        quoted(&files.password),
    )
}

/// One broker of this run and how to reach it.
struct Broker {
    guard: ServerGuard,
    output: OutputArgs,
}

/// Starts this executable as one broker with `config`, in a fresh
/// directory (which also holds the TLS files, if any).
async fn start(
    name: &str,
    dir: tempfile::TempDir,
    config: &str,
    tls: Option<&SecureFiles>,
) -> Result<Broker, CliError> {
    let config_path = dir.path().join("broker.toml");
    std::fs::write(&config_path, config)
        .map_err(|e| CliError::Bench(format!("cannot write the broker config: {e}")))?;
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Bench(format!("cannot find this executable: {e}")))?;
    let (port, admin) = (peers::free_port()?, peers::free_port()?);
    let args: Vec<OsString> = vec![
        "broker".into(),
        "--config".into(),
        config_path.into_os_string(),
        "--node-id".into(),
        "1".into(),
        "--listen".into(),
        loopback(port).to_string().into(),
        "--admin-listen".into(),
        loopback(admin).to_string().into(),
        "--data-dir".into(),
        dir.path().join("data").into_os_string(),
    ];
    let guard = start_server(
        name.to_owned(),
        exe,
        args,
        dir,
        loopback(port),
        "serving clients on",
    )
    .await?;
    let output = OutputArgs {
        client_config: ClientConfigArgs::internal(),
        credentials: tls.map_or_else(CredentialArgs::default, |files| CredentialArgs {
            user: Some(DEV_SUPERUSER.to_owned()),
            password_file: Some(files.password.clone()),
            token_file: None,
        }),
        broker: vec![guard.addr.to_string()],
        json: true,
        timeout_ms: MALACHI_TIMEOUT_MS,
        tls: tls.map_or_else(TlsArgs::default, |files| TlsArgs {
            tls_ca: Some(files.ca.clone()),
            ..TlsArgs::default()
        }),
    };
    Ok(Broker { guard, output })
}

/// Waits until the TLS broker takes its superuser's login: the bootstrap
/// user is created in raft once the broker serves.
async fn wait_for_login(broker: &Broker) -> Result<(), CliError> {
    let started = Instant::now();
    loop {
        let last = match super::super::bench_client(&broker.output).await {
            Ok(_) => return Ok(()),
            Err(e) => e.to_string(),
        };
        if started.elapsed() > CLUSTER_READY_MAX {
            return Err(CliError::Bench(format!(
                "malachi tls: no login within {}: {last} ({})",
                human_duration(CLUSTER_READY_MAX),
                broker.guard.log_tail()
            )));
        }
        tokio::time::sleep(CLUSTER_READY_POLL).await;
    }
}

fn empty() -> Result<LoadOutcome, CliError> {
    Ok(LoadOutcome {
        records: 0,
        payload_bytes: 0,
        seconds: 0.0,
        hist: histogram()?,
        errors: 0,
        dropped: 0,
    })
}

/// The TLS rows: each producer count and the read-back, against the
/// plaintext broker beside it.
pub async fn run(plan: &Plan, notes: &Notes) -> Result<Vec<Row>, CliError> {
    let plain_dir = fresh_dir(plan, "malachi-plain-compare-")?;
    let plain = start(
        "malachi broker (plaintext)",
        plain_dir,
        malachi_config(),
        None,
    )
    .await?;
    let tls_dir = fresh_dir(plan, "malachi-tls-compare-")?;
    let files = secure::ensure(tls_dir.path())?;
    let config = tls_config(&files);
    let tls = start("malachi broker (tls)", tls_dir, &config, Some(&files)).await?;
    wait_for_login(&tls).await?;
    let version = format!(
        "malachi {}, TLS (rustls, aws-lc-rs) and SCRAM-SHA-256; baseline a plaintext broker, {TLS_ROUNDS} slices interleaved",
        env!("CARGO_PKG_VERSION")
    );
    let slice = plan.row / TLS_ROUNDS;
    let mut rows = Vec::new();
    for &n in &plan.producers {
        let (mut on_plain, mut on_tls) = (empty()?, empty()?);
        for round in 1..=TLS_ROUNDS {
            notes.progress(&format!(
                "malachi tls: {n} producers, slice {round} of {TLS_ROUNDS}, plaintext then TLS"
            ));
            absorb(&mut on_plain, produce(&plain, n, slice).await?);
            absorb(&mut on_tls, produce(&tls, n, slice).await?);
        }
        let mut r = row(
            MALACHI_TLS,
            scenario(n),
            Mode::Durable,
            "per write",
            n,
            &on_tls,
            &version,
        );
        r.plaintext_mb_per_s = Some(on_plain.mb_per_s());
        rows.push(r);
    }
    let topic = format!("bench-p{}", plan.consume_source());
    let (mut on_plain, mut on_tls) = (empty()?, empty()?);
    for round in 1..=TLS_ROUNDS {
        notes.progress(&format!(
            "malachi tls: consume, slice {round} of {TLS_ROUNDS}, plaintext then TLS"
        ));
        absorb(&mut on_plain, consume(&plain, &topic, slice).await?);
        absorb(&mut on_tls, consume(&tls, &topic, slice).await?);
    }
    let mut r = row(
        MALACHI_TLS,
        "consume".into(),
        Mode::Durable,
        "per write",
        1,
        &on_tls,
        &version,
    );
    r.plaintext_mb_per_s = Some(on_plain.mb_per_s());
    rows.push(r);
    drop((plain, tls));
    Ok(rows)
}

async fn produce(
    broker: &Broker,
    producers: usize,
    slice: Duration,
) -> Result<LoadOutcome, CliError> {
    let load = ProduceLoad {
        topic: format!("bench-p{producers}"),
        producers,
        record_size: RECORD_BYTES,
        batch_records: MALACHI_BATCH_RECORDS,
        window: MALACHI_WINDOW,
        duration: slice,
    };
    let (outcome, _) = produce_load(&broker.output, &load, true)
        .await
        .map_err(|e| {
            CliError::Bench(format!(
                "{} produce ({}): {e}",
                broker.guard.name,
                broker.guard.log_tail()
            ))
        })?;
    Ok(outcome)
}

/// One slice of reading `topic` from its start, again from the start at
/// its tail (both brokers read the same records, from the page cache once
/// read).
async fn consume(broker: &Broker, topic: &str, slice: Duration) -> Result<LoadOutcome, CliError> {
    let mut outcome = consume_load(
        &broker.output,
        topic,
        1,
        slice,
        FETCH_BYTES,
        AtTail::Restart,
        true,
    )
    .await
    .map_err(|e| {
        CliError::Bench(format!(
            "{} consume ({}): {e}",
            broker.guard.name,
            broker.guard.log_tail()
        ))
    })?;
    // consume_load counts encoded block bytes; rows compare record payloads.
    outcome.payload_bytes = outcome.records * RECORD_BYTES as u64;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_broker_is_the_plaintext_config_with_tls_and_scram() {
        let dir = tempfile::tempdir().unwrap();
        let files = SecureFiles::under(dir.path());
        let config = tls_config(&files);
        assert!(config.starts_with(malachi_config()), "{config}");
        let parsed: malachi_actors::BrokerConfig = toml::from_str(&config).unwrap();
        assert_eq!(
            parsed.tls.cert_path.as_deref(),
            Some(files.broker_cert.as_path())
        );
        assert_eq!(
            parsed.security.authentication,
            malachi_actors::Authentication::Scram
        );
        assert_eq!(parsed.security.superusers, vec!["User:admin".to_owned()]);
        assert_eq!(parsed.store.flush_interval_ms, 0);
    }
}
