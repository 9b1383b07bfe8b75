//! The four SCRAM messages of RFC 5802 §7, parsed strictly and bounded
//! before anything is allocated beyond the message itself.

use super::scram::{
    KEY_BYTES, Key, MESSAGE_BYTES_MAX, NONCE_BYTES_MAX, ScramError, USERNAME_BYTES_MAX,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A parsed `client-first-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClientFirst<'a> {
    /// `n,,` or `y,,`, as sent: `c=` must be its base64. These are the only
    /// gs2 headers accepted: no channel binding (`n`: the client does not
    /// support it; `y`: it does but believes the server does not, which is
    /// true, since `-PLUS` is never offered), and no authorization identity.
    pub gs2_header: &'a str,
    /// The message without the gs2 header: the first part of AuthMessage.
    pub bare: &'a str,
    pub username: String,
    pub nonce: &'a str,
}

/// A parsed `server-first-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ServerFirst<'a> {
    pub nonce: &'a str,
    pub salt: Vec<u8>,
    pub iterations: u32,
}

/// A parsed `client-final-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClientFinal<'a> {
    /// `client-final-message-without-proof`: the last part of AuthMessage.
    pub without_proof: &'a str,
    pub channel_binding: Vec<u8>,
    pub nonce: &'a str,
    pub proof: Key,
}

/// A parsed `server-final-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ServerFinal {
    Verifier(Key),
    Error(String),
}

fn check_message(message: &str) -> Result<(), ScramError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(ScramError::TooLong {
            field: "message",
            actual: message.len(),
            limit: MESSAGE_BYTES_MAX,
        });
    }
    if message.contains('\0') {
        return Err(ScramError::Malformed("NUL byte"));
    }
    Ok(())
}

/// The value of attribute `name` in `part` (`name=value`).
fn attribute(part: Option<&str>, name: char) -> Result<&str, ScramError> {
    let part = part.ok_or(ScramError::Malformed("missing attribute"))?;
    if part.starts_with("m=") {
        return Err(ScramError::MandatoryExtension);
    }
    part.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('='))
        .ok_or(ScramError::Malformed("unexpected attribute"))
}

/// Optional extensions: `x=value` with a letter name, ignored but shaped.
fn extensions<'a>(rest: impl Iterator<Item = &'a str>) -> Result<(), ScramError> {
    for part in rest {
        if part.starts_with("m=") {
            return Err(ScramError::MandatoryExtension);
        }
        let bytes = part.as_bytes();
        if !(bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b'=') {
            return Err(ScramError::Malformed("bad extension"));
        }
    }
    Ok(())
}

fn check_nonce(nonce: &str) -> Result<&str, ScramError> {
    if nonce.is_empty() {
        return Err(ScramError::Malformed("empty nonce"));
    }
    if nonce.len() > NONCE_BYTES_MAX {
        return Err(ScramError::TooLong {
            field: "nonce",
            actual: nonce.len(),
            limit: NONCE_BYTES_MAX,
        });
    }
    // printable = %x21-2B / %x2D-7E: visible ASCII but ','.
    if !nonce
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::Malformed("nonce is not printable ASCII"));
    }
    Ok(nonce)
}

fn decode_b64(value: &str, what: &'static str, max: usize) -> Result<Vec<u8>, ScramError> {
    // Bound before decoding: base64 never shrinks below 3/4 of its length.
    if value.len() > max.div_ceil(3) * 4 {
        return Err(ScramError::TooLong {
            field: what,
            actual: value.len(),
            limit: max.div_ceil(3) * 4,
        });
    }
    STANDARD
        .decode(value)
        .map_err(|_| ScramError::Malformed("bad base64"))
}

fn decode_key(value: &str, what: &'static str) -> Result<Key, ScramError> {
    let bytes = decode_b64(value, what, KEY_BYTES)?;
    Key::try_from(bytes.as_slice()).map_err(|_| ScramError::Malformed("key is not 32 bytes"))
}

/// A `saslname` with `=2C` and `=3D` unescaped.
fn decode_username(value: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3);
        match escape {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad username escape")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty username"));
    }
    if out.len() > USERNAME_BYTES_MAX {
        return Err(ScramError::TooLong {
            field: "username",
            actual: out.len(),
            limit: USERNAME_BYTES_MAX,
        });
    }
    Ok(out)
}

/// A user name as a `saslname`: `,` as `=2C` and `=` as `=3D`.
pub(super) fn encode_username(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

pub(super) fn parse_client_first(message: &str) -> Result<ClientFirst<'_>, ScramError> {
    check_message(message)?;
    let header_end = match message.as_bytes() {
        [b'n' | b'y', b',', b',', ..] => 3,
        [b'p', b'=', ..] => return Err(ScramError::ChannelBindingNotSupported),
        [b'n' | b'y', b',', b'a', b'=', ..] => return Err(ScramError::AuthzidNotSupported),
        _ => return Err(ScramError::Malformed("bad gs2 header")),
    };
    let (gs2_header, bare) = message.split_at(header_end);
    let mut parts = bare.split(',');
    let username = decode_username(attribute(parts.next(), 'n')?)?;
    let nonce = check_nonce(attribute(parts.next(), 'r')?)?;
    extensions(parts)?;
    Ok(ClientFirst {
        gs2_header,
        bare,
        username,
        nonce,
    })
}

pub(super) fn parse_server_first(message: &str) -> Result<ServerFirst<'_>, ScramError> {
    check_message(message)?;
    let mut parts = message.split(',');
    let nonce = check_nonce(attribute(parts.next(), 'r')?)?;
    let salt = decode_b64(
        attribute(parts.next(), 's')?,
        "salt",
        super::scram::SALT_BYTES_MAX,
    )?;
    let count = attribute(parts.next(), 'i')?;
    if count.is_empty() || count.len() > 10 || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ScramError::Malformed("bad iteration count"));
    }
    let iterations = count
        .parse::<u32>()
        .map_err(|_| ScramError::Malformed("bad iteration count"))?;
    extensions(parts)?;
    Ok(ServerFirst {
        nonce,
        salt,
        iterations,
    })
}

pub(super) fn parse_client_final(message: &str) -> Result<ClientFinal<'_>, ScramError> {
    check_message(message)?;
    let at = message
        .rfind(",p=")
        .ok_or(ScramError::Malformed("missing proof"))?;
    let (without_proof, proof) = (&message[..at], &message[at + 3..]);
    let proof = decode_key(proof, "proof")?;
    let mut parts = without_proof.split(',');
    let channel_binding = decode_b64(attribute(parts.next(), 'c')?, "channel binding", 64)?;
    let nonce = check_nonce(attribute(parts.next(), 'r')?)?;
    extensions(parts)?;
    Ok(ClientFinal {
        without_proof,
        channel_binding,
        nonce,
        proof,
    })
}

pub(super) fn parse_server_final(message: &str) -> Result<ServerFinal, ScramError> {
    check_message(message)?;
    let mut parts = message.split(',');
    let first = parts.next().unwrap_or_default();
    let answer = if let Some(value) = first.strip_prefix("e=") {
        ServerFinal::Error(value.to_owned())
    } else {
        ServerFinal::Verifier(decode_key(attribute(Some(first), 'v')?, "verifier")?)
    };
    extensions(parts)?;
    Ok(answer)
}

/// `base64(bytes)`.
pub(super) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_round_trip_through_their_escapes() {
        for name in ["user", "a,b", "a=b", "=,=,", "ünï"] {
            assert_eq!(decode_username(&encode_username(name)).unwrap(), name);
        }
        assert!(decode_username("a=2").is_err());
        assert!(decode_username("a=41").is_err());
        assert!(decode_username("").is_err());
    }

    #[test]
    fn a_client_first_message_is_parsed_and_its_variants_refused() {
        let first = parse_client_first("n,,n=user,r=abc").unwrap();
        assert_eq!(first.gs2_header, "n,,");
        assert_eq!(first.bare, "n=user,r=abc");
        assert_eq!(first.username, "user");
        assert_eq!(first.nonce, "abc");
        assert!(parse_client_first("y,,n=user,r=abc,x=ext").is_ok());
        let refusals = [
            (
                "p=tls-unique,,n=user,r=abc",
                ScramError::ChannelBindingNotSupported,
            ),
            ("n,a=admin,n=user,r=abc", ScramError::AuthzidNotSupported),
            ("n,,m=x,n=user,r=abc", ScramError::MandatoryExtension),
            ("n,,n=user,r=abc,m=x", ScramError::MandatoryExtension),
            ("n,,n=user,r=a,bc", ScramError::Malformed("bad extension")),
            (
                "n,,r=abc,n=user",
                ScramError::Malformed("unexpected attribute"),
            ),
            ("n,,n=user", ScramError::Malformed("missing attribute")),
            ("q,,n=user,r=abc", ScramError::Malformed("bad gs2 header")),
            ("n,,n=user,r=", ScramError::Malformed("empty nonce")),
            (
                "n,,n=user,r=a\u{1}",
                ScramError::Malformed("nonce is not printable ASCII"),
            ),
            ("n,,n=us\0er,r=a", ScramError::Malformed("NUL byte")),
        ];
        for (message, error) in refusals {
            assert_eq!(parse_client_first(message), Err(error), "{message}");
        }
        let long = format!("n,,n=user,r={}", "a".repeat(MESSAGE_BYTES_MAX));
        assert!(matches!(
            parse_client_first(&long),
            Err(ScramError::TooLong { .. })
        ));
    }

    #[test]
    fn server_and_final_messages_are_parsed_strictly() {
        let first = parse_server_first("r=abcdef,s=QSXCR+Q6sek8bf92,i=4096").unwrap();
        assert_eq!(first.iterations, 4096);
        assert_eq!(first.salt.len(), 12);
        assert!(parse_server_first("r=abc,s=QSXCR+Q6sek8bf92,i=-1").is_err());
        assert!(parse_server_first("r=abc,s=QSXCR+Q6sek8bf92,i=99999999999").is_err());
        assert!(parse_server_first("r=abc,s=not base64,i=4096").is_err());
        let proof = b64(&[1u8; 32]);
        let last = format!("c=biws,r=abc,p={proof}");
        let parsed = parse_client_final(&last).unwrap();
        assert_eq!(parsed.without_proof, "c=biws,r=abc");
        assert_eq!(parsed.channel_binding, b"n,,");
        assert!(parse_client_final("c=biws,r=abc,p=AAAA").is_err());
        assert!(parse_client_final("c=biws,r=abc").is_err());
        assert_eq!(
            parse_server_final("e=invalid-proof"),
            Ok(ServerFinal::Error("invalid-proof".into()))
        );
        assert_eq!(
            parse_server_final(&format!("v={proof}")),
            Ok(ServerFinal::Verifier([1u8; 32]))
        );
        assert!(parse_server_final("x=1").is_err());
    }
}
