//! Small charts drawn on the server as SVG: no script, readable without colour (every bar has
//! its number), with a `<title>` for screen readers.

use std::fmt::Write as _;

use crate::report::Week;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A horizontal bar chart, one labelled bar per row.
pub fn bars(title: &str, rows: &[(String, f64)]) -> String {
    let max = rows.iter().map(|r| r.1).fold(0.0_f64, f64::max).max(1.0);
    let (label_w, bar_w, row_h) = (140.0, 320.0, 22.0);
    let h = row_h * rows.len().max(1) as f64 + 8.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg role="img" class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg"><title>{t}</title>"#,
        w = label_w + bar_w + 60.0,
        t = esc(title)
    );
    for (i, (label, v)) in rows.iter().enumerate() {
        let y = 4.0 + i as f64 * row_h;
        let w = (v / max) * bar_w;
        let _ = write!(
            s,
            r##"<text x="0" y="{ty}" font-size="13">{l}</text><rect x="{label_w}" y="{y}" width="{w:.1}" height="{bh}" fill="#0b57d0"/><text x="{nx:.1}" y="{ty}" font-size="13">{v}</text>"##,
            ty = y + 14.0,
            l = esc(label),
            bh = row_h - 6.0,
            nx = label_w + w + 6.0,
        );
    }
    s.push_str("</svg>");
    s
}

/// One gate's weekly rejection rate as small columns (0 – 100 %), oldest week first; weeks
/// with no decision are drawn as a dot.
pub fn weekly_rates(weeks: &[Week]) -> String {
    let (col_w, h) = (14.0, 36.0);
    let w = col_w * weeks.len().max(1) as f64;
    let mut s = String::new();
    let summary: Vec<String> = weeks
        .iter()
        .map(|wk| {
            format!(
                "week of {}: {}",
                &crate::fmt::datetime(wk.start)[..10],
                wk.rate()
                    .map(|r| format!("{:.0} %", r * 100.0))
                    .unwrap_or_else(|| "no decisions".into())
            )
        })
        .collect();
    let _ = write!(
        s,
        r#"<svg role="img" class="trend" width="{w}" height="{h}" viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg"><title>{t}</title>"#,
        t = esc(&summary.join("; "))
    );
    for (i, wk) in weeks.iter().enumerate() {
        let x = i as f64 * col_w + 2.0;
        match wk.rate() {
            Some(r) => {
                let bh = (r * (h - 4.0)).max(1.0);
                let _ = write!(
                    s,
                    r##"<rect x="{x}" y="{y:.1}" width="{cw}" height="{bh:.1}" fill="#b3261e"/>"##,
                    y = h - bh,
                    cw = col_w - 4.0
                );
            }
            None => {
                let _ = write!(
                    s,
                    r##"<circle cx="{cx}" cy="{cy}" r="1.5" fill="#5a5a5a"/>"##,
                    cx = x + (col_w - 4.0) / 2.0,
                    cy = h - 2.0
                );
            }
        }
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        let s = bars("a<b", &[("x&y".into(), 3.0)]);
        assert!(s.contains("a&lt;b") && s.contains("x&amp;y") && s.contains(">3<"));
    }
}
