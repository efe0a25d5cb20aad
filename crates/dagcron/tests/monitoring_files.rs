//! The ready-made monitoring files of `examples/`: the Prometheus alert
//! rules pass `promtool check rules` and their unit tests (`promtool test
//! rules`), the Grafana dashboard parses, and every PromQL expression of
//! both names only the metrics of `examples/prometheus-metrics.txt` (the
//! one list of what dagcron exports) and filters only on their labels.
//!
//! These tests need `promtool` (Debian's `prometheus` package); without it
//! they fail, they do not skip.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// One exported metric, as the list declares it.
#[derive(Debug)]
struct Metric {
    histogram: bool,
    labels: BTreeSet<String>,
}

/// `examples/prometheus-metrics.txt`: name, type, labels (`-` for none).
fn metrics() -> BTreeMap<String, Metric> {
    let mut out = BTreeMap::new();
    for line in read("examples/prometheus-metrics.txt").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [name, kind, labels] = words[..] else {
            panic!("expected `name type labels`: {line:?}");
        };
        assert!(
            ["counter", "gauge", "histogram"].contains(&kind),
            "{line:?}"
        );
        assert!(
            kind != "counter" || name.ends_with("_total"),
            "a counter's samples end in _total: {line:?}"
        );
        let labels = match labels {
            "-" => BTreeSet::new(),
            list => list.split(',').map(str::to_string).collect(),
        };
        let metric = Metric {
            histogram: kind == "histogram",
            labels,
        };
        assert!(
            out.insert(name.to_string(), metric).is_none(),
            "{name} twice"
        );
    }
    out
}

/// Runs promtool from the workspace's root; its absence is a failure.
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Debian's `prometheus` package \
                 (`apt-get install -y --no-install-recommends prometheus`), which provides it"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The series a PromQL expression selects: each metric name with the label
/// names its matchers use (an empty name for a bare `{...}` selector).
/// Strings, ranges, Grafana's `$variables`, numbers, functions, keywords and
/// the label lists of `by (...)` and its kin are not metric names.
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "atan2",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
    ];
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    // The index just past the byte `close` that ends the group opened at
    // `i`, strings inside it skipped.
    let past = |mut i: usize, close: u8| {
        i += 1;
        while i < b.len() && b[i] != close {
            i = if matches!(b[i], b'"' | b'\'' | b'`') {
                skip_string(b, i)
            } else {
                i + 1
            };
        }
        (i + 1).min(b.len())
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if matches!(c, b'"' | b'\'' | b'`') {
            i = skip_string(b, i);
        } else if c == b'[' {
            i = past(i, b']');
        } else if c == b'{' {
            let end = past(i, b'}');
            out.push((String::new(), label_names(&expr[i + 1..end - 1])));
            i = end;
        } else if c == b'$' {
            i += 1;
            if b.get(i) == Some(&b'{') {
                i = past(i, b'}');
            } else {
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || c == b'.' {
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let next = skip_ws(i);
            if GROUPING.contains(&word) {
                if b.get(next) == Some(&b'(') {
                    i = past(next, b')');
                }
            } else if b.get(next) == Some(&b'(') || KEYWORDS.contains(&word) {
                // A function, an aggregation or an operator.
            } else if b.get(next) == Some(&b'{') {
                let end = past(next, b'}');
                out.push((word.to_string(), label_names(&expr[next + 1..end - 1])));
                i = end;
            } else {
                out.push((word.to_string(), vec![]));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The index just past the string that starts at `i`.
fn skip_string(b: &[u8], i: usize) -> usize {
    let quote = b[i];
    let mut j = i + 1;
    while j < b.len() && b[j] != quote {
        j += if b[j] == b'\\' && quote != b'`' { 2 } else { 1 };
    }
    (j + 1).min(b.len())
}

/// The label names of the matchers `a="x", b=~"y"`.
fn label_names(matchers: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut part = String::new();
    let mut quote = None;
    let mut chars = matchers.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, ',') => names.push(std::mem::take(&mut part)),
            (None, '"' | '\'' | '`') => {
                quote = Some(c);
                part.push(c);
            }
            (Some(q), '\\') if q != '`' => {
                chars.next();
            }
            (Some(q), _) if c == q => {
                quote = None;
                part.push(c);
            }
            _ => part.push(c),
        }
    }
    names.push(part);
    names
        .iter()
        .map(|p| {
            p.trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// What is wrong with the metrics `expr` names, if anything.
fn check_expression(expr: &str, metrics: &BTreeMap<String, Metric>) -> Vec<String> {
    let mut problems = Vec::new();
    let found = selectors(expr);
    if found.is_empty() {
        problems.push(format!("names no metric: {expr}"));
    }
    for (name, labels) in found {
        let (metric, extra) = match metrics.get(&name) {
            Some(m) if !m.histogram => (m, None),
            _ => match ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| Some((name.strip_suffix(s)?, *s)))
                .and_then(|(base, s)| Some((metrics.get(base).filter(|m| m.histogram)?, s)))
            {
                Some((m, suffix)) => (m, Some(suffix)),
                None => {
                    problems.push(format!(
                        "{name:?} is not in examples/prometheus-metrics.txt: {expr}"
                    ));
                    continue;
                }
            },
        };
        for label in labels {
            // Every series also has the scrape's `instance` and `job`.
            let known = metric.labels.contains(&label)
                || ["instance", "job"].contains(&label.as_str())
                || (label == "le" && extra == Some("_bucket"));
            if !known {
                problems.push(format!("{name} has no label {label:?}: {expr}"));
            }
        }
    }
    problems
}

#[test]
fn the_promql_reader_finds_metrics_and_their_matchers() {
    let check = |expr: &str, want: &[(&str, &[&str])]| {
        let want: Vec<(String, Vec<String>)> = want
            .iter()
            .map(|(n, l)| (n.to_string(), l.iter().map(|s| s.to_string()).collect()))
            .collect();
        assert_eq!(selectors(expr), want, "{expr}");
    };
    check("up", &[("up", &[])]);
    check(
        r#"sum by (namespace, job) (rate(a_total{namespace=~"$namespace", outcome="x,y"}[$__rate_interval])) > 0"#,
        &[("a_total", &["namespace", "outcome"])],
    );
    check(
        "histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))",
        &[("h_bucket", &[])],
    );
    check(
        "time() - b offset 15m unless on (agent) c > bool 3 * 1e3",
        &[("b", &[]), ("c", &[])],
    );
    check(
        r#"label_replace(d{a="\"}"}, "dst", "$1", "src", "(.*)") or {job="x"}"#,
        &[("d", &["a"]), ("", &["job"])],
    );
    check(
        "max without (state) (e) / ignoring (x) group_left (y) f",
        &[("e", &[]), ("f", &[])],
    );
}

/// The alert rules are valid for promtool, and their unit tests pass.
#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let (ok, out) = promtool(&["check", "rules", "examples/prometheus-alerts.yaml"]);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&["test", "rules", "examples/prometheus-alerts.test.yaml"]);
    assert!(ok, "promtool test rules:\n{out}");
}

/// Every alert has a `for:`, a severity and a summary and a description,
/// and names only known metrics and labels.
#[test]
fn the_alert_rules_use_only_known_metrics() {
    let metrics = metrics();
    let rules: Value = serde_saphyr::from_str(&read("examples/prometheus-alerts.yaml")).unwrap();
    let mut problems = Vec::new();
    let mut alerts = 0;
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            alerts += 1;
            for (field, ok) in [
                ("for", rule["for"].is_string()),
                (
                    "severity",
                    ["critical", "warning"]
                        .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                ),
                ("summary", rule["annotations"]["summary"].is_string()),
                (
                    "description",
                    rule["annotations"]["description"].is_string(),
                ),
            ] {
                if !ok {
                    problems.push(format!("{name} lacks its {field}"));
                }
            }
            problems.extend(check_expression(rule["expr"].as_str().unwrap(), &metrics));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(alerts >= 6, "{alerts}");
}

/// The dashboard parses, every query of its panels and variables names
/// only known metrics and labels and is valid PromQL (promtool reads it as
/// a recording rule, with Grafana's variables replaced), every panel reads
/// the `${datasource}` variable, and every metric of the list is shown.
#[test]
fn the_dashboard_parses_and_queries_only_known_metrics() {
    let metrics = metrics();
    let dashboard: Value = serde_json::from_str(&read("examples/grafana-dashboard.json"))
        .expect("the dashboard is JSON");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(variables.contains(&"datasource") && variables.contains(&"namespace"));
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);

    let mut exprs = Vec::new();
    let mut problems = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        if panel["type"] == "row" {
            continue;
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("{title}: its data source is not ${{datasource}}"));
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        // `label_values(metric, label)`: Grafana's, not PromQL.
        let query = v["query"]["query"].as_str().unwrap();
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("expected label_values(metric, label): {query}"));
        let (metric, label) = inner.split_once(',').unwrap();
        match metrics.get(metric.trim()) {
            Some(m) if m.labels.contains(label.trim()) => {}
            _ => problems.push(format!("variable {}: {query}", v["name"])),
        }
    }
    let mut shown = BTreeSet::new();
    for expr in &exprs {
        problems.extend(check_expression(expr, &metrics));
        for (name, _) in selectors(expr) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| metrics.contains_key(*b)))
                .unwrap_or(&name)
                .to_string();
            shown.insert(base);
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    let unshown: Vec<_> = metrics.keys().filter(|m| !shown.contains(*m)).collect();
    assert!(unshown.is_empty(), "metrics without a panel: {unshown:?}");

    // promtool parses each query as a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let promql = expr
            .replace("$namespace", ".*")
            .replace("$__rate_interval", "5m")
            .replace("$__range", "6h");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&promql).unwrap()
        ));
    }
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).unwrap();
    let (ok, out) = promtool(&["check", "rules", file.to_str().unwrap()]);
    assert!(ok, "the dashboard's queries as PromQL:\n{out}");
}
