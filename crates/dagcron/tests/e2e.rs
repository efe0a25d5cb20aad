//! End to end: the real binary, on loopback, killed with SIGKILL mid-run and
//! restarted; every claim is checked from the API. Tests that need nothing
//! of a process (no signal, no environment of its own) start the server in
//! their own process instead, on a listener they bound, and drive it with
//! the real command line.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Api, InProcess, Server, attempt_pid, setup, until, wait_gone};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

const JOBS: &str = r#"
namespace: e2e
jobs:
  - name: tick
    schedule: "* * * * * *"
    misfire: run_all
    max_catchup: 1000
    max_active_runs: 50
    # A kill can land while one of these attempts runs: it is lost, and
    # retried, like any attempt caught by a crash.
    retry: { max_attempts: 3, backoff: fixed, initial: 1s, max: 1s }
    tasks:
      - { id: a, shell: "true" }
      - { id: b, depends_on: [a], shell: "true" }
  - name: long
    schedule: "*/2 * * * * *"
    concurrency: allow
    max_active_runs: 10
    misfire: skip
    retry: { max_attempts: 3, backoff: fixed, initial: 1s, max: 1s }
    tasks:
      - { id: slow, shell: "sleep 1" }
"#;

/// SIGKILL in the middle of runs, a restart after downtime: every scheduled
/// second has exactly one run, none is missing (run_all), nothing stays
/// running, and killed attempts were retried.
#[test]
fn kill_nine_loses_and_doubles_nothing() {
    let (_dir, data) = setup();
    let mut server = Server::start(&data, &["--misfire-grace", "0"]);
    let (status, body) = server.post("/api/v1/apply", JOBS, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let applied_at = jiff::Timestamp::now();
    // Run until some `long` attempts are in flight, then kill without warning.
    until("some long attempts run, after three ticks", || {
        let running = server
            .all_runs("long")
            .iter()
            .any(|r| r["tasks"][0]["state"] == "running");
        running && server.all_runs("tick").len() >= 3
    });
    let before = server.all_runs("tick").len();
    server.signal(Signal::SIGKILL);
    // The process is down: the fires of these seconds are missed, and must
    // be caught up (run_all) when it comes back.
    std::thread::sleep(Duration::from_secs(3));
    let mut server = Server::start(&data, &["--misfire-grace", "0"]);
    // Catch-up plus new fires; then a second kill while runs are in flight.
    server.wait_runs("tick", before + 5);
    server.signal(Signal::SIGKILL);
    let mut server = Server::start(&data, &["--misfire-grace", "0"]);
    let before = server.all_runs("tick").len();
    server.wait_runs("tick", before + 2);
    server.signal(Signal::SIGTERM);
    let server = Server::start(&data, &["--misfire-grace", "0"]);
    // Stop firing, then let everything finish.
    server.post(
        "/api/v1/namespaces/e2e/jobs/tick/pause",
        "",
        "application/json",
    );
    server.post(
        "/api/v1/namespaces/e2e/jobs/long/pause",
        "",
        "application/json",
    );
    server.wait_idle(&["tick", "long"]);

    let fires = server.get("/api/v1/namespaces/e2e/jobs/tick/fires?limit=10000")["items"]
        .as_array()
        .unwrap()
        .clone();
    let seconds: Vec<i64> = fires
        .iter()
        .map(|f| {
            f["scheduled_at"]
                .as_str()
                .unwrap()
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_second()
        })
        .collect();
    assert!(seconds.len() >= 8, "only {} fires", seconds.len());
    assert!(seconds[0] <= applied_at.as_second() + 2);
    for w in seconds.windows(2) {
        assert_eq!(
            w[1] - w[0],
            1,
            "a scheduled second is missing or doubled between {} and {}",
            w[0],
            w[1]
        );
    }
    let runs = server.all_runs("tick");
    let run_ids: BTreeSet<i64> = runs.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    let fired: BTreeSet<i64> = fires
        .iter()
        .map(|f| {
            f["run_id"]
                .as_i64()
                .expect("every tick fire has a run under run_all")
        })
        .collect();
    assert_eq!(run_ids, fired, "runs and fires match one to one");
    let scheduled: BTreeSet<&str> = runs
        .iter()
        .map(|r| r["scheduled_at"].as_str().unwrap())
        .collect();
    assert_eq!(
        scheduled.len(),
        runs.len(),
        "no scheduled instant has two runs"
    );
    for r in runs.iter().chain(server.all_runs("long").iter()) {
        for t in r["tasks"].as_array().unwrap() {
            for a in t["attempts"].as_array().unwrap() {
                assert_ne!(a["state"], "running", "attempt left running: {r}");
            }
        }
        assert!(
            !["pending", "running"].contains(&r["state"].as_str().unwrap()),
            "run left active: {r}"
        );
    }
    for r in &runs {
        assert_eq!(r["state"], "succeeded", "a tick run did not succeed: {r}");
    }
    // Attempts killed with the process were recorded lost and retried.
    let long = server.all_runs("long");
    let lost: Vec<&Value> = long
        .iter()
        .filter(|r| r["tasks"][0]["attempts"][0]["state"] == "lost")
        .collect();
    assert!(!lost.is_empty(), "no attempt was caught by the kill");
    for r in lost {
        let attempts = r["tasks"][0]["attempts"].as_array().unwrap();
        assert_eq!(
            attempts.last().unwrap()["state"],
            "succeeded",
            "lost attempt not retried: {r}"
        );
    }
}

/// A failing task is retried after its configured delay, and a SIGTERM lets
/// a running attempt finish instead of losing it.
#[test]
fn retries_wait_their_delay_and_sigterm_drains() {
    let (dir, data) = setup();
    let marker = dir.path().join("attempts");
    let mut server = Server::start(&data, &[]);
    let file = format!(
        r#"
namespace: e2e
jobs:
  - name: flaky
    retry: {{ max_attempts: 3, backoff: fixed, initial: 2s, max: 2s }}
    tasks:
      - {{ id: t, shell: 'echo $DAGCRON_ATTEMPT >> {m}; test $DAGCRON_ATTEMPT -ge 2' }}
  - name: drain
    tasks:
      - {{ id: t, shell: 'sleep 2; echo done' }}
"#,
        m = marker.display()
    );
    assert_eq!(
        server.post("/api/v1/apply", &file, "application/yaml").0,
        200
    );
    let (status, run) = server.post(
        "/api/v1/namespaces/e2e/jobs/flaky/trigger",
        "",
        "application/json",
    );
    assert_eq!(status, 201);
    server.wait_idle(&["flaky"]);
    let run = server.get(&format!("/api/v1/runs/{}", run["id"]));
    let attempts = run["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let finished: jiff::Timestamp = attempts[0]["finished_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let restarted: jiff::Timestamp = attempts[1]["started_at"].as_str().unwrap().parse().unwrap();
    let gap = restarted.duration_since(finished).as_secs_f64();
    assert!(gap >= 2.0, "retried after {gap}s, before the configured 2s");

    let (_, run) = server.post(
        "/api/v1/namespaces/e2e/jobs/drain/trigger",
        "",
        "application/json",
    );
    // SIGTERM once the attempt is running: it must be allowed to finish.
    until("the attempt runs", || {
        server.get(&format!("/api/v1/runs/{}", run["id"]))["tasks"][0]["state"] == "running"
    });
    server.signal(Signal::SIGTERM);
    let server = Server::start(&data, &[]);
    let run = server.get(&format!("/api/v1/runs/{}", run["id"]));
    assert_eq!(
        run["state"], "succeeded",
        "the attempt finished during shutdown: {run}"
    );
    assert_eq!(run["tasks"][0]["attempts"].as_array().unwrap().len(), 1);
}

/// The example job files apply cleanly to a real server, twice. (The
/// monitoring files beside them, `prometheus-*` and `grafana-*`, are
/// checked by `monitoring_files.rs`.)
#[test]
fn examples_apply_cleanly_and_idempotently() {
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut applied = 0;
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        // Job files only: the monitoring files and the demo's module live beside them.
        if name.starts_with("prometheus-") || !name.ends_with(".yaml") {
            continue;
        }
        applied += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        let (status, first) = server.post("/api/v1/apply", &text, "application/yaml");
        assert_eq!(status, 200, "{}: {first}", path.display());
        let (_, second) = server.post("/api/v1/apply", &text, "application/yaml");
        for j in second["jobs"].as_array().unwrap() {
            assert_eq!(
                j["result"]["result"],
                json!("unchanged"),
                "{}",
                path.display()
            );
        }
    }
    assert!(applied >= 2, "{applied}");
}

/// A configuration file supplies what flags do not; a typo in it is an error.
#[test]
fn configuration_file() {
    let (dir, data) = setup();
    let config = dir.path().join("dagcron.toml");
    // Port 0: the system chooses, so that it cannot be the default's 7700.
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:0\"\npool_size = 4\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    let address_file = dir.path().join("address");
    let log = dir.path().join("server.log");
    let mut child = common::Killed(
        Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args([
                "serve",
                "--config",
                config.to_str().unwrap(),
                "--address-file",
            ])
            .arg(&address_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let address = common::wait_address(&mut child.0, &address_file, &log);
    assert_ne!(
        address.port(),
        7700,
        "the server did not listen where the file said"
    );
    assert!(
        reqwest::blocking::get(format!("http://{address}/healthz"))
            .unwrap()
            .status()
            .is_success()
    );
    assert!(
        data.join("dagcron.db").exists(),
        "the data directory comes from the file"
    );
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGTERM).unwrap();
    child.0.wait().unwrap();

    std::fs::write(&config, "pool_sise = 3\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pool_sise") && stderr.contains("dagcron.toml"),
        "{stderr}"
    );
}

/// Following a running attempt streams its output as it comes, and ends
/// when the attempt does; `dagcron logs -f` prints the same.
#[test]
fn following_a_running_attempt_streams_its_output() {
    use std::io::Read;

    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let (status, body) = server.post(
        "/api/v1/apply",
        "namespace: e2e\njobs:\n  - { name: talk, tasks: [{ id: t, shell: 'echo first; sleep 2; echo second' }] }\n",
        "application/yaml",
    );
    assert_eq!(status, 200, "{body}");
    let (status, run) = server.post(
        "/api/v1/namespaces/e2e/jobs/talk/trigger",
        "{}",
        "application/json",
    );
    assert_eq!(status, 201, "{run}");
    let id = run["id"].as_i64().unwrap();
    until("the attempt runs", || {
        server.get(&format!("/api/v1/runs/{id}"))["tasks"][0]["attempts"][0]["state"] == "running"
    });
    let (mut resp, mut seen) = server.follow_log_until(id, "t", "first");
    assert_eq!(
        server.get(&format!("/api/v1/runs/{id}"))["state"],
        "running",
        "the first line arrived while the attempt ran"
    );
    resp.read_to_end(&mut seen).unwrap();
    assert_eq!(String::from_utf8_lossy(&seen), "first\nsecond\n");

    let out = server
        .cli()
        .args(["logs", &id.to_string(), "t", "-f"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\nsecond\n");
}

/// `dagcron logs` without `-f` printed nothing while the attempt ran; it
/// prints the output so far, and says on standard error that more may come.
#[test]
fn logs_of_a_running_attempt_print_its_output_so_far() {
    let (dir, data) = setup();
    let go = dir.path().join("go");
    let server = InProcess::start(&data, &[]);
    let file = format!(
        "namespace: e2e\njobs:\n  - {{ name: gated, tasks: [{{ id: t, shell: \"echo first; while [ ! -e '{}' ]; do sleep 0.02; done; echo second\" }}] }}\n",
        go.display()
    );
    server.apply(&file);
    let id = server.trigger("gated").to_string();
    let logs = || server.cli().args(["logs", &id, "t"]).output().unwrap();
    let out = until("the first line is printed", || {
        let out = logs();
        (out.status.success() && !out.stdout.is_empty()).then_some(out)
    });
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\n");
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(note.contains("still running"), "{note}");
    std::fs::write(&go, "").unwrap();
    until("the run ends", || {
        server.get(&format!("/api/v1/runs/{id}"))["state"] == "succeeded"
    });
    let out = logs();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\nsecond\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// `cluster status` on a server alone exited 1 with a 404; a refused
/// token did not say which token was sent or which file was looked for.
#[test]
fn the_command_line_says_what_a_server_alone_is_and_which_token_it_sent() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let out = server.cli().args(["cluster", "status"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("a single server, no cluster"),
        "{out:?}"
    );
    let elsewhere = dir.path().join("elsewhere");
    let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["--server", &server.url, "jobs", "list", "e2e"])
        .env_remove("DAGCRON_TOKEN")
        .env("DAGCRON_DATA_DIR", &elsewhere)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("401"), "{stderr}");
    assert!(
        stderr.contains(&format!("{}", elsewhere.join("admin.token").display())),
        "{stderr}"
    );
    let out = server
        .cli()
        .args(["--token", "dgc_wrong", "jobs", "list", "e2e"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("given by --token or DAGCRON_TOKEN"),
        "{stderr}"
    );
}

/// `jobs show` printed the API's JSON whatever was asked; it prints the
/// job's state and its definition as YAML, and JSON with `--json`.
#[test]
fn a_job_is_shown_with_its_definition_as_yaml() {
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    server.apply("namespace: e2e\njobs:\n  - { name: shown, schedule: '@hourly', tasks: [{ id: t, shell: 'echo hi' }] }\n");
    let out = server
        .cli()
        .args(["jobs", "show", "e2e/shown"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("e2e/shown  version 1  active  updated "),
        "{text}"
    );
    assert!(text.contains("\n---\nname: shown\n"), "{text}");
    assert!(text.contains("  shell: echo hi\n"), "{text}");
    let out = server
        .cli()
        .args(["--json", "jobs", "show", "e2e/shown"])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["spec"]["name"], "shown");
}

fn attempt_states(server: &Server, run: i64) -> Vec<String> {
    server.get(&format!("/api/v1/runs/{run}"))["tasks"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap().to_string())
        .collect()
}

/// With `--shutdown-grace 1`, a task still running at the end of the grace
/// was left running (its parent became 1); after the restart its attempt was
/// lost and retried, and both copies ran. And after a SIGKILL of the server,
/// the task's process lived on beside its retry.
#[test]
fn regression_no_task_outlives_its_server() {
    let (_dir, data) = setup();
    let mut server = Server::start(&data, &["--shutdown-grace", "1"]);
    let file = "namespace: e2e\njobs:\n  - name: long\n    retry: { max_attempts: 5, backoff: fixed, initial: 100ms, max: 100ms }\n    tasks:\n      - { id: t, shell: 'sleep 300' }\n";
    assert_eq!(
        server.post("/api/v1/apply", file, "application/yaml").0,
        200
    );
    let run = server.trigger("long");
    let first = attempt_pid(run, "t", 1);
    // SIGTERM: the attempt gets its second of grace, then is killed and
    // recorded before the server exits.
    let started = Instant::now();
    assert!(server.signal(Signal::SIGTERM).success());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the server took {:?} to stop",
        started.elapsed()
    );
    wait_gone(first, "attempt 1");
    let mut server = Server::start(&data, &["--shutdown-grace", "1"]);
    let pid = attempt_pid(run, "t", 2);
    assert_eq!(attempt_states(&server, run), ["lost", "running"]);
    // SIGKILL: nothing is killed, the task's process lives on...
    server.signal(Signal::SIGKILL);
    assert!(
        kill(Pid::from_raw(pid as i32), None).is_ok(),
        "the task's process is expected to outlive a SIGKILL of its server"
    );
    // ...until the next server, which kills it before it retries.
    let mut server = Server::start(&data, &["--shutdown-grace", "1"]);
    wait_gone(pid, "attempt 2");
    let third = attempt_pid(run, "t", 3);
    assert_eq!(attempt_states(&server, run), ["lost", "lost", "running"]);
    // Stopped as it should be, the last server leaves nothing behind either
    // (a process left here held whatever its test runner had open).
    assert!(server.signal(Signal::SIGTERM).success());
    wait_gone(third, "attempt 3");
}

/// A server stopped with SIGSTOP, then continued, fired every instant it
/// had missed in a burst, ignoring the misfire policy (47 runs after 40 s
/// stopped, none recorded as missed).
#[test]
fn regression_a_suspended_server_follows_the_misfire_policy_when_it_wakes() {
    let (_dir, data) = setup();
    let server = Server::start(&data, &["--misfire-grace", "2"]);
    let file = "namespace: e2e\njobs:\n  - { name: tick, schedule: '* * * * * *', misfire: run_once, concurrency: allow, max_active_runs: 100, tasks: [{ id: t, noop: true }] }\n";
    assert_eq!(
        server.post("/api/v1/apply", file, "application/yaml").0,
        200
    );
    server.wait_runs("tick", 2);
    server.send(Signal::SIGSTOP);
    let stopped_at = jiff::Timestamp::now();
    // Stopped well past the grace: the fires of these seconds are overdue.
    std::thread::sleep(Duration::from_secs(8));
    server.send(Signal::SIGCONT);
    let woke_at = jiff::Timestamp::now();
    server.wait_runs("tick", server.all_runs("tick").len() + 2);
    let fires = server.get("/api/v1/namespaces/e2e/jobs/tick/fires?limit=10000")["items"]
        .as_array()
        .unwrap()
        .clone();
    let during: Vec<&str> = fires
        .iter()
        .filter(|f| {
            let at: jiff::Timestamp = f["scheduled_at"].as_str().unwrap().parse().unwrap();
            at > stopped_at && at < woke_at
        })
        .map(|f| f["outcome"].as_str().unwrap())
        .collect();
    let count = |o: &str| during.iter().filter(|d| **d == o).count();
    assert!(
        during.len() >= 7,
        "every second of the stop is in the ledger: {during:?}"
    );
    assert!(
        count("missed_skipped") >= 4,
        "missed fires recorded: {during:?}"
    );
    assert_eq!(
        count("missed_caught_up"),
        1,
        "run_once catches up one: {during:?}"
    );
    assert!(count("fired") <= 3, "no burst of on-time fires: {during:?}");
}

/// The quick start needs no extra step: the first start writes an
/// instance-admin token that the command line on this machine reads; with
/// it, tokens are created, listed and revoked from the command line.
#[test]
fn the_command_line_finds_the_local_admin_token_and_manages_tokens() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    // Without a token, the API refuses.
    let (status, body) = server.post(
        "/api/v1/apply",
        "namespace: x\njobs: []\n",
        "application/yaml",
    );
    assert_eq!(status, 200, "{body}");
    let anonymous =
        reqwest::blocking::get(format!("{}/api/v1/namespaces/x/jobs", server.url)).unwrap();
    assert_eq!(anonymous.status(), 401);
    // The CLI, run where the data directory is, reads admin.token.
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args(["--server", &server.url])
            .args(args)
            .env("DAGCRON_DATA_DIR", &data)
            .env_remove("DAGCRON_TOKEN")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    cli(&["jobs", "list", "x"]);
    let secret = cli(&[
        "tokens",
        "create",
        "--name",
        "ci",
        "--role",
        "viewer",
        "--namespace",
        "x",
    ]);
    let secret = secret.trim();
    assert!(secret.starts_with("dgc_"), "{secret}");
    let list = cli(&["tokens", "list"]);
    assert!(list.contains("ci") && !list.contains(secret), "{list}");
    let id = list
        .lines()
        .find(|l| l.ends_with(" ci"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    // The viewer reads, and may not change anything.
    let viewer = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["--server", &server.url, "--token", secret, "apply", "-f"])
        .arg(dir.path().join("none.yaml"))
        .output()
        .unwrap();
    assert!(!viewer.status.success());
    std::fs::write(dir.path().join("x.yaml"), "namespace: x\njobs: []\n").unwrap();
    let viewer = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["--server", &server.url, "--token", secret, "apply", "-f"])
        .arg(dir.path().join("x.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&viewer.stderr);
    assert!(
        !viewer.status.success() && stderr.contains("403"),
        "{stderr}"
    );
    cli(&["tokens", "revoke", &id]);
    let revoked = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args([
            "--server",
            &server.url,
            "--token",
            secret,
            "jobs",
            "list",
            "x",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&revoked.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("revoked"),
        "{stderr}"
    );
    // Data directory 0700; database, key and token files 0600.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    for f in ["dagcron.db", "server.key", "admin.token"] {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
}

/// Every task inherited the server's whole environment: `shell: env`
/// printed the agent join token and whatever the operator had exported.
#[test]
fn regression_tasks_get_a_clean_environment() {
    let (_dir, data) = setup();
    let mut server = Server::start_env(
        &data,
        &["--pass-env", "HTTP_PROXY"],
        &[
            ("DAGCRON_AGENT_TOKEN", "agent-secret"),
            ("OPERATOR_SECRET", "hunter2"),
            ("HTTP_PROXY", "http://proxy.invalid:3128"),
        ],
    );
    let job = "namespace: e2e\njobs:\n  - { name: env, tasks: [{ id: t, shell: { command: env, env: { MINE: declared } } }] }\n";
    assert_eq!(server.post("/api/v1/apply", job, "application/yaml").0, 200);
    let run = server.trigger("env");
    server.wait_run(run, "succeeded");
    let out = server
        .http()
        .get(format!(
            "{}/api/v1/runs/{run}/tasks/t/attempts/1/log",
            server.url
        ))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for leaked in [
        "agent-secret",
        "hunter2",
        "DAGCRON_AGENT_TOKEN",
        "OPERATOR_SECRET",
    ] {
        assert!(!out.contains(leaked), "{leaked} reached the task:\n{out}");
    }
    for given in [
        "PATH=",
        "DAGCRON_RUN_ID=",
        "MINE=declared",
        "HTTP_PROXY=http://proxy.invalid:3128",
    ] {
        assert!(out.contains(given), "{given} missing:\n{out}");
    }
    assert!(server.signal(Signal::SIGTERM).success());
}

/// Every change and every refused call is in the audit log, hash-chained:
/// `dagcron audit verify` passes on the log as written, and finds a row
/// changed or deleted in the database behind the server's back.
#[test]
fn the_audit_log_records_changes_and_refusals_and_finds_tampering() {
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let job = "namespace: e2e\njobs:\n  - { name: a, tasks: [{ id: t, noop: true }] }\n";
    assert_eq!(server.post("/api/v1/apply", job, "application/yaml").0, 200);
    let run = server.trigger("a");
    server.wait_run(run, "succeeded");
    let refused = reqwest::blocking::Client::new()
        .post(format!(
            "{}/api/v1/namespaces/e2e/jobs/a/trigger",
            server.url
        ))
        .send()
        .unwrap();
    assert_eq!(refused.status(), 401);
    let audit = |server: &Api, args: &[&str]| {
        let out = server.cli().arg("audit").args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, text) = audit(&server, &[]);
    assert!(ok, "{text}");
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].contains("POST /api/v1/apply") && lines[0].contains(" 200 "),
        "{text}"
    );
    // The apply is audited under its file's namespace; the call refused
    // for want of a token named a namespace it may not write rows into.
    let (ok, scoped) = audit(&server, &["--namespace", "e2e"]);
    assert!(
        ok && scoped.lines().count() == 3,
        "the apply and the trigger, not the refused call: {scoped}"
    );
    assert!(
        lines[1].contains("/jobs/a/trigger") && lines[1].contains("tok_"),
        "{text}"
    );
    assert!(
        lines[2].contains(" 401 ") && lines[2].contains("127.0.0.1"),
        "{text}"
    );
    assert_eq!(
        audit(&server, &["--verify"]),
        (true, "3 rows, chain intact\n".into())
    );

    // Behind the server's back: a changed row, then a deleted one.
    server.stop();
    let db = rusqlite::Connection::open(data.join("dagcron.db")).unwrap();
    db.execute("UPDATE audit SET outcome = 200 WHERE seq = 3", [])
        .unwrap();
    let server = InProcess::start(&data, &[]);
    let (ok, text) = audit(&server, &["--verify"]);
    assert!(!ok && text.contains("broken at row 3"), "{text}");
    db.execute("UPDATE audit SET outcome = 401 WHERE seq = 3", [])
        .unwrap();
    db.execute("DELETE FROM audit WHERE seq = 2", []).unwrap();
    let (ok, text) = audit(&server, &["--verify"]);
    assert!(!ok && text.contains("row 2 is missing"), "{text}");
}

/// A secret set from the command line reaches the task that refers to it
/// (in its environment, and in an HTTP header), is stored encrypted, and
/// is `***` in everything the attempt reports, in its base64 and
/// URL-encoded forms too; the API never answers its value.
#[test]
fn secrets_reach_their_tasks_and_nothing_else() {
    use std::io::Write as _;
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let value = "s3cr3t/value+1";
    let mut set = server
        .cli()
        .args(["secrets", "set", "e2e", "db-password"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    set.stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let out = set.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let job = "namespace: e2e\njobs:\n  - name: uses\n    tasks:\n      - id: t\n        shell:\n          command: 'echo \"plain $PASSWORD\"; printf %s \"$PASSWORD\" | base64; echo \"$PASSWORD\" | sed \"s|/|%2F|; s|+|%2B|\"; test \"$PASSWORD\" = \"s3cr3t/value+1\"'\n          env: { PASSWORD: { secret: db-password } }\n";
    let (status, body) = server.post("/api/v1/apply", job, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let run = server.trigger("uses");
    let r = server.wait_run(run, "succeeded");
    let log = server
        .http()
        .get(format!(
            "{}/api/v1/runs/{run}/tasks/t/attempts/1/log",
            server.url
        ))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(log, "plain ***\n***\n***\n", "{r}");
    // Never answered, never stored in the clear.
    let list = server.get("/api/v1/namespaces/e2e/secrets");
    assert_eq!(list["items"][0]["name"], "db-password");
    assert!(!list.to_string().contains(value));
    let db = rusqlite::Connection::open(data.join("dagcron.db")).unwrap();
    let stored: Vec<u8> = db
        .query_row("SELECT ciphertext FROM secrets", [], |r| r.get(0))
        .unwrap();
    assert!(!stored.windows(value.len()).any(|w| w == value.as_bytes()));
    // A task that refers to a secret that does not exist fails, saying which.
    let job = "namespace: e2e\njobs:\n  - { name: missing, tasks: [{ id: t, shell: { command: 'true', env: { X: { secret: nope } } } }] }\n";
    assert_eq!(server.post("/api/v1/apply", job, "application/yaml").0, 200);
    let run = server.trigger("missing");
    let r = server.wait_run(run, "failed");
    let error = r["tasks"][0]["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("no secret nope"), "{error}");
    // A secret on a command line is refused at apply.
    let job = "namespace: e2e\njobs:\n  - { name: bad, tasks: [{ id: t, shell: 'echo {{secrets.db-password}}' }] }\n";
    let (status, body) = server.post("/api/v1/apply", job, "application/yaml");
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("command line"), "{body}");
    drop(dir);
}

/// `dagcron secrets rotate-key` makes a new master key, re-encrypts every
/// secret under it and retires the old key once nothing uses it; tasks get
/// their secrets throughout, and after a restart.
#[test]
fn the_master_key_rotates_without_losing_a_secret() {
    use std::io::Write as _;
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    for name in ["one", "two"] {
        let mut set = server
            .cli()
            .args(["secrets", "set", "e2e", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        set.stdin
            .take()
            .unwrap()
            .write_all(format!("value-{name}").as_bytes())
            .unwrap();
        assert!(set.wait().unwrap().success());
    }
    let job = "namespace: e2e\njobs:\n  - { name: uses, tasks: [{ id: t, shell: { command: 'test \"$A$B\" = value-onevalue-two', env: { A: { secret: one }, B: { secret: two } } } }] }\n";
    assert_eq!(server.post("/api/v1/apply", job, "application/yaml").0, 200);
    let first = server.get("/api/v1/secrets/keys")["current"]
        .as_str()
        .unwrap()
        .to_string();
    let out = server
        .cli()
        .args(["secrets", "rotate-key"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until("the secrets are re-encrypted", || {
        let keys = server.get("/api/v1/secrets/keys");
        let current = keys["current"].as_str().unwrap();
        let all = keys["keys"].as_array().unwrap();
        if current != first && all.len() == 1 && all[0]["secrets"] == 2 {
            Ok(())
        } else {
            Err(keys)
        }
    });
    assert!(
        std::fs::read_dir(data.join("master-keys"))
            .unwrap()
            .next()
            .is_none(),
        "the retired key's file is gone"
    );
    let run = server.trigger("uses");
    server.wait_run(run, "succeeded");
    assert_eq!(server.stop(), dagcron::serve::Exit::Stopped);
    let server = InProcess::start(&data, &[]);
    let run = server.trigger("uses");
    server.wait_run(run, "succeeded");
}

/// `--log-format json` writes one JSON object per line: the level, the
/// timestamp, the message and the event's fields at the top level (here,
/// the run whose deadline passed).
#[test]
fn logs_can_be_json_one_object_per_line() {
    let (_dir, data) = setup();
    let mut server = Server::start(&data, &["--log-format", "json"]);
    let file = "namespace: e2e\njobs:\n  - { name: late, deadline: 1s, tasks: [{ id: t, shell: 'sleep 30' }] }\n";
    assert_eq!(
        server.post("/api/v1/apply", file, "application/yaml").0,
        200
    );
    let run = server.trigger("late");
    server.wait_run(run, "failed");
    assert!(server.signal(Signal::SIGTERM).success());
    let text = std::fs::read_to_string(&server.log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string())
    );
    let deadline = lines
        .iter()
        .find(|l| l["message"] == "run deadline passed; stopping it")
        .unwrap_or_else(|| panic!("no deadline line in {text}"));
    assert_eq!(deadline["run"], run, "{deadline}");
    // The attempt's end and the run's carry what they are about as fields.
    let attempt = lines
        .iter()
        .find(|l| l["task"] == "t" && l["run"] == run)
        .unwrap_or_else(|| panic!("no attempt line in {text}"));
    assert_eq!(
        (&attempt["namespace"], &attempt["job"], &attempt["attempt"]),
        (&json!("e2e"), &json!("late"), &json!(1)),
        "{attempt}"
    );
    let ended = lines
        .iter()
        .find(|l| {
            l["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("run failed"))
        })
        .unwrap_or_else(|| panic!("no line of the run's end in {text}"));
    assert_eq!(
        (&ended["namespace"], &ended["job"], &ended["run"]),
        (&json!("e2e"), &json!("late"), &json!(run)),
        "{ended}"
    );
}

/// The offline commands know anchors: `cron next --anchor` counts an
/// `@every` expression from one, as a job's `anchor` does, and `dag
/// validate` reports a malformed anchor with its path.
#[test]
fn the_offline_commands_count_every_from_an_anchor_and_check_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args([
            "cron",
            "next",
            "@every 90m",
            "--anchor",
            "2026-01-01T00:10:00Z",
            "--from",
            "2026-01-01T00:00:00Z",
            "--count",
            "3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        r#"["2026-01-01T00:10:00+00:00","2026-01-01T01:40:00+00:00","2026-01-01T03:10:00+00:00"]"#
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.yaml");
    std::fs::write(
        &file,
        "namespace: a\njobs:\n  - name: j\n    schedule: '@every 90m'\n    anchor: '2026-01-01 at ten past midnight'\n    tasks: [{ id: t, shell: 'true' }]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["dag", "validate", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("jobs[0].anchor: invalid anchor \"2026-01-01 at ten past midnight\""),
        "{stderr}"
    );
}

/// A job file with a misspelt field: `dag validate` exited 1 (2 for other
/// problems), printed `error:` twice, placed it at `<input>` and listed
/// every field of a job instead of the one meant.
#[test]
fn a_misspelt_field_is_placed_in_its_file_with_the_field_meant() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "namespace: a\njobs:\n  - name: j\n    schedul: '@hourly'\n    tasks: [{ id: t, shell: 'true' }]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dagcron"))
        .args(["dag", "validate", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown field `schedul`: did you mean `schedule`?"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}:4:5", file.display())),
        "{stderr}"
    );
    assert_eq!(stderr.matches("error:").count(), 1, "{stderr}");
}

/// Past the ready backlog, a manual trigger gets 429 with `Retry-After`
/// and the code `busy`, and makes no run.
#[test]
fn a_trigger_past_the_ready_backlog_is_told_to_come_back() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &["--pool-size", "1", "--max-ready-backlog", "1"]);
    let gate = dir.path().join("gate");
    let wait = format!("while [ ! -e {} ]; do sleep 0.01; done", gate.display());
    let file = format!(
        "namespace: e2e\njobs:\n  - {{ name: wide, tasks: [{{ id: a, shell: '{wait}' }}, {{ id: b, shell: '{wait}' }}] }}\n"
    );
    assert_eq!(
        server.post("/api/v1/apply", &file, "application/yaml").0,
        200
    );
    let first = server.trigger("wide");
    let refused = server
        .http()
        .post(format!(
            "{}/api/v1/namespaces/e2e/jobs/wide/trigger",
            server.url
        ))
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body: Value = refused.json().unwrap();
    assert_eq!(body["error"]["code"], "busy", "{body}");
    std::fs::write(&gate, "").unwrap();
    server.wait_run(first, "succeeded");
    assert_eq!(
        server.all_runs("wide").len(),
        1,
        "the refused trigger made no run"
    );
    server.stop();
}

/// `dagcron admin retention` shows the default, changes what is named and
/// keeps the other, refuses an age under an hour, returns to the default;
/// `dagcron admin prune --dry-run` says what would go (nothing: the runs
/// are new), as does a real pass.
#[test]
fn retention_is_read_and_set_and_pruning_asked_from_the_command_line() {
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let cli = |args: &[&str]| server.cli().args(args).output().unwrap();
    let ok = |args: &[&str]| {
        let out = cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(
        ok(&["admin", "retention", "e2e"]),
        "keep 30 day(s) (2592000s) and at least the last 100 run(s) of each job (the instance's default)\n"
    );
    ok(&["admin", "retention", "e2e", "--max-age", "7d"]);
    assert_eq!(
        ok(&["admin", "retention", "e2e", "--keep-last", "3"]),
        "keep 7 day(s) (604800s) and at least the last 3 run(s) of each job\n"
    );
    let refused = cli(&["admin", "retention", "e2e", "--max-age", "10m"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("max_age_seconds is from 3600"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        ok(&["admin", "retention", "e2e"]).contains("last 3 run(s)"),
        "unchanged"
    );
    let file = "namespace: e2e\njobs:\n  - { name: a, tasks: [{ id: t, noop: true }] }\n";
    assert_eq!(
        server.post("/api/v1/apply", file, "application/yaml").0,
        200
    );
    let run = server.trigger("a");
    server.wait_run(run, "succeeded");
    assert_eq!(
        ok(&["admin", "prune", "--dry-run", "e2e"]),
        "nothing would go\n"
    );
    assert_eq!(ok(&["admin", "prune"]), "nothing pruned\n");
    let json = ok(&["--json", "admin", "prune", "--dry-run"]);
    let answer: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(answer, json!({"dry_run": true, "namespaces": []}));
    assert!(ok(&["admin", "retention", "e2e", "--default"]).contains("(the instance's default)"));
    assert_eq!(server.all_runs("a").len(), 1);
    server.stop();
}

/// `dagcron admin quotas`: shows a namespace's quotas, changes those named
/// and keeps the others, clears them; a file past one is refused.
#[test]
fn quotas_are_read_and_set_from_the_command_line() {
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let cli = |args: &[&str]| {
        let out = server.cli().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(cli(&["admin", "quotas", "e2e"]).contains("max_jobs                 no limit"));
    cli(&["admin", "quotas", "e2e", "--max-jobs", "1"]);
    let shown = cli(&["admin", "quotas", "e2e", "--max-active-runs", "5"]);
    assert!(
        shown.contains("max_jobs                 1"),
        "kept: {shown}"
    );
    assert!(shown.contains("max_active_runs          5"), "{shown}");
    let two = "namespace: e2e\njobs:\n  - { name: a, tasks: [{ id: t, noop: true }] }\n  - { name: b, tasks: [{ id: t, noop: true }] }\n";
    let (status, body) = server.post("/api/v1/apply", two, "application/yaml");
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("quota_exceeded")),
        "{body}"
    );
    let cleared = cli(&["admin", "quotas", "e2e", "--clear"]);
    assert!(!cleared.contains("max_jobs                 1"), "{cleared}");
    assert_eq!(server.post("/api/v1/apply", two, "application/yaml").0, 200);
    server.stop();
}

/// `jobs trigger --at` plans a run; the server is killed with SIGKILL
/// before its instant and comes back after it: the run is made once, late
/// by the misfire policy, and `jobs upcoming` lists planned runs until
/// they are made.
#[test]
fn a_run_planned_from_the_command_line_survives_a_kill_and_is_made_once() {
    let (_dir, data) = setup();
    let mut server = Server::start(&data, &["--misfire-grace", "0"]);
    let (status, body) = server.post(
        "/api/v1/apply",
        "namespace: e2e\njobs:\n  - { name: later, misfire: run_once, tasks: [{ id: a, shell: 'echo made' }] }\n",
        "application/yaml",
    );
    assert_eq!(status, 200, "{body}");
    let cli = |server: &Server, args: &[&str]| {
        let out = server.cli().args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, said) = cli(
        &server,
        &["jobs", "trigger", "e2e/later", "--at", "tomorrow"],
    );
    assert!(!ok && said.contains("RFC 3339"), "{said}");
    let at = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3))
        .round(jiff::Unit::Second)
        .unwrap();
    let far = at + jiff::SignedDuration::from_hours(24);
    for when in [at, far] {
        let (ok, said) = cli(
            &server,
            &[
                "--json",
                "jobs",
                "trigger",
                "e2e/later",
                "--at",
                &when.to_string(),
            ],
        );
        assert!(ok, "{said}");
        let run: Value = serde_json::from_str(&said).unwrap();
        assert_eq!(run["state"], "planned", "{run}");
    }
    let (ok, upcoming) = cli(&server, &["jobs", "upcoming", "e2e/later"]);
    assert!(ok, "{upcoming}");
    assert_eq!(upcoming.matches("planned").count(), 2, "{upcoming}");
    server.signal(Signal::SIGKILL);
    // Down across the instant.
    while jiff::Timestamp::now() < at + jiff::SignedDuration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let server = Server::start(&data, &["--misfire-grace", "0"]);
    let made = until("the planned run is made", || {
        let runs = server.all_runs("later");
        match runs.iter().find(|r| r["state"] == "succeeded") {
            Some(r) => Ok(r.clone()),
            None => Err(format!("{runs:?}")),
        }
    });
    assert_eq!(made["scheduled_at"], at.to_string());
    let runs = server.all_runs("later");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (ok, upcoming) = cli(&server, &["jobs", "upcoming", "e2e/later"]);
    assert!(ok, "{upcoming}");
    assert_eq!(upcoming.matches("planned").count(), 1, "{upcoming}");
    assert!(upcoming.contains(&far.to_string()), "{upcoming}");
}

/// Headers were read with no timeout: 20 slowloris connections (a request
/// line and one header, then nothing) were still open after 45 s. A
/// connection that sends nothing, or stops in its headers, is now closed
/// after the header timeout (10 s), and the server answers meanwhile.
#[test]
fn regression_slow_clients_are_closed_after_the_header_timeout() {
    use std::io::{Read, Write};
    let (_dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let address = server.url.trim_start_matches("http://").to_string();
    let mut slow: Vec<std::net::TcpStream> = (0..20)
        .map(|i| {
            let mut c = std::net::TcpStream::connect(&address).unwrap();
            if i % 2 == 0 {
                c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            c
        })
        .collect();
    let started = Instant::now();
    assert_eq!(
        server
            .http()
            .get(format!("{}/healthz", server.url))
            .send()
            .unwrap()
            .status(),
        200,
        "the server answers beside them"
    );
    for c in &mut slow {
        let mut buf = [0u8; 256];
        // Closed: the read ends (at once with an end of file, or a reset),
        // long before the 30 s of the read timeout.
        match c.read(&mut buf) {
            Ok(n) => assert!(
                n == 0 || buf[..n].starts_with(b"HTTP/1.1 408"),
                "{:?}",
                &buf[..n]
            ),
            Err(e) => assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "still open after {:?}",
                started.elapsed()
            ),
        }
    }
}

/// Priorities through a real server: with its one slot (`--pool-size 1`)
/// held, a job of priority 50 triggered after three default tasks starts
/// first; the three keep their order.
#[test]
fn the_server_starts_higher_priorities_first() {
    let (dir, data) = setup();
    let trace = dir.path().join("trace");
    let server = Server::start(&data, &["--pool-size", "1"]);
    let t = trace.display();
    server.apply(&format!(
        "namespace: {ns}\njobs:\n  - {{ name: hold, tasks: [{{ id: long, shell: 'sleep 60' }}] }}\n  - name: low\n    tasks:\n      - {{ id: a, shell: 'echo low-a >> {t}' }}\n      - {{ id: b, shell: 'echo low-b >> {t}' }}\n      - {{ id: c, shell: 'echo low-c >> {t}' }}\n  - {{ name: high, priority: 50, tasks: [{{ id: x, shell: 'echo high >> {t}' }}] }}\n",
        ns = server.namespace
    ));
    let state = |run: i64, task: usize| {
        server.get(&format!("/api/v1/runs/{run}"))["tasks"][task]["state"].clone()
    };
    let hold = server.trigger("hold");
    until("the slot is held", || state(hold, 0) == "running");
    let low = server.trigger("low");
    until("the low tasks wait", || {
        (0..3).all(|i| state(low, i) == "ready")
    });
    let high = server.trigger("high");
    until("the high task waits", || state(high, 0) == "ready");
    let (status, body) = server.post(
        &format!("/api/v1/runs/{hold}/cancel"),
        "",
        "application/json",
    );
    assert!(status < 300, "{status} {body}");
    server.wait_run(low, "succeeded");
    server.wait_run(high, "succeeded");
    assert_eq!(
        std::fs::read_to_string(&trace).unwrap(),
        "high\nlow-a\nlow-b\nlow-c\n"
    );
}

/// `examples/fan-out.yaml` through a real server: each region and feed an
/// instance with its item, the report gets the orders as a list, an empty
/// list skips the fan-out with a note; an instance held for an operator is
/// marked through the API by its percent-encoded id, and the command line
/// shows the instances and their logs.
#[test]
fn the_fan_out_example_runs_an_instance_per_item_and_operators_act_on_one() {
    let (_dir, data) = setup();
    let server = Server::start(&data, &[]);
    let ns = server.namespace.clone();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/fan-out.yaml");
    let yaml = std::fs::read_to_string(path).unwrap();
    server.apply(&yaml.replace("namespace: shop", &format!("namespace: {ns}")));
    let job = server.get(&format!("/api/v1/namespaces/{ns}/jobs/nightly-sync"));
    assert_eq!(job["spec"]["priority"], 20, "{job}");
    assert_eq!(job["spec"]["tasks"][2]["priority"], -10, "{job}");
    let run = server.trigger("nightly-sync");
    let r = server.wait_run(run, "succeeded");
    let tasks: Vec<(String, String, String)> = r["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap_or("").to_string();
            (s("id"), s("state"), s("item"))
        })
        .collect();
    let t = |id: &str, item: &str| (id.to_string(), "succeeded".to_string(), item.to_string());
    assert_eq!(
        tasks,
        [
            t("discover", ""),
            t("sync", ""),
            t("check-feed", ""),
            t("report", ""),
            t("sync[0]", "\"eu-west\""),
            t("sync[1]", "\"eu-central\""),
            t("sync[2]", "\"us-east\""),
            t("check-feed[0]", "\"prices\""),
            t("check-feed[1]", "\"stock\""),
            t("check-feed[2]", "\"images\""),
        ]
    );
    assert_eq!(r["tasks"][1]["outputs"]["orders"], r#"["40","80","120"]"#);
    let id = run.to_string();
    let logs = |task: &str| {
        let out = server.cli().args(["logs", &id, task]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(logs("sync[1]"), "syncing eu-central (instance 1)\n");
    assert_eq!(
        logs("report"),
        "orders per region: [\"40\",\"80\",\"120\"]\n"
    );
    let out = server.cli().args(["runs", "show", &id]).output().unwrap();
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.contains("instances: 3 succeeded"), "{shown}");
    // Values are printed escaped, one line each.
    assert!(
        shown.contains(r#"output orders = [\"40\",\"80\",\"120\"]"#),
        "{shown}"
    );

    // No regions: the fan-out is skipped, saying why.
    let (status, body) = server.post(
        &format!("/api/v1/namespaces/{ns}/jobs/nightly-sync/trigger"),
        r#"{"params": {"regions": "[]"}}"#,
        "application/json",
    );
    assert_eq!(status, 201, "{body}");
    let r = server.wait_run(body["id"].as_i64().unwrap(), "succeeded");
    assert_eq!(r["tasks"][1]["state"], "skipped");
    assert_eq!(
        r["tasks"][1]["note"],
        "`for_each` gave no items: nothing to run"
    );

    // An instance held for an operator, marked by its id.
    server.apply(&format!(
        "namespace: {ns}\njobs:\n  - name: held\n    retry: {{ max_attempts: 1 }}\n    tasks:\n      - {{ id: x, for_each: [1, 2, 3], on_exhausted: hold, shell: 'test {{{{item}}}} != 2' }}\n      - {{ id: after, depends_on: [x], shell: 'echo after' }}\n"
    ));
    let run = server.trigger("held");
    until("x[1] held", || {
        server.get(&format!("/api/v1/runs/{run}"))["tasks"][3]["state"] == "held"
    });
    let (status, body) = server.post(
        &format!("/api/v1/runs/{run}/tasks/x%5B1%5D/mark_succeeded"),
        "",
        "application/json",
    );
    assert_eq!(status, 200, "{body}");
    let r = server.wait_run(run, "succeeded");
    assert_eq!(r["tasks"][3]["id"], "x[1]");
    assert_eq!(r["tasks"][3]["state"], "succeeded");
    let (status, body) = server.post(
        &format!("/api/v1/runs/{run}/tasks/x%5B9%5D/mark_succeeded"),
        "",
        "application/json",
    );
    assert_eq!(status, 404, "an instance the run does not have: {body}");
}
