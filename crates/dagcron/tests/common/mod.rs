//! Shared by the tests that start a server: a `dagcron serve` process on
//! loopback, or a server in the test's own process (`InProcess`), both
//! reached through their API (`Api`); and signals.
//!
//! No port is picked beforehand: a process binds `127.0.0.1:0` and writes
//! the address it got to a file (`--address-file`), an in-process server
//! is handed a listener bound by the test.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// A server's API, as the tests reach it.
pub struct Api {
    pub url: String,
    /// The namespace `all_runs` reads.
    pub namespace: String,
    /// The server's output (a process's; an in-process server has none).
    pub log: PathBuf,
    /// The API token every call sends.
    pub token: Option<String>,
    /// For a server over TLS: the certificate (PEM) of its authority.
    pub ca: Option<Vec<u8>>,
}

/// A `dagcron serve` process, killed with the guard.
pub struct Server {
    pub child: Child,
    api: Api,
}

impl Deref for Server {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Api {
        &mut self.api
    }
}

/// The instance-admin token the first start of a server wrote in `data`.
pub fn admin_token(data: &Path) -> String {
    std::fs::read_to_string(data.join("admin.token"))
        .expect("the server wrote its admin token")
        .trim()
        .to_string()
}

/// The address a server started with `--address-file file` wrote there,
/// once it answers (bounded; a server that exits first fails the test).
pub fn wait_address(child: &mut Child, file: &Path, log: &Path) -> SocketAddr {
    until(
        &format!("the server comes up (see {})", log.display()),
        || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("server exited with {status}; see {}", log.display());
            }
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
        },
    )
}

/// `dagcron serve` on `127.0.0.1:0` with `--address-file` beside `log`
/// (any older one removed first), output appended to `log`.
pub fn serve_command(log: &Path) -> (Command, PathBuf) {
    let address_file = log.with_extension("addr");
    let _ = std::fs::remove_file(&address_file);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dagcron"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--address-file"])
        .arg(&address_file)
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file));
    (cmd, address_file)
}

impl Server {
    /// `dagcron serve` with its SQLite data in `data`.
    pub fn start(data: &Path, extra: &[&str]) -> Server {
        Server::start_env(data, extra, &[])
    }

    /// [`Server::start`] with these variables in the server's environment.
    pub fn start_env(data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec!["--data-dir", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut server = Server::spawn_env(&args, &data.with_extension("log"), env);
        server.token = Some(admin_token(data));
        server
    }

    /// A server started by the test itself (with flags or an environment
    /// `spawn` does not give), once it answers: its token is read from
    /// `data`, and it is killed with the guard like any other.
    pub fn adopt(child: Child, url: String, namespace: &str, log: PathBuf, data: &Path) -> Server {
        Server {
            child,
            api: Api {
                url,
                namespace: namespace.into(),
                log,
                token: Some(admin_token(data)),
                ca: None,
            },
        }
    }

    /// `dagcron serve ARGS...` on a port of its choosing, output appended
    /// to `log`; returns once the API answers.
    pub fn spawn(args: &[&str], log: &Path) -> Server {
        Server::spawn_env(args, log, &[])
    }

    /// [`Server::spawn`] with these variables in the server's environment.
    pub fn spawn_env(args: &[&str], log: &Path, env: &[(&str, &str)]) -> Server {
        let (mut cmd, address_file) = serve_command(log);
        let mut child = cmd.args(args).envs(env.iter().copied()).spawn().unwrap();
        let address = wait_address(&mut child, &address_file, log);
        Server {
            child,
            api: Api {
                url: format!("http://{address}"),
                namespace: "e2e".into(),
                log: log.to_path_buf(),
                token: None,
                ca: None,
            },
        }
    }

    /// Sends `sig` and waits for the process to exit.
    pub fn signal(&mut self, sig: Signal) -> ExitStatus {
        self.send(sig);
        self.child.wait().unwrap()
    }

    /// Sends `sig` without waiting.
    pub fn send(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }
}

/// A server in the test's own process (`dagcron::serve::run` on a listener
/// the test bound, on a runtime of its own thread), stopped and awaited
/// with the guard.
pub struct InProcess {
    api: Api,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<dagcron::serve::Exit>>>,
}

impl Deref for InProcess {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl DerefMut for InProcess {
    fn deref_mut(&mut self) -> &mut Api {
        &mut self.api
    }
}

impl InProcess {
    /// A server with its SQLite data in `data`, started with these `serve`
    /// flags (as the command line reads them); returns once it answers.
    pub fn start(data: &Path, flags: &[&str]) -> InProcess {
        let mut words = vec!["--data-dir", data.to_str().unwrap()];
        words.extend_from_slice(flags);
        let config = dagcron::serve::Config::from_flags(words).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                dagcron::serve::run(config, listener, async {
                    let _ = stopped.await;
                })
                .await
            })
        });
        let mut server = InProcess {
            api: Api {
                url: format!("http://{address}"),
                namespace: "e2e".into(),
                log: PathBuf::new(),
                token: None,
                ca: None,
            },
            stop: Some(stop),
            thread: Some(thread),
        };
        // The listener is bound already: this waits until the server
        // serves it, or fails once the server has given up.
        let answered = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
            .get(format!("{}/healthz", server.url))
            .send();
        if answered.is_err() {
            let ended = server.thread.take().unwrap().join().unwrap();
            panic!(
                "the server did not come up: {answered:?}, {:?}",
                ended.err()
            );
        }
        server.token = Some(admin_token(data));
        server
    }

    /// Asks the server to stop (as a signal would), waits until it has
    /// drained, and returns how it ended.
    pub fn stop(mut self) -> dagcron::serve::Exit {
        self.shut_down().expect("the server ran")
    }

    fn shut_down(&mut self) -> Option<dagcron::serve::Exit> {
        drop(self.stop.take());
        let thread = self.thread.take()?;
        Some(thread.join().unwrap().expect("the server stops cleanly"))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Stop it, but do not turn a failed assertion into an abort.
            drop(self.stop.take());
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
            return;
        }
        self.shut_down();
    }
}

impl Api {
    /// An HTTP client that sends this server's token.
    pub fn http(&self) -> reqwest::blocking::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().unwrap(),
            );
        }
        let mut builder = reqwest::blocking::Client::builder()
            .default_headers(headers)
            .timeout(None);
        if let Some(pem) = &self.ca {
            builder = builder.add_root_certificate(reqwest::Certificate::from_pem(pem).unwrap());
        }
        builder.build().unwrap()
    }

    /// The command line, pointed at this server with its token.
    pub fn cli(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dagcron"));
        cmd.args(["--server", &self.url]);
        if let Some(token) = &self.token {
            cmd.env("DAGCRON_TOKEN", token);
        }
        cmd
    }

    pub fn get(&self, path: &str) -> Value {
        self.http()
            .get(format!("{}{path}", self.url))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }

    pub fn post(&self, path: &str, body: &str, content_type: &str) -> (u16, Value) {
        let resp = self
            .http()
            .post(format!("{}{path}", self.url))
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
            .unwrap_or_else(|e| {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!(
                    "POST {path}: {e}; the server's last lines:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            });
        (resp.status().as_u16(), resp.json().unwrap_or(Value::Null))
    }

    /// The text of `/metrics`.
    pub fn metrics(&self) -> String {
        self.http()
            .get(format!("{}/metrics", self.url))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    /// `PUT path` with a JSON body; the answer's status and body.
    pub fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http()
            .put(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        (resp.status().as_u16(), resp.json().unwrap_or(Value::Null))
    }

    /// Applies a job file (YAML), which must be accepted.
    pub fn apply(&self, yaml: &str) {
        let (status, body) = self.post("/api/v1/apply", yaml, "application/yaml");
        assert_eq!(status, 200, "{body}");
    }

    /// Triggers `job` of this server's namespace; returns the run's id.
    pub fn trigger(&self, job: &str) -> i64 {
        let (status, run) = self.post(
            &format!("/api/v1/namespaces/{}/jobs/{job}/trigger", self.namespace),
            "{}",
            "application/json",
        );
        assert_eq!(status, 201, "{run}");
        run["id"].as_i64().unwrap()
    }

    /// Triggers `job` of this server's namespace as a caller that sends its
    /// W3C trace context; returns the run's id.
    pub fn trigger_traced(&self, job: &str, traceparent: &str, tracestate: &str) -> i64 {
        let triggered = self
            .http()
            .post(format!(
                "{}/api/v1/namespaces/{}/jobs/{job}/trigger",
                self.url, self.namespace
            ))
            .header("traceparent", traceparent)
            .header("tracestate", tracestate)
            .body("{}")
            .send()
            .unwrap();
        assert_eq!(triggered.status(), 201);
        triggered.json::<Value>().unwrap()["id"].as_i64().unwrap()
    }

    /// Waits (bounded) until run `id` is in `state`; returns the run.
    pub fn wait_run(&self, id: i64, state: &str) -> Value {
        until(&format!("run {id} is {state}"), || {
            let run = self.get(&format!("/api/v1/runs/{id}"));
            if run["state"] == state {
                Ok(run)
            } else {
                Err(run)
            }
        })
    }

    pub fn all_runs(&self, job: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut cursor = String::new();
        loop {
            let page = self.get(&format!(
                "/api/v1/namespaces/{}/jobs/{job}/runs?limit=1000{cursor}",
                self.namespace
            ));
            out.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => return out,
            }
        }
    }

    /// Follows the log of attempt 1 of `task` in run `id` until its output
    /// holds `text`; returns the stream (still open) and what was read.
    pub fn follow_log_until(
        &self,
        id: i64,
        task: &str,
        text: &str,
    ) -> (reqwest::blocking::Response, Vec<u8>) {
        use std::io::Read;
        let mut resp = self
            .http()
            .get(format!(
                "{}/api/v1/runs/{id}/tasks/{task}/attempts/1/log?follow=true",
                self.url
            ))
            .send()
            .unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains(text) {
            let n = resp.read(&mut buf).unwrap();
            assert!(n > 0, "the stream ended before {text:?}");
            seen.extend_from_slice(&buf[..n]);
        }
        (resp, seen)
    }

    /// Waits (bounded) until `job` has at least `n` runs.
    pub fn wait_runs(&self, job: &str, n: usize) {
        until(&format!("{job} has {n} runs"), || {
            self.all_runs(job).len() >= n
        });
    }

    pub fn wait_idle(&self, jobs: &[&str]) {
        until("the runs have finished", || {
            !jobs
                .iter()
                .flat_map(|j| self.all_runs(j))
                .any(|r| ["pending", "running"].contains(&r["state"].as_str().unwrap()))
        });
    }
}

/// A join token for agents, made through the API with the server's token.
pub fn join_token(server: &Api, namespace: Option<&str>, labels: Option<Value>) -> String {
    let (status, made) = server.post(
        "/api/v1/tokens",
        &serde_json::json!({ "name": "agent", "role": "agent", "namespace": namespace, "labels": labels })
            .to_string(),
        "application/json",
    );
    assert_eq!(status, 201, "{made}");
    made["token"].as_str().unwrap().to_string()
}

/// A child process killed (and reaped) when the guard goes.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            print_tail("server", &self.api.log);
        }
    }
}

/// On a failed test, the last lines a process wrote, for the test's output.
fn print_tail(what: &str, log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(200);
    eprintln!(
        "--- the last lines of the {what}'s output ({}):",
        log.display()
    );
    for line in &lines[from..] {
        eprintln!("{line}");
    }
}

/// A temporary directory and a data path inside it; installs the HTTP
/// client's TLS provider.
pub fn setup() -> (tempfile::TempDir, PathBuf) {
    // The HTTP client's TLS uses rustls with the ring provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    // The server's shell tasks run as an unprivileged user when the tests
    // run as root: the files they write here must be theirs to write.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let data = dir.path().join("data");
    (dir, data)
}

/// Waits (bounded) until the process whose id a task wrote to `pid_file`
/// has ended (nothing to wait for if the task never started): a cancelled
/// task's shell is gone, so nothing it would have done later can happen.
/// (A task on an agent knows its id; one the server runs in its sandbox
/// does not: see [`attempt_pid`].)
pub fn wait_process_gone(pid_file: &Path) {
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
    else {
        return;
    };
    wait_gone(pid, &pid_file.display().to_string());
}

/// The process id, as this machine sees it, of the first process of an
/// attempt a server runs in its sandbox (where the task sees itself as
/// PID 1): the process whose environment names the run, the task and the
/// attempt. Waits for it, bounded.
pub fn attempt_pid(run: i64, task: &str, attempt: u32) -> u32 {
    let mut found = None;
    until("the attempt's process runs", || {
        found = attempt_pids(run, task, attempt).into_iter().min();
        found.is_some()
    });
    found.unwrap()
}

/// The processes of an attempt (see [`attempt_pid`]) running now.
pub fn attempt_pids(run: i64, task: &str, attempt: u32) -> Vec<u32> {
    let wanted = [
        format!("DAGCRON_RUN_ID={run}"),
        format!("DAGCRON_TASK_ID={task}"),
        format!("DAGCRON_ATTEMPT={attempt}"),
    ];
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            wanted.iter().all(|w| vars.contains(&w.as_bytes()))
        })
        .collect()
}

/// Waits (bounded) until process `pid` has ended (or is a zombie its
/// parent has not reaped yet).
pub fn wait_gone(pid: u32, what: &str) {
    // Gone, or a zombie its parent has not reaped yet.
    until(&format!("process {pid} of {what} has ended"), || {
        !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    });
}

/// A `dagcron worker` process with labels, in a directory of its own
/// (so that a task's `pwd` says where it ran).
pub struct Agent {
    pub child: Child,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    pub fn start(server: &Api, root: &Path, id: &str, labels: &str, capacity: u32) -> Agent {
        Agent::start_via(server, &server.url, root, id, labels, capacity)
    }

    /// An agent that reaches `server` at `url` (through a proxy, say).
    pub fn start_via(
        server: &Api,
        url: &str,
        root: &Path,
        id: &str,
        labels: &str,
        capacity: u32,
    ) -> Agent {
        let dir = root.join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = root.join(format!("{id}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let token = join_token(server, None, None);
        let child = Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args(["worker", "--server", url, "--id", id, "--labels", labels])
            .args(["--token", &token])
            .args(["--capacity", &capacity.to_string()])
            .current_dir(&dir)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let agent = Agent {
            child,
            dir,
            log: log_path,
        };
        until(&format!("agent {id} is connected"), || {
            server.get("/api/v1/workers")["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["id"] == id && w["connected"] == true)
        });
        agent
    }

    pub fn signal(&mut self, sig: Signal) -> std::process::ExitStatus {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            print_tail("agent", &self.log);
        }
    }
}

#[allow(unused_imports)]
pub use dagcron_testkit::{until, until_within};

/// The log of an attempt.
pub fn log(server: &Api, id: i64, task: &str, attempt: u32) -> String {
    server
        .http()
        .get(format!(
            "{}/api/v1/runs/{id}/tasks/{}/attempts/{attempt}/log",
            server.url,
            task.replace('[', "%5B").replace(']', "%5D")
        ))
        .send()
        .unwrap()
        .text()
        .unwrap()
}

/// Copies bytes from `from` to `to` for a test's TCP proxy until either
/// side closes or `stop`, then closes `to`. While `held`, nothing passes
/// and both sides stay open (what was sent arrives once it is let go, as
/// with packets dropped and sent again); every chunk waits `delay_ms`
/// before it passes.
pub fn pipe(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    held: &std::sync::atomic::AtomicBool,
    stop: &std::sync::atomic::AtomicBool,
    delay_ms: &std::sync::atomic::AtomicU64,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 16 << 10];
    while !stop.load(Ordering::SeqCst) {
        if held.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let wait = delay_ms.load(Ordering::SeqCst);
                if wait > 0 {
                    std::thread::sleep(Duration::from_millis(wait));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// The states of the attempts of a run's first task, in order.
pub fn attempt_states(run: &Value) -> Vec<String> {
    run["tasks"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap().to_string())
        .collect()
}
