//! SVG timelines: which package each vCPU ran on over time, one panel per
//! run, written by hand (no drawing crate).
//!
//! Each panel has one row per vCPU; time runs left to right on a scale shared
//! by all panels of the file (so shorter runs are visibly shorter). A bar's
//! colour is the package, solid where the vCPU ran at least
//! [`ACTIVE_BUSY_FRACTION`] of the time, pale where it (nearly) idled. Long runs are drawn with at most
//! [`MAX_COLUMNS`] columns per row, each showing the package the vCPU was on
//! most during that span.

use std::fmt::Write as _;

use super::run::{RunResult, Timeline, TimelineCell};

/// Columns per row at most: about one per 2 pixels of the plot, which keeps
/// a file of 20 panels of 8 vCPUs under a few MB even when every column
/// differs (the unpinned baseline).
pub const MAX_COLUMNS: usize = 480;

/// Package colours (colour-blind-safe Okabe-Ito palette), cycled for hosts
/// with more packages.
pub const PACKAGE_COLOURS: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

/// A column counts as "running" (solid) when the vCPU ran at least this
/// share of it: 10 % separates a vCPU doing work (a build thread runs about
/// 29 % of the time) from one that only wakes for timers.
pub const ACTIVE_BUSY_FRACTION: f64 = 0.1;

/// Opacity of columns where the vCPU (nearly) idled.
const IDLE_OPACITY: &str = "0.25";

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const ROW_HEIGHT: f64 = 10.0;
const ROW_GAP: f64 = 2.0;
const TITLE_HEIGHT: f64 = 18.0;
const AXIS_HEIGHT: f64 = 18.0;
const PANEL_GAP: f64 = 14.0;
const LEGEND_HEIGHT: f64 = 26.0;

/// Escapes text for XML character data and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// One drawn bar: columns `[start, end)` of a row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bar {
    start: usize,
    end: usize,
    package: u16,
    busy: bool,
}

/// Downsamples a row of cells to at most [`MAX_COLUMNS`] columns of `bucket`
/// ticks and merges equal neighbours into bars.
fn bars(cells: &[TimelineCell], bucket: usize) -> Vec<Bar> {
    let bucket = bucket.max(1);
    let mut out: Vec<Bar> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    for (column, chunk) in cells.chunks(bucket).enumerate() {
        counts.clear();
        let mut busy = 0.0f64;
        for cell in chunk {
            busy += f64::from(cell.busy);
            if let Some(p) = cell.package {
                let p = usize::from(p);
                if counts.len() <= p {
                    counts.resize(p + 1, 0);
                }
                counts[p] += 1;
            }
        }
        let Some((package, _)) = counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        else {
            continue;
        };
        let bar = Bar {
            start: column * bucket,
            end: column * bucket + chunk.len(),
            // An index of `counts`, which u16 packages sized.
            package: u16::try_from(package).unwrap_or(u16::MAX),
            busy: busy / chunk.len() as f64 >= ACTIVE_BUSY_FRACTION,
        };
        match out.last_mut() {
            Some(last)
                if last.end == bar.start
                    && last.package == bar.package
                    && last.busy == bar.busy =>
            {
                last.end = bar.end;
            }
            _ => out.push(bar),
        }
    }
    out
}

/// Renders panels, one per `(title, run)`, into one SVG document. Runs
/// without a timeline get a note instead of rows.
pub fn render(heading: &str, panels: &[(String, &RunResult)]) -> String {
    let max_s = panels
        .iter()
        .map(|(_, r)| r.elapsed_s)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let mut height = TITLE_HEIGHT + LEGEND_HEIGHT;
    for (_, r) in panels {
        let rows = r.timeline.as_ref().map_or(1, |t| t.vcpus.len().max(1));
        height += TITLE_HEIGHT + rows as f64 * (ROW_HEIGHT + ROW_GAP) + AXIS_HEIGHT + PANEL_GAP;
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="8" y="14" font-size="13" font-weight="bold">{}</text>"#,
        escape(heading)
    );
    write_legend(&mut s, panels);
    let mut y = TITLE_HEIGHT + LEGEND_HEIGHT;
    for (title, run) in panels {
        y = write_panel(&mut s, y, title, run, max_s);
    }
    s.push_str("</svg>\n");
    s
}

/// The legend: one colour per package, and what solid and pale mean.
fn write_legend(s: &mut String, panels: &[(String, &RunResult)]) {
    let packages = panels
        .iter()
        .map(|(_, r)| r.package_ids.len())
        .max()
        .unwrap_or(0);
    let mut x = 8.0;
    let legend_y = TITLE_HEIGHT + 4.0;
    for p in 0..packages {
        let colour = PACKAGE_COLOURS[p % PACKAGE_COLOURS.len()];
        let id = panels
            .iter()
            .find_map(|(_, r)| r.package_ids.get(p).copied())
            .unwrap_or(u32::try_from(p).unwrap_or(u32::MAX));
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{legend_y}" width="14" height="10" fill="{colour}"/><text x="{}" y="{}">package {id}</text>"#,
            x + 18.0,
            legend_y + 9.0
        );
        x += 90.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{x}" y="{}">solid: running (at least {:.0} % busy); pale: idle</text>"#,
        legend_y + 9.0,
        ACTIVE_BUSY_FRACTION * 100.0
    );
}

/// One panel at height `y`: its title, a row per vCPU and the time axis
/// (`max_s` seconds across the plot). Returns the height after it.
fn write_panel(s: &mut String, mut y: f64, title: &str, run: &RunResult, max_s: f64) -> f64 {
    let _ = writeln!(
        s,
        r#"<text x="8" y="{}" font-weight="bold">{}</text>"#,
        y + 13.0,
        escape(title)
    );
    y += TITLE_HEIGHT;
    let scale = (WIDTH - LEFT - RIGHT) / max_s;
    match &run.timeline {
        Some(tl) if !tl.vcpus.is_empty() => {
            let ticks = tl.cells.iter().map(Vec::len).max().unwrap_or(0);
            let bucket = ticks.div_ceil(MAX_COLUMNS).max(1);
            let tick_s = tl.tick_ms as f64 / 1000.0;
            for (row, id) in tl.vcpus.iter().enumerate() {
                let ry = y + row as f64 * (ROW_HEIGHT + ROW_GAP);
                let _ = writeln!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="end">vm{} vcpu{}</text>"#,
                    LEFT - 6.0,
                    ry + ROW_HEIGHT - 1.0,
                    id.vm,
                    id.vcpu
                );
                write_row(s, tl, row, bucket, tick_s, scale, run.elapsed_s, ry);
            }
            y += tl.vcpus.len() as f64 * (ROW_HEIGHT + ROW_GAP);
        }
        _ => {
            let _ = writeln!(
                s,
                r#"<text x="{LEFT}" y="{}">(no timeline recorded)</text>"#,
                y + ROW_HEIGHT
            );
            y += ROW_HEIGHT + ROW_GAP;
        }
    }
    write_axis(s, y, max_s, scale);
    y + AXIS_HEIGHT + PANEL_GAP
}

#[allow(clippy::too_many_arguments)]
fn write_row(
    s: &mut String,
    tl: &Timeline,
    row: usize,
    bucket: usize,
    tick_s: f64,
    scale: f64,
    elapsed_s: f64,
    y: f64,
) {
    for bar in bars(&tl.cells[row], bucket) {
        let start_s = bar.start as f64 * tick_s;
        let end_s = (bar.end as f64 * tick_s).min(elapsed_s);
        if end_s <= start_s {
            continue;
        }
        let colour = PACKAGE_COLOURS[usize::from(bar.package) % PACKAGE_COLOURS.len()];
        let opacity = if bar.busy {
            String::new()
        } else {
            format!(r#" fill-opacity="{IDLE_OPACITY}""#)
        };
        let _ = writeln!(
            s,
            r#"<rect x="{:.2}" y="{y}" width="{:.2}" height="{ROW_HEIGHT}" fill="{colour}"{opacity}/>"#,
            LEFT + start_s * scale,
            ((end_s - start_s) * scale).max(0.5),
        );
    }
}

fn write_axis(s: &mut String, y: f64, max_s: f64, scale: f64) {
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{y}" x2="{:.2}" y2="{y}" stroke="#444"/>"##,
        LEFT + max_s * scale
    );
    // About 10 labelled ticks at 1/2/5 x 10^k seconds.
    let raw = max_s / 10.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|st| *st >= raw)
        .unwrap_or(magnitude * 10.0);
    let mut t = 0.0;
    while t <= max_s + step * 1e-9 {
        let x = LEFT + t * scale;
        let label = if step >= 1.0 {
            format!("{t:.0} s")
        } else {
            format!("{t:.1} s")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.2}" y1="{y}" x2="{x:.2}" y2="{}" stroke="#444"/><text x="{x:.2}" y="{}" text-anchor="middle" font-size="9">{label}</text>"##,
            y + 3.0,
            y + 13.0
        );
        t += step;
    }
}

#[cfg(test)]
// Every cast here is on a value the test itself chooses or bounds (counts, indices,
// sizes, pids), far inside the target type.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use crate::run::Placement;
    use pvmm_scheduler::placement::VcpuId;
    use pvmm_scheduler::policy::Policy;

    fn cell(package: Option<u16>, busy: f32) -> TimelineCell {
        TimelineCell { package, busy }
    }

    fn run_with(cells: Vec<Vec<TimelineCell>>, elapsed_s: f64) -> RunResult {
        RunResult {
            placement: Placement::Engine(Policy::Performance),
            package_ids: vec![0, 1],
            elapsed_s,
            has_jobs: false,
            finished: true,
            vm_done_s: vec![None],
            work_done_s: 1.0,
            backlog_s: 0.0,
            package_idle: vec![0.5, 0.5],
            energy_j: 1.0,
            migrations: 0,
            ticks: 1,
            timeline: Some(Timeline {
                tick_ms: 100,
                vcpus: (0..cells.len() as u32)
                    .map(|vcpu| VcpuId { vm: 0, vcpu })
                    .collect(),
                cells,
            }),
        }
    }

    #[test]
    fn merges_equal_neighbours() {
        let row = vec![
            cell(Some(0), 1.0),
            cell(Some(0), 0.9),
            cell(Some(1), 1.0),
            cell(Some(1), 0.05),
            cell(None, 0.0),
            cell(Some(1), 0.0),
        ];
        let b = bars(&row, 1);
        assert_eq!(
            b,
            vec![
                Bar {
                    start: 0,
                    end: 2,
                    package: 0,
                    busy: true
                },
                Bar {
                    start: 2,
                    end: 3,
                    package: 1,
                    busy: true
                },
                Bar {
                    start: 3,
                    end: 4,
                    package: 1,
                    busy: false
                },
                Bar {
                    start: 5,
                    end: 6,
                    package: 1,
                    busy: false
                },
            ]
        );
        // Buckets of 3: majority package, mean busy.
        let b = bars(&row, 3);
        assert_eq!(
            b[0],
            Bar {
                start: 0,
                end: 3,
                package: 0,
                busy: true
            }
        );
        assert_eq!(
            b[1],
            Bar {
                start: 3,
                end: 6,
                package: 1,
                busy: false
            }
        );
    }

    #[test]
    fn svg_is_well_formed_xml_with_one_rect_per_bar() {
        let run = run_with(
            vec![
                vec![cell(Some(0), 1.0); 10],
                vec![cell(Some(1), 1.0), cell(Some(0), 0.0), cell(Some(1), 1.0)],
            ],
            1.0,
        );
        let mut no_timeline = run.clone();
        no_timeline.timeline = None;
        let svg = render(
            "N=2 <kernbench> & \"friends\"",
            &[("performance".into(), &run), ("x".into(), &no_timeline)],
        );
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(
            root.tag_name().namespace(),
            Some("http://www.w3.org/2000/svg")
        );
        let bars: Vec<_> = root
            .descendants()
            .filter(|n| n.has_tag_name("rect") && n.attribute("height") == Some("10"))
            .collect();
        // Row 0: one bar; row 1: three bars; plus 2 legend swatches.
        assert_eq!(bars.len(), 4 + 2);
        let texts: Vec<String> = root
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(str::to_string))
            .collect();
        assert!(texts.contains(&"N=2 <kernbench> & \"friends\"".to_string()));
        assert!(texts.contains(&"vm0 vcpu1".to_string()));
        assert!(texts.contains(&"(no timeline recorded)".to_string()));
        assert!(texts.iter().any(|t| t == "package 1"));
    }

    #[test]
    fn long_rows_are_downsampled() {
        let cells: Vec<TimelineCell> = (0..10_000)
            .map(|i| cell(Some((i % 2) as u16), 1.0))
            .collect();
        let run = run_with(vec![cells], 1000.0);
        let svg = render("long", &[("unpinned".into(), &run)]);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
        assert!(rects <= MAX_COLUMNS + 3, "{rects}");
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a<b>&'\""), "a&lt;b&gt;&amp;&apos;&quot;");
        assert_eq!(escape("x\u{1}y"), "x y");
    }
}
