use super::*;
use proptest::prelude::*;

const NOW: u64 = 1_800_000_000;

fn key() -> SwimKey {
    SwimKey::from_cookie("a cluster secret")
}

#[test]
fn a_sealed_datagram_opens_once_under_the_same_key() {
    let mut sealer = Sealer::new(&key(), 7, 0xfeed);
    let mut opener = Opener::new(&key());
    let sealed = sealer.seal(NOW, b"ping").unwrap();
    assert_eq!(sealed.len(), 4 + SEAL_OVERHEAD_BYTES);
    assert_eq!(sealed[0], SEAL_MAGIC);
    assert!(
        !sealed.windows(4).any(|w| w == b"ping"),
        "the body is not readable on the wire"
    );
    assert_eq!(opener.open(NOW + 1, &sealed).unwrap(), b"ping");
    assert_eq!(
        opener.open(NOW + 1, &sealed),
        Err(OpenError::Replayed {
            sender: 7,
            counter: 0
        })
    );
}

/// The wire layout (ADR 0147), frozen: magic, sender, session, counter
/// and stamp in the clear (big-endian), then the ciphertext and its tag.
/// A change here is a change of the SWIM wire format.
#[test]
fn the_sealed_layout_is_frozen() {
    let mut sealer = Sealer::new(
        &SwimKey::from_cookie("snapshot cookie"),
        7,
        0x0102_0304_0506_0708,
    );
    let _ = sealer.seal(NOW, b"first").unwrap();
    let sealed = sealer.seal(NOW, b"swim").unwrap();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let (head, body) = sealed.split_at(SEAL_HEADER_BYTES);
    insta::assert_snapshot!(format!(
        "magic   {}\nsender  {}\nsession {}\ncounter {}\nstamp   {}\nbody    {}",
        hex(&head[..1]),
        hex(&head[1..9]),
        hex(&head[9..17]),
        hex(&head[17..21]),
        hex(&head[21..29]),
        hex(body),
    ));
}

#[test]
fn the_key_is_the_cookies_and_never_shown() {
    assert_eq!(key(), SwimKey::from_cookie("a cluster secret"));
    assert_ne!(key(), SwimKey::from_cookie("another secret"));
    assert_eq!(format!("{:?}", key()), "SwimKey(..)");
}

#[test]
fn another_clusters_key_or_a_changed_byte_is_a_forgery() {
    let mut sealer = Sealer::new(&SwimKey::from_cookie("other"), 7, 1);
    let mut opener = Opener::new(&key());
    let sealed = sealer.seal(NOW, b"suspect 3").unwrap();
    assert_eq!(opener.open(NOW, &sealed), Err(OpenError::Forged));
    let mut ours = Sealer::new(&key(), 7, 1);
    let good = ours.seal(NOW, b"suspect 3").unwrap();
    // Every byte, header included, is covered by the tag.
    for at in 1..good.len() {
        let mut changed = good.clone();
        changed[at] ^= 0x01;
        assert!(opener.open(NOW, &changed).is_err(), "byte {at} changed");
    }
    assert_eq!(opener.sessions(), 0, "no forgery is remembered");
    assert_eq!(opener.open(NOW, &good).unwrap(), b"suspect 3");
}

#[test]
fn a_stale_or_early_stamp_is_dropped() {
    let mut sealer = Sealer::new(&key(), 7, 1);
    let mut opener = Opener::new(&key());
    let old = sealer.seal(NOW - SEAL_SKEW_S - 1, b"x").unwrap();
    assert!(matches!(
        opener.open(NOW, &old),
        Err(OpenError::Stale { .. })
    ));
    let early = sealer.seal(NOW + SEAL_SKEW_S + 1, b"x").unwrap();
    assert!(matches!(
        opener.open(NOW, &early),
        Err(OpenError::Stale { .. })
    ));
    let edge = sealer.seal(NOW - SEAL_SKEW_S, b"x").unwrap();
    assert!(opener.open(NOW, &edge).is_ok());
}

#[test]
fn plain_or_short_datagrams_are_not_sealed() {
    let mut opener = Opener::new(&key());
    assert_eq!(
        opener.open(NOW, b"\x01plain foca"),
        Err(OpenError::NotSealed { len: 11 })
    );
    let short = [SEAL_MAGIC; SEAL_OVERHEAD_BYTES - 1];
    assert!(matches!(
        opener.open(NOW, &short),
        Err(OpenError::NotSealed { .. })
    ));
}

#[test]
fn reordered_datagrams_within_the_window_open_and_older_ones_do_not() {
    let mut sealer = Sealer::new(&key(), 3, 9);
    let mut opener = Opener::new(&key());
    let sealed: Vec<Vec<u8>> = (0..100)
        .map(|i| sealer.seal(NOW, &[i as u8]).unwrap())
        .collect();
    // The newest first, then some older ones within the window.
    assert!(opener.open(NOW, &sealed[99]).is_ok());
    assert!(opener.open(NOW, &sealed[98]).is_ok());
    assert!(
        opener
            .open(NOW, &sealed[99 - REPLAY_WINDOW as usize])
            .is_ok()
    );
    assert!(opener.open(NOW, &sealed[98]).is_err(), "a repeat");
    assert!(
        opener
            .open(NOW, &sealed[98 - REPLAY_WINDOW as usize])
            .is_err(),
        "older than the window"
    );
}

#[test]
fn a_spent_session_refuses_until_renewed() {
    let mut sealer = Sealer::new(&key(), 3, 9);
    sealer.counter = u32::MAX;
    assert_eq!(sealer.seal(NOW, b"x"), Err(SealError::SessionSpent));
    sealer.renew(10);
    let mut opener = Opener::new(&key());
    assert!(opener.open(NOW, &sealer.seal(NOW, b"x").unwrap()).is_ok());
}

#[test]
fn the_sessions_tracked_are_bounded() {
    let mut opener = Opener::new(&key());
    for session in 0..(SEAL_SESSIONS_MAX as u64 + 10) {
        let mut sealer = Sealer::new(&key(), 1, session);
        assert!(opener.open(NOW, &sealer.seal(NOW, b"x").unwrap()).is_ok());
    }
    assert_eq!(opener.sessions(), SEAL_SESSIONS_MAX);
}

#[test]
fn the_modes_step_from_plain_to_sealed() {
    use SealMode::*;
    let table: Vec<(bool, bool, bool)> = [Off, Accept, Send, Required]
        .iter()
        .map(|m| (m.sends_sealed(), m.accepts_plain(), m.accepts_sealed()))
        .collect();
    assert_eq!(
        table,
        vec![
            (false, true, false),
            (false, true, true),
            (true, true, true),
            (true, false, true),
        ]
    );
    assert_eq!(SealMode::default(), Required);
}

proptest! {
    /// Whatever order a session's datagrams arrive in, each opens at most
    /// once, and every one within the window of the newest seen opens.
    #[test]
    fn each_counter_opens_at_most_once(order in proptest::collection::vec(0u32..200, 1..400)) {
        let mut window = Window { highest: order[0], below: 0, heard_at_s: 0 };
        let mut taken = std::collections::BTreeSet::from([order[0]]);
        for &c in &order[1..] {
            let highest = window.highest;
            let fresh = window.take(c, 0);
            if fresh {
                prop_assert!(taken.insert(c), "counter {c} opened twice");
            } else {
                prop_assert!(taken.contains(&c) || c + REPLAY_WINDOW < highest, "{c} refused below {highest}");
            }
        }
    }

    /// Garbage never panics the opener and never opens.
    #[test]
    fn garbage_never_opens(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut opener = Opener::new(&key());
        prop_assert!(opener.open(NOW, &bytes).is_err());
    }
}
