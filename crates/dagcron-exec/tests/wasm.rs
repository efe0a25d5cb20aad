//! WebAssembly tasks through the executor: what the module gets of its
//! attempt (identity, parameters, secrets, granted variables), and how its
//! ending is reported. The sandbox's own limits are tested in dagcron-wasm.
#![cfg(feature = "wasm")]

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

fn ctx() -> AttemptContext {
    AttemptContext {
        namespace: "billing".into(),
        job: "nightly".into(),
        run_id: 42,
        task_id: "extract".into(),
        attempt: 3,
        scheduled_at: "2026-01-01T02:30:00Z".parse().unwrap(),
        idempotency_key: "billing/nightly/42/extract".into(),
        params: BTreeMap::from([("region".into(), "cn-east".into())]),
        secrets: SecretValues(BTreeMap::from([("token".into(), "s3cr3t-value".into())])),
        trace: None,
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
