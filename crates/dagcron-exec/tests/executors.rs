//! Executors against real processes, a real HTTP server on loopback and
//! (with the `wasm` feature) real WebAssembly modules.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dagcron_core::Executor;
use dagcron_core::Failure;
use dagcron_core::model::{HttpSpec, ShellCommand};
use dagcron_exec::{AttemptContext, Ending, Limits, TraceHeaders, run};
use tokio_util::sync::CancellationToken;

fn ctx() -> AttemptContext {
    AttemptContext {
        item: Default::default(),
        outputs: Default::default(),
        namespace: "billing".into(),
        job: "nightly".into(),
        run_id: 42,
        task_id: "extract".into(),
        attempt: 3,
        scheduled_at: "2026-01-01T02:30:00Z".parse().unwrap(),
        idempotency_key: "billing/nightly/42/extract".into(),
        params: BTreeMap::from([("region".into(), "cn-east".into())]),
        secrets: Default::default(),
        trace: None,
        policy: None,
    }
}

fn sh(script: &str) -> Executor {
    Executor::Shell(ShellCommand {
        command: script.into(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: None,
    })
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[tokio::test]
async fn shell_gets_identity_params_and_substitution() {
    let script = "echo \"$DAGCRON_NAMESPACE $DAGCRON_JOB $DAGCRON_RUN_ID $DAGCRON_TASK_ID $DAGCRON_ATTEMPT $DAGCRON_SCHEDULED_AT $DAGCRON_IDEMPOTENCY_KEY $DAGCRON_PARAM_REGION\"; echo region={{params.region}} >&2";
    let out = run(
        &sh(script),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded);
    assert_eq!(out.exit_code, Some(0));
    let log = String::from_utf8(out.log).unwrap();
    assert!(
        log.contains(
            "billing nightly 42 extract 3 2026-01-01T02:30:00Z billing/nightly/42/extract cn-east\n"
        ),
        "{log}"
    );
    assert!(log.contains("region=cn-east\n"), "{log}");
}

#[tokio::test]
async fn command_with_args_env_and_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = Executor::Shell(ShellCommand {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), "pwd; echo $MODE".into()],
        env: BTreeMap::from([("MODE".into(), "full-{{params.region}}".into())]),
        cwd: Some(dir.path().to_string_lossy().into()),
    });
    let out = run(
        &cmd,
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    let log = String::from_utf8(out.log).unwrap();
    assert_eq!(
        log,
        format!(
            "{}\nfull-cn-east\n",
            dir.path().canonicalize().unwrap().display()
        )
    );
}

#[tokio::test]
async fn failures_carry_the_exit_code() {
    let out = run(
        &sh("echo oops >&2; exit 75"),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(75))));
    assert_eq!(out.error.as_deref(), Some("exit status 75"));
    assert_eq!(out.log, b"oops\n");
    let out = run(
        &sh("/nonexistent/program"),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(127))));
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    // The shell starts a background grandchild, then waits; both must die.
    let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
    let start = Instant::now();
    let out = run(
        &sh(&script),
        &ctx(),
        Some(Duration::from_millis(300)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the attempt returned promptly"
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The grandchild was reaped by nobody but is killed: wait until it is gone.
    until_gone(pid, "grandchild").await;
}

/// Waits (bounded) until process `pid` is gone or a zombie.
async fn until_gone(pid: i32, what: &str) {
    dagcron_testkit::until_async(&format!("{what} {pid} is gone"), async || {
        !alive(pid)
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
    })
    .await;
}

/// A descendant that left the process group (`setsid`) kept the output
/// pipes open: the attempt stayed running for the descendant's whole life,
/// and the descendant survived the timeout.
#[tokio::test]
async fn regression_a_detached_descendant_is_killed_and_does_not_hold_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("detached.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 40' & while [ ! -s {p} ]; do sleep 0.01; done; echo started; sleep 300",
        p = pidfile.display()
    );
    let start = Instant::now();
    let out = run(
        &sh(&script),
        &ctx(),
        Some(Duration::from_millis(500)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the attempt ended within the grace, not with its descendant ({:?})",
        start.elapsed()
    );
    assert!(String::from_utf8_lossy(&out.log).contains("started"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    until_gone(pid, "detached descendant").await;
}

/// The same when the task's own process exits at once: what it left
/// behind is killed too, and the attempt ends without waiting for it.
#[tokio::test]
async fn a_detached_descendant_dies_with_a_finished_task() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("detached.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 40' & while [ ! -s {p} ]; do sleep 0.01; done; echo done",
        p = pidfile.display()
    );
    let out = run(
        &sh(&script),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded, "{out:?}");
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    until_gone(pid, "detached descendant").await;
}

/// `{{params.who}}` with `x; touch pwned` ran the second command.
#[tokio::test]
async fn regression_parameters_in_a_shell_string_are_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = ctx();
    c.params.insert("who".into(), "x; touch pwned".into());
    let cmd = Executor::Shell(ShellCommand {
        command: "echo hello {{params.who}}".into(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: Some(dir.path().to_string_lossy().into()),
    });
    let out = run(&cmd, &c, None, CancellationToken::new(), Limits::default()).await;
    assert_eq!(out.ending, Ending::Succeeded);
    assert_eq!(String::from_utf8_lossy(&out.log), "hello x; touch pwned\n");
    assert!(!dir.path().join("pwned").exists());
}

/// A missing working directory was reported as the command not existing.
#[tokio::test]
async fn regression_a_missing_working_directory_is_named() {
    let cmd = Executor::Shell(ShellCommand {
        command: "echo hi".into(),
        args: vec![],
        env: BTreeMap::new(),
        cwd: Some("/no/such/dir".into()),
    });
    let out = run(
        &cmd,
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    expect_test::expect![[r#"Some("could not start \"echo hi\": its working directory \"/no/such/dir\" does not exist or is not a directory")"#]]
        .assert_eq(&format!("{:?}", out.error));
}

#[tokio::test]
async fn cancellation_stops_a_running_task() {
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.cancel();
    });
    let out = run(&sh("sleep 30"), &ctx(), None, cancel, Limits::default()).await;
    assert_eq!(out.ending, Ending::Cancelled);
}

#[tokio::test]
async fn output_is_capped() {
    let out = run(
        &sh("head -c 100000 /dev/zero | tr '\\0' x"),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits { max_output: 1000 },
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded);
    let log = String::from_utf8(out.log).unwrap();
    assert!(log.starts_with(&"x".repeat(1000)));
    assert!(
        log.ends_with("[dagcron: output truncated, 99000 more bytes dropped]\n"),
        "{}",
        &log[1000..]
    );
}

async fn server() -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route(
            "/echo",
            post(|headers: axum::http::HeaderMap, body: String| async move {
                let key = headers
                    .get("x-dagcron-idempotency-key")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let attempt = headers
                    .get("x-dagcron-attempt")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                format!("{key} {attempt} {body}")
            }),
        )
        .route(
            "/trace",
            get(|headers: axum::http::HeaderMap| async move {
                let get = |name: &str| {
                    headers
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default()
                };
                format!("{} {}", get("traceparent"), get("tracestate"))
            }),
        )
        .route(
            "/json",
            get(|| async {
                r#"{"id": 7, "meta": {"name": "n-1"}, "items": [{"k": "first"}], "none": null}"#
            }),
        )
        .route(
            "/fail",
            get(|| async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// An attempt's context with a trace context.
fn traced() -> AttemptContext {
    AttemptContext {
        trace: Some(TraceHeaders {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("vendor=value".into()),
        }),
        ..ctx()
    }
}

/// A task's own spans join the run's trace: a shell task gets TRACEPARENT
/// and TRACESTATE, an HTTP task the `traceparent` and `tracestate` headers.
#[tokio::test]
async fn tasks_get_the_trace_context_of_their_attempt() {
    let out = run(
        &sh("echo \"$TRACEPARENT $TRACESTATE\""),
        &traced(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    let expected = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 vendor=value";
    assert_eq!(String::from_utf8(out.log).unwrap(), format!("{expected}\n"));
    let base = server().await;
    let out = run(
        &http("GET", format!("{base}/trace"), None, vec![]),
        &traced(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(String::from_utf8(out.log).unwrap(), expected);
    // Without one, neither.
    let out = run(
        &sh("echo \"[${TRACEPARENT-unset}]\""),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(String::from_utf8(out.log).unwrap(), "[unset]\n");
}

fn http(method: &str, url: String, body: Option<&str>, expect: Vec<u16>) -> Executor {
    Executor::Http(HttpSpec {
        outputs: Default::default(),
        method: method.into(),
        url,
        headers: BTreeMap::new(),
        body: body.map(String::from),
        expect,
    })
}

#[tokio::test]
async fn http_tasks() {
    let base = server().await;
    let out = run(
        &http(
            "POST",
            format!("{base}/echo"),
            Some("region={{params.region}}"),
            vec![],
        ),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded);
    assert_eq!(
        String::from_utf8(out.log).unwrap(),
        "billing/nightly/42/extract 3 region=cn-east"
    );

    let out = run(
        &http("GET", format!("{base}/fail"), None, vec![]),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Failed(Failure::HttpStatus(503)));
    assert_eq!(out.exit_code, Some(503));
    let out = run(
        &http("GET", format!("{base}/fail"), None, vec![503]),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded, "503 was declared expected");

    let out = run(
        &http("GET", format!("{base}/slow"), None, vec![]),
        &ctx(),
        Some(Duration::from_millis(200)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::TimedOut);

    // Nothing listens on port 9 of loopback.
    let out = run(
        &http("GET", "http://127.0.0.1:9/".into(), None, vec![]),
        &ctx(),
        None,
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert!(
        matches!(out.ending, Ending::Failed(Failure::Error(_))),
        "{out:?}"
    );
}

/// WebAssembly tasks through the executor: what the module gets of its
/// attempt (identity, parameters, secrets, granted variables), and how its
/// ending is reported. The sandbox's own limits are tested in dagcron-wasm.
#[cfg(feature = "wasm")]
mod wasm {
    use std::collections::BTreeMap;

    use dagcron_core::model::{EnvValue, Grants, WasmSpec};
    use dagcron_core::{Executor, Failure};
    use dagcron_exec::{AttemptContext, Ending, Limits, LiveLog, SecretValues, run, run_live};
    use tokio_util::sync::CancellationToken;

    /// Prints its environment, then its arguments (both NUL-separated), then
    /// what it reads on standard input.
    const SHOW: &str = r#"(module
      (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "environ_get" (func $env_get (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 2)
      (func $print (param $ptr i32) (param $len i32)
        (i32.store (i32.const 0) (local.get $ptr))
        (i32.store (i32.const 4) (local.get $len))
        (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
      (func (export "_start")
        (drop (call $env_sizes (i32.const 16) (i32.const 20)))
        (drop (call $env_get (i32.const 1024) (i32.const 8192)))
        (call $print (i32.const 8192) (i32.load (i32.const 20)))
        (drop (call $args_sizes (i32.const 16) (i32.const 20)))
        (drop (call $args_get (i32.const 2048) (i32.const 40960)))
        (call $print (i32.const 40960) (i32.load (i32.const 20)))
        (i32.store (i32.const 24) (i32.const 61440))
        (i32.store (i32.const 28) (i32.const 4096))
        (drop (call $read (i32.const 0) (i32.const 24) (i32.const 1) (i32.const 32)))
        (call $print (i32.const 61440) (i32.load (i32.const 32)))
        (call $exit (i32.const 4))))"#;

    /// The executors' attempt, with a secret given to it.
    fn ctx() -> AttemptContext {
        AttemptContext {
            secrets: SecretValues(BTreeMap::from([("token".into(), "s3cr3t-value".into())])),
            ..super::ctx()
        }
    }

    fn spec(module: &std::path::Path) -> WasmSpec {
        WasmSpec {
            module: module.display().to_string(),
            sha256: None,
            args: vec!["--region".into(), "{{params.region}}".into()],
            env: BTreeMap::from([
                (
                    "GREETING".into(),
                    EnvValue::Plain("hello {{params.region}}".into()),
                ),
                (
                    "TOKEN".into(),
                    EnvValue::Secret {
                        secret: "token".into(),
                    },
                ),
            ]),
            stdin: Some("input for {{params.region}}".into()),
            memory: None,
            fuel: None,
            grants: Grants {
                env: vec!["HOME".into()],
                ..Grants::default()
            },
        }
    }

    #[tokio::test]
    async fn a_module_gets_its_identity_parameters_and_secrets_and_its_exit_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("show.wat");
        std::fs::write(&module, SHOW).unwrap();
        let live = LiveLog::new(1 << 20);
        let out = run_live(
            &Executor::Wasm(spec(&module)),
            &ctx(),
            None,
            CancellationToken::new(),
            Limits::default(),
            Some(&live),
        )
        .await;
        assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(4))));
        assert_eq!(out.exit_code, Some(4));
        assert_eq!(out.error.as_deref(), Some("exit status 4"));
        let log = String::from_utf8(out.log.clone())
            .unwrap()
            .replace('\0', "\n");
        for line in [
            "DAGCRON_NAMESPACE=billing",
            "DAGCRON_JOB=nightly",
            "DAGCRON_RUN_ID=42",
            "DAGCRON_TASK_ID=extract",
            "DAGCRON_ATTEMPT=3",
            "DAGCRON_SCHEDULED_AT=2026-01-01T02:30:00Z",
            "DAGCRON_IDEMPOTENCY_KEY=billing/nightly/42/extract",
            "DAGCRON_PARAM_REGION=cn-east",
            "GREETING=hello cn-east",
            // The secret's value reached the module; what it printed is redacted.
            "TOKEN=***",
            "show.wat\n--region\ncn-east\ninput for cn-east",
        ] {
            assert!(log.contains(line), "{line:?} missing from {log:?}");
        }
        assert!(log.contains("\nHOME="), "a granted variable: {log:?}");
        assert!(
            !log.contains("PATH="),
            "nothing of the host ungranted: {log:?}"
        );
        assert!(!log.contains("s3cr3t-value"));
        let (followed, done) = live.read_from(0);
        assert!(done);
        assert_eq!(
            String::from_utf8(followed).unwrap().replace('\0', "\n"),
            log,
            "the live log saw the same output"
        );
    }

    /// Writes `rows=7` to `outputs` in its first granted directory.
    const WRITE_OUTPUTS: &str = r#"(module
      (import "wasi_snapshot_preview1" "path_open" (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (memory (export "memory") 1)
      (data (i32.const 100) "outputs")
      (data (i32.const 300) "rows=7\n")
      (func (export "_start") (local $err i32)
        (local.set $err (call $open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 7)
          (i32.const 0) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 200)))
        (if (local.get $err) (then (call $exit (i32.add (i32.const 100) (local.get $err)))))
        (i32.store (i32.const 0) (i32.const 300))
        (i32.store (i32.const 4) (i32.const 7))
        (drop (call $write (i32.load (i32.const 200)) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

    /// A module finds its outputs file at `$DAGCRON_OUTPUTS` (its directory
    /// granted as `/dagcron`), and its upstream tasks' outputs as variables.
    #[tokio::test]
    async fn a_module_hands_outputs_and_reads_upstream_ones() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("write.wat");
        std::fs::write(&module, WRITE_OUTPUTS).unwrap();
        let mut task = spec(&module);
        task.args.clear();
        task.env.clear();
        task.stdin = None;
        let out = run(
            &Executor::Wasm(task),
            &ctx(),
            None,
            CancellationToken::new(),
            Limits::default(),
        )
        .await;
        assert_eq!(out.ending, Ending::Succeeded, "{:?}", out.error);
        assert_eq!(out.outputs.get("rows").map(String::as_str), Some("7"));

        let show = dir.path().join("show.wat");
        std::fs::write(&show, SHOW).unwrap();
        let mut c = ctx();
        c.outputs.insert(
            "extract".into(),
            std::sync::Arc::new(BTreeMap::from([("rows".into(), "42".into())])),
        );
        let mut task = spec(&show);
        task.args = vec!["{{tasks.extract.outputs.rows}}".into()];
        let out = run(
            &Executor::Wasm(task),
            &c,
            None,
            CancellationToken::new(),
            Limits::default(),
        )
        .await;
        let log = String::from_utf8(out.log).unwrap().replace('\0', "\n");
        for line in [
            "DAGCRON_OUTPUTS=/dagcron/outputs",
            "DAGCRON_OUTPUT_EXTRACT_ROWS=42",
            "show.wat\n42\n",
        ] {
            assert!(log.contains(line), "{line:?} missing from {log:?}");
        }
    }

    /// A grant of the temporary directory would show every attempt's
    /// outputs file to the module (it runs as the server): refused,
    /// whatever the namespace's policy.
    #[tokio::test]
    async fn a_module_is_never_granted_the_outputs_files_of_others() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("write.wat");
        std::fs::write(&module, WRITE_OUTPUTS).unwrap();
        let mut task = spec(&module);
        task.grants.dirs = vec![dagcron_core::wasm::DirGrant {
            host: std::env::temp_dir().display().to_string(),
            guest: "/tmp".into(),
            write: true,
        }];
        let out = run(
            &Executor::Wasm(task),
            &ctx(),
            None,
            CancellationToken::new(),
            Limits::default(),
        )
        .await;
        assert!(
            matches!(out.ending, Ending::Failed(Failure::Error(_))),
            "{out:?}"
        );
        assert!(out.error.unwrap().contains("other attempts' outputs files"));
        assert!(out.log.is_empty());
    }

    #[tokio::test]
    async fn a_missing_secret_fails_before_the_module_starts() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("show.wat");
        std::fs::write(&module, SHOW).unwrap();
        let mut c = ctx();
        c.secrets = SecretValues::default();
        let out = run(
            &Executor::Wasm(spec(&module)),
            &c,
            None,
            CancellationToken::new(),
            Limits::default(),
        )
        .await;
        assert_eq!(
            out.error.as_deref(),
            Some("the secret token of variable TOKEN was not given to this attempt")
        );
        assert!(matches!(out.ending, Ending::Failed(Failure::Error(_))));
    }

    /// What a tenant's WebAssembly task asks for is checked against its
    /// namespace's policy when the attempt starts, on real paths: a module
    /// outside the allowed directories (or reached through a symbolic link
    /// from inside them), mounting `/`, reading a host variable.
    #[tokio::test]
    async fn a_module_asking_more_than_its_policy_allows_does_not_start() {
        use dagcron_core::exec_policy::ExecPolicy;
        use dagcron_core::wasm::DirGrant;
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("modules");
        std::fs::create_dir(&allowed).unwrap();
        let module = allowed.join("show.wat");
        std::fs::write(&module, SHOW).unwrap();
        let outside = dir.path().join("outside.wat");
        std::fs::write(&outside, SHOW).unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("link.wat")).unwrap();
        let policy = ExecPolicy {
            wasm_modules: vec![allowed.display().to_string()],
            wasm_env: vec!["HOME".into()],
            ..ExecPolicy::default()
        };
        let attempt = |spec: WasmSpec| {
            let mut c = ctx();
            c.policy = Some(std::sync::Arc::new(policy.clone()));
            async move {
                run(
                    &Executor::Wasm(spec),
                    &c,
                    None,
                    CancellationToken::new(),
                    Limits::default(),
                )
                .await
            }
        };
        let out = attempt(spec(&module)).await;
        assert_eq!(
            out.ending,
            Ending::Failed(Failure::Exit(Some(4))),
            "allowed: it ran"
        );
        for (what, task) in [
            ("outside", spec(&outside)),
            ("through a link", spec(&allowed.join("link.wat"))),
            (
                "mounting /",
                WasmSpec {
                    grants: Grants {
                        dirs: vec![DirGrant {
                            host: "/".into(),
                            guest: "/r".into(),
                            write: false,
                        }],
                        ..Grants::default()
                    },
                    ..spec(&module)
                },
            ),
            (
                "a host variable",
                WasmSpec {
                    grants: Grants {
                        env: vec!["DAGCRON_AGENT_TOKEN".into()],
                        ..Grants::default()
                    },
                    ..spec(&module)
                },
            ),
        ] {
            let out = attempt(task).await;
            assert!(
                matches!(out.ending, Ending::Failed(Failure::Error(_))),
                "{what}: {out:?}"
            );
            let error = out.error.unwrap();
            assert!(error.contains("policy"), "{what}: {error}");
            assert!(out.log.is_empty(), "{what}: nothing ran");
        }
    }
}

async fn go(executor: &Executor, ctx: &AttemptContext) -> dagcron_exec::Outcome {
    run(
        executor,
        ctx,
        Some(Duration::from_secs(30)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await
}

fn outputs(pairs: &[(&str, &str)]) -> dagcron_core::outputs::Outputs {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn a_shell_task_hands_outputs_through_its_file() {
    let out = go(
        &sh("echo rows=42 >> \"$DAGCRON_OUTPUTS\"; printf 'note<<END\\na\\nb\\nEND\\n' >> $DAGCRON_OUTPUTS"),
        &ctx(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded, "{:?}", out.error);
    assert_eq!(out.outputs, outputs(&[("rows", "42"), ("note", "a\nb")]));
    // One JSON object, written by a program the task started.
    let out = go(
        &sh(
            "sh -c 'echo {\\\"parts\\\": [\\\"a\\\", \\\"b\\\"], \\\"n\\\": 2} > $DAGCRON_OUTPUTS'",
        ),
        &ctx(),
    )
    .await;
    assert_eq!(
        out.outputs,
        outputs(&[("parts", r#"["a","b"]"#), ("n", "2")])
    );
    // The file is gone once the attempt is over.
    let out = go(
        &sh("echo path=$DAGCRON_OUTPUTS >> $DAGCRON_OUTPUTS"),
        &ctx(),
    )
    .await;
    let path = std::path::PathBuf::from(&out.outputs["path"]);
    assert!(
        !path.exists() && !path.parent().unwrap().exists(),
        "{path:?}"
    );
}

#[tokio::test]
async fn outputs_a_task_cannot_hand_fail_it_and_a_failed_task_hands_none() {
    let cases = [
        (
            "echo 'rows 42' > $DAGCRON_OUTPUTS",
            "line 1: expected key=value",
        ),
        ("echo '1x=2' > $DAGCRON_OUTPUTS", "invalid output name"),
        (
            "head -c 200000 /dev/zero | tr '\\0' x | sed 's/^/k=/' > $DAGCRON_OUTPUTS",
            "at most 65536",
        ),
        // The server is not made to read another file, nor to wait on a pipe.
        (
            "echo secret=1 > /tmp/planted-$$; rm $DAGCRON_OUTPUTS; ln -s /tmp/planted-$$ $DAGCRON_OUTPUTS",
            "replaced by something other than a regular file",
        ),
        (
            "rm $DAGCRON_OUTPUTS; mkfifo $DAGCRON_OUTPUTS",
            "replaced by something other than a regular file",
        ),
    ];
    for (script, why) in cases {
        let started = Instant::now();
        let out = go(&sh(script), &ctx()).await;
        assert!(
            matches!(out.ending, Ending::Failed(Failure::Error(_))),
            "{script}: {:?}",
            out.ending
        );
        assert!(
            out.error.as_deref().unwrap_or("").contains(why),
            "{script}: {:?}",
            out.error
        );
        assert!(out.outputs.is_empty());
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{script} stalled the attempt"
        );
    }
    // A task that removed its file has no outputs, and that is no error.
    let out = go(&sh("rm $DAGCRON_OUTPUTS"), &ctx()).await;
    assert_eq!(out.ending, Ending::Succeeded);
    // A failed task hands nothing downstream; refused outputs do not hide
    // its own failure.
    let out = go(&sh("echo rows=1 > $DAGCRON_OUTPUTS; exit 3"), &ctx()).await;
    assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(3))));
    assert!(out.outputs.is_empty());
    let out = go(&sh("echo 'bad line' > $DAGCRON_OUTPUTS; exit 3"), &ctx()).await;
    assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(3))));
}

#[tokio::test]
async fn upstream_outputs_are_data_in_a_shell_string_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let pwned = dir.path().join("pwned");
    let hostile = format!("x; touch {}", pwned.display());
    let mut ctx = ctx();
    ctx.outputs.insert(
        "extract".into(),
        std::sync::Arc::new(outputs(&[("rows", hostile.as_str()), ("q", "it's $(id)")])),
    );
    let out = go(
        &sh("echo [{{tasks.extract.outputs.rows}}] [{{ tasks.extract.outputs.q }}] [{{tasks.extract.outputs.none}}]; echo \"$DAGCRON_OUTPUT_EXTRACT_ROWS\""),
        &ctx,
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded, "{:?}", out.error);
    assert!(!pwned.exists(), "an output ran as shell code");
    assert_eq!(
        String::from_utf8(out.log).unwrap(),
        format!("[{hostile}] [it's $(id)] [{{{{tasks.extract.outputs.none}}}}]\n{hostile}\n")
    );
}

#[tokio::test]
async fn secrets_in_outputs_are_redacted() {
    let mut ctx = ctx();
    ctx.secrets =
        dagcron_exec::SecretValues(BTreeMap::from([("db".into(), "hunter2-password".into())]));
    let cmd = Executor::Shell(ShellCommand {
        command: "echo dsn=postgres://u:$PW@h/db >> $DAGCRON_OUTPUTS".into(),
        args: vec![],
        env: BTreeMap::from([(
            "PW".into(),
            dagcron_core::model::EnvValue::Secret {
                secret: "db".into(),
            },
        )]),
        cwd: None,
    });
    let out = go(&cmd, &ctx).await;
    assert_eq!(out.outputs, outputs(&[("dsn", "postgres://u:***@h/db")]));
}

#[tokio::test]
async fn an_http_task_takes_its_outputs_from_the_json_answer() {
    let base = server().await;
    let mut task = http("GET", format!("{base}/json"), None, vec![]);
    if let Executor::Http(h) = &mut task {
        h.outputs = BTreeMap::from([
            ("id".into(), "$.id".into()),
            ("name".into(), "$.meta.name".into()),
            ("first".into(), "$.items[0].k".into()),
            ("gone".into(), "$.none".into()),
            ("missing".into(), "$.nope".into()),
        ]);
    }
    let out = go(&task, &ctx()).await;
    assert_eq!(out.ending, Ending::Succeeded, "{:?}", out.error);
    assert_eq!(
        out.outputs,
        outputs(&[("id", "7"), ("name", "n-1"), ("first", "first")])
    );
    // An answer that is not JSON fails a task that wants outputs from it.
    let mut task = http("POST", format!("{base}/echo"), Some("x"), vec![]);
    if let Executor::Http(h) = &mut task {
        h.outputs = BTreeMap::from([("id".into(), "$.id".into())]);
    }
    let out = go(&task, &ctx()).await;
    assert!(matches!(out.ending, Ending::Failed(Failure::Error(_))));
    assert!(out.error.unwrap().contains("the answer is not JSON"));
}
