//! `--plot FILE.svg`: the loss curve, and each device's busy share over the run, as a
//! self-contained SVG image.

use std::fmt::Write as _;

/// Colours of the devices' lines, in turn.
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

const WIDTH: f64 = 720.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const GAP: f64 = 60.0;

/// What the plot shows.
pub struct Series<'a> {
    /// The title above the plot.
    pub title: &'a str,
    /// `(step, loss)` of every step trained (a recovery's repeated steps replace the
    /// first tries).
    pub losses: &'a [(u64, f64)],
    /// Per device, `(last step of a logging window, busy share in it)`.
    pub busy: &'a [(String, Vec<(u64, f64)>)],
    /// Steps at which the group changed (a device lost or left out), with a label.
    pub marks: &'a [(u64, String)],
}

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A polyline through `points` mapped into the panel at `top`.
fn polyline(
    out: &mut String,
    points: &[(f64, f64)],
    (x_max, y_min, y_max): (f64, f64, f64),
    top: f64,
    colour: &str,
) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let span = (y_max - y_min).max(1e-12);
    let coords: Vec<String> = points
        .iter()
        .filter(|(_, y)| y.is_finite())
        .map(|&(x, y)| {
            let px = LEFT + plot_w * x / x_max.max(1.0);
            let py = top + PANEL * (1.0 - (y - y_min) / span);
            format!("{px:.1},{py:.1}")
        })
        .collect();
    let _ = writeln!(
        out,
        r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{}"/>"#,
        coords.join(" ")
    );
}

/// The frame, the title and the axis labels of one panel.
fn frame(out: &mut String, top: f64, title: &str, y: (f64, f64), x_max: f64, y_fmt: &str) {
    let plot_w = WIDTH - LEFT - RIGHT;
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL}" fill="none" stroke="#888"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}" font-size="13">{}</text>"#,
        top - 8.0,
        esc(title)
    );
    for (v, py) in [(y.1, top), (y.0, top + PANEL)] {
        let label = match y_fmt {
            "%" => format!("{:.0}%", v * 100.0),
            "log" => format!("1e{v:.0}"),
            _ => format!("{v:.2}"),
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"#,
            LEFT - 4.0,
            py + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">step {x_max:.0}</text>"#,
        LEFT + plot_w,
        top + PANEL + 14.0
    );
}

/// The SVG text of the plot.
pub fn svg(s: &Series<'_>) -> String {
    let height = TOP + 2.0 * PANEL + GAP + 30.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="20" font-size="15" font-weight="bold">{}</text>"#,
        esc(s.title)
    );
    let x_max = s.losses.iter().map(|p| p.0).max().unwrap_or(1) as f64;
    // Loss, on a logarithmic scale when it spans more than two decades.
    let positive: Vec<f64> = s
        .losses
        .iter()
        .map(|p| p.1)
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let (lo, hi) = positive
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let top = TOP + 10.0;
    if !positive.is_empty() && hi / lo > 100.0 {
        let (a, b) = (lo.log10().floor(), hi.log10().ceil());
        frame(&mut out, top, "loss (log scale)", (a, b), x_max, "log");
        let points: Vec<(f64, f64)> = s
            .losses
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|&(x, y)| (x as f64, y.log10()))
            .collect();
        polyline(&mut out, &points, (x_max, a, b), top, "#333");
    } else {
        let y_max = if positive.is_empty() { 1.0 } else { hi };
        frame(&mut out, top, "loss", (0.0, y_max), x_max, "");
        let points: Vec<(f64, f64)> = s.losses.iter().map(|&(x, y)| (x as f64, y)).collect();
        polyline(&mut out, &points, (x_max, 0.0, y_max), top, "#333");
    }
    // Busy shares.
    let top2 = top + PANEL + GAP;
    frame(
        &mut out,
        top2,
        "busy share of each device (per logging window)",
        (0.0, 1.0),
        x_max,
        "%",
    );
    for (i, (device, points)) in s.busy.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x as f64, y)).collect();
        polyline(&mut out, &pts, (x_max, 0.0, 1.0), top2, colour);
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{colour}">{}</text>"#,
            WIDTH - RIGHT + 8.0,
            top2 + 14.0 + 16.0 * i as f64,
            esc(device)
        );
    }
    // Changes of the group, across both panels.
    let plot_w = WIDTH - LEFT - RIGHT;
    for (i, (step, label)) in s.marks.iter().enumerate() {
        let px = LEFT + plot_w * *step as f64 / x_max.max(1.0);
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#c00" stroke-dasharray="4 3"/>"##,
            top2 + PANEL
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#c00">{}</text>"##,
            px + 3.0,
            top + 12.0 + 12.0 * i as f64,
            esc(label)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_is_well_formed_and_escapes_names() {
        let losses: Vec<(u64, f64)> = (1..=20).map(|s| (s, 3.0 / s as f64)).collect();
        let busy = vec![("host:<0>".to_string(), vec![(10, 0.5), (20, 0.7)])];
        let marks = vec![(12, "host:1 lost".to_string())];
        let text = svg(&Series {
            title: "t & u",
            losses: &losses,
            busy: &busy,
            marks: &marks,
        });
        assert!(text.starts_with("<svg") && text.ends_with("</svg>\n"));
        assert!(text.contains("host:&lt;0&gt;") && text.contains("t &amp; u"));
        assert_eq!(text.matches("<polyline").count(), 2);
        assert!(text.contains("host:1 lost"));
        // Four decades of loss: a logarithmic axis.
        let falling: Vec<(u64, f64)> = (1..=20).map(|s| (s, 10f64.powi(-(s as i32) / 5))).collect();
        let text = svg(&Series {
            title: "t",
            losses: &falling,
            busy: &[],
            marks: &[],
        });
        assert!(
            text.contains("loss (log scale)") && text.contains("1e-4"),
            "{text}"
        );
    }
}
