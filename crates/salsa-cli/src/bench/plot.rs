//! Plain SVG charts for benchmark reports: line charts (throughput and WA over time, latency
//! CDF with a log axis) and bar charts (policies side by side). Written by hand because the
//! plotting crates need system fonts to lay out text, which a fresh CI machine lacks; an SVG
//! viewer lays the text out itself.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One named line.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn label(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn frame(svg: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title),
        (LEFT + W - RIGHT) / 2.0,
        H - 10.0,
        esc(x_label),
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label)
    );
}

/// A line chart; with `log_x` the x axis is logarithmic (values must be positive).
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series], log_x: bool) -> String {
    let mut svg = String::new();
    frame(&mut svg, title, x_label, y_label);
    let fx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y1 = y1.max(y);
    }
    if x0 > x1 {
        svg.push_str("<text x=\"300\" y=\"200\">no data</text></svg>\n");
        return svg;
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let y0 = 0.0;
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.05 };
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| LEFT + (fx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
    for t in ticks(y0, y1) {
        let y = py(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            label(t)
        );
    }
    let xt: Vec<f64> = if log_x {
        (x0.floor() as i32..=x1.ceil() as i32)
            .map(|e| e as f64)
            .filter(|e| *e >= x0 - 1e-9 && *e <= x1 + 1e-9)
            .collect()
    } else {
        ticks(x0, x1)
    };
    for t in xt {
        let x = LEFT + (t - x0) / (x1 - x0) * pw;
        let text = if log_x { label(10f64.powf(t)) } else { label(t) };
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{text}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
            path.join(" ")
        );
        let ly = TOP + 14.0 + i as f64 * 18.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - RIGHT + 12.0,
            W - RIGHT + 32.0,
            W - RIGHT + 38.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Bars side by side, with an optional dashed reference line (a goal or an analytic value).
pub fn bar_chart(title: &str, y_label: &str, bars: &[(String, f64)], reference: Option<(&str, f64)>) -> String {
    let mut svg = String::new();
    frame(&mut svg, title, "", y_label);
    let top = bars.iter().map(|b| b.1).chain(reference.map(|r| r.1)).fold(0.0f64, f64::max);
    let y1 = if top <= 0.0 { 1.0 } else { top * 1.1 };
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let py = |y: f64| TOP + ph - y / y1 * ph;
    for t in ticks(0.0, y1) {
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            py(t),
            LEFT + pw,
            py(t),
            LEFT - 6.0,
            py(t) + 4.0,
            label(t)
        );
    }
    let n = bars.len().max(1) as f64;
    let slot = pw / n;
    for (i, (name, v)) in bars.iter().enumerate() {
        let x = LEFT + i as f64 * slot + slot * 0.15;
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
            py(*v),
            slot * 0.7,
            py(0.0) - py(*v),
            COLORS[i % COLORS.len()],
            x + slot * 0.35,
            py(*v) - 5.0,
            label((v * 1000.0).round() / 1000.0),
            x + slot * 0.35,
            TOP + ph + 16.0,
            esc(name)
        );
    }
    if let Some((name, v)) = reference {
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}">{} {}</text>"##,
            py(v),
            LEFT + pw,
            py(v),
            LEFT + pw + 6.0,
            py(v) + 4.0,
            esc(name),
            label(v)
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_and_carry_their_data() {
        let s = vec![
            Series {
                name: "greedy <1>".into(),
                points: vec![(0.0, 1.0), (1.0, 2.5), (2.0, 2.7)],
            },
            Series {
                name: "ours".into(),
                points: vec![(0.0, 1.0), (2.0, 1.6)],
            },
        ];
        let svg = line_chart("WA", "volumes written", "WA", &s, false);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("greedy &lt;1&gt;"));
        let cdf = line_chart("lat", "us", "fraction", &s, true);
        assert_eq!(cdf.matches("<polyline").count(), 2);
        let bars = bar_chart("cmp", "WA", &[("a".into(), 2.0), ("b".into(), 1.5)], Some(("goal", 1.6)));
        assert_eq!(bars.matches("<rect x=").count(), 3, "two bars and the frame");
        assert!(bars.contains("stroke-dasharray"));
        assert!(line_chart("empty", "x", "y", &[], false).contains("no data"));
    }
}
