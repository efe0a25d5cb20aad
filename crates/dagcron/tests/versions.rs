//! Versions, rollbacks, re-runs and manual intervention through a real
//! server on loopback and the real command line; and an upgrade that changes the rules of a
//! stored schedule's zone, reported at start by a `dagcron serve` process.

mod common;

use std::path::Path;

use common::{Api, InProcess, Server, setup, until};
use serde_json::{Value, json};

/// Runs the command line against `server`; returns (success, stdout, stderr).
fn cli(server: &Api, args: &[&str]) -> (bool, String, String) {
    let out = server.cli().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The command line's standard output, failing the test if it failed.
fn ok(server: &Api, args: &[&str]) -> String {
    let (success, out, err) = cli(server, args);
    assert!(success, "{args:?}: {err}");
    out
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

const V1: &str = r#"
namespace: e2e
jobs:
  - name: report
    schedule: "0 0 3 * * *"
    tasks:
      - { id: fetch, shell: "echo fetching" }
"#;

const V2: &str = r#"
namespace: e2e
jobs:
  - name: report
    schedule: "0 30 4 * * *"
    tasks:
      - { id: fetch, shell: "echo fetching" }
      - { id: send, depends_on: [fetch], shell: "echo sent" }
"#;

#[test]
fn versions_are_listed_diffed_and_rolled_back_from_the_command_line() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    ok(&server, &["apply", "-f", &write(dir.path(), "v1.yaml", V1)]);
    ok(&server, &["apply", "-f", &write(dir.path(), "v2.yaml", V2)]);

    let listed = ok(&server, &["jobs", "versions", "e2e/report"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[1].trim_start().starts_with("2*"), "{listed}");
    assert!(lines[2].trim_start().starts_with("1 "), "{listed}");
    assert!(
        lines[1].contains("admin (bootstrap) (tok_") && lines[1].contains("cron 1, tzdb "),
        "who applied it, under which rules: {listed}"
    );

    let diff = ok(&server, &["jobs", "diff", "e2e/report", "1", "2"]);
    assert!(
        diff.starts_with("--- e2e/report version 1\n+++ e2e/report version 2\n@@ "),
        "{diff}"
    );
    for line in [
        "-schedule: 0 0 3 * * *",
        "+schedule: 0 30 4 * * *",
        "+- id: send",
    ] {
        assert!(diff.lines().any(|l| l == line), "{line:?} in\n{diff}");
    }
    assert!(
        diff.lines().any(|l| l == " name: report"),
        "context lines: {diff}"
    );

    let rolled = ok(&server, &["jobs", "rollback", "e2e/report", "--to", "1"]);
    assert_eq!(
        rolled,
        "e2e/report rolled back to version 1: now at version 3\n"
    );
    let listed = ok(&server, &["jobs", "versions", "e2e/report"]);
    let newest = listed.lines().nth(1).unwrap();
    assert!(
        newest.trim_start().starts_with("3*") && newest.contains("rollback of 1"),
        "{listed}"
    );
    let job = server.get("/api/v1/namespaces/e2e/jobs/report");
    assert_eq!(
        (job["version"].clone(), job["spec"]["schedule"].clone()),
        (json!(3), json!("0 0 3 * * *"))
    );
    assert_eq!(
        ok(&server, &["jobs", "diff", "e2e/report", "1", "3"]),
        "versions 1 and 3 of e2e/report are the same\n"
    );
    let json: Value = serde_json::from_str(&ok(
        &server,
        &["--json", "jobs", "diff", "e2e/report", "3", "2"],
    ))
    .unwrap();
    assert_eq!(
        (json["from"].clone(), json["to"].clone()),
        (json!(3), json!(2))
    );
    assert!(
        json["diff"].as_str().unwrap().contains("+- id: send"),
        "{json}"
    );
    assert_eq!(
        ok(&server, &["jobs", "rollback", "e2e/report", "--to", "3"]),
        "e2e/report is already equal to version 3 (it stays at version 3)\n"
    );

    // Versions that do not exist, or that are not numbers: a clear error.
    let (success, _, err) = cli(&server, &["jobs", "rollback", "e2e/report", "--to", "99"]);
    assert!(
        !success && err.contains("404") && err.contains("no version 99"),
        "{err}"
    );
    for bad in ["0", "latest", "99999999999999999999"] {
        let (success, _, err) = cli(&server, &["jobs", "diff", "e2e/report", "1", bad]);
        assert!(!success && err.contains("invalid value"), "{bad}: {err}");
    }
    let (success, _, err) = cli(&server, &["jobs", "rollback", "e2e/report", "--to", "-4"]);
    assert!(!success && err.contains("unexpected argument"), "{err}");
    let (success, _, err) = cli(&server, &["jobs", "versions", "e2e/none"]);
    assert!(!success && err.contains("no job e2e/none"), "{err}");
    assert_eq!(
        server.get("/api/v1/namespaces/e2e/jobs/report")["version"],
        3,
        "nothing changed"
    );
}

#[test]
fn a_failed_run_is_rerun_from_its_failed_tasks_from_the_command_line() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let fixed = dir.path().join("fixed");
    let file = format!(
        "namespace: e2e\njobs:\n  - name: etl\n    params: {{ region: eu }}\n    tasks:\n      - {{ id: extract, shell: 'true' }}\n      - {{ id: load, depends_on: [extract], shell: 'test -e {}' }}\n",
        fixed.display()
    );
    ok(
        &server,
        &["apply", "-f", &write(dir.path(), "etl.yaml", &file)],
    );
    let triggered = ok(
        &server,
        &[
            "--json",
            "jobs",
            "trigger",
            "e2e/etl",
            "--param",
            "region=us",
        ],
    );
    let first = serde_json::from_str::<Value>(&triggered).unwrap()["id"]
        .as_i64()
        .unwrap();
    server.wait_run(first, "failed");

    std::fs::write(&fixed, "").unwrap();
    let shown = ok(&server, &["runs", "rerun", &first.to_string(), "--failed"]);
    let head = shown.lines().next().unwrap();
    assert!(
        head.contains("trigger=rerun") && head.ends_with(&format!("rerun of {first}")),
        "{shown}"
    );
    assert!(
        shown.lines().any(|l| l.contains("extract")
            && l.contains("succeeded")
            && l.contains("carried over")),
        "{shown}"
    );
    let again: i64 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let run = server.wait_run(again, "succeeded");
    assert_eq!(
        (run["rerun_of"].clone(), run["params"].clone()),
        (json!(first), json!({ "region": "us" }))
    );
    assert_eq!(run["tasks"][1]["attempts"][0]["state"], "succeeded");
    let (success, _, err) = cli(&server, &["logs", &again.to_string(), "extract"]);
    assert!(
        !success && err.contains(&format!("carried over from run {first}")),
        "{err}"
    );

    // Nothing failed: asked for its failed tasks, the re-run is refused.
    let (success, _, err) = cli(&server, &["runs", "rerun", &again.to_string(), "--failed"]);
    assert!(
        !success && err.contains("409") && err.contains("re-run it whole"),
        "{err}"
    );
    let whole: Value = serde_json::from_str(&ok(
        &server,
        &["--json", "runs", "rerun", &again.to_string()],
    ))
    .unwrap();
    assert_eq!(whole["rerun_of"], again);
    server.wait_run(whole["id"].as_i64().unwrap(), "succeeded");
    let (success, _, err) = cli(&server, &["runs", "rerun", "123"]);
    assert!(
        !success && err.contains("404") && err.contains("no run 123"),
        "{err}"
    );
    assert_eq!(server.all_runs("etl").len(), 3);
}

/// Held tasks from the command line: listed per namespace, retried, marked
/// and failed; a refusal says why.
#[test]
fn held_tasks_are_listed_and_settled_from_the_command_line() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let fixed = dir.path().join("fixed");
    let file = format!(
        "namespace: e2e\njobs:\n  - name: etl\n    tasks:\n      - {{ id: extract, shell: 'test -e {}', on_exhausted: hold }}\n      - {{ id: load, depends_on: [extract], shell: 'true' }}\n",
        fixed.display()
    );
    ok(
        &server,
        &["apply", "-f", &write(dir.path(), "etl.yaml", &file)],
    );
    let held = |run: i64| {
        until(&format!("run {run} holds its task"), || {
            server.get(&format!("/api/v1/runs/{run}"))["tasks"][0]["state"] == "held"
        });
    };
    let trigger = || {
        let out = ok(&server, &["--json", "jobs", "trigger", "e2e/etl"]);
        serde_json::from_str::<Value>(&out).unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    let (first, second) = (trigger(), trigger());
    held(first);
    held(second);
    let listed = ok(&server, &["runs", "held", "e2e"]);
    let rows: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    assert!(
        rows[0].starts_with(&first.to_string()) && rows[0].contains("extract"),
        "{listed}"
    );
    let json: Value =
        serde_json::from_str(&ok(&server, &["--json", "runs", "held", "e2e"])).unwrap();
    assert_eq!(json["items"][1]["run"], second);

    // A task that is not held cannot be failed; the message says why.
    let (success, _, err) = cli(&server, &["runs", "fail", &first.to_string(), "load"]);
    assert!(
        !success && err.contains("409") && err.contains("the task is pending"),
        "{err}"
    );
    std::fs::write(&fixed, "").unwrap();
    let shown = ok(&server, &["runs", "retry", &first.to_string(), "extract"]);
    assert!(shown.starts_with(&format!("run {first} ")), "{shown}");
    assert_eq!(
        server.wait_run(first, "succeeded")["tasks"][0]["attempts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    ok(
        &server,
        &["runs", "mark", &second.to_string(), "extract", "skipped"],
    );
    let run = server.wait_run(second, "succeeded");
    assert_eq!(
        (&run["tasks"][0]["state"], &run["tasks"][1]["state"]),
        (&json!("skipped"), &json!("skipped"))
    );
    std::fs::remove_file(&fixed).unwrap();
    let third = trigger();
    held(third);
    ok(&server, &["runs", "fail", &third.to_string(), "extract"]);
    server.wait_run(third, "failed");
    let (success, _, err) = cli(
        &server,
        &["runs", "mark", &third.to_string(), "extract", "succeeded"],
    );
    assert!(
        !success && err.contains("409") && err.contains("runs rerun"),
        "{err}"
    );
    assert_eq!(
        ok(&server, &["runs", "held", "e2e"]).lines().count(),
        1,
        "only the header"
    );
}

/// The rules a version of a job was stored with, as a server of another
/// release (another time zone database, in which Europe/Berlin's rules
/// were other) would have written them.
const OLD_RULES: &str = r#"{"cron":1,"tzdb":"2000a","zones":{"Europe/Berlin":"0123456789abcdef"}}"#;

#[test]
fn an_upgrade_that_changes_a_zones_rules_is_reported_at_start() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let file = "namespace: e2e\njobs:\n  - { name: berlin, schedule: '0 30 2 * * *', timezone: Europe/Berlin, tasks: [{ id: t, noop: true }] }\n  - { name: utc, schedule: '0 30 2 * * *', tasks: [{ id: t, noop: true }] }\n";
    let path = write(dir.path(), "jobs.yaml", file);
    ok(&server, &["apply", "-f", &path]);
    server.stop();
    // The same database, as the older release left it.
    let db = rusqlite::Connection::open(data.join("dagcron.db")).unwrap();
    for table in ["jobs", "job_versions"] {
        db.execute(
            &format!("UPDATE {table} SET rules = ?1 WHERE name = 'berlin'"),
            [OLD_RULES],
        )
        .unwrap();
    }
    drop(db);

    let server = Server::start(&data, &[]);
    let warning = until("the server warns of changed rules", || {
        let log = std::fs::read_to_string(&server.log).unwrap_or_default();
        match log.lines().find(|l| l.contains("other scheduling rules")) {
            Some(line) => Ok(line.to_string()),
            None => Err(log),
        }
    });
    assert!(
        warning.contains("WARN")
            && warning.contains(
                "e2e/berlin (rules of Europe/Berlin changed (time zone database 2000a -> "
            )
            && !warning.contains("e2e/utc"),
        "{warning}"
    );
    let job = server.get("/api/v1/namespaces/e2e/jobs/berlin");
    assert_eq!(
        job["rules_changed"]["zones"],
        json!(["Europe/Berlin"]),
        "{job}"
    );
    assert!(
        server
            .get("/api/v1/namespaces/e2e/jobs/utc")
            .get("rules_changed")
            .is_none()
    );
    // Applying the job again accepts the new rules: a new version.
    let applied = ok(&server, &["apply", "-f", &path]);
    assert!(
        applied
            .lines()
            .any(|l| l.starts_with("e2e/berlin") && l.contains("updated (version 2)")),
        "{applied}"
    );
    assert!(
        applied
            .lines()
            .any(|l| l.starts_with("e2e/utc") && l.contains("unchanged (version 1)")),
        "{applied}"
    );
    let job = server.get("/api/v1/namespaces/e2e/jobs/berlin");
    assert!(job.get("rules_changed").is_none(), "{job}");
}
