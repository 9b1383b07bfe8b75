//! The runner's side channel: JSON lines on the driver's stdin.
//!
//! The runner injects the faults, but the driver owns the history, so the
//! runner's events go into it through the driver and are stamped on the
//! driver's clock, under the history's lock, when the driver reads them:
//! one clock and one writer, so no merge step and no ordering question. The
//! runner sends a `nemesis` line just before it injects the fault and a
//! `heal` line just after the fault is healed, so the stamps bracket the
//! fault from outside.
//!
//! | line | effect |
//! | --- | --- |
//! | `{"kind":"nemesis","event":E,"target":T,"detail":D}` | logged as is, stamped |
//! | `{"kind":"heal","event":E}`, `{"kind":"reconverged","event":E}` | logged, stamped |
//! | `{"kind":"copies",...}` | logged, stamped (the end-of-run copy digests) |
//! | `{"cmd":"final"}` | stop the producers and consumers, run the final read |
//! | `{"cmd":"end"}` (or the end of stdin) | close the history and exit |
//!
//! Any `t_ms` the runner puts on a line is replaced by the driver's stamp.
//! Only the kinds above are accepted from the runner: the workload's own
//! kinds (`produce`, `read`, ...) come from the driver alone.

use malachi_chaos_checker::Event;
use serde_json::Value;

use crate::error::DriverError;

/// One line from the runner.
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// An event to stamp and log (nemesis, heal, reconverged, copies).
    Log(Value),
    Final,
    End,
}

/// The kinds the runner may log.
const RUNNER_KINDS: [&str; 4] = ["nemesis", "heal", "reconverged", "copies"];

/// Parses one line; a blank line is `None`.
pub fn parse(line: &str) -> Result<Option<Control>, DriverError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let value: Value =
        serde_json::from_str(line).map_err(|e| DriverError::Control(format!("{e}: {line}")))?;
    if let Some(cmd) = value.get("cmd").and_then(Value::as_str) {
        return match cmd {
            "final" => Ok(Some(Control::Final)),
            "end" => Ok(Some(Control::End)),
            other => Err(DriverError::Control(format!("unknown cmd {other:?}"))),
        };
    }
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    if !RUNNER_KINDS.contains(&kind) {
        return Err(DriverError::Control(format!(
            "the runner may log only {RUNNER_KINDS:?}, not {kind:?}"
        )));
    }
    // Check now that it is a well-formed event, so a bad line is refused
    // here rather than written into the history.
    stamped(&value, 0)?;
    Ok(Some(Control::Log(value)))
}

/// The event with `t_ms` set to the driver's stamp.
pub fn stamped(value: &Value, t_ms: u64) -> Result<Event, DriverError> {
    let mut value = value.clone();
    if let Some(map) = value.as_object_mut() {
        map.insert("t_ms".to_owned(), Value::from(t_ms));
    }
    serde_json::from_value(value).map_err(|e| DriverError::Control(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nemesis_line_is_logged_with_the_drivers_stamp() {
        let line =
            r#"{"kind":"nemesis","t_ms":999999,"event":"kill","target":"b2","detail":"SIGKILL"}"#;
        let Some(Control::Log(value)) = parse(line).unwrap() else {
            panic!("not a log line")
        };
        let event = stamped(&value, 42).unwrap();
        assert_eq!(event.t_ms(), 42);
        assert!(matches!(event, Event::Nemesis { ref event, .. } if event == "kill"));
    }

    #[test]
    fn commands_and_blank_lines_parse() {
        assert_eq!(parse(r#"{"cmd":"final"}"#).unwrap(), Some(Control::Final));
        assert_eq!(parse(r#"{"cmd":"end"}"#).unwrap(), Some(Control::End));
        assert_eq!(parse("   ").unwrap(), None);
    }

    #[test]
    fn the_runner_cannot_log_workload_events_or_malformed_ones() {
        let produce = r#"{"kind":"produce","client":"x","key":"k","seq":1,"value":"k:1"}"#;
        assert!(parse(produce).is_err());
        assert!(parse(r#"{"kind":"heal"}"#).is_err());
        assert!(parse("not json").is_err());
        assert!(parse(r#"{"cmd":"explode"}"#).is_err());
    }
}
