//! The sandbox of shell tasks, against real processes: what a hostile
//! task tries (reading the server's files, its environment, another
//! task's environment, keeping privileges) and what must still work
//! (exit codes, timeouts, cancellation, writing outside the hidden paths).
//!
//! Its own test binary: the sandbox is enabled once for the whole process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use dagcron_core::exec_policy::ExecPolicy;
use dagcron_core::model::{EnvValue, ShellCommand};
use dagcron_core::{Executor, Failure};
use dagcron_exec::sandbox::{self, TaskUser};
use dagcron_exec::{AttemptContext, Ending, Limits, Outcome, SecretValues, run};
use tokio_util::sync::CancellationToken;

/// The "server's" files: a data directory with a token and a key file
/// outside it, hidden from tasks; and a directory tasks may write to.
struct Server {
    _dir: tempfile::TempDir,
    data: PathBuf,
    key: PathBuf,
    scratch: PathBuf,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("admin.token"), "admin-token-of-the-server").unwrap();
        let key = dir.path().join("master.key");
        std::fs::write(&key, "master-key-of-the-server").unwrap();
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        // Tasks run as an unprivileged user when the tests run as root.
        chmod(dir.path(), 0o755);
        chmod(&scratch, 0o777);
        // A key inside the data directory is hidden with it.
        std::fs::write(data.join("server.key"), "server-key-of-the-server").unwrap();
        sandbox::enable(
            &[data.clone(), data.join("server.key"), key.clone()],
            TaskUser::nobody(),
        )
        .expect("the sandbox can be made on this machine");
        Server {
            _dir: dir,
            data,
            key,
            scratch,
        }
    })
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn ctx() -> AttemptContext {
    AttemptContext {
        item: Default::default(),
        outputs: Default::default(),
        namespace: "alpha".into(),
        job: "j".into(),
        run_id: 1,
        task_id: "t".into(),
        attempt: 1,
        scheduled_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        idempotency_key: "alpha/j/1/t".into(),
        params: BTreeMap::new(),
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

async fn go(executor: &Executor, ctx: &AttemptContext) -> (Outcome, String) {
    server();
    let out = run(
        executor,
        ctx,
        Some(Duration::from_secs(30)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    let log = String::from_utf8_lossy(&out.log).into_owned();
    (out, log)
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn a_task_cannot_read_the_admin_token_or_the_master_key() {
    let s = server();
    let script = format!(
        "cat {d}/admin.token; echo; cat {d}/server.key; echo; ls -a {d}; cat {k}; echo; echo end",
        d = s.data.display(),
        k = s.key.display()
    );
    let (out, log) = go(&sh(&script), &ctx()).await;
    assert!(!log.contains("admin-token-of-the-server"), "{log}");
    assert!(!log.contains("master-key-of-the-server"), "{log}");
    assert!(!log.contains("server-key-of-the-server"), "{log}");
    assert!(log.contains("end"), "the task ran: {log}");
    assert_eq!(out.ending, Ending::Succeeded, "{log}");
    // Nor can it write there.
    let script = format!("echo x > {}/planted", s.data.display());
    let (out, _) = go(&sh(&script), &ctx()).await;
    assert!(matches!(out.ending, Ending::Failed(_)));
    assert!(!s.data.join("planted").exists());
    // The server itself still reads its files.
    assert_eq!(
        std::fs::read_to_string(s.data.join("admin.token")).unwrap(),
        "admin-token-of-the-server"
    );
}

#[tokio::test]
async fn a_task_sees_no_other_process_so_not_the_servers_environment() {
    let (out, log) = go(
        &sh("echo ppid=$PPID pid=$$; ls /proc | grep -c '^[0-9]'; cat /proc/$PPID/environ; echo; cat /proc/1/cmdline"),
        &ctx(),
    )
    .await;
    assert_eq!(out.ending, Ending::Succeeded, "{log}");
    assert!(
        log.contains("ppid=0 pid=1\n"),
        "PID 1 of its own namespace: {log}"
    );
    let processes: u32 = log.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(processes <= 4, "only the task's own processes: {log}");
    assert!(
        !log.contains("PATH="),
        "no environment of the server: {log}"
    );
}

/// While beta's task runs with its secret in its environment, alpha's task
/// looks through every /proc/*/environ for it (reversed, past redaction).
#[tokio::test]
async fn another_tenants_running_task_leaks_nothing() {
    let s = server();
    let ready = s.scratch.join("beta-ready");
    let beta = Executor::Shell(ShellCommand {
        command: format!("touch {}; sleep 5", ready.display()),
        args: vec![],
        env: BTreeMap::from([(
            "PGPASSWORD".into(),
            EnvValue::Secret {
                secret: "db-password".into(),
            },
        )]),
        cwd: None,
    });
    let beta_ctx = AttemptContext {
        namespace: "beta".into(),
        secrets: SecretValues(BTreeMap::from([(
            "db-password".into(),
            "beta-db-password".into(),
        )])),
        ..ctx()
    };
    let beta_run = tokio::spawn(async move { go(&beta, &beta_ctx).await });
    for _ in 0..200 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready.exists(), "beta's task started");
    let (_, log) = go(
        &sh("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | rev; echo scanned"),
        &ctx(),
    )
    .await;
    assert!(log.contains("scanned"), "{log}");
    assert!(!log.contains("drowssap-bd-ateb"), "{log}");
    assert!(!log.contains("DROWSSAPGP"), "{log}");
    beta_run.abort();
}

#[tokio::test]
async fn a_task_runs_unprivileged_and_cannot_gain_privileges() {
    let (_, log) = go(
        &sh("id -u; id -g; grep NoNewPrivs /proc/self/status"),
        &ctx(),
    )
    .await;
    let mut lines = log.lines();
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    let gid: u32 = lines.next().unwrap().parse().unwrap();
    if root() {
        let nobody = TaskUser::nobody();
        assert_eq!((uid, gid), (nobody.uid, nobody.gid), "{log}");
    } else {
        assert_eq!(uid, nix::unistd::geteuid().as_raw(), "{log}");
    }
    assert!(log.contains("NoNewPrivs:\t1"), "{log}");
    // Its namespace's policy may name another user.
    if root() {
        let other = AttemptContext {
            policy: Some(std::sync::Arc::new(ExecPolicy {
                run_as: Some("4242:4343".into()),
                ..ExecPolicy::default()
            })),
            ..ctx()
        };
        let (_, log) = go(&sh("id -u; id -g"), &other).await;
        assert_eq!(log, "4242\n4343\n");
    }
}

#[tokio::test]
async fn exit_codes_output_and_writes_elsewhere_still_work() {
    let s = server();
    let file = s.scratch.join("written");
    let script = format!(
        "echo out; echo err >&2; echo data > {}; exit 3",
        file.display()
    );
    let (out, log) = go(&sh(&script), &ctx()).await;
    assert_eq!(out.ending, Ending::Failed(Failure::Exit(Some(3))), "{log}");
    assert_eq!(out.exit_code, Some(3));
    assert!(log.contains("out\n") && log.contains("err\n"), "{log}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "data\n");
}

#[tokio::test]
async fn a_timeout_kills_the_task_and_what_it_left_behind() {
    server();
    let started = std::time::Instant::now();
    let out = run(
        &sh("sleep 60 & setsid sleep 60 & sleep 60"),
        &ctx(),
        Some(Duration::from_millis(300)),
        CancellationToken::new(),
        Limits::default(),
    )
    .await;
    assert_eq!(out.ending, Ending::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(20));
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
    });
    let out = run(&sh("sleep 60"), &ctx(), None, cancel, Limits::default()).await;
    assert_eq!(out.ending, Ending::Cancelled);
}

/// Another task (the same unprivileged user, another namespace) can find
/// no outputs file to write into: the directory holding them cannot be
/// listed, and the attempts' own names cannot be guessed; nor can a task
/// put anything beside its own file. A task still writes its own.
#[tokio::test]
async fn a_task_cannot_reach_another_tasks_outputs_file() {
    let script = "echo mine=1 >> $DAGCRON_OUTPUTS; own=$(dirname $DAGCRON_OUTPUTS); base=$(dirname $own); \
        ls $base && echo LISTED; for f in $base/*/outputs; do echo stolen=1 >> \"$f\" && echo WROTE; done; \
        touch $own/other && echo CREATED; ln -sf /etc/passwd $own/link && echo LINKED; true";
    let (out, log) = go(&sh(script), &ctx()).await;
    assert_eq!(out.ending, Ending::Succeeded, "{log}");
    assert_eq!(
        out.outputs.get("mine").map(String::as_str),
        Some("1"),
        "{log}"
    );
    assert!(!out.outputs.contains_key("stolen"), "{log}");
    if root() {
        for what in ["LISTED", "WROTE", "CREATED", "LINKED"] {
            assert!(!log.contains(what), "{what}: {log}");
        }
    }
}
