//! The chaos certification's judge: it reads the history of one chaos run
//! and says whether the brokers kept their promises, with one test per
//! anomaly it claims to find (issue 20). It drives nothing itself; the
//! harness that starts brokers, injects faults and logs the history is a
//! separate piece of `chaos/`.
//!
//! The checker streams the history: it reads one line at a time into one
//! buffer and keeps a few words per write, per pass and key, and per
//! distinct cursor (values and cursors as 64-bit digests), never the file's
//! text. Every anomaly is decided at the line that shows it, or at the end of
//! the history for what only the end can show.
//!
//! # The history
//!
//! JSON Lines: one event per line, each an object with `kind` and `t_ms`
//! (the harness's monotonic clock, milliseconds since the run started).
//! Blank lines are skipped; fields the checker does not know are ignored.
//!
//! **The lines are in the order things happened.** `t_ms` never decreases
//! from one line to the next, and an event the harness observed before
//! another is on an earlier line. The rules below say "before" for "on an
//! earlier line", so events in the same millisecond are still ordered. The
//! harness gets this by stamping and writing each event under one lock.
//!
//! | kind | fields | meaning |
//! | --- | --- | --- |
//! | `produce` | `client`, `key`, `seq`, `value` | a producer sent a write of `value` (e.g. `"key:seq"`) under `key`; its identity is (`key`, `seq`) |
//! | `produce_ok` | `client`, `key`, `seq`, `value` | the write was acknowledged: durable, never to be lost; `value` is the one sent |
//! | `produce_fail` | `client`, `key`, `seq`, `error` | the write definitely did not happen: only for errors that guarantee it was not applied |
//! | `produce_unknown` | `client`, `key`, `seq`, `error` | a timeout or a lost connection: the write may or may not have landed |
//! | `read` | `consumer`, `key`, `seq`, `value`, `cursor` | a consumer was delivered a record; `cursor` is the opaque cursor the broker returned after it (the batch's `next_cursor`) |
//! | `resume` | `consumer`, `cursor` | the consumer restarts from a cursor it saved earlier |
//! | `final_read` | `consumer`, `broker` (optional) | the consumer's read from the start reached the end of the log; `broker` is where a reader pinned to one broker started |
//! | `copies` | `topic`, `segment`, `seal_len`, `digests` | the end-of-run look at every copy of one sealed segment: `digests` maps each broker that should hold a copy to `{valid_len, crc32}`, the copy's valid bytes and the CRC-32 (IEEE) of its first `min(valid_len, seal_len)` bytes; a missing copy is listed with `valid_len` 0 |
//! | `nemesis` | `event`, `target`, `detail` (optional) | a fault starts: `event` is its kind (`kill`, `pause`, `partition`, ...), `target` what it hits |
//! | `heal` | `event` | the oldest open fault of that kind is healed |
//! | `reconverged` | `event` | optional: the cluster reconverged after the oldest heal of that kind still waiting for it |
//!
//! The workload's contract, which a history breaking it fails as bad input:
//! every write is sent once, with a `produce` line before its outcome; it
//! gets at most one outcome; a key's seqs are sent increasing (one producer
//! per key; a retry that may land twice gets a new seq); `produce_ok`
//! repeats the value sent. The run writes one topic and retention deletes
//! nothing during it. A consumer's first pass starts at the start of the
//! log, and `final_read` ends such a pass
//! (with no read before it, a read from the start that found nothing); after
//! it the consumer reads again only after a `resume`. A `heal` or
//! `reconverged` needs an open fault or a waiting heal of its kind.
//!
//! # Passes
//!
//! A consumer reads in passes: pass 0 from the start of the log, opened by
//! its first read; each `resume` ends the current pass and opens the next,
//! from the cursor. A resumed pass legitimately rereads what came after its
//! cursor, so repeats and order are judged within a pass, never across.
//!
//! # Anomalies
//!
//! Write A *must precede* write B of the same key when A was acknowledged
//! before B was sent: the log is linearizable, so A sits before B in it.
//! Writes that overlapped (B sent before A's acknowledgement, or A's outcome
//! unknown) may land in either order, and the checker demands nothing of
//! them.
//!
//! 1. **`lost`**: at a `final_read`, every write acknowledged before it must
//!    have been delivered in that consumer's pass. One anomaly per write,
//!    naming every final reader that missed it. The harness stops the
//!    producers and reads to the end of the log before logging `final_read`.
//! 2. **`duplicate`**: a (key, seq) delivered twice within one pass.
//! 3. **`order_broken`**: within a pass, for records of one key:
//!    - *late*: record A is delivered after record B although A must precede
//!      B. (With one write in flight per key this is exactly "seq decreased
//!      within a pass"; pipelined writes that overlapped may arrive in
//!      either order.)
//!    - *skipped*: the pass delivered X and then B, with nothing of the key
//!      in between, and an A that must follow X and precede B was never
//!      delivered in the pass. X is the pass's previous record of the key;
//!      in pass 0 "the start of the log" stands for X (everything must
//!      follow it), and in a resumed pass the cursor's record of the key
//!      does. X must precede A is required because a record of unknown
//!      outcome may land late. A gap that is filled later in the pass is
//!      reported once, as late; in a final read a gap never filled is the
//!      write's `lost` anomaly, not also an order one.
//! 4. **`never_written`**: a delivered (key, seq, value) that no `produce`
//!    sent, whatever its outcome: either (key, seq) was never sent
//!    (`seq_was_written` false) or it was sent with another value.
//! 5. **`read_of_failed_write`**: a delivered record whose write got
//!    `produce_fail`, in either order of the two lines.
//! 6. **`cursor_backwards`**: a cursor comes after every record read with
//!    it. After a `resume` from cursor C, a delivery of (key, seq) that
//!    precedes C redelivers it: one the pass that was given C delivered
//!    before it (up to its last read carrying C), or one that preceded the
//!    cursor that pass resumed from. A lower seq than one read with C is not
//!    enough: a record of unknown outcome may land after higher seqs of its
//!    key (a failed session's batch applied late), and then rightly follows
//!    a cursor given before it landed. A resume from a cursor no read
//!    carried sets no floor and is counted in the report.
//! 7. **`copies_diverge`**: in a `copies` event, the copies with `valid_len
//!    >= seal_len` (full copies) do not all have the same `crc32`.
//! 8. **`short_copy`**: in a `copies` event, a copy with `valid_len <
//!    seal_len`. The event is the end-of-run look, after every heal and
//!    reconvergence, so a copy still short is one healing failed to refill.
//! 9. **`slow_recovery`**: after a `heal`, the first `produce_ok` (of any
//!    client) comes more than `recovery_bound_ms` later, or never. The
//!    harness keeps producing after the last heal.
//! 10. **`read_differs_by_broker`**: at the end of the history, a final
//!     read's pass lacks a (key, seq) that another final read's pass
//!     delivered, acknowledged or not. The producers stop and drain before
//!     the first final read, so every final reader reads one log to its
//!     end, whichever broker it started at (the harness pins one reader to
//!     each broker): a reader that found "the end" short of another is one
//!     anomaly, naming how many records it lacks, how many of them were
//!     acknowledged (each of those is also `lost`), a few of them, and the
//!     readers that delivered them. A record nothing showed in the log
//!     before the short reader's end (neither acknowledged nor delivered to
//!     anyone) is not counted: a write of unknown outcome may be committed
//!     after that reader's last poll (a slow quorum, a failover's seal).
//!
//! One delivery yields at most one position anomaly, tried in the order
//! cursor, duplicate, order; `never_written` and `read_of_failed_write`
//! judge its value and stand apart. A delivery whose (key, seq) was never
//! sent has no place in the key's order and is judged on its value only.
//!
//! # Vacuity
//!
//! A run with no anomaly is still not clean if it did too little: fewer than
//! `min_acked` acknowledged writes, fewer than `min_events` nemesis events,
//! or no `final_read` (so no write could be judged lost). Its verdict is
//! `vacuous`. Anomalies outrank vacuity: a run that found a bug is
//! `anomalous` however little it did.
//!
//! # Entry points
//!
//! [`check_path`] and [`check`] judge a file or a reader; [`Checker`] takes
//! lines or events one at a time. The [`Report`] serializes to the results
//! JSON and prints as a summary table. The `malachi-chaos-check` binary
//! exits 0 clean, 1 anomalous, 2 vacuous, 3 when the history (or the command
//! line) cannot be judged or the results cannot be written.

mod anomaly;
mod check;
mod error;
mod event;
mod report;
mod seqset;

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

pub use anomaly::Anomaly;
pub use check::{Checker, check};
pub use error::CheckError;
pub use event::{CopyDigest, Event};
pub use report::{
    Config, FinalRead, MIN_ACKED_DEFAULT, MIN_EVENTS_DEFAULT, RECOVERY_BOUND_MS_DEFAULT, Recovery,
    Report, Vacuity, Verdict, WriteCounts,
};

/// Checks the history in the file at `path`.
pub fn check_path(path: &Path, config: &Config) -> Result<Report, CheckError> {
    let file = File::open(path).map_err(|source| CheckError::Open {
        path: path.to_owned(),
        source,
    })?;
    check(BufReader::new(file), config)
}
