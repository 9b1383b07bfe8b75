//! The figures of `malachi bench scale --auto-reshape true` and their
//! rendering: the pre-split topic's throughput, the one-range topic's per
//! window while it reshapes itself, and when it first reached
//! [`TARGET_PERMILLE`] of the pre-split topic (issue 38: within
//! [`TARGET_WITHIN_SECONDS`]). Pure: the snapshot test below pins the text.

use serde::Serialize;

/// The share of the pre-split topic's records/s the target asks for.
pub const TARGET_PERMILLE: u64 = 900;
/// Within how long, from the first record, the target asks for it.
pub const TARGET_WITHIN_SECONDS: u64 = 60;

/// The reshaping settings the one-range topic ran under (its policy's,
/// else the brokers' defaults).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AutoSettings {
    pub split_write_bytes_per_second: u64,
    pub split_after_ms: u64,
    pub reshape_interval_ms: u64,
    pub ranges_max: u32,
    pub rate_window_ms: u64,
}

/// One measurement window of the one-range topic.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AutoWindow {
    /// Seconds from the start of its load to the window's end.
    pub end_s: f64,
    pub records_per_s: f64,
    /// Record value bytes only, 10^6 a megabyte.
    pub mb_per_s: f64,
    /// Active ranges at the window's end, and their primaries per broker.
    pub active_ranges: usize,
    pub primaries_per_broker: Vec<usize>,
    pub errors: u64,
}

/// One automatic reshape of the one-range topic, as `topic describe`
/// listed it at the end.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AutoReshape {
    /// Seconds from the start of the load (the brokers' clocks).
    pub at_s: f64,
    pub kind: String,
    pub ranges: Vec<u64>,
    pub children: Vec<u64>,
    pub refused: Option<String>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AutoSummary {
    pub brokers: u64,
    pub presplit_ranges: usize,
    /// Before the one-range topic's load.
    pub presplit_records_per_s: f64,
    /// After it, on the same cluster.
    pub presplit_again_records_per_s: f64,
    /// What the target is taken of: the mean of the two.
    pub reference_records_per_s: f64,
    pub target_records_per_s: f64,
    pub settings: AutoSettings,
    pub windows: Vec<AutoWindow>,
    /// The end of the first window at or above the target.
    pub reached_at_s: Option<f64>,
    pub reshapes: Vec<AutoReshape>,
}

/// The pre-split topic's records/s the target is taken of: the mean of its
/// measurements before and after the one-range topic (the one present if
/// the other is 0).
pub fn reference(before: f64, after: f64) -> f64 {
    match (before > 0.0, after > 0.0) {
        (true, true) => (before + after) / 2.0,
        (true, false) => before,
        _ => after,
    }
}

/// The target: [`TARGET_PERMILLE`] of the pre-split topic's records/s.
pub fn target(presplit_records_per_s: f64) -> f64 {
    presplit_records_per_s * TARGET_PERMILLE as f64 / 1_000.0
}

/// The end of the first window whose records/s reached `target`.
pub fn reached_at(windows: &[AutoWindow], target: f64) -> Option<f64> {
    windows
        .iter()
        .find(|w| target > 0.0 && w.records_per_s >= target)
        .map(|w| w.end_s)
}

/// The settings line.
pub fn settings_text(settings: &AutoSettings) -> String {
    format!(
        "reshaping: split above {:.1} MB/s for {} s, {} s between a merge and a split, up to {} ranges, rates over {} s",
        settings.split_write_bytes_per_second as f64 / 1e6,
        settings.split_after_ms / 1_000,
        settings.reshape_interval_ms / 1_000,
        settings.ranges_max,
        settings.rate_window_ms / 1_000,
    )
}

/// One window as text.
pub fn window_text(window: &AutoWindow) -> String {
    let primaries: Vec<String> = window
        .primaries_per_broker
        .iter()
        .map(ToString::to_string)
        .collect();
    let mut line = format!(
        "  +{:.0} s: {:.0} records/s, {:.1} MB/s; {} active ranges (primaries {})",
        window.end_s,
        window.records_per_s,
        window.mb_per_s,
        window.active_ranges,
        primaries.join("/"),
    );
    if window.errors > 0 {
        line.push_str(&format!("; {} errors", window.errors));
    }
    line
}

/// The conclusion line.
pub fn verdict_text(summary: &AutoSummary) -> String {
    let ran = summary.windows.last().map_or(0.0, |w| w.end_s);
    match summary.reached_at_s {
        Some(at) => format!(
            "reached {}% of the pre-split topic at +{at:.0} s ({} within {TARGET_WITHIN_SECONDS} s)",
            TARGET_PERMILLE / 10,
            if at <= TARGET_WITHIN_SECONDS as f64 {
                "target met:"
            } else {
                "target missed: not"
            },
        ),
        None => format!(
            "did not reach {}% of the pre-split topic in {ran:.0} s (target: within {TARGET_WITHIN_SECONDS} s)",
            TARGET_PERMILLE / 10
        ),
    }
}

/// The whole report.
pub fn render_text(summary: &AutoSummary) -> String {
    let mut text = format!(
        "{} brokers: pre-split topic ({} ranges) {:.0} records/s before and {:.0} after (mean {:.0}); one-range topic with automatic reshaping, target {:.0} records/s\n",
        summary.brokers,
        summary.presplit_ranges,
        summary.presplit_records_per_s,
        summary.presplit_again_records_per_s,
        summary.reference_records_per_s,
        summary.target_records_per_s,
    );
    text.push_str(&settings_text(&summary.settings));
    text.push('\n');
    for window in &summary.windows {
        text.push_str(&window_text(window));
        text.push('\n');
    }
    for reshape in &summary.reshapes {
        let outcome = match &reshape.refused {
            Some(why) => format!("refused: {why}"),
            None => format!("into {:?}", reshape.children),
        };
        text.push_str(&format!(
            "  {} of {:?} at +{:.1} s, {outcome}\n",
            reshape.kind, reshape.ranges, reshape.at_s
        ));
    }
    text.push_str(&verdict_text(summary));
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(end_s: f64, records_per_s: f64, ranges: usize) -> AutoWindow {
        AutoWindow {
            end_s,
            records_per_s,
            mb_per_s: records_per_s * 1024.0 / 1e6,
            active_ranges: ranges,
            primaries_per_broker: (0..3).map(|i| usize::from(i < ranges)).collect(),
            errors: 0,
        }
    }

    fn summary(windows: Vec<AutoWindow>) -> AutoSummary {
        let reference = reference(21_000.0, 19_000.0);
        let target = target(reference);
        AutoSummary {
            brokers: 3,
            presplit_ranges: 6,
            presplit_records_per_s: 21_000.0,
            presplit_again_records_per_s: 19_000.0,
            reference_records_per_s: reference,
            target_records_per_s: target,
            settings: AutoSettings {
                split_write_bytes_per_second: 4_194_304,
                split_after_ms: 30_000,
                reshape_interval_ms: 60_000,
                ranges_max: 64,
                rate_window_ms: 10_000,
            },
            reached_at_s: reached_at(&windows, target),
            windows,
            reshapes: vec![AutoReshape {
                at_s: 31.2,
                kind: "split".into(),
                ranges: vec![1],
                children: vec![2, 3],
                refused: None,
            }],
        }
    }

    #[test]
    fn the_target_is_reached_at_the_first_window_above_it() {
        let windows = vec![
            window(5.0, 9_000.0, 1),
            window(10.0, 18_500.0, 2),
            window(15.0, 17_000.0, 2),
        ];
        assert_eq!(reached_at(&windows, target(20_000.0)), Some(10.0));
        assert_eq!(reached_at(&windows, 0.0), None);
        assert_eq!(reached_at(&windows[..1], target(20_000.0)), None);
    }

    #[test]
    fn the_reference_is_the_mean_of_the_two_baselines() {
        assert_eq!(reference(21_000.0, 19_000.0), 20_000.0);
        assert_eq!(reference(21_000.0, 0.0), 21_000.0);
        assert_eq!(reference(0.0, 19_000.0), 19_000.0);
        assert_eq!(target(reference(21_000.0, 19_000.0)), 18_000.0);
    }

    #[test]
    fn the_report_shows_windows_reshapes_and_when_the_target_was_met() {
        let windows = vec![
            window(5.0, 9_000.0, 1),
            window(35.0, 12_000.0, 2),
            window(40.0, 18_200.0, 3),
        ];
        insta::assert_snapshot!(render_text(&summary(windows)));
    }

    #[test]
    fn the_report_says_when_the_target_was_not_met() {
        let windows = vec![window(5.0, 9_000.0, 1), window(60.0, 12_000.0, 2)];
        insta::assert_snapshot!(render_text(&summary(windows)));
    }
}
