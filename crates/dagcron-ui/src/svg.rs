//! Pictures drawn on the server as SVG: a job's DAG in layers, and a run's
//! Gantt timeline. Pure functions of their inputs; the size of a picture
//! grows with the tasks it shows, never with the history of a job.

use std::fmt::Write as _;

use jiff::Timestamp;

/// Escapes text for XML (SVG text and attributes).
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A task of the graph: its id, its state in the latest run (none: no run
/// yet) and where a click leads.
pub(crate) struct DagNode {
    pub(crate) id: String,
    pub(crate) state: Option<String>,
    /// How long it took in the latest run (empty: it did not run).
    pub(crate) took: String,
    pub(crate) href: Option<String>,
}

const NODE_W: usize = 150;
const NODE_H: usize = 42;
const COL_GAP: usize = 60;
const ROW_GAP: usize = 18;
const PAD: usize = 10;

/// The DAG drawn in layers (`waves`: every task of a layer depends only on
/// earlier ones), left to right; in a layer, tasks are ordered by the mean
/// row of their upstream tasks, which keeps most edges straight.
pub(crate) fn dag(nodes: &[DagNode], upstream: &[Vec<usize>], waves: &[Vec<usize>]) -> String {
    let mut row = vec![0f64; nodes.len()];
    let mut pos = vec![(0usize, 0usize); nodes.len()];
    let mut tallest = 0;
    for (col, wave) in waves.iter().enumerate() {
        let mut order: Vec<(f64, usize)> = wave
            .iter()
            .map(|&i| {
                let ups = &upstream[i];
                let key = if ups.is_empty() {
                    i as f64
                } else {
                    ups.iter().map(|&u| row[u]).sum::<f64>() / ups.len() as f64
                };
                (key, i)
            })
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (r, &(_, i)) in order.iter().enumerate() {
            row[i] = r as f64;
            pos[i] = (PAD + col * (NODE_W + COL_GAP), PAD + r * (NODE_H + ROW_GAP));
        }
        tallest = tallest.max(order.len());
    }
    let width = PAD * 2 + waves.len().max(1) * (NODE_W + COL_GAP) - COL_GAP;
    let height = PAD * 2 + tallest.max(1) * (NODE_H + ROW_GAP) - ROW_GAP;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="The job's tasks and their dependencies"><defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path class="arrow" d="M0,0 L8,4 L0,8 z"/></marker></defs>"#
    );
    for (i, ups) in upstream.iter().enumerate() {
        for &u in ups {
            let (x1, y1) = (pos[u].0 + NODE_W, pos[u].1 + NODE_H / 2);
            let (x2, y2) = (pos[i].0, pos[i].1 + NODE_H / 2);
            let mid = (x1 + x2) / 2;
            let _ = write!(
                svg,
                r#"<path class="edge" marker-end="url(#arrow)" d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}"><title>{} → {}</title></path>"#,
                esc(&nodes[u].id),
                esc(&nodes[i].id)
            );
        }
    }
    for (i, n) in nodes.iter().enumerate() {
        let (x, y) = pos[i];
        let state = n.state.as_deref().unwrap_or("none");
        let label = if n.id.chars().count() > 18 {
            format!("{}…", n.id.chars().take(17).collect::<String>())
        } else {
            n.id.clone()
        };
        let shown = if state == "none" { "no run yet" } else { state };
        let detail = if n.took.is_empty() {
            shown.to_string()
        } else {
            format!("{shown} · {}", n.took)
        };
        let inner = format!(
            r#"<g class="node s-{state}"><title>{id}: {detail}</title><rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6"/><text x="{tx}" y="{ty}">{label}</text><text class="detail" x="{tx}" y="{dy}">{detail}</text></g>"#,
            id = esc(&n.id),
            detail = esc(&detail),
            tx = x + 10,
            ty = y + 17,
            dy = y + 33,
            label = esc(&label),
        );
        match &n.href {
            Some(h) => {
                let _ = write!(svg, r#"<a href="{}">{inner}</a>"#, esc(h));
            }
            None => svg.push_str(&inner),
        }
    }
    svg.push_str("</svg>");
    svg
}

/// One bar of a Gantt row: an attempt, or a wait before one.
pub(crate) struct Bar {
    pub(crate) from: Timestamp,
    pub(crate) to: Timestamp,
    /// `wait`, or the attempt's state.
    pub(crate) class: String,
    pub(crate) title: String,
    pub(crate) href: Option<String>,
}

/// A task's row of the Gantt timeline.
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) bars: Vec<Bar>,
}

const LABEL_W: f64 = 170.0;
const CHART_W: f64 = 760.0;
const ROW_H: f64 = 26.0;
const AXIS_H: f64 = 22.0;

/// The Gantt timeline of a run over `[start, end]`: a row per task, its
/// waits dashed and its attempts colored by their states, with an axis of
/// time since the start.
pub(crate) fn gantt(rows: &[Row], start: Timestamp, end: Timestamp) -> String {
    let span = (end.as_millisecond() - start.as_millisecond()).max(1) as f64;
    let x = |t: Timestamp| {
        LABEL_W + ((t.as_millisecond() - start.as_millisecond()) as f64 / span) * CHART_W
    };
    let width = LABEL_W + CHART_W + 20.0;
    let height = AXIS_H + rows.len().max(1) as f64 * ROW_H + 6.0;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="gantt" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="When each task waited and ran">"#
    );
    for k in 0..=4 {
        let frac = f64::from(k) / 4.0;
        let tx = LABEL_W + frac * CHART_W;
        let at = jiff::SignedDuration::from_millis((span * frac) as i64);
        let _ = write!(
            svg,
            r#"<line class="axis" x1="{tx:.1}" y1="{AXIS_H}" x2="{tx:.1}" y2="{height}"/><text x="{tx:.1}" y="14" text-anchor="middle">+{}</text>"#,
            crate::format::duration(at)
        );
    }
    for (r, row) in rows.iter().enumerate() {
        let y = AXIS_H + r as f64 * ROW_H;
        let _ = write!(
            svg,
            r#"<text x="{lx}" y="{ty:.1}" text-anchor="end">{label}</text>"#,
            lx = LABEL_W - 8.0,
            ty = y + ROW_H / 2.0 + 4.0,
            label = esc(&row.label)
        );
        for bar in &row.bars {
            let (x1, x2) = (x(bar.from), x(bar.to).max(x(bar.from) + 2.0));
            let class = if bar.class == "wait" {
                "waitbar".to_string()
            } else {
                format!("bar s-{}", bar.class)
            };
            let rect = format!(
                r#"<g class="{class}"><title>{title}</title><rect x="{x1:.1}" y="{by:.1}" width="{w:.1}" height="{h:.1}" rx="3"/></g>"#,
                title = esc(&bar.title),
                by = y + 5.0,
                w = x2 - x1,
                h = ROW_H - 10.0,
            );
            match &bar.href {
                Some(h) => {
                    let _ = write!(svg, r#"<a href="{}">{rect}</a>"#, esc(h));
                }
                None => svg.push_str(&rect),
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, state: Option<&str>) -> DagNode {
        DagNode {
            id: id.into(),
            state: state.map(Into::into),
            took: if state.is_some() {
                "1.2 s".into()
            } else {
                String::new()
            },
            href: None,
        }
    }

    #[test]
    fn a_dag_is_drawn_in_layers_with_an_edge_per_dependency() {
        // a -> b, a -> c, b -> d, c -> d
        let nodes = [
            node("a", Some("succeeded")),
            node("b", Some("failed")),
            node("c", None),
            node("d<x>", Some("running")),
        ];
        let upstream = vec![vec![], vec![0], vec![0], vec![1, 2]];
        let waves = vec![vec![0], vec![1, 2], vec![3]];
        let svg = dag(&nodes, &upstream, &waves);
        assert_eq!(svg.matches("<path class=\"edge\"").count(), 4);
        assert!(svg.contains(r#"class="node s-failed""#));
        assert!(svg.contains(r#"class="node s-none""#));
        assert!(svg.contains("d&lt;x&gt;"), "ids are escaped");
        assert_eq!(svg.matches(r#"marker-end="url(#arrow)""#).count(), 4);
        assert!(svg.contains("<title>b → d&lt;x&gt;</title>"), "{svg}");
        assert!(svg.contains(">failed · 1.2 s</text>"), "{svg}");
        assert!(svg.contains(">no run yet</text>"), "{svg}");
        // Three layers of 150 px and two gaps of 60 px, padded by 10 px;
        // two rows of 42 px and a gap of 18.
        assert!(svg.contains(r#"width="590" height="122""#), "{svg}");
    }

    /// Fifty tasks (one fanning out to 48 that join in one): no two boxes
    /// overlap, and the picture grows by a row per task of the widest
    /// layer.
    #[test]
    fn fifty_tasks_are_drawn_without_overlaps() {
        let nodes: Vec<DagNode> = (0..50).map(|i| node(&format!("t{i}"), None)).collect();
        let mut upstream = vec![vec![]];
        upstream.extend((1..49).map(|_| vec![0]));
        upstream.push((1..49).collect());
        let waves = vec![vec![0], (1..49).collect(), vec![49]];
        let svg = dag(&nodes, &upstream, &waves);
        let boxes: Vec<(usize, usize)> = svg
            .match_indices("<rect x=\"")
            .map(|(at, _)| {
                let rest = &svg[at + 9..];
                let x: usize = rest[..rest.find('"').unwrap()].parse().unwrap();
                let y_at = rest.find("y=\"").unwrap() + 3;
                let y: usize = rest[y_at..y_at + rest[y_at..].find('"').unwrap()]
                    .parse()
                    .unwrap();
                (x, y)
            })
            .collect();
        assert_eq!(boxes.len(), 50);
        for (i, a) in boxes.iter().enumerate() {
            for b in &boxes[i + 1..] {
                let apart = a.0.abs_diff(b.0) >= NODE_W || a.1.abs_diff(b.1) >= NODE_H;
                assert!(apart, "{a:?} and {b:?} overlap");
            }
        }
        assert!(svg.contains(&format!(
            r#"height="{}""#,
            PAD * 2 + 48 * (NODE_H + ROW_GAP) - ROW_GAP
        )));
    }

    #[test]
    fn a_gantt_bar_spans_its_share_of_the_run() {
        let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        let rows = [Row {
            label: "extract".into(),
            bars: vec![
                Bar {
                    from: t(0),
                    to: t(5),
                    class: "wait".into(),
                    title: "waited".into(),
                    href: None,
                },
                Bar {
                    from: t(5),
                    to: t(10),
                    class: "succeeded".into(),
                    title: "attempt 1".into(),
                    href: Some("/runs/1?task=extract&attempt=1".into()),
                },
            ],
        }];
        let svg = gantt(&rows, t(0), t(10));
        // The attempt takes the second half of 760 px after 170 px of labels.
        assert!(
            svg.contains(r#"<rect x="550.0" y="27.0" width="380.0""#),
            "{svg}"
        );
        assert!(svg.contains(r#"class="waitbar""#));
        assert!(svg.contains("+10.0 s"));
        assert!(svg.contains("task=extract&amp;attempt=1"));
    }
}
