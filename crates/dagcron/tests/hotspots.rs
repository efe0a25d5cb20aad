//! The hot-spot report through a real server on loopback (in this
//! process) and the real command line: jobs of two namespaces that fire at
//! the same second, read with an instance token and with a token scoped to
//! one namespace.

mod common;

use common::{Api, InProcess, setup};
use serde_json::{Value, json};

/// Every job fires at second 0 of every hour, so the hour from now holds
/// exactly one hot second, whatever the time the test runs.
const JOBS_A: &str = r#"
namespace: a
jobs:
  - { name: five-fields, schedule: "0 * * * *", tasks: [{ id: t, noop: true }] }
  - { name: descriptor, schedule: "@hourly", tasks: [{ id: t, noop: true }] }
  - { name: six-fields, schedule: "0 0 * * * *", tasks: [{ id: t, noop: true }] }
  - { name: manual, tasks: [{ id: t, noop: true }] }
"#;

const JOBS_B: &str = r#"
namespace: b
jobs:
  - { name: other, schedule: "0 * * * *", tasks: [{ id: t, noop: true }] }
  - { name: paused, schedule: "0 * * * *", paused: true, tasks: [{ id: t, noop: true }] }
"#;

fn instant(v: &Value) -> jiff::Timestamp {
    v.as_str().unwrap().parse().unwrap()
}

/// The names of the jobs listed under the first hot second.
fn listed(report: &Value) -> Vec<String> {
    report["hotspots"][0]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            format!(
                "{}/{}",
                j["namespace"].as_str().unwrap(),
                j["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn the_report_finds_jobs_firing_together_within_the_tokens_namespaces() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    for file in [JOBS_A, JOBS_B] {
        let (status, body) = server.post("/api/v1/apply", file, "application/yaml");
        assert_eq!(status, 200, "{body}");
    }

    // An instance token sees both namespaces; the paused job and the one
    // without a schedule do not fire.
    let all = server.get("/api/v1/schedules/hotspots");
    assert_eq!(all["jobs"], json!(4), "{all}");
    assert_eq!(all["fires"], json!(4), "{all}");
    assert_eq!(all["peak_per_second"], json!(4), "{all}");
    assert_eq!(all["capped"], Value::Null);
    let hot = all["hotspots"].as_array().unwrap();
    assert_eq!(hot.len(), 1, "{all}");
    let (from, to, at) = (
        instant(&all["from"]),
        instant(&all["to"]),
        instant(&hot[0]["at"]),
    );
    assert_eq!(to.duration_since(from), jiff::SignedDuration::from_hours(1));
    assert!(from <= at && at < to && at.as_second() % 3600 == 0, "{all}");
    assert_eq!(hot[0]["count"], json!(4));
    assert_eq!(
        listed(&all),
        ["a/descriptor", "a/five-fields", "a/six-fields", "b/other"]
    );
    let suggestions: Vec<(&str, &str)> = hot[0]["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["expression"].as_str().unwrap(),
                j["suggestion"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        suggestions,
        [
            ("@hourly", "H * * * *"),
            ("0 * * * *", "H * * * *"),
            ("0 0 * * * *", "H H * * * *"),
            ("0 * * * *", "H * * * *"),
        ]
    );
    assert!(hot[0]["advice"].as_str().unwrap().contains("`H`"), "{all}");

    // A viewer of namespace a sees a's jobs only, and another namespace
    // looks empty rather than forbidden.
    let (status, made) = server.post(
        "/api/v1/tokens",
        r#"{"name": "viewer-a", "role": "viewer", "namespace": "a"}"#,
        "application/json",
    );
    assert_eq!(status, 201, "{made}");
    let viewer = Api {
        url: server.url.clone(),
        namespace: "a".into(),
        log: server.log.clone(),
        token: Some(made["token"].as_str().unwrap().to_string()),
        ca: None,
    };
    let mine = viewer.get("/api/v1/schedules/hotspots?window=2h&top=5");
    assert_eq!(mine["jobs"], json!(3), "{mine}");
    assert_eq!(mine["hotspots"][0]["count"], json!(3), "{mine}");
    assert_eq!(
        listed(&mine),
        ["a/descriptor", "a/five-fields", "a/six-fields"]
    );
    let theirs = viewer.get("/api/v1/schedules/hotspots?namespace=b");
    assert_eq!(
        (theirs["jobs"].clone(), theirs["hotspots"].clone()),
        (json!(0), json!([])),
        "{theirs}"
    );
    // The instance token may ask for one namespace.
    let b = server.get("/api/v1/schedules/hotspots?namespace=b");
    assert_eq!(
        (b["jobs"].clone(), b["hotspots"].clone()),
        (json!(1), json!([])),
        "{b}"
    );

    // Bad input is a 400 in the JSON error shape.
    let resp = server
        .http()
        .get(format!("{}/api/v1/schedules/hotspots?window=0", server.url))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().unwrap();
    assert_eq!(body["error"]["code"], "bad_request", "{body}");

    // The command line: JSON, and a text form with the suggestions.
    let cli = |args: &[&str]| {
        let out = server
            .cli()
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (ok, json_out, err) = cli(&[
        "--json",
        "schedules",
        "hotspots",
        "--window",
        "2h",
        "--top",
        "3",
    ]);
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(report["hotspots"][0]["count"], json!(4), "{report}");
    assert_eq!(
        instant(&report["to"]).duration_since(instant(&report["from"])),
        jiff::SignedDuration::from_hours(2)
    );
    let (ok, text, err) = cli(&["schedules", "hotspots", "--namespace", "a"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("3 jobs, 3 fires, at most 3 in one second"),
        "{text}"
    );
    assert!(
        text.contains("a/six-fields") && text.contains("-> H H * * * *"),
        "{text}"
    );
    assert!(!text.contains("b/other"), "{text}");
    let (ok, _, err) = cli(&["schedules", "hotspots", "--top", "0"]);
    assert!(
        !ok && err.contains("400") && err.contains("top must be at least 1"),
        "{err}"
    );
}
