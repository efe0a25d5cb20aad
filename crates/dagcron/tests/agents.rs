//! Remote worker agents with real processes on loopback: a server and two
//! agents with different labels, each agent in a directory of its own so
//! that a task's `pwd` says where it ran. The server is a process where a
//! test signals it, kills something or speaks TLS, and in the test's own
//! process otherwise.

mod common;

use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    Agent, InProcess, Killed, Server, attempt_pids, attempt_states, join_token, log, setup, until,
    wait_process_gone,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

#[test]
fn tasks_go_to_agents_by_label_and_survive_an_agent_killed_mid_task() {
    let (dir, data) = setup();
    let mut server = Server::start(&data, &["--agent-lease-ttl-ms", "2000"]);
    server.namespace = "a".into();
    let root = dir.path().join("agents");
    let mut eu = Agent::start(&server, &root, "eu-1", "zone=eu,pool=x", 2);
    let mut us = Agent::start(&server, &root, "us-1", "zone=us,pool=x", 2);
    let jobs = r#"
namespace: a
jobs:
  - name: routed
    tasks:
      - { id: eu, shell: 'pwd', run_on: { labels: { zone: eu } } }
      - { id: us, shell: 'pwd', run_on: { labels: { zone: us } } }
      - { id: here, shell: 'echo in the server', depends_on: [eu, us] }
  - name: long
    retry: { max_attempts: 3, backoff: fixed, initial: 1s }
    tasks:
      - { id: t, shell: 'touch started-$DAGCRON_ATTEMPT; sleep 3; pwd', run_on: { labels: { pool: x } } }
  - name: chatty
    tasks:
      - { id: t, shell: 'echo one; sleep 2; echo two', run_on: { labels: { zone: eu } } }
  - name: stop
    tasks:
      - { id: t, shell: 'echo $$ > pid; sleep 3; touch finished', run_on: { labels: { zone: us } } }
"#;
    let (status, body) = server.post("/api/v1/apply", jobs, "application/yaml");
    assert_eq!(status, 200, "{body}");

    // Routing by label.
    let id = server.trigger("routed");
    server.wait_run(id, "succeeded");
    assert!(log(&server, id, "eu", 1).trim().ends_with("eu-1"));
    assert!(log(&server, id, "us", 1).trim().ends_with("us-1"));
    assert_eq!(log(&server, id, "here", 1).trim(), "in the server");

    // The output of a remote attempt can be followed while it runs.
    let id = server.trigger("chatty");
    until("the remote attempt runs", || {
        server.get(&format!("/api/v1/runs/{id}"))["tasks"][0]["state"] == "running"
    });
    let _follow = server.follow_log_until(id, "t", "one");
    assert_eq!(
        server.get(&format!("/api/v1/runs/{id}"))["state"],
        "running",
        "the first line arrived while the remote attempt ran"
    );
    server.wait_run(id, "succeeded");
    assert_eq!(log(&server, id, "t", 1), "one\ntwo\n");

    // SIGKILL of the agent running an attempt: lost, then retried on the other.
    let id = server.trigger("long");
    let mut first = None;
    until("an agent starts the attempt", || {
        first = [&eu, &us]
            .into_iter()
            .position(|a| a.dir.join("started-1").exists());
        first.is_some()
    });
    let killed_at = Instant::now();
    let survivor = if first == Some(0) {
        eu.signal(Signal::SIGKILL);
        &us
    } else {
        us.signal(Signal::SIGKILL);
        &eu
    };
    let run = server.wait_run(id, "succeeded");
    let attempts = run["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["state"], "lost", "{run}");
    assert_eq!(attempts.last().unwrap()["state"], "succeeded", "{run}");
    assert!(
        survivor
            .dir
            .join(format!("started-{}", attempts.len()))
            .exists()
    );
    eprintln!(
        "killed agent's attempt retried and done {} ms after SIGKILL (agent lease 2000 ms)",
        killed_at.elapsed().as_millis()
    );

    // Cancelling a run stops its remote attempt on the agent.
    let us_agent = if first == Some(0) {
        us
    } else {
        // The us agent was the one killed: start it again.
        drop(us);
        Agent::start(&server, &root, "us-1", "zone=us,pool=x", 2)
    };
    let id = server.trigger("stop");
    until("the attempt runs", || {
        server.get(&format!("/api/v1/runs/{id}"))["tasks"][0]["state"] == "running"
    });
    let (status, body) = server.post(&format!("/api/v1/runs/{id}/cancel"), "", "application/json");
    assert!(status < 300, "{status} {body}");
    let run = server.wait_run(id, "cancelled");
    assert_eq!(
        run["tasks"][0]["attempts"][0]["state"], "cancelled",
        "{run}"
    );
    wait_process_gone(&us_agent.dir.join("pid"));
    assert!(
        !us_agent.dir.join("finished").exists(),
        "the cancelled task ran to its end"
    );
    // The attempt ends with the agent's own result, once its process is
    // gone: it said "cancelled before an agent took it", and the agent's
    // result was then refused as stale.
    let error = run["tasks"][0]["attempts"][0]["error"]
        .as_str()
        .unwrap_or("");
    assert!(!error.contains("before an agent took it"), "{run}");
    assert_eq!(
        server.get("/api/v1/workers")["stale_results_refused"],
        0,
        "the agent's result of a cancelled attempt was counted stale"
    );
    server.signal(Signal::SIGTERM);
}

/// Many short tasks over two agents: each runs exactly once, counted by the
/// files the tasks write.
#[test]
fn a_flood_of_short_tasks_runs_each_exactly_once() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &[]);
    server.namespace = "a".into();
    let root = dir.path().join("agents");
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let _one = Agent::start(&server, &root, "one", "pool=flood", 4);
    let _two = Agent::start(&server, &root, "two", "pool=flood", 4);
    let mut yaml = String::from(
        "namespace: a\njobs:\n  - name: flood\n    concurrency: allow\n    max_active_runs: 100\n    tasks:\n",
    );
    for i in 0..20 {
        yaml.push_str(&format!(
            "      - {{ id: t{i}, shell: 'touch {}/$DAGCRON_RUN_ID-$DAGCRON_TASK_ID-$DAGCRON_ATTEMPT-$(basename $(pwd))', run_on: {{ labels: {{ pool: flood }} }} }}\n",
            marks.display()
        ));
    }
    let (status, body) = server.post("/api/v1/apply", &yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let ids: Vec<i64> = (0..10).map(|_| server.trigger("flood")).collect();
    for id in &ids {
        server.wait_run(*id, "succeeded");
    }
    let files: Vec<String> = std::fs::read_dir(&marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files.len(), 200, "every task ran once");
    let mut tasks: Vec<String> = files
        .iter()
        .map(|f| f.rsplitn(3, '-').nth(2).unwrap().to_string())
        .collect();
    tasks.sort();
    tasks.dedup();
    assert_eq!(tasks.len(), 200, "no task ran twice");
    let on = |agent: &str| files.iter().filter(|f| f.ends_with(agent)).count();
    assert!(
        on("-one") > 0 && on("-two") > 0,
        "both agents worked: {} and {}",
        on("-one"),
        on("-two")
    );
    eprintln!(
        "200 attempts: {} on one agent, {} on the other",
        on("-one"),
        on("-two")
    );
}

/// A timed instruction: the job's runs are made a second before their
/// instant, the agent receives the task ahead and starts it at the instant,
/// and each attempt records how far from the instant it started.
#[test]
fn timed_instructions_are_sent_ahead_and_started_at_their_instant() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &[]);
    server.namespace = "a".into();
    let _agent = Agent::start(
        &server,
        &dir.path().join("agents"),
        "clock",
        "role=timed",
        4,
    );
    let yaml = "namespace: a\njobs:\n  - name: timed\n    schedule: '*/2 * * * * *'\n    send_ahead: 1s\n    concurrency: allow\n    max_active_runs: 4\n    tasks:\n      - { id: go, shell: 'true', run_on: { labels: { role: timed } } }\n";
    let (status, body) = server.post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    server.wait_runs("timed", 3);
    server.post(
        "/api/v1/namespaces/a/jobs/timed/pause",
        "",
        "application/json",
    );
    server.wait_idle(&["timed"]);
    let runs = server.all_runs("timed");
    for run in &runs {
        assert_eq!(run["state"], "succeeded", "{run}");
        let scheduled: jiff::Timestamp = run["scheduled_at"].as_str().unwrap().parse().unwrap();
        let created: jiff::Timestamp = run["created_at"].as_str().unwrap().parse().unwrap();
        assert!(created < scheduled, "made ahead: {run}");
        let attempt = &run["tasks"][0]["attempts"][0];
        assert_eq!(attempt["started_at"], run["scheduled_at"], "{run}");
        let error = attempt["start_error_us"].as_i64().expect("a start error");
        // Correctness, not speed: an agent that ignored the instant, or got
        // its clock offset backwards, would be off by about the second sent ahead.
        assert!(error.abs() < 500_000, "started {error} µs from the instant");
        eprintln!("start error {error} µs");
    }
}

/// A TCP proxy between an agent and the server whose connections can be
/// cut (both directions closed, new ones refused) and restored, or stalled
/// (nothing passes, the connections stay open, what was sent meanwhile
/// arrives when it heals: packets dropped and sent again): network
/// failures between real processes.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            cut: Arc::default(),
            stalled: Arc::default(),
            stop: Arc::default(),
            open: Arc::default(),
        };
        let (cut, stop, open) = (proxy.cut.clone(), proxy.stop.clone(), proxy.open.clone());
        let stalled = proxy.stalled.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                // Checked under the lock `cut` takes, held until the
                // connection is in the list: a connection accepted while the
                // proxy is being cut is refused or closed with the others.
                let mut open = open.lock().unwrap();
                if cut.load(Ordering::SeqCst) {
                    continue;
                }
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    let (stalled, stop) = (stalled.clone(), stop.clone());
                    std::thread::spawn(move || {
                        common::pipe(from, to, &stalled, &stop, &Default::default());
                    });
                }
                open.extend([client, server]);
            }
        });
        proxy
    }

    /// Closes every connection and refuses new ones.
    fn cut(&self) {
        let mut open = self.open.lock().unwrap();
        self.cut.store(true, Ordering::SeqCst);
        for s in open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Nothing passes either way until [`Proxy::heal`]; no side is told.
    fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.stalled.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.heal();
        self.cut();
    }
}

/// An agent cut off silently (its connection open, nothing passing) kept
/// running its attempt past its lease while the server retried it on
/// another agent: both ran at once. The agent now kills its attempts when
/// its lease ends without a word from the server, and the server reports
/// them lost only after a grace that covers the kill.
#[test]
fn regression_a_silently_cut_off_agent_kills_its_attempt_before_the_retry_starts() {
    let (dir, data) = setup();
    let mut server = Server::start(&data, &["--agent-lease-ttl-ms", "4000"]);
    server.namespace = "a".into();
    let port: u16 = server.url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = Proxy::start(port);
    let via = format!("http://127.0.0.1:{}", proxy.port);
    let root = dir.path().join("agents");
    let far = Agent::start_via(&server, &via, &root, "far", "pool=w", 2);
    let d = dir.path().display();
    // The first attempt holds a lock on a file while it runs (its processes
    // hold it; it goes when they are gone); a later attempt checks, as it
    // starts, that it can take the lock: that the first is gone.
    let script = format!(
        "lock={d}/lock; if [ $DAGCRON_ATTEMPT -eq 1 ]; then exec 9>$lock; flock 9; touch {d}/started; sleep 30; touch {d}/done-1; elif ! flock -n $lock true; then touch {d}/overlap; fi"
    );
    let yaml = format!(
        "namespace: a\njobs:\n  - name: cut\n    retry: {{ max_attempts: 2, backoff: fixed, initial: 100ms, max: 100ms }}\n    tasks:\n      - {{ id: t, shell: '{}', run_on: {{ labels: {{ pool: w }} }} }}\n",
        script.replace('\'', "''")
    );
    let (status, body) = server.post("/api/v1/apply", &yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let id = server.trigger("cut");
    until("the first attempt runs", || {
        dir.path().join("started").exists()
    });
    let _near = Agent::start(&server, &root, "near", "pool=w", 2);
    let cut = Instant::now();
    proxy.stall();
    let run = server.wait_run(id, "succeeded");
    assert_eq!(attempt_states(&run), ["lost", "succeeded"], "{run}");
    assert!(
        !dir.path().join("overlap").exists(),
        "the retry started while the first attempt still ran"
    );
    let retried = cut.elapsed();
    proxy.heal();
    // The first attempt was killed, not left to finish.
    assert_eq!(attempt_pids(id, "t", 1), Vec::<u32>::new());
    assert!(!dir.path().join("done-1").exists());
    let text = std::fs::read_to_string(&far.log).unwrap();
    assert!(text.contains("its running attempts are killed"), "{text}");
    eprintln!(
        "silent cut: retried {} ms after the cut, no overlap",
        retried.as_millis()
    );
    server.signal(Signal::SIGTERM);
}

/// The agent's network is cut while it runs a task, then restored: within
/// the agent lease the result reported on reconnection is taken and the
/// attempt counts once; past the lease the attempt is lost and retried, and
/// the late result is refused as stale.
#[test]
fn an_agent_cut_off_reports_on_reconnection_and_a_late_result_is_refused() {
    let (dir, data) = setup();
    let mut server = Server::start(&data, &["--agent-lease-ttl-ms", "8000"]);
    server.namespace = "a".into();
    let port: u16 = server.url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = Proxy::start(port);
    let via = format!("http://127.0.0.1:{}", proxy.port);
    let agent = Agent::start_via(
        &server,
        &via,
        &dir.path().join("agents"),
        "far",
        "site=far",
        2,
    );
    let yaml = "namespace: a\njobs:\n  - name: cut\n    retry: { max_attempts: 2, backoff: fixed, initial: 1s }\n    tasks:\n      - { id: t, shell: 'touch started-$DAGCRON_ATTEMPT; sleep 2; touch done-$DAGCRON_ATTEMPT; echo done', run_on: { labels: { site: far } } }\n";
    let (status, body) = server.post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let stale = |s: &Server| {
        s.get("/api/v1/workers")["stale_results_refused"]
            .as_i64()
            .unwrap()
    };

    // A short cut: the task ends while the agent is unreachable; its result
    // comes with the next hello.
    let id = server.trigger("cut");
    until("the task starts", || agent.dir.join("started-1").exists());
    proxy.cut();
    until("the server sees the agent gone", || {
        server.get("/api/v1/workers")["items"][0]["connected"] == false
    });
    until("the task ends, unreported", || {
        agent.dir.join("done-1").exists()
    });
    assert_eq!(
        server.get(&format!("/api/v1/runs/{id}"))["state"],
        "running"
    );
    proxy.restore();
    let run = server.wait_run(id, "succeeded");
    let attempts = run["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "taken once, not retried: {run}");
    assert_eq!(log(&server, id, "t", 1), "done\n");
    assert_eq!(stale(&server), 0);
    std::fs::remove_file(agent.dir.join("done-1")).unwrap();
    std::fs::remove_file(agent.dir.join("started-1")).unwrap();

    // A cut longer than the agent lease: the attempt is lost and retried
    // (on the same agent once it is back); the first result, reported on
    // reconnection, carries a stale token and is refused.
    let id = server.trigger("cut");
    until("the task starts", || agent.dir.join("started-1").exists());
    proxy.cut();
    until("the attempt is declared lost", || {
        server.get(&format!("/api/v1/runs/{id}"))["tasks"][0]["attempts"][0]["state"] == "lost"
    });
    until("the first attempt ends, unreported", || {
        agent.dir.join("done-1").exists()
    });
    proxy.restore();
    let run = server.wait_run(id, "succeeded");
    let attempts = run["tasks"][0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{run}");
    assert_eq!(attempts[0]["state"], "lost", "{run}");
    assert_eq!(attempts[1]["state"], "succeeded", "{run}");
    assert_eq!(stale(&server), 1, "the late result was refused");
    server.signal(Signal::SIGTERM);
}

/// SIGTERM to an agent: it finishes the attempt it runs, takes no new one,
/// and exits; the task that came meanwhile waits for another agent.
#[test]
fn an_agent_drains_on_sigterm() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &[]);
    server.namespace = "a".into();
    let root = dir.path().join("agents");
    let mut first = Agent::start(&server, &root, "first", "role=drain", 2);
    let yaml = "namespace: a\njobs:\n  - name: drain\n    concurrency: allow\n    max_active_runs: 2\n    tasks:\n      - { id: t, shell: 'touch started-$DAGCRON_RUN_ID; sleep 2; touch finished-$DAGCRON_RUN_ID', run_on: { labels: { role: drain } } }\n";
    let (status, body) = server.post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let running = server.trigger("drain");
    until("the agent runs the task", || {
        first.dir.join(format!("started-{running}")).exists()
    });
    kill(Pid::from_raw(first.child.id() as i32), Signal::SIGTERM).unwrap();
    until("the server knows the agent drains", || {
        server.get("/api/v1/workers")["items"][0]["draining"] == true
    });
    let waiting = server.trigger("drain");
    let status = until("the agent exits", || first.child.try_wait().unwrap());
    assert!(status.success(), "{status}");
    assert!(first.dir.join(format!("finished-{running}")).exists());
    server.wait_run(running, "succeeded");
    assert!(
        !first.dir.join(format!("started-{waiting}")).exists(),
        "a draining agent took a new task"
    );
    assert_eq!(
        server.get(&format!("/api/v1/runs/{waiting}"))["state"],
        "running"
    );
    let second = Agent::start(&server, &root, "second", "role=drain", 2);
    server.wait_run(waiting, "succeeded");
    assert!(second.dir.join(format!("finished-{waiting}")).exists());
}

/// Remote attempts are bounded by the agents' capacity, not by the
/// server's own pool: with a pool of one, an agent with four slots runs a
/// run's four parallel remote tasks at once.
#[test]
fn remote_tasks_are_not_bounded_by_the_servers_pool() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &["--pool-size", "1"]);
    server.namespace = "a".into();
    let agent = Agent::start(&server, &dir.path().join("agents"), "wide", "role=wide", 4);
    let mut yaml = String::from("namespace: a\njobs:\n  - name: wide\n    tasks:\n");
    for t in 0..4 {
        yaml.push_str(&format!(
            "      - {{ id: t{t}, shell: 'touch started-{t}; sleep 2; touch done-{t}', run_on: {{ labels: {{ role: wide }} }} }}\n"
        ));
    }
    let (status, body) = server.post("/api/v1/apply", &yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let id = server.trigger("wide");
    until("the four tasks start", || {
        (0..4).all(|t| agent.dir.join(format!("started-{t}")).exists())
    });
    assert!(
        (0..4).all(|t| !agent.dir.join(format!("done-{t}")).exists()),
        "the tasks ran one after another"
    );
    server.wait_run(id, "succeeded");
}

/// A CA and a certificate for 127.0.0.1 signed by it, as PEM files in `dir`:
/// (CA certificate, server certificate, server key).
fn test_certificates(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(vec![]).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".into()]).unwrap();
    leaf.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// `dagcron serve` over TLS with `certs` (CA, certificate, key) and `extra`
/// flags, once it answers; its calls trust the CA.
fn tls_server(
    data: &Path,
    certs: &(PathBuf, PathBuf, PathBuf),
    extra: &[&std::ffi::OsStr],
) -> Server {
    let (ca, cert, key) = certs;
    let log = data.with_extension("log");
    let (mut cmd, address_file) = common::serve_command(&log);
    let mut child = cmd
        .arg("--data-dir")
        .arg(data)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .args(extra)
        .spawn()
        .unwrap();
    // Written once the server answers: over TLS, and with its admin token made.
    let address = common::wait_address(&mut child, &address_file, &log);
    let pem = std::fs::read(ca).unwrap();
    let url = format!("https://{address}");
    let mut server = Server::adopt(child, url, "tls", log, data);
    server.ca = Some(pem);
    server
}

/// The API and the agents' stream over TLS: the command line and an agent
/// that trust the CA reach the server, a plain-text client does not.
#[test]
fn the_api_and_the_agents_speak_tls() {
    let (dir, data) = setup();
    let certs = test_certificates(dir.path());
    let ca = certs.0.clone();
    let server = tls_server(&data, &certs, &[]);
    let url = server.url.clone();
    let plain = reqwest::blocking::get(url.replacen("https://", "http://", 1) + "/healthz");
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain text answered"
    );
    let cli = |args: &[&str]| {
        let out = server
            .cli()
            .arg("--ca")
            .arg(&ca)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let tls_join_token = cli(&["tokens", "create", "--name", "tls", "--role", "agent"]);
    let tls_join_token = tls_join_token.trim().to_string();
    std::fs::write(
        dir.path().join("job.yaml"),
        "namespace: tls\njobs:\n  - { name: far, tasks: [{ id: t, shell: 'echo over tls', run_on: { labels: { net: tls } } }] }\n",
    )
    .unwrap();
    cli(&["apply", "-f", dir.path().join("job.yaml").to_str().unwrap()]);
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let _agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args([
                "worker",
                "--server",
                &url,
                "--id",
                "tls-agent",
                "--labels",
                "net=tls",
                "--token",
                &tls_join_token,
                "--ca",
            ])
            .arg(&ca)
            .current_dir(&agent_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let run: i64 = {
        let out = cli(&["--json", "jobs", "trigger", "tls/far"]);
        serde_json::from_str::<Value>(&out).unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    server.wait_run(run, "succeeded");
    let log = server
        .http()
        .get(format!("{url}/api/v1/runs/{run}/tasks/t/attempts/1/log"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert_eq!(log, "over tls\n");
    let mut server = server;
    assert!(server.signal(Signal::SIGTERM).success());
}

/// With no `--agent-token` set, anything that reached the port could attach
/// as an agent and be handed tasks, their parameters and secrets. Agents now
/// need a join token, and take only what it allows: its namespace, and no
/// label it does not list.
#[test]
fn regression_agents_need_a_join_token_and_keep_within_it() {
    let (dir, data) = setup();
    let server = InProcess::start(&data, &[]);
    let worker = |token: Option<&str>, id: &str, labels: &str| {
        let agent_dir = dir.path().join(id);
        std::fs::create_dir_all(&agent_dir).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dagcron"));
        cmd.args([
            "worker",
            "--server",
            &server.url,
            "--id",
            id,
            "--labels",
            labels,
        ])
        .current_dir(&agent_dir)
        .env_remove("DAGCRON_AGENT_TOKEN");
        if let Some(token) = token {
            cmd.args(["--token", token]);
        }
        cmd
    };
    // No token, or a label the token does not list: refused, and the agent says why.
    let out = worker(None, "stranger", "zone=eu").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("join token"),
        "{out:?}"
    );
    let eu_only = join_token(&server, None, Some(serde_json::json!({ "zone": "eu" })));
    let out = worker(Some(&eu_only), "liar", "zone=us").output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("zone=us"),
        "{out:?}"
    );
    // A token of namespace a: the agent runs a's task, never b's.
    let file = |ns: &str| {
        format!(
            "namespace: {ns}\njobs:\n  - {{ name: j, tasks: [{{ id: t, shell: 'touch {}/ran-{ns}', run_on: {{ labels: {{ zone: eu }} }} }}] }}\n",
            dir.path().display()
        )
    };
    for ns in ["b", "a"] {
        assert_eq!(
            server
                .post("/api/v1/apply", &file(ns), "application/yaml")
                .0,
            200
        );
    }
    let trigger = |ns: &str| {
        let (status, run) = server.post(
            &format!("/api/v1/namespaces/{ns}/jobs/j/trigger"),
            "{}",
            "application/json",
        );
        assert_eq!(status, 201, "{run}");
        run["id"].as_i64().unwrap()
    };
    let b = trigger("b");
    let a = trigger("a");
    let only_a = join_token(&server, Some("a"), None);
    let _agent = Killed(
        worker(Some(&only_a), "a-agent", "zone=eu")
            .arg("--capacity")
            .arg("1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    server.wait_run(a, "succeeded");
    assert!(dir.path().join("ran-a").exists());
    assert!(
        !dir.path().join("ran-b").exists(),
        "an agent of namespace a ran b's task"
    );
    assert_eq!(server.get(&format!("/api/v1/runs/{b}"))["state"], "running");
    // A join token is good for nothing else.
    let as_agent = reqwest::blocking::Client::new()
        .get(format!("{}/api/v1/namespaces/a/jobs", server.url))
        .bearer_auth(&only_a)
        .send()
        .unwrap();
    assert_eq!(as_agent.status(), 403);
}

/// With `--client-ca`, an agent must present a certificate signed by it
/// (mutual TLS); the command line needs none.
#[test]
fn agents_present_a_client_certificate_when_the_server_asks() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let (dir, data) = setup();
    let certs = test_certificates(dir.path());
    let ca = certs.0.clone();
    // A second authority for agents, and an agent certificate signed by it.
    let agents_ca_key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let agents_ca = params.self_signed(&agents_ca_key).unwrap();
    let agent_key = KeyPair::generate().unwrap();
    let agent_cert = CertificateParams::new(vec!["agent-1".into()])
        .unwrap()
        .signed_by(&agent_key, &agents_ca, &agents_ca_key)
        .unwrap();
    let agents_ca_file = dir.path().join("agents-ca.pem");
    let (agent_cert_file, agent_key_file) =
        (dir.path().join("agent.pem"), dir.path().join("agent.key"));
    std::fs::write(&agents_ca_file, agents_ca.pem()).unwrap();
    std::fs::write(&agent_cert_file, agent_cert.pem()).unwrap();
    std::fs::write(&agent_key_file, agent_key.serialize_pem()).unwrap();
    let mut server = tls_server(
        &data,
        &certs,
        &["--client-ca".as_ref(), agents_ca_file.as_os_str()],
    );
    let url = server.url.clone();
    // The command line, without a client certificate, is served.
    let out = server
        .cli()
        .arg("--ca")
        .arg(&ca)
        .args(["tokens", "create", "--name", "m", "--role", "agent"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let join = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let worker = |with_cert: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dagcron"));
        cmd.args([
            "worker", "--server", &url, "--id", "m-agent", "--token", &join, "--ca",
        ])
        .arg(&ca)
        .current_dir(dir.path());
        if with_cert {
            cmd.arg("--cert")
                .arg(&agent_cert_file)
                .arg("--key")
                .arg(&agent_key_file);
        }
        cmd
    };
    let out = worker(false).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("client certificate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _agent = Killed(
        worker(true)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    until("the agent with its certificate is connected", || {
        server.get("/api/v1/workers")["items"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["id"] == "m-agent"))
    });
    assert!(server.signal(Signal::SIGTERM).success());
}

/// A trigger's trace context reaches a task run by an agent: the server
/// here records no spans, so the task gets the caller's context as it came
/// (with its `tracestate`).
#[test]
fn the_trace_context_goes_with_the_task_to_its_agent() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &[]);
    server.namespace = "a".into();
    let agent = Agent::start(
        &server,
        &dir.path().join("agents"),
        "tracer",
        "role=tracer",
        1,
    );
    let yaml = "namespace: a\njobs:\n  - name: traced\n    tasks:\n      - { id: t, shell: 'echo \"$TRACEPARENT $TRACESTATE\" > seen', run_on: { labels: { role: tracer } } }\n";
    let (status, body) = server.post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let id = server.trigger_traced("traced", traceparent, "congo=t61rcWkgMzE");
    server.wait_run(id, "succeeded");
    assert_eq!(
        std::fs::read_to_string(agent.dir.join("seen")).unwrap(),
        format!("{traceparent} congo=t61rcWkgMzE\n")
    );
}

/// A server asked to stop while an agent's stream was dead (the agent's
/// network gone, its connection open without a FIN) was still running
/// minutes later: the HTTP server's graceful shutdown waited for every
/// connection to close. A stopped agent (SIGSTOP) holds its connection
/// the same way; the server must stop within its grace and the close grace.
#[test]
fn regression_a_dead_agent_stream_does_not_keep_a_server_from_stopping() {
    let (dir, data) = setup();
    let mut server = Server::start(&data, &["--shutdown-grace", "1"]);
    server.namespace = "a".into();
    let root = dir.path().join("agents");
    let agent = Agent::start(&server, &root, "frozen", "zone=x", 1);
    let pid = Pid::from_raw(agent.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    let status = server.signal(Signal::SIGTERM);
    let took = started.elapsed();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(20),
        "the server took {took:?} to stop"
    );
}
