//! A builder for crafted histories: each call appends one event line, the
//! clock advancing 10 ms per line unless set with `at`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use malachi_chaos_checker::{Config, Report, check};
use serde_json::{Value, json};

/// Gates that crafted histories pass: they judge one anomaly, not volume.
pub fn lenient() -> Config {
    Config {
        min_acked: 0,
        min_events: 0,
        recovery_bound_ms: 30_000,
    }
}

#[derive(Debug, Default)]
pub struct History {
    pub t_ms: u64,
    pub lines: Vec<String>,
}

/// The value a write of (key, seq) carries.
pub fn value(key: &str, seq: u64) -> String {
    format!("{key}:{seq}")
}

/// The cursor returned after (key, seq), unique per record.
pub fn cursor(key: &str, seq: u64) -> String {
    format!("cur-{key}-{seq}")
}

impl History {
    pub fn new() -> Self {
        History::default()
    }

    /// Sets the clock for the next line.
    pub fn at(&mut self, t_ms: u64) -> &mut Self {
        self.t_ms = t_ms;
        self
    }

    pub fn event(&mut self, kind: &str, mut fields: Value) -> &mut Self {
        let object = fields.as_object_mut().unwrap();
        object.insert("kind".into(), json!(kind));
        object.insert("t_ms".into(), json!(self.t_ms));
        self.lines.push(fields.to_string());
        self.t_ms += 10;
        self
    }

    pub fn send(&mut self, key: &str, seq: u64) -> &mut Self {
        self.event(
            "produce",
            json!({"client": "p0", "key": key, "seq": seq, "value": value(key, seq)}),
        )
    }

    pub fn ok(&mut self, key: &str, seq: u64) -> &mut Self {
        self.event(
            "produce_ok",
            json!({"client": "p0", "key": key, "seq": seq, "value": value(key, seq)}),
        )
    }

    pub fn fail(&mut self, key: &str, seq: u64) -> &mut Self {
        self.event(
            "produce_fail",
            json!({"client": "p0", "key": key, "seq": seq, "error": "not_leader"}),
        )
    }

    pub fn unknown(&mut self, key: &str, seq: u64) -> &mut Self {
        self.event(
            "produce_unknown",
            json!({"client": "p0", "key": key, "seq": seq, "error": "timeout"}),
        )
    }

    /// A write sent and acknowledged.
    pub fn write(&mut self, key: &str, seq: u64) -> &mut Self {
        self.send(key, seq).ok(key, seq)
    }

    pub fn read(&mut self, consumer: &str, key: &str, seq: u64) -> &mut Self {
        self.read_value(consumer, key, seq, &value(key, seq))
    }

    pub fn read_value(&mut self, consumer: &str, key: &str, seq: u64, value: &str) -> &mut Self {
        self.event(
            "read",
            json!({"consumer": consumer, "key": key, "seq": seq, "value": value,
                   "cursor": cursor(key, seq)}),
        )
    }

    pub fn resume(&mut self, consumer: &str, cursor: &str) -> &mut Self {
        self.event("resume", json!({"consumer": consumer, "cursor": cursor}))
    }

    pub fn final_read(&mut self, consumer: &str) -> &mut Self {
        self.event("final_read", json!({"consumer": consumer}))
    }

    /// The final read of a reader pinned to one broker.
    pub fn final_read_at(&mut self, consumer: &str, broker: &str) -> &mut Self {
        self.event(
            "final_read",
            json!({"consumer": consumer, "broker": broker}),
        )
    }

    pub fn nemesis(&mut self, event: &str, target: &str) -> &mut Self {
        self.event(
            "nemesis",
            json!({"event": event, "target": target, "detail": "crafted"}),
        )
    }

    pub fn heal(&mut self, event: &str) -> &mut Self {
        self.event("heal", json!({"event": event}))
    }

    pub fn reconverged(&mut self, event: &str) -> &mut Self {
        self.event("reconverged", json!({"event": event}))
    }

    /// A `copies` event; each copy is (broker, valid_len, crc32).
    pub fn copies(
        &mut self,
        segment: u64,
        seal_len: u64,
        copies: &[(&str, u64, u32)],
    ) -> &mut Self {
        let digests: serde_json::Map<String, Value> = copies
            .iter()
            .map(|(broker, valid_len, crc32)| {
                (
                    (*broker).to_owned(),
                    json!({"valid_len": valid_len, "crc32": crc32}),
                )
            })
            .collect();
        self.event(
            "copies",
            json!({"topic": "chaos", "segment": segment, "seal_len": seal_len, "digests": digests}),
        )
    }

    pub fn text(&self) -> String {
        let mut text = self.lines.join("\n");
        text.push('\n');
        text
    }

    /// Judges the history with the lenient gates.
    pub fn check(&self) -> Report {
        check(self.text().as_bytes(), &lenient()).unwrap()
    }

    /// The line number (1-based) of the last line appended so far.
    pub fn last_line(&self) -> u64 {
        self.lines.len() as u64
    }
}

/// A clean run: a fault and its heal, two keys written and read live by
/// `live`, a resume by `resumer`, the final read by `final`, intact copies.
pub fn clean() -> History {
    let mut h = History::new();
    h.nemesis("kill", "b2");
    h.write("k1", 1).read("live", "k1", 1);
    h.write("k2", 1).read("live", "k2", 1);
    h.write("k1", 2).read("live", "k1", 2);
    h.heal("kill");
    h.write("k2", 2).read("live", "k2", 2);
    h.reconverged("kill");
    h.read("resumer", "k1", 1).read("resumer", "k2", 1);
    // Resuming after k1 seq 1 rereads what follows it in the log.
    h.resume("resumer", &cursor("k1", 1));
    h.read("resumer", "k2", 1)
        .read("resumer", "k1", 2)
        .read("resumer", "k2", 2);
    for (key, seq) in [("k1", 1), ("k2", 1), ("k1", 2), ("k2", 2)] {
        h.read("final", key, seq);
    }
    h.final_read("final");
    h.copies(
        7,
        4096,
        &[
            ("b1", 4096, 0xdead_beef),
            ("b2", 5000, 0xdead_beef),
            ("b3", 4096, 0xdead_beef),
        ],
    );
    h
}
