//! The figures of `malachi bench scale` and their rendering: one row per
//! broker count and round, then the ratio of the largest count's
//! throughput to the smallest's, each round's and their median. Pure: the
//! snapshot test below pins the text.

use serde::Serialize;

/// What one broker count measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ScaleRow {
    /// Which pass over the counts (from 1, `--rounds`).
    pub round: u32,
    pub brokers: u64,
    pub ranges: usize,
    /// Active primaries per broker, node 1 first, before the load.
    pub primaries_per_broker: Vec<usize>,
    pub producers: usize,
    pub value_bytes: usize,
    pub seconds: f64,
    pub records: u64,
    pub records_per_s: f64,
    /// Record value bytes only, 10^6 a megabyte.
    pub mb_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub errors: u64,
    /// Each broker's CPU over the measurement, in percent of one core.
    pub broker_cpu_percent: Vec<f64>,
    /// The share of CFS periods in which the brokers were throttled (all
    /// brokers together); `None` without cgroups.
    pub throttled_share: Option<f64>,
    /// The bench process's own CPU, in percent of one core.
    pub bench_cpu_percent: f64,
}

/// The caps every broker ran under, and the run's conclusion.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ScaleSummary {
    /// `None` with `--no-cgroups`.
    pub cpu_millis_per_broker: Option<u64>,
    /// `None` when the disk was not capped.
    pub write_bytes_per_second_per_broker: Option<u64>,
    /// Why the disk was not capped, when it was asked for.
    pub disk_note: Option<String>,
    pub brokers_min: u64,
    pub brokers_max: u64,
    /// records/s at the largest count over records/s at the smallest: the
    /// median of `round_ratios`.
    pub ratio: Option<f64>,
    /// That ratio in each round, in round order.
    pub round_ratios: Vec<f64>,
}

/// The ratio of the row with the most brokers to the one with the fewest.
pub fn ratio(rows: &[ScaleRow]) -> Option<f64> {
    let min = rows.iter().min_by_key(|r| r.brokers)?;
    let max = rows.iter().max_by_key(|r| r.brokers)?;
    (min.records_per_s > 0.0 && min.brokers != max.brokers)
        .then(|| max.records_per_s / min.records_per_s)
}

/// Each round's [`ratio`], in round order (rounds without one left out).
pub fn round_ratios(rows: &[ScaleRow]) -> Vec<f64> {
    let mut rounds: Vec<u32> = rows.iter().map(|r| r.round).collect();
    rounds.sort_unstable();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| {
            let of_round: Vec<ScaleRow> =
                rows.iter().filter(|r| r.round == round).cloned().collect();
            ratio(&of_round)
        })
        .collect()
}

/// The median (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[mid]),
        _ => Some((sorted[mid - 1] + sorted[mid]) / 2.0),
    }
}

/// The caps line printed before the runs.
pub fn caps_text(summary: &ScaleSummary) -> String {
    let cpu = summary.cpu_millis_per_broker.map_or_else(
        || "no CPU cap (--no-cgroups)".to_owned(),
        |m| format!("{m} millicores of CPU"),
    );
    let disk = match (
        summary.write_bytes_per_second_per_broker,
        &summary.disk_note,
    ) {
        (Some(bps), _) => format!("{:.1} MB/s of disk writes", bps as f64 / 1e6),
        (None, Some(note)) => format!("no disk cap: {note}"),
        (None, None) => "no disk cap".to_owned(),
    };
    format!("each broker: {cpu}, {disk}")
}

/// One row as text: throughput, latency, where the primaries were and
/// where the CPU went.
pub fn row_text(row: &ScaleRow) -> String {
    let primaries: Vec<String> = row
        .primaries_per_broker
        .iter()
        .map(ToString::to_string)
        .collect();
    let cpu: Vec<String> = row
        .broker_cpu_percent
        .iter()
        .map(|c| format!("{c:.0}"))
        .collect();
    let mut line = format!(
        "{}{} brokers, {} ranges (primaries {}): {:.0} records/s, {:.1} MB/s over {:.1} s, p50 {} us, p99 {} us; broker CPU % [{}]",
        if row.round > 1 {
            format!("round {}: ", row.round)
        } else {
            String::new()
        },
        row.brokers,
        row.ranges,
        primaries.join("/"),
        row.records_per_s,
        row.mb_per_s,
        row.seconds,
        row.p50_us,
        row.p99_us,
        cpu.join(" "),
    );
    if let Some(share) = row.throttled_share {
        line.push_str(&format!(", throttled {:.0}% of periods", share * 100.0));
    }
    line.push_str(&format!("; bench process {:.0}%", row.bench_cpu_percent));
    if row.errors > 0 {
        line.push_str(&format!("; {} errors", row.errors));
    }
    line
}

/// The whole report: the caps, each row, and the ratio.
pub fn render_text(summary: &ScaleSummary, rows: &[ScaleRow]) -> String {
    let mut text = caps_text(summary);
    text.push('\n');
    for row in rows {
        text.push_str(&row_text(row));
        text.push('\n');
    }
    text.push_str(&ratio_text(summary));
    text.push('\n');
    text
}

/// The conclusion line.
pub fn ratio_text(summary: &ScaleSummary) -> String {
    let Some(ratio) = summary.ratio else {
        return "no ratio: one broker count, or nothing acknowledged".to_owned();
    };
    let mut text = format!(
        "{} brokers / {} brokers: {ratio:.2}x the records/s",
        summary.brokers_max, summary.brokers_min
    );
    if summary.round_ratios.len() > 1 {
        let each: Vec<String> = summary
            .round_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect();
        text.push_str(&format!(
            " (median of {} rounds: {})",
            each.len(),
            each.join(", ")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(brokers: u64, records_per_s: f64) -> ScaleRow {
        let n = usize::try_from(brokers).unwrap_or(0);
        ScaleRow {
            round: 1,
            brokers,
            ranges: 12,
            primaries_per_broker: (0..n).map(|i| 12 / n + usize::from(i < 12 % n)).collect(),
            producers: 16,
            value_bytes: 1024,
            seconds: 20.0,
            records: (records_per_s * 20.0) as u64,
            records_per_s,
            mb_per_s: records_per_s * 1024.0 / 1e6,
            p50_us: 21_000,
            p99_us: 64_000,
            errors: 0,
            broker_cpu_percent: vec![24.6; n],
            throttled_share: Some(0.93),
            bench_cpu_percent: 61.0,
        }
    }

    #[test]
    fn the_ratio_is_the_largest_count_over_the_smallest() {
        let rows = [row(6, 40_000.0), row(3, 20_000.0)];
        assert_eq!(ratio(&rows), Some(2.0));
        assert_eq!(ratio(&rows[..1]), None);
        assert_eq!(ratio(&[]), None);
    }

    #[test]
    fn the_report_shows_caps_rows_and_ratio() {
        let rows = vec![row(3, 20_000.0), row(6, 37_000.0)];
        let summary = ScaleSummary {
            cpu_millis_per_broker: Some(250),
            write_bytes_per_second_per_broker: Some(16_000_000),
            disk_note: None,
            brokers_min: 3,
            brokers_max: 6,
            ratio: ratio(&rows),
            round_ratios: round_ratios(&rows),
        };
        insta::assert_snapshot!(render_text(&summary, &rows));
    }

    #[test]
    fn rounds_alternate_and_the_ratio_is_their_median() {
        let mut rows = Vec::new();
        for (round, (three, six)) in [
            (20_000.0, 36_000.0),
            (18_000.0, 40_000.0),
            (20_000.0, 30_000.0),
        ]
        .into_iter()
        .enumerate()
        {
            for mut r in [row(3, three), row(6, six)] {
                r.round = round as u32 + 1;
                rows.push(r);
            }
        }
        let ratios = round_ratios(&rows);
        assert_eq!(ratios.len(), 3);
        assert!((ratios[1] - 40.0 / 18.0).abs() < 1e-9);
        assert_eq!(median(&ratios), Some(1.8));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
        assert_eq!(median(&[]), None);
        let summary = ScaleSummary {
            cpu_millis_per_broker: Some(100),
            write_bytes_per_second_per_broker: None,
            disk_note: None,
            brokers_min: 3,
            brokers_max: 6,
            ratio: median(&ratios),
            round_ratios: ratios,
        };
        insta::assert_snapshot!(render_text(&summary, &rows));
    }

    #[test]
    fn the_report_says_why_the_disk_was_not_capped() {
        let mut uncapped = row(3, 1_000.0);
        uncapped.throttled_share = None;
        uncapped.errors = 7;
        let summary = ScaleSummary {
            cpu_millis_per_broker: None,
            write_bytes_per_second_per_broker: None,
            disk_note: Some("/tmp/x is on overlay (0:45), which has no block device".into()),
            brokers_min: 3,
            brokers_max: 3,
            ratio: None,
            round_ratios: Vec::new(),
        };
        insta::assert_snapshot!(render_text(&summary, &[uncapped]));
    }
}
