//! SWIM datagrams sealed with the cluster's key (issue 39, ADR 0147).
//!
//! Without this, any host that reaches a broker's UDP port can declare
//! brokers dead or gossip attributes (`malachi.storage=full`) that steer
//! placement and failover. Each datagram is sealed with ChaCha20-Poly1305
//! under a 256-bit key every broker of the cluster derives from the
//! cluster cookie (HKDF-SHA256), so only a holder of the cookie can send
//! one a broker accepts, and nobody else can read one.
//!
//! A sealed datagram is `[magic][sender][session][counter][sent_at_s]`
//! (1 + 8 + 8 + 4 + 8 bytes, big-endian), then the ciphertext and its
//! 16-byte tag. The header is the AEAD's associated data, so none of it
//! can be changed in flight. The nonce is `session ‖ counter`: a session
//! is 64 random bits drawn when a sender starts (and again before its
//! counter would wrap), so a nonce never repeats under the key.
//!
//! Replays are refused twice over: a datagram stamped more than
//! [`SEAL_SKEW_S`] from the receiver's clock is dropped, and within that,
//! each (sender, session) keeps a window of the last [`REPLAY_WINDOW`]
//! counters it accepted (as IPsec's anti-replay window does). Only a
//! datagram that authenticated touches that state, so a forger cannot
//! fill it; it is bounded anyway ([`SEAL_SESSIONS_MAX`]).
//!
//! Pure: the caller gives the time and the session's randomness.

use std::collections::BTreeMap;

use aws_lc_rs::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf;

/// The first byte of a sealed datagram. foca's own datagrams (postcard)
/// start with a small varint; a plain one that happens to start with this
/// byte fails to open and is then read as plain if plain ones are
/// accepted.
pub const SEAL_MAGIC: u8 = 0xA7;
/// Header bytes before the ciphertext.
pub const SEAL_HEADER_BYTES: usize = 1 + 8 + 8 + 4 + 8;
/// The AEAD tag after it.
pub const SEAL_TAG_BYTES: usize = 16;
/// What sealing adds to a datagram: a sealed one is at most the
/// settings' `packet_bytes_max` plus this.
pub const SEAL_OVERHEAD_BYTES: usize = SEAL_HEADER_BYTES + SEAL_TAG_BYTES;
/// A datagram stamped further than this from the receiver's clock, either
/// way, is dropped: the bound on how long a captured datagram can be
/// replayed into a session the receiver no longer tracks.
pub const SEAL_SKEW_S: u64 = 120;
/// (sender, session) pairs tracked at once. Only authenticated datagrams
/// add one; past the bound the least recently heard is forgotten.
pub const SEAL_SESSIONS_MAX: usize = 4096;
/// Counters remembered per session below its highest.
pub const REPLAY_WINDOW: u32 = 64;

/// The cluster's SWIM key. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SwimKey([u8; 32]);

impl std::fmt::Debug for SwimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwimKey(..)")
    }
}

struct KeyLen;

impl hkdf::KeyType for KeyLen {
    fn len(&self) -> usize {
        32
    }
}

impl SwimKey {
    /// The key every broker with `cookie` derives: HKDF-SHA256 of the
    /// cookie, salted and labelled for this use only.
    pub fn from_cookie(cookie: &str) -> SwimKey {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"malachi swim seal v1");
        let prk = salt.extract(cookie.as_bytes());
        let mut key = [0u8; 32];
        let info: [&[u8]; 1] = [b"swim datagrams"];
        // Expanding 32 bytes from SHA-256 cannot fail (the limit is 8 160).
        if let Ok(okm) = prk.expand(&info, KeyLen) {
            let _ = okm.fill(&mut key);
        }
        SwimKey(key)
    }

    fn aead(&self) -> LessSafeKey {
        // A 32-byte key is ChaCha20-Poly1305's length: this cannot fail.
        match UnboundKey::new(&CHACHA20_POLY1305, &self.0) {
            Ok(key) => LessSafeKey::new(key),
            Err(_) => unreachable!("a 32-byte key fits ChaCha20-Poly1305"),
        }
    }
}

/// How a broker treats SWIM datagrams (`membership.swim_seal`). The
/// default seals and accepts only sealed ones; the two steps between let
/// a cluster from before sealing move to it without a stop (ADR 0147).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SealMode {
    /// Send plain, accept only plain: as before sealing (unsafe).
    Off,
    /// Send plain, accept both: step 1 of moving to sealing.
    Accept,
    /// Send sealed, accept both: step 2.
    Send,
    /// Send sealed, accept only sealed.
    #[default]
    Required,
}

impl SealMode {
    pub fn sends_sealed(self) -> bool {
        matches!(self, SealMode::Send | SealMode::Required)
    }
    pub fn accepts_plain(self) -> bool {
        !matches!(self, SealMode::Required)
    }
    pub fn accepts_sealed(self) -> bool {
        !matches!(self, SealMode::Off)
    }
}

/// What the runtime seals with: the key and the mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealSettings {
    pub key: SwimKey,
    pub mode: SealMode,
}

/// Why a datagram was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("not a sealed datagram ({len} bytes)")]
    NotSealed { len: usize },
    #[error("the datagram did not authenticate (wrong key, or changed in flight)")]
    Forged,
    #[error("stamped {sent_at_s} s, {skew_s} s from this broker's clock (at most {SEAL_SKEW_S})")]
    Stale { sent_at_s: u64, skew_s: u64 },
    #[error("counter {counter} of sender {sender}'s session was seen already, or is too old")]
    Replayed { sender: u64, counter: u32 },
}

/// Why a datagram could not be sealed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The session's counter is spent: start a new session.
    #[error("the session's counter is spent")]
    SessionSpent,
}

/// Seals this broker's datagrams.
pub struct Sealer {
    key: LessSafeKey,
    sender: u64,
    session: u64,
    counter: u32,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("sender", &self.sender)
            .field("session", &self.session)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer for `sender` starting a session (64 random bits).
    pub fn new(key: &SwimKey, sender: u64, session: u64) -> Sealer {
        Sealer {
            key: key.aead(),
            sender,
            session,
            counter: 0,
        }
    }

    /// Starts a new session (the caller draws its bits).
    pub fn renew(&mut self, session: u64) {
        assert_ne!(session, self.session, "a new session has new bits");
        self.session = session;
        self.counter = 0;
    }

    /// `plain` sealed, stamped `now_s` (seconds since the Unix epoch).
    pub fn seal(&mut self, now_s: u64, plain: &[u8]) -> Result<Vec<u8>, SealError> {
        let counter = self.counter;
        self.counter = counter.checked_add(1).ok_or(SealError::SessionSpent)?;
        let header = header(self.sender, self.session, counter, now_s);
        let mut out = Vec::with_capacity(SEAL_OVERHEAD_BYTES + plain.len());
        out.extend_from_slice(&header);
        let mut body = plain.to_vec();
        let sealed = self.key.seal_in_place_append_tag(
            nonce(self.session, counter),
            Aad::from(&header),
            &mut body,
        );
        // Sealing fails only for a body longer than the cipher allows
        // (256 GiB), far above any datagram.
        assert!(sealed.is_ok(), "a datagram-sized body always seals");
        out.extend_from_slice(&body);
        debug_assert_eq!(out.len(), plain.len() + SEAL_OVERHEAD_BYTES);
        Ok(out)
    }
}

/// The last [`REPLAY_WINDOW`] counters of one session: `highest` and a
/// bitmap of those below it (bit `i` is `highest - 1 - i`).
#[derive(Debug, Clone, Copy)]
struct Window {
    highest: u32,
    below: u64,
    heard_at_s: u64,
}

impl Window {
    /// Takes `counter` if it is new; `false` for a repeat or one older than
    /// the window.
    fn take(&mut self, counter: u32, now_s: u64) -> bool {
        let fresh = if counter > self.highest {
            let shift = counter - self.highest;
            // The old highest becomes bit `shift - 1`; what falls past
            // bit 63 is older than the window.
            self.below = match shift {
                1..=63 => (self.below << shift) | (1 << (shift - 1)),
                64 => 1 << 63,
                _ => 0,
            };
            self.highest = counter;
            true
        } else if counter == self.highest {
            false
        } else {
            let back = self.highest - counter;
            if back > REPLAY_WINDOW {
                false
            } else {
                let bit = 1u64 << (back - 1);
                let new = self.below & bit == 0;
                self.below |= bit;
                new
            }
        };
        if fresh {
            self.heard_at_s = now_s;
        }
        fresh
    }
}

/// Opens the datagrams a broker receives, refusing forgeries and replays.
pub struct Opener {
    key: LessSafeKey,
    sessions: BTreeMap<(u64, u64), Window>,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Opener {
    pub fn new(key: &SwimKey) -> Opener {
        Opener {
            key: key.aead(),
            sessions: BTreeMap::new(),
        }
    }

    /// The plain datagram inside `datagram`, received at `now_s`.
    pub fn open(&mut self, now_s: u64, datagram: &[u8]) -> Result<Vec<u8>, OpenError> {
        let len = datagram.len();
        if len < SEAL_OVERHEAD_BYTES || datagram[0] != SEAL_MAGIC {
            return Err(OpenError::NotSealed { len });
        }
        let (head, body) = datagram.split_at(SEAL_HEADER_BYTES);
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let (sender, session, sent_at_s) = (word(1), word(9), word(21));
        let counter = u32::from_be_bytes([head[17], head[18], head[19], head[20]]);
        let skew_s = now_s.abs_diff(sent_at_s);
        if skew_s > SEAL_SKEW_S {
            return Err(OpenError::Stale { sent_at_s, skew_s });
        }
        let mut plain = body.to_vec();
        let opened = self
            .key
            .open_in_place(nonce(session, counter), Aad::from(head), &mut plain)
            .map_err(|_| OpenError::Forged)?;
        let opened_len = opened.len();
        plain.truncate(opened_len);
        if !self.take(sender, session, counter, now_s) {
            return Err(OpenError::Replayed { sender, counter });
        }
        Ok(plain)
    }

    /// Records `counter` of (sender, session) if it is new.
    fn take(&mut self, sender: u64, session: u64, counter: u32, now_s: u64) -> bool {
        if let Some(window) = self.sessions.get_mut(&(sender, session)) {
            return window.take(counter, now_s);
        }
        if self.sessions.len() >= SEAL_SESSIONS_MAX {
            self.forget_oldest(now_s);
        }
        let window = Window {
            highest: counter,
            below: 0,
            heard_at_s: now_s,
        };
        self.sessions.insert((sender, session), window);
        debug_assert!(self.sessions.len() <= SEAL_SESSIONS_MAX);
        true
    }

    /// Forgets every session not heard within twice the skew (their
    /// datagrams are stale anyway), or else the least recently heard one.
    fn forget_oldest(&mut self, now_s: u64) {
        self.sessions
            .retain(|_, w| now_s.saturating_sub(w.heard_at_s) <= 2 * SEAL_SKEW_S);
        if self.sessions.len() >= SEAL_SESSIONS_MAX {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, w)| w.heard_at_s)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.sessions.remove(&oldest);
            }
        }
    }

    /// Sessions tracked now.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

fn header(sender: u64, session: u64, counter: u32, sent_at_s: u64) -> [u8; SEAL_HEADER_BYTES] {
    let mut h = [0u8; SEAL_HEADER_BYTES];
    h[0] = SEAL_MAGIC;
    h[1..9].copy_from_slice(&sender.to_be_bytes());
    h[9..17].copy_from_slice(&session.to_be_bytes());
    h[17..21].copy_from_slice(&counter.to_be_bytes());
    h[21..29].copy_from_slice(&sent_at_s.to_be_bytes());
    h
}

fn nonce(session: u64, counter: u32) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&session.to_be_bytes());
    n[8..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

#[cfg(test)]
mod tests;
