//! How records are read from stdin and printed to stdout: `KEY<TAB>VALUE`
//! text lines, or JSON objects whose binary fields travel as base64.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use malachi_wire::{Header, Record};
use serde::{Deserialize, Serialize};

/// One input line in `--json` mode. Either `key` or `key_b64` (and either
/// `value` or `value_b64`) may be given; header values are text.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonInput {
    key: Option<String>,
    key_b64: Option<String>,
    value: Option<String>,
    value_b64: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// One output record in `--json` mode: text fields when the bytes are UTF-8,
/// `*_b64` fields otherwise.
#[derive(Debug, Serialize)]
pub struct JsonRecord {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_b64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    pub headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp_ms: Option<u64>,
}

/// Parse one text line: `KEY<TAB>VALUE`, or the whole line as the value when
/// a fixed key is given.
pub fn parse_text_line(line: &str, fixed_key: Option<&str>) -> Result<Record, String> {
    match fixed_key {
        Some(key) => Ok(Record::new(
            Bytes::copy_from_slice(key.as_bytes()),
            Bytes::copy_from_slice(line.as_bytes()),
        )),
        None => {
            let (key, value) = line.split_once('\t').ok_or_else(|| {
                "expected KEY<TAB>VALUE (or pass --key KEY to give every line the same key)"
                    .to_owned()
            })?;
            Ok(Record::new(
                Bytes::copy_from_slice(key.as_bytes()),
                Bytes::copy_from_slice(value.as_bytes()),
            ))
        }
    }
}

/// Parse one `--json` input line.
pub fn parse_json_line(line: &str, fixed_key: Option<&str>) -> Result<Record, String> {
    let input: JsonInput =
        serde_json::from_str(line).map_err(|e| format!("not a record object: {e}"))?;
    let key = match (input.key, input.key_b64, fixed_key) {
        (Some(_), Some(_), _) => return Err("give key or key_b64, not both".into()),
        (Some(key), None, _) => Bytes::from(key.into_bytes()),
        (None, Some(b64), _) => Bytes::from(
            B64.decode(b64.as_bytes())
                .map_err(|e| format!("key_b64 is not base64: {e}"))?,
        ),
        (None, None, Some(key)) => Bytes::copy_from_slice(key.as_bytes()),
        (None, None, None) => return Err("missing key (or key_b64, or --key)".into()),
    };
    let value = match (input.value, input.value_b64) {
        (Some(_), Some(_)) => return Err("give value or value_b64, not both".into()),
        (Some(value), None) => Bytes::from(value.into_bytes()),
        (None, Some(b64)) => Bytes::from(
            B64.decode(b64.as_bytes())
                .map_err(|e| format!("value_b64 is not base64: {e}"))?,
        ),
        (None, None) => return Err("missing value (or value_b64)".into()),
    };
    let mut record = Record::new(key, value);
    for (name, value) in input.headers {
        record = record.with_header(name, Bytes::from(value.into_bytes()));
    }
    Ok(record)
}

/// A record as one text line (without the newline). Tabs and newlines in
/// the key and newlines in the value are escaped so one record stays one
/// line; invalid UTF-8 is replaced.
pub fn format_text(record: &Record) -> String {
    let key = String::from_utf8_lossy(&record.key)
        .replace('\\', "\\\\")
        .replace('\t', "\\t")
        .replace('\n', "\\n");
    let value = String::from_utf8_lossy(&record.value)
        .replace('\\', "\\\\")
        .replace('\n', "\\n");
    format!("{key}\t{value}")
}

/// A record as its JSON output object.
pub fn to_json(record: &Record) -> JsonRecord {
    let (key, key_b64) = text_or_b64(&record.key);
    let (value, value_b64) = text_or_b64(&record.value);
    let headers = record
        .headers
        .iter()
        .map(|Header { name, value }| (name.clone(), String::from_utf8_lossy(value).into_owned()))
        .collect();
    JsonRecord {
        key,
        key_b64,
        value,
        value_b64,
        headers,
        timestamp_ms: record.timestamp_ms,
    }
}

fn text_or_b64(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, Some(B64.encode(bytes))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_line_splits_at_the_first_tab() {
        let record = parse_text_line("k1\tv\twith tab", None).unwrap();
        assert_eq!(&record.key[..], b"k1");
        assert_eq!(&record.value[..], b"v\twith tab");
    }

    #[test]
    fn a_text_line_without_tab_needs_a_fixed_key() {
        assert!(
            parse_text_line("just a value", None)
                .unwrap_err()
                .contains("--key")
        );
        let record = parse_text_line("just a value", Some("k")).unwrap();
        assert_eq!(&record.key[..], b"k");
        assert_eq!(&record.value[..], b"just a value");
    }

    #[test]
    fn a_json_line_carries_headers_and_base64() {
        let record = parse_json_line(
            r#"{"key_b64":"AP8=","value":"v","headers":{"h":"x"}}"#,
            None,
        )
        .unwrap();
        assert_eq!(&record.key[..], &[0x00, 0xff]);
        assert_eq!(&record.value[..], b"v");
        assert_eq!(record.headers.len(), 1);
        assert_eq!(record.headers[0].name, "h");
    }

    #[test]
    fn a_json_line_with_both_value_forms_is_refused() {
        let err =
            parse_json_line(r#"{"key":"k","value":"v","value_b64":"dg=="}"#, None).unwrap_err();
        assert!(err.contains("not both"), "{err}");
    }

    #[test]
    fn a_json_line_with_an_unknown_field_is_refused() {
        assert!(parse_json_line(r#"{"key":"k","vaule":"v"}"#, None).is_err());
    }

    #[test]
    fn binary_output_goes_to_base64_fields() {
        let json = to_json(&Record::new(
            Bytes::from_static(b"k"),
            Bytes::from_static(&[0xff]),
        ));
        let line = serde_json::to_string(&json).unwrap();
        assert_eq!(line, r#"{"key":"k","value_b64":"/w==","headers":{}}"#);
    }

    #[test]
    fn text_output_keeps_one_record_on_one_line() {
        let record = Record::new(Bytes::from_static(b"a\tb"), Bytes::from_static(b"x\ny"));
        assert_eq!(format_text(&record), "a\\tb\tx\\ny");
    }
}
