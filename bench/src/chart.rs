//! The SVG bar chart of a comparison: MB/s per scenario, one bar per system
//! and durability, drawn with plotters' SVG backend (no fonts or bitmaps to
//! install: the SVG names a font family and the viewer draws the text).

use plotters::prelude::*;

use crate::report::Row;

const WIDTH_PX: u32 = 1200;
const HEIGHT_PX: u32 = 640;

/// The chart of `rows`' throughput scenarios (produce and consume) as an SVG
/// document. `title` goes on top (the date and machine, say).
pub fn svg(rows: &[Row], title: &str) -> Result<String, String> {
    let rows: Vec<&Row> = rows
        .iter()
        .filter(|r| r.scenario.starts_with("produce-") || r.scenario == "consume")
        .collect();
    let mut scenarios: Vec<&str> = Vec::new();
    let mut series: Vec<String> = Vec::new();
    for row in &rows {
        if !scenarios.contains(&row.scenario.as_str()) {
            scenarios.push(&row.scenario);
        }
        let name = series_name(row);
        if !series.contains(&name) {
            series.push(name);
        }
    }
    let y_max = rows.iter().map(|r| r.mb_per_s).fold(1.0_f64, f64::max) * 1.15;
    let groups = scenarios.len().max(1) as f64;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..groups, 0.0..y_max)
            .map_err(|e| e.to_string())?;
        let names = scenarios.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(scenarios.len() * 2 + 1)
            .x_label_formatter(&|x| {
                // Label each group at its middle (x = g + 0.5).
                let g = x.floor();
                if (x - g - 0.5).abs() < 1e-6 {
                    names
                        .get(g as usize)
                        .map_or_else(String::new, |s| (*s).to_owned())
                } else {
                    String::new()
                }
            })
            .y_desc("MB/s (1 KiB record payloads)")
            .draw()
            .map_err(|e| e.to_string())?;
        let bar_width = 0.8 / series.len().max(1) as f64;
        for (si, name) in series.iter().enumerate() {
            let color = Palette99::pick(si).to_rgba();
            let bars = rows
                .iter()
                .filter(|r| &series_name(r) == name)
                .filter_map(|r| {
                    let g = scenarios.iter().position(|s| *s == r.scenario)? as f64;
                    let x0 = g + 0.1 + si as f64 * bar_width;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + bar_width * 0.9, r.mb_per_s)],
                        color.filled(),
                    ))
                });
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn series_name(row: &Row) -> String {
    if row.durability == "-" {
        row.system.clone()
    } else {
        format!("{} (fsync {})", row.system, row.fsync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::fixed_rows;

    #[test]
    fn the_chart_is_an_svg_with_a_bar_and_a_legend_entry_per_series() {
        let svg = svg(&fixed_rows(), "bench compare").unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for label in [
            "malachi (fsync per write)",
            "redis (fsync every 1 s)",
            "nats (fsync every 2 min)",
            "raw-disk (fsync per write)",
            "produce-p16",
            "consume",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
        // The loopback limit is not a throughput bar.
        assert!(!svg.contains("loopback"));
    }
}
