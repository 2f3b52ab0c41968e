//! The `--svg` plot of `apm simulate`: connections by state over time, one panel per
//! policy, stacked areas. Plain SVG written by hand: no plotting dependency.

use provider_sim::{RunReport, Scenario};
use std::fmt::Write;

const W: f64 = 960.0;
const PANEL_H: f64 = 170.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const GAP: f64 = 40.0;

/// State colours: armed, unprotected, failing over, lost.
const COLOURS: [(&str, &str); 4] = [
    ("armed", "#2e9e5b"),
    ("unprotected", "#f0b429"),
    ("failing over", "#e8702a"),
    ("lost", "#c62828"),
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The whole SVG document.
pub fn render(scenario: &Scenario, seed: u64, reports: &[RunReport]) -> String {
    // Faults are numbered on the plot and listed under it: a dashed line alone says
    // that something happened, not what.
    let faults: Vec<(f64, &str)> = reports
        .first()
        .map(|r| {
            r.timeline
                .iter()
                .filter(|(_, text)| !text.starts_with("SM "))
                .map(|(t, text)| (*t, text.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let key_top = TOP + reports.len() as f64 * (PANEL_H + GAP) + 10.0;
    // Under the key: what each event cost the SMs and SAs, per policy.
    let load: Vec<String> = reports
        .iter()
        .flat_map(super::sim_events::svg_lines)
        .collect();
    let load_top = key_top + faults.len() as f64 * 16.0 + 24.0;
    let height = load_top + load.len() as f64 * 14.0 + 20.0;
    let dur = scenario.duration_ms.max(1) as f64;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="20" font-size="15" font-weight="bold">{} (seed {seed})</text>"#,
        esc(&scenario.name)
    );
    for (k, (name, colour)) in COLOURS.iter().enumerate() {
        let lx = LEFT + k as f64 * 130.0;
        let _ = writeln!(
            o,
            r#"<rect x="{lx}" y="30" width="12" height="12" fill="{colour}"/><text x="{}" y="40">{name}</text>"#,
            lx + 16.0
        );
    }
    for (pi, r) in reports.iter().enumerate() {
        panel(&mut o, pi, r, &faults, dur);
    }
    for (n, (t, text)) in faults.iter().enumerate() {
        let _ = writeln!(
            o,
            r#"<text x="{LEFT}" y="{:.1}">{}. at {:.0} ms: {}</text>"#,
            key_top + 12.0 + n as f64 * 16.0,
            n + 1,
            t,
            esc(text)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">What each failure event cost the SMs and SAs</text>"#,
        load_top
    );
    for (n, line) in load.iter().enumerate() {
        let _ = writeln!(
            o,
            r#"<text x="{LEFT}" y="{:.1}" font-size="11">{}</text>"#,
            load_top + 14.0 + n as f64 * 14.0,
            esc(line)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// The plot of one policy's run (`pi`-th from the top): its title, the stacked bands of
/// connections by state, the numbered fault lines and the time axis.
fn panel(o: &mut String, pi: usize, r: &RunReport, faults: &[(f64, &str)], dur: f64) {
    let plot_w = W - LEFT - RIGHT;
    let x = |t_ms: f64| LEFT + plot_w * (t_ms / dur).clamp(0.0, 1.0);
    let top = TOP + 10.0 + pi as f64 * (PANEL_H + GAP);
    let bottom = top + PANEL_H;
    let total = r.connections.max(1) as f64;
    let y = |v: f64| bottom - PANEL_H * (v / total).clamp(0.0, 1.0);
    let _ = writeln!(
        o,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{} — lost {}, restore p99 {:.1} ms, unprotected {:.1} conn-s</text>"#,
        top - 6.0,
        esc(&r.policy),
        r.lost,
        r.restore_ms.p99,
        r.unprotected_ms_total / 1000.0
    );
    // Stacked bands, bottom up: armed, unprotected, failing over, lost.
    for (band, (_, colour)) in COLOURS.iter().enumerate() {
        let level = |s: &provider_sim::Sample, upto: usize| -> f64 {
            let v = [s.armed, s.unprotected, s.migrating, s.lost];
            v[..upto].iter().map(|&n| f64::from(n)).sum()
        };
        let mut pts = String::new();
        for s in &r.samples {
            let _ = write!(pts, "{:.1},{:.1} ", x(s.t_ms as f64), y(level(s, band + 1)));
        }
        for s in r.samples.iter().rev() {
            let _ = write!(pts, "{:.1},{:.1} ", x(s.t_ms as f64), y(level(s, band)));
        }
        let _ = writeln!(
            o,
            r#"<polygon points="{}" fill="{}" stroke="none"/>"#,
            pts.trim_end(),
            colour
        );
    }
    let _ = writeln!(
        o,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" text-anchor="end">{}</text><text x="{}" y="{}" text-anchor="end">0</text>"#,
        LEFT - 5.0,
        top + 10.0,
        r.connections,
        LEFT - 5.0,
        bottom
    );
    // Faults as numbered dashed lines (the key under the plots says what each is).
    for (n, (t, text)) in faults.iter().enumerate() {
        let fx = x(*t);
        let _ = writeln!(
            o,
            r##"<line x1="{fx:.1}" y1="{top}" x2="{fx:.1}" y2="{bottom}" stroke="#222" stroke-dasharray="3,3"><title>{:.0} ms: {}</title></line><text x="{:.1}" y="{}" font-size="11" fill="#222">{}</text>"##,
            t,
            esc(text),
            fx + 3.0,
            top + 12.0,
            n + 1
        );
    }
    // Time axis: one tick per second.
    let mut sec = 0u64;
    while (sec * 1000) as f64 <= dur {
        let tx = x((sec * 1000) as f64);
        let _ = writeln!(
            o,
            r##"<line x1="{tx:.1}" y1="{bottom}" x2="{tx:.1}" y2="{}" stroke="#444"/><text x="{tx:.1}" y="{}" text-anchor="middle">{sec} s</text>"##,
            bottom + 4.0,
            bottom + 16.0
        );
        sec += 1;
    }
}
