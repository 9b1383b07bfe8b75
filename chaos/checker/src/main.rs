//! `malachi-chaos-check`: judges one chaos run's history, prints the summary
//! table and optionally writes the results JSON. Exit codes: 0 clean, 1 any
//! anomaly, 2 vacuous, 3 the history or the command line cannot be judged
//! (or the results cannot be written).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use malachi_chaos_checker::{
    CheckError, Config, MIN_ACKED_DEFAULT, MIN_EVENTS_DEFAULT, RECOVERY_BOUND_MS_DEFAULT, Verdict,
    check_path,
};

/// Exit code for a history, command line or results file the checker could
/// not handle. Clap's own usage error code (2) would read as "vacuous".
const EXIT_BAD_INPUT: u8 = 3;

/// Judge a chaos run's history (JSON Lines) for lost, duplicated, reordered
/// or invented records, cursors that go backwards, diverging sealed copies
/// and slow recovery after heals.
#[derive(Debug, Parser)]
#[command(name = "malachi-chaos-check", version)]
struct Cli {
    /// The history file, one JSON event per line.
    history: PathBuf,
    /// Write the full report as JSON here (e.g. chaos/results/RUN.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A run with fewer acknowledged writes is vacuous.
    #[arg(long, default_value_t = MIN_ACKED_DEFAULT)]
    min_acked: u64,
    /// A run with fewer nemesis events is vacuous.
    #[arg(long, default_value_t = MIN_EVENTS_DEFAULT)]
    min_events: u64,
    /// The longest a heal may go without an acknowledged write after it.
    #[arg(long, default_value_t = RECOVERY_BOUND_MS_DEFAULT)]
    recovery_bound_ms: u64,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // --help and --version are not errors.
            let code = if error.use_stderr() {
                EXIT_BAD_INPUT
            } else {
                0
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    match run(&cli) {
        Ok(verdict) => ExitCode::from(verdict.exit_code()),
        Err(error) => {
            eprintln!("malachi-chaos-check: {error}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

fn run(cli: &Cli) -> Result<Verdict, CheckError> {
    let config = Config {
        min_acked: cli.min_acked,
        min_events: cli.min_events,
        recovery_bound_ms: cli.recovery_bound_ms,
    };
    let report = check_path(&cli.history, &config)?;
    // A closed stdout must not hide the verdict, which the exit code carries.
    let _ = write!(
        std::io::stdout().lock(),
        "history: {}\n{}",
        cli.history.display(),
        report.summary()
    );
    if let Some(out) = &cli.out {
        report.write_json(out)?;
    }
    Ok(report.verdict)
}
