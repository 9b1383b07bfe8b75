//! Keyed record sequences: the input a keyed writer feeds a producer, and
//! the per-key order checker that reads them back (each key's values 0, 1,
//! 2, ... in order, each once: no loss, duplicate or reordering).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::wait::wait_until_blocking;

/// Input line `i` (0-based) of a keyed sequence over `keys` keys:
/// `k<i % keys>\t<i / keys>\n`.
pub fn keyed_line(i: u64, keys: u64) -> String {
    format!("k{}\t{}\n", i % keys, i / keys)
}

/// The records are input lines `0..lines` of a keyed sequence over `keys`
/// keys: under each key, its values 0, 1, 2, ... in order, each once.
pub fn assert_keyed_sequences(records: &[(String, String)], keys: u64, lines: u64) {
    let mut next: HashMap<&str, u64> = HashMap::new();
    for (at, (key, value)) in records.iter().enumerate() {
        let expected = next.entry(key.as_str()).or_default();
        let got: u64 = value.parse().unwrap_or_else(|_| panic!("value {value:?}"));
        assert_eq!(
            got, *expected,
            "record {at}: key {key} has {got} where {expected} comes next (a duplicate, gap or reordering)"
        );
        *expected += 1;
    }
    for k in 0..keys {
        let per_key = lines / keys + u64::from(k < lines % keys);
        let key = format!("k{k}");
        assert_eq!(
            next.get(key.as_str()).copied().unwrap_or(0),
            per_key,
            "records read under {key}"
        );
    }
    assert_eq!(records.len() as u64, lines, "records read in all");
}

/// Values grouped by key, each key's in the order they were read: two
/// reads hold the same records in the same per-key order when their maps
/// are equal (the order across keys is free).
pub fn by_key<K: Ord, V>(records: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, Vec<V>> {
    let mut map = BTreeMap::<K, Vec<V>>::new();
    for (key, value) in records {
        map.entry(key).or_default().push(value);
    }
    map
}

/// A thread writing lines `0..lines` (as `line(i)` makes them) to a
/// producer's stdin in chunks of `chunk`, counting what it has written so
/// a test can wait for a point of the input (to kill a broker there).
#[derive(Debug)]
pub struct KeyedWriter {
    written: Arc<AtomicU64>,
    lines: u64,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl KeyedWriter {
    /// Starts writing. `pace` is slept between chunks: it spreads the input
    /// over the faults the test injects (pacing, not synchronisation). A
    /// failed write (the producer stopped) ends the writer; it counts every
    /// line as written so no wait on it hangs, and [`KeyedWriter::join`]
    /// returns the error. Dropping `stdin` at the end ends the input.
    pub fn spawn<W, L>(mut stdin: W, lines: u64, chunk: u64, pace: Duration, line: L) -> KeyedWriter
    where
        W: Write + Send + 'static,
        L: Fn(u64) -> String + Send + 'static,
    {
        let written = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&written);
        let thread = std::thread::spawn(move || {
            let mut i = 0;
            while i < lines {
                let end = (i + chunk).min(lines);
                let text: String = (i..end).map(&line).collect();
                if let Err(e) = stdin
                    .write_all(text.as_bytes())
                    .and_then(|()| stdin.flush())
                {
                    counter.store(lines, Ordering::Relaxed);
                    return Err(e);
                }
                i = end;
                counter.store(i, Ordering::Relaxed);
                std::thread::sleep(pace);
            }
            Ok(lines)
        });
        KeyedWriter {
            written,
            lines,
            thread,
        }
    }

    /// How many lines were written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// A handle on the count, for a wait over several writers.
    pub fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.written)
    }

    /// Blocks until at least `n` lines were written (or the writer ended);
    /// returns how many were.
    pub fn wait_written(&self, n: u64) -> u64 {
        let what = format!("{n} of {} lines are written", self.lines);
        wait_until_blocking(
            &what,
            Duration::from_secs(120),
            Duration::from_millis(2),
            || {
                let now = self.written();
                if now >= n { Ok(now) } else { Err(now) }
            },
        )
    }

    /// Waits for the writer to end: the lines written, or the write error
    /// that stopped it.
    pub fn join(self) -> std::io::Result<u64> {
        match self.thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(lines: impl Iterator<Item = u64>, keys: u64) -> Vec<(String, String)> {
        lines
            .map(|i| {
                let line = keyed_line(i, keys);
                let (key, value) = line.trim_end().split_once('\t').unwrap();
                (key.to_owned(), value.to_owned())
            })
            .collect()
    }

    #[test]
    fn the_checker_takes_any_interleaving_of_keys_and_refuses_a_key_out_of_order() {
        // Keys interleave freely: every k0, then every k1, then every k2.
        let mut by_key_order = read_back(0..10, 3);
        by_key_order.sort_by(|a, b| a.0.cmp(&b.0));
        assert_keyed_sequences(&by_key_order, 3, 10);
        // Within a key, order is kept: k1's first record moved to the end.
        let mut records = read_back(0..10, 3);
        let first_k1 = records.remove(1);
        records.push(first_k1);
        let result = std::panic::catch_unwind(|| assert_keyed_sequences(&records, 3, 10));
        assert!(result.is_err(), "k1 out of order was accepted");
    }

    #[test]
    fn the_checker_refuses_a_duplicate_and_a_loss() {
        let mut duplicated = read_back(0..10, 3);
        duplicated.insert(4, duplicated[3].clone());
        assert!(std::panic::catch_unwind(|| assert_keyed_sequences(&duplicated, 3, 10)).is_err());
        let lost = read_back(0..9, 3);
        assert!(std::panic::catch_unwind(|| assert_keyed_sequences(&lost, 3, 10)).is_err());
    }

    #[test]
    fn the_writer_writes_every_line_in_chunks_and_counts_them() {
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = KeyedWriter::spawn(sink.clone(), 100, 7, Duration::ZERO, |i| keyed_line(i, 4));
        assert!(writer.wait_written(50) >= 50);
        assert_eq!(writer.join().unwrap(), 100);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let expected: String = (0..100).map(|i| keyed_line(i, 4)).collect();
        assert_eq!(text, expected);
    }
}
