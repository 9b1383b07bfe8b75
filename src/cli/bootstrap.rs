//! The bootstrap brokers of a client command: `--broker` (repeatable, each
//! value one address or several separated by commas) or `MALACHI_BROKER`
//! (the same, comma-separated), as Kafka's `bootstrap.servers`. The client
//! tries them in order and learns the rest of the cluster from the first
//! that answers, so a few addresses suffice.

use malachi_wire::client::BOOTSTRAP_BROKERS_MAX_DEFAULT;

use super::error::CliError;

/// Addresses one `--broker` list may hold: the client's own bound.
pub const BOOTSTRAP_BROKERS_MAX: usize = BOOTSTRAP_BROKERS_MAX_DEFAULT;

/// The addresses `values` name, in order: split at commas, trimmed, blank
/// items skipped (a trailing comma is harmless). No address at all, an item
/// that is not `host:port`, an address given twice or more than
/// [`BOOTSTRAP_BROKERS_MAX`] addresses is refused before anything is sent.
pub fn parse_brokers(values: &[String]) -> Result<Vec<String>, CliError> {
    let mut brokers: Vec<String> = Vec::new();
    let items = values.iter().flat_map(|v| v.split(',')).map(str::trim);
    for item in items.filter(|i| !i.is_empty()) {
        if !is_host_port(item) {
            return Err(CliError::Config(format!(
                "--broker {item:?} is not host:port"
            )));
        }
        if brokers.iter().any(|b| b == item) {
            return Err(CliError::Config(format!("--broker lists {item} twice")));
        }
        if brokers.len() == BOOTSTRAP_BROKERS_MAX {
            return Err(CliError::Config(format!(
                "--broker lists more than {BOOTSTRAP_BROKERS_MAX} addresses; a few of the cluster's brokers suffice"
            )));
        }
        brokers.push(item.to_owned());
    }
    if brokers.is_empty() {
        return Err(CliError::Config("--broker names no address".into()));
    }
    debug_assert!(brokers.len() <= BOOTSTRAP_BROKERS_MAX);
    Ok(brokers)
}

/// `host:port` with a non-empty host and a port number (`[::1]:4040` too).
fn is_host_port(item: &str) -> bool {
    item.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains(char::is_whitespace) && port.parse::<u16>().is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Result<Vec<String>, String> {
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        parse_brokers(&values).map_err(|e| e.to_string())
    }

    #[test]
    fn one_address_is_taken_as_it_is() {
        assert_eq!(parse(&["127.0.0.1:4040"]).unwrap(), ["127.0.0.1:4040"]);
        assert_eq!(parse(&["[::1]:4040"]).unwrap(), ["[::1]:4040"]);
    }

    #[test]
    fn commas_and_repeats_make_one_ordered_list_with_blanks_skipped() {
        let got = parse(&[" a:1 , b:2,", "c:3", ",, d:4"]).unwrap();
        assert_eq!(got, ["a:1", "b:2", "c:3", "d:4"]);
    }

    #[test]
    fn no_address_a_repeat_a_bad_item_and_too_many_are_refused() {
        insta::assert_snapshot!(parse(&[" , ", ""]).unwrap_err(), @"invalid configuration: --broker names no address");
        insta::assert_snapshot!(parse(&["a:1,b:2", "a:1"]).unwrap_err(), @"invalid configuration: --broker lists a:1 twice");
        insta::assert_snapshot!(parse(&["a:1,b"]).unwrap_err(), @r#"invalid configuration: --broker "b" is not host:port"#);
        assert!(parse(&[":80"]).is_err());
        assert!(parse(&["a:99999"]).is_err());
        let many: Vec<String> = (0..=BOOTSTRAP_BROKERS_MAX)
            .map(|i| format!("10.0.0.{i}:4040"))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(parse(&refs[..BOOTSTRAP_BROKERS_MAX]).is_ok());
        insta::assert_snapshot!(parse(&refs).unwrap_err(), @"invalid configuration: --broker lists more than 32 addresses; a few of the cluster's brokers suffice");
    }
}
