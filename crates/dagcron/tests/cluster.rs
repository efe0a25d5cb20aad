//! The cluster with real processes: several `dagcron serve` nodes on
//! loopback sharing one PostgreSQL database (a fresh one per test), killed
//! with SIGKILL, paused with SIGSTOP, stopped with SIGTERM. Every claim is
//! checked from the API or from the database itself.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Killed, Server, attempt_pids, attempt_states, join_token, log, setup, until};
use dagcron_test_pg::TestDatabase;
use jiff::{SignedDuration, Timestamp};
use nix::sys::signal::Signal;
use serde_json::Value;

/// The tests of this file each start several nodes: one at a time, so that
/// they do not starve each other of the machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

struct Cluster {
    /// First, so that the nodes stop (and a failed test prints their
    /// output) before their directory and database go.
    nodes: Vec<Option<Server>>,
    db: TestDatabase,
    dir: tempfile::TempDir,
    ttl_ms: u64,
    /// More flags for every node.
    extra: Vec<String>,
    /// The server key file every node is started with.
    key_file: std::path::PathBuf,
    /// The instance-admin token made by `dagcron tokens bootstrap`.
    token: String,
}

impl Cluster {
    fn new(label: &str, size: usize, ttl_ms: u64) -> Cluster {
        Cluster::with_flags(label, size, ttl_ms, &[])
    }

    fn with_flags(label: &str, size: usize, ttl_ms: u64, extra: &[&str]) -> Cluster {
        let (dir, _) = setup();
        let db = TestDatabase::create_blocking(label);
        // The cluster's first token and server key, as an operator makes them.
        let key_file = dir.path().join("server.key");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args(["tokens", "bootstrap", "--database", &db.url, "--key-file"])
            .arg(&key_file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let mut cluster = Cluster {
            key_file,
            token,
            db,
            dir,
            nodes: (0..size).map(|_| None).collect(),
            ttl_ms,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for i in 0..size {
            cluster.start(i);
        }
        cluster
    }

    fn start(&mut self, i: usize) {
        let url = self.db.url.clone();
        self.start_via(i, &url);
    }

    /// Starts node `i` on the database at `url` (the test's own, or a
    /// proxy in front of it).
    fn start_via(&mut self, i: usize, url: &str) {
        self.start_with(i, url, &[]);
    }

    /// Starts node `i` on the database at `url` with more flags of its own.
    fn start_with(&mut self, i: usize, url: &str, flags: &[&str]) {
        let (mut args, log) = self.node_args(i, url);
        args.extend(flags.iter().map(|f| f.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut server = Server::spawn(&args, &log);
        server.namespace = "c".into();
        server.token = Some(self.token.clone());
        self.nodes[i] = Some(server);
    }

    /// Starts node `i` on the database at `url` without waiting for it to
    /// answer (it may not, for a while).
    fn launch_via(&self, i: usize, url: &str) -> (Killed, std::path::PathBuf) {
        let (args, log) = self.node_args(i, url);
        let (mut cmd, _) = common::serve_command(&log);
        (Killed(cmd.args(&args).spawn().unwrap()), log)
    }

    /// The flags of node `i` on the database at `url`, and its log.
    fn node_args(&self, i: usize, url: &str) -> (Vec<String>, std::path::PathBuf) {
        let id = format!("n{i}");
        let log = self.dir.path().join(format!("{id}.log"));
        let mut args: Vec<String> = [
            "--database",
            url,
            "--node-id",
            &id,
            "--lease-ttl-ms",
            &self.ttl_ms.to_string(),
            "--misfire-grace",
            "0",
            "--key-file",
            self.key_file.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.extra.iter().cloned());
        (args, log)
    }

    fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("node is running")
    }

    fn node_mut(&mut self, i: usize) -> &mut Server {
        self.nodes[i].as_mut().expect("node is running")
    }

    /// Any running node.
    fn any(&self) -> &Server {
        self.nodes.iter().flatten().next().expect("a running node")
    }

    fn epoch_of(&self, i: usize) -> i64 {
        self.node(i).get("/healthz")["node"]["epoch"]
            .as_i64()
            .unwrap()
    }

    /// Waits (bounded) until the running nodes agree on a ring of all of
    /// them, and their owned jobs add up to `jobs`.
    fn wait_converged(&self, jobs: i64) -> Vec<i64> {
        let live = self.nodes.iter().flatten().count();
        until("the cluster converges", || {
            let views: Vec<Value> = self
                .nodes
                .iter()
                .flatten()
                .map(|n| n.get("/api/v1/cluster"))
                .collect();
            let agreed = views.iter().all(|v| v["this_node"]["ring_size"] == live);
            let alive = views[0]["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["state"] == "alive" && n["lease_valid"] == true)
                .count();
            // Each node's own count is current; the ones in heartbeats lag a beat.
            let owned: Vec<i64> = views
                .iter()
                .map(|v| v["this_node"]["owned_jobs"].as_i64().unwrap())
                .collect();
            if agreed && alive == live && owned.iter().sum::<i64>() == jobs {
                Ok(owned)
            } else {
                Err(format!("{views:?}"))
            }
        })
    }

    fn apply(&self, yaml: &str) {
        let (status, body) = self.any().post("/api/v1/apply", yaml, "application/yaml");
        assert_eq!(status, 200, "{body}");
    }

    /// The database's count for `sql`.
    fn count(&self, sql: &str) -> i64 {
        self.db.scalar(sql)
    }

    /// Waits (bounded) until every job of `jobs` has fired at `t` or later.
    fn wait_fired_through(&self, jobs: &[String], t: Timestamp) {
        let names = jobs
            .iter()
            .map(|j| format!("'{j}'"))
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!(
            "SELECT count(DISTINCT job) FROM fires WHERE namespace = 'c' AND job IN ({names}) AND scheduled_at >= {}",
            us(t)
        );
        until(&format!("every job fired through {t}"), || {
            self.count(&sql) == jobs.len() as i64
        });
    }
}

/// `n` jobs firing every second, each run one no-op task.
fn every_second(n: usize, prefix: &str) -> (String, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i:04}")).collect();
    let mut yaml = String::from("namespace: c\njobs:\n");
    for name in &names {
        yaml.push_str(&format!(
            "  - {{ name: {name}, schedule: '* * * * * *', misfire: run_all, max_catchup: 1000, concurrency: allow, max_active_runs: 1000, tasks: [{{ id: t, noop: true }}] }}\n"
        ));
    }
    (yaml, names)
}

fn us(t: Timestamp) -> i64 {
    t.as_microsecond()
}

/// Every second of `[from, to]` has exactly one run of every job; returns
/// the number of (job, second) pairs checked.
fn assert_exactly_once(server: &Server, jobs: &[String], from: Timestamp, to: Timestamp) -> usize {
    let (from, to) = (from.as_second(), to.as_second());
    let mut checked = 0;
    for job in jobs {
        let runs = server.all_runs(job);
        let seconds: Vec<i64> = runs
            .iter()
            .map(|r| {
                r["scheduled_at"]
                    .as_str()
                    .unwrap()
                    .parse::<Timestamp>()
                    .unwrap()
                    .as_second()
            })
            .collect();
        let unique: BTreeSet<i64> = seconds.iter().copied().collect();
        assert_eq!(
            unique.len(),
            seconds.len(),
            "{job} has a second with two runs"
        );
        for s in from..=to {
            assert!(unique.contains(&s), "{job} has no run for second {s}");
            checked += 1;
        }
    }
    checked
}

/// How long after `kill` the first fire written by another node came, for
/// the jobs whose fires `epoch` was writing just before.
fn failover_ms(cluster: &Cluster, epoch: i64, kill: Timestamp) -> i64 {
    let k = us(kill);
    let first: i64 = cluster.count(&format!(
        "SELECT (extract(epoch FROM max(first_after)) * 1000000)::bigint FROM (
            SELECT f.job, min(f.recorded_at) AS first_after FROM fires f
            WHERE f.job IN (SELECT job FROM fires WHERE node_epoch = {epoch} AND recorded_at > to_timestamp({k} / 1e6) - interval '3 seconds')
              AND f.recorded_at > to_timestamp({k} / 1e6) AND f.node_epoch <> {epoch}
            GROUP BY f.job) x"
    ));
    (first - k) / 1000
}

/// Runs and attempts that are still unfinished although they began more
/// than a few seconds before `at` (no-op tasks finish at once).
fn stuck(cluster: &Cluster, at: Timestamp) -> (i64, i64) {
    let old = us(at) - 5_000_000;
    (
        cluster.count(&format!(
            "SELECT count(*) FROM runs WHERE state IN ('pending', 'running') AND created_at < {old}"
        )),
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE state IN ('dispatching', 'running') AND started_at < {old}"
        )),
    )
}

/// Three nodes, 150 jobs firing every second; SIGKILL one node, later a
/// second, then restart both: every second of the whole window has exactly
/// one run of every job, nothing stays running, ownership converges.
#[test]
fn nodes_killed_and_restarted_lose_and_double_no_fire() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::new("kill", 3, 2000);
    let (yaml, jobs) = every_second(150, "j");
    cluster.apply(&yaml);
    let owned = cluster.wait_converged(150);
    assert!(owned.iter().all(|n| *n > 0), "{owned:?}");
    // The window starts once every job fires.
    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, from);

    let epoch0 = cluster.epoch_of(0);
    let kill0 = Timestamp::now();
    cluster.node_mut(0).signal(Signal::SIGKILL);
    cluster.nodes[0] = None;
    cluster.wait_converged(150);
    // The survivors carry every job on for a while.
    cluster.wait_fired_through(&jobs, Timestamp::now() + jiff::SignedDuration::from_secs(2));

    let epoch1 = cluster.epoch_of(1);
    let kill1 = Timestamp::now();
    cluster.node_mut(1).signal(Signal::SIGKILL);
    cluster.nodes[1] = None;
    cluster.wait_converged(150);
    cluster.wait_fired_through(&jobs, Timestamp::now() + jiff::SignedDuration::from_secs(2));

    cluster.start(0);
    cluster.start(1);
    let owned = cluster.wait_converged(150);
    assert!(owned.iter().all(|n| *n > 0), "{owned:?}");
    // The window ends once every job fired past it.
    let to = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));

    let checked = assert_exactly_once(cluster.any(), &jobs, from, to);
    let doubled = cluster.count(
        "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY namespace, job, scheduled_at HAVING count(*) > 1) d",
    );
    assert_eq!(doubled, 0);
    let end = Timestamp::now();
    assert_eq!(
        stuck(&cluster, end),
        (0, 0),
        "runs or attempts stayed unfinished"
    );
    eprintln!(
        "checked {checked} (job, second) pairs: no fire lost or doubled; failover after SIGKILL: {} ms and {} ms (lease {} ms)",
        failover_ms(&cluster, epoch0, kill0),
        failover_ms(&cluster, epoch1, kill1),
        cluster.ttl_ms
    );
}

/// A node paused past its lease (SIGSTOP, then SIGCONT) writes nothing after
/// it wakes: it finds itself fenced and exits, its jobs fired meanwhile by
/// the other node exactly once.
#[test]
fn a_paused_node_does_not_fire_or_write_after_it_wakes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::new("pause", 2, 1500);
    let (yaml, jobs) = every_second(60, "p");
    cluster.apply(&yaml);
    cluster.wait_converged(60);
    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, from);
    let epoch = cluster.epoch_of(0);

    cluster.node(0).send(Signal::SIGSTOP);
    // Paused for longer than its lease: the other node takes every job
    // over and fires them.
    until("node 1 owns every job", || {
        cluster.node(1).get("/api/v1/cluster")["this_node"]["owned_jobs"] == 60
    });
    cluster.wait_fired_through(&jobs, Timestamp::now() + jiff::SignedDuration::from_secs(1));
    let woke = Timestamp::now();
    cluster.node(0).send(Signal::SIGCONT);
    let status = cluster.node_mut(0).child.wait().unwrap();
    cluster.nodes[0] = None;
    assert_eq!(status.code(), Some(75), "a fenced node exits with 75");

    let w = us(woke);
    assert_eq!(
        cluster.count(&format!(
            "SELECT count(*) FROM fires WHERE node_epoch = {epoch} AND recorded_at >= to_timestamp({w} / 1e6)"
        )),
        0,
        "fires written after waking"
    );
    assert_eq!(
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE node_epoch = {epoch} AND started_at >= {w}"
        )),
        0,
        "attempts started after waking"
    );
    assert_eq!(
        cluster.count(&format!(
            "SELECT count(*) FROM runs WHERE owner_epoch = {epoch} AND created_at >= {w}"
        )),
        0,
        "runs created after waking"
    );
    let to = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));
    let checked = assert_exactly_once(cluster.any(), &jobs, from, to);

    // It comes back with a new epoch and a share of the jobs.
    cluster.start(0);
    let owned = cluster.wait_converged(60);
    assert!(owned.iter().all(|n| *n > 0), "{owned:?}");
    assert!(cluster.epoch_of(0) > epoch);
    eprintln!("paused node fenced; {checked} (job, second) pairs checked");
}

/// A run cancelled through another node stops. SIGTERM: the node hands its
/// jobs over at once (long before its lease would end), finishes its
/// running attempts, and leaves; nothing is lost.
#[test]
fn graceful_shutdown_hands_over_at_once_and_loses_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A lease far longer than the test: a hand-over that waited for it would fail.
    let mut cluster = Cluster::new("leave", 2, 60_000);
    let (mut yaml, jobs) = every_second(40, "g");
    yaml.push_str(
        "  - { name: slow, schedule: '* * * * * *', concurrency: allow, max_active_runs: 100, tasks: [{ id: s, shell: 'sleep 1.5' }] }\n",
    );
    yaml.push_str(
        "  - { name: manual, schedule: '0 0 0 1 1 *', tasks: [{ id: s, shell: 'sleep 60' }] }\n",
    );
    cluster.apply(&yaml);
    cluster.wait_converged(42);

    // A run of one node cancelled through the other.
    let id = cluster.node(1).trigger("manual");
    let (status, body) =
        cluster
            .node(0)
            .post(&format!("/api/v1/runs/{id}/cancel"), "", "application/json");
    assert!(status < 300, "{status} {body}");
    cluster.node(0).wait_run(id, "cancelled");

    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, from);
    let epoch = cluster.epoch_of(0);
    let term = Timestamp::now();
    let status = cluster.node_mut(0).signal(Signal::SIGTERM);
    cluster.nodes[0] = None;
    assert!(status.success(), "{status}");
    cluster.wait_converged(42);
    let to = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));
    let checked = assert_exactly_once(cluster.any(), &jobs, from, to);
    let handover = failover_ms(&cluster, epoch, term);
    assert!(
        handover < 60_000,
        "the hand-over waited for the lease ({handover} ms)"
    );
    // The attempts it was running when told to stop were finished, not lost.
    assert_eq!(
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE node_epoch = {epoch} AND state <> 'succeeded'"
        )),
        0
    );
    cluster.any().post(
        "/api/v1/namespaces/c/jobs/slow/pause",
        "",
        "application/json",
    );
    cluster.node(1).wait_idle(&["slow"]);
    eprintln!("graceful hand-over after {handover} ms; {checked} (job, second) pairs checked");
}

/// With three nodes and 10,000 jobs, each node owns within ±10% of a third.
#[test]
fn ten_thousand_jobs_are_shared_evenly_by_three_nodes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::new("balance", 3, 5000);
    for chunk in 0..5 {
        let mut yaml = String::from("namespace: c\njobs:\n");
        for i in 0..2000 {
            yaml.push_str(&format!(
                "  - {{ name: b{chunk}-{i:04}, schedule: '0 0 0 1 1 *', tasks: [{{ id: t, noop: true }}] }}\n"
            ));
        }
        cluster.apply(&yaml);
    }
    let owned = cluster.wait_converged(10_000);
    for n in &owned {
        assert!((3_000..=3_667).contains(n), "uneven shares: {owned:?}");
    }
    // The same view from the command line.
    let out = cluster
        .node(1)
        .cli()
        .args(["cluster", "status"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("this node: n1 "), "{text}");
    for id in ["n0", "n1", "n2"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(id) && l.contains("alive") && l.contains("valid")),
            "{text}"
        );
    }
    eprintln!("10,000 jobs over 3 nodes: {owned:?}");
    // Deletions through one node reach every node (the owners count one less).
    for name in ["b0-0000", "b1-0001", "b2-0002"] {
        let resp = cluster
            .node(2)
            .http()
            .delete(format!(
                "{}/api/v1/namespaces/c/jobs/{name}",
                cluster.node(2).url
            ))
            .send()
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
    }
    cluster.wait_converged(9_997);
}

/// Jobs whose runs are still running on their old owner move to a node
/// that joins: the new owner counts those runs, so that a `forbid` job
/// never has two runs at once across the cluster (before, the new owner
/// started a run at the next second beside the old one's).
#[test]
fn regression_a_job_that_moves_counts_the_runs_still_running_on_its_old_owner() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Nothing here waits for a lease to end: a long one keeps a stall of
    // the database under load (1.3 s seen, with a 2 s lease) from ending
    // both nodes' leases, which stopped them and failed the test.
    let mut cluster = Cluster::new("moves", 1, 6000);
    let jobs: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
    let mut yaml = String::from("namespace: c\njobs:\n");
    for name in &jobs {
        yaml.push_str(&format!(
            "  - {{ name: {name}, schedule: '* * * * * *', concurrency: forbid, tasks: [{{ id: t, shell: 'sleep 4' }}] }}\n"
        ));
    }
    cluster.apply(&yaml);
    until("every job has a run running on n0", || {
        cluster.count("SELECT count(DISTINCT job) FROM runs WHERE state = 'running'") == 8
    });
    let n0 = cluster.epoch_of(0);
    cluster.nodes.push(None);
    cluster.start(1);
    cluster.wait_converged(8);
    let n1 = cluster.epoch_of(1);
    let joined = Timestamp::now();
    // Past the end of n0's last runs, and a few fires of n1's own after.
    cluster.wait_fired_through(&jobs, joined + SignedDuration::from_secs(7));
    let moved = cluster.count(&format!(
        "SELECT count(DISTINCT job) FROM runs WHERE owner_epoch = {n1}"
    ));
    assert!(moved > 0, "no job moved to the node that joined");
    let skipped_for_n0 = cluster.count(&format!(
        "SELECT count(*) FROM fires
         WHERE outcome = 'skipped_overlap' AND node_epoch = {n1}
           AND job IN (SELECT job FROM runs WHERE owner_epoch = {n0})"
    ));
    let overlapping = cluster.count(
        "SELECT count(*) FROM runs a JOIN runs b
           ON a.namespace = b.namespace AND a.job = b.job AND a.id < b.id
         WHERE a.started_at IS NOT NULL AND b.started_at IS NOT NULL
           AND a.started_at < COALESCE(b.finished_at, 9223372036854775807)
           AND b.started_at < COALESCE(a.finished_at, 9223372036854775807)",
    );
    assert_eq!(
        overlapping, 0,
        "runs of a forbid job ran at once ({moved} jobs moved, {skipped_for_n0} fires skipped for n0's runs)"
    );
}

/// Nodes with one slot each: a run's parallel tasks overflow to the other
/// node, which claims and runs them; when that node is killed mid-task, its
/// attempt is declared lost once its lease ends and is retried.
#[test]
fn attempts_overflow_to_a_node_with_room_and_survive_its_death() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::with_flags("share", 2, 2000, &["--pool-size", "1"]);
    let e0 = cluster.epoch_of(0);
    let e1 = cluster.epoch_of(1);
    cluster.apply(
        "namespace: c\njobs:\n  - { name: fan, schedule: '0 0 0 1 1 *', tasks: [{ id: t0, shell: 'sleep 1' }, { id: t1, shell: 'sleep 1' }, { id: t2, shell: 'sleep 1' }, { id: t3, shell: 'sleep 1' }, { id: t4, shell: 'sleep 1' }, { id: t5, shell: 'sleep 1' }] }\n  - { name: long, schedule: '0 0 0 1 1 *', retry: { max_attempts: 3, backoff: fixed, initial: 1s }, tasks: [{ id: a, shell: 'sleep 6' }, { id: b, shell: 'sleep 6' }] }\n",
    );
    cluster.wait_converged(2);

    let id = cluster.node(0).trigger("fan");
    cluster.node(0).wait_run(id, "succeeded");
    let per_node = |epoch: i64| {
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE run_id = {id} AND node_epoch = {epoch} AND state = 'succeeded'"
        ))
    };
    let (on0, on1) = (per_node(e0), per_node(e1));
    assert_eq!(on0 + on1, 6, "one attempt per task");
    assert!(on0 > 0 && on1 > 0, "both nodes ran tasks: {on0} and {on1}");

    let id = cluster.node(0).trigger("long");
    until("node 1 runs one of the run's tasks", || {
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE run_id = {id} AND node_epoch = {e1} AND state = 'running'"
        )) == 1
    });
    let kill = Timestamp::now();
    cluster.node_mut(1).signal(Signal::SIGKILL);
    cluster.nodes[1] = None;
    cluster.node(0).wait_run(id, "succeeded");
    let lost_after_ms = (cluster.count(&format!(
        "SELECT finished_at FROM attempts WHERE run_id = {id} AND node_epoch = {e1} AND state = 'lost'"
    )) - us(kill))
        / 1000;
    let run = cluster.node(0).get(&format!("/api/v1/runs/{id}"));
    let states: Vec<Vec<String>> = run["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["state"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert!(
        states.contains(&vec!["lost".to_string(), "succeeded".to_string()]),
        "{states:?}"
    );
    assert!(
        states.contains(&vec!["succeeded".to_string()]),
        "{states:?}"
    );

    // Node 1 back; a run cancelled while node 1 runs one of its tasks: the
    // owner withdraws the attempt and node 1 kills its process.
    cluster.start(1);
    cluster.wait_converged(2);
    let e1 = cluster.epoch_of(1);
    let marks = cluster.dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o777)).unwrap();
    cluster.apply(&format!(
        "namespace: c\njobs:\n  - {{ name: stop, schedule: '0 0 0 1 1 *', tasks: [{{ id: a, shell: 'sleep 3; touch {0}/a' }}, {{ id: b, shell: 'sleep 3; touch {0}/b' }}] }}\n",
        marks.display(),
    ));
    cluster.wait_converged(3);
    let id = cluster.node(0).trigger("stop");
    until("node 1 runs one of the run's tasks", || {
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE run_id = {id} AND node_epoch = {e1} AND state = 'running'"
        )) == 1
    });
    let (status, body) =
        cluster
            .node(1)
            .post(&format!("/api/v1/runs/{id}/cancel"), "", "application/json");
    assert!(status < 300, "{status} {body}");
    cluster.node(0).wait_run(id, "cancelled");
    // Their processes are gone, and neither left its mark.
    for task in ["a", "b"] {
        until("the task's processes are gone", || {
            attempt_pids(id, task, 1).is_empty()
        });
    }
    assert!(
        std::fs::read_dir(&marks).unwrap().next().is_none(),
        "a cancelled task ran to its end"
    );
    assert_eq!(
        cluster.count(&format!(
            "SELECT count(*) FROM attempts WHERE run_id = {id} AND state <> 'cancelled'"
        )),
        0
    );
    eprintln!(
        "fan-out: {on0} tasks on node 0, {on1} on node 1; attempt of the killed node declared lost {lost_after_ms} ms after SIGKILL (lease {} ms)",
        cluster.ttl_ms
    );
}

/// An agent connected to one node of two runs the remote tasks of every
/// run, whichever node made it; when its node is killed mid-task, the agent
/// moves to the other node, which stops the orphaned process, declares the
/// attempt lost (its node is gone) and has the agent retry it.
#[test]
fn an_agent_on_one_node_serves_the_cluster_and_outlives_its_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::new("agents", 2, 2000);
    let (e0, e1) = (cluster.epoch_of(0), cluster.epoch_of(1));
    let edge = cluster.dir.path().join("edge");
    std::fs::create_dir_all(&edge).unwrap();
    let log = std::fs::File::create(cluster.dir.path().join("edge.log")).unwrap();
    // Node 1 first, node 0 when node 1 does not answer.
    let servers = format!("{},{}", cluster.node(1).url, cluster.node(0).url);
    let join = join_token(cluster.node(1), None, None);
    let _agent = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args([
                "worker",
                "--server",
                &servers,
                "--id",
                "edge",
                "--labels",
                "site=edge",
                "--token",
                &join,
            ])
            .current_dir(&edge)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let connected = |node: &Server| {
        node.get("/api/v1/workers")["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["connected"] == true)
    };
    until("the agent is connected to node 1", || {
        connected(cluster.node(1))
    });
    cluster.apply(
        "namespace: c\njobs:\n  - { name: remote, schedule: '0 0 0 1 1 *', tasks: [{ id: t, shell: 'echo on the edge', run_on: { labels: { site: edge } } }] }\n  - { name: long, schedule: '0 0 0 1 1 *', retry: { max_attempts: 3, backoff: fixed, initial: 1s }, tasks: [{ id: t, shell: 'touch started-$DAGCRON_ATTEMPT; sleep 4; touch done-$DAGCRON_ATTEMPT', run_on: { labels: { site: edge } } }] }\n",
    );
    cluster.wait_converged(2);

    // Runs made by either node: their remote tasks all reach the agent
    // through node 1; node 0's through the cluster's shared attempts.
    let ids: Vec<(i64, i64)> = (0..3)
        .flat_map(|_| {
            [
                (cluster.node(0).trigger("remote"), e0),
                (cluster.node(1).trigger("remote"), e1),
            ]
        })
        .collect();
    for (id, _) in &ids {
        let run = cluster.node(0).wait_run(*id, "succeeded");
        let attempts = run["tasks"][0]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{run}");
    }
    for (id, _) in &ids {
        assert_eq!(
            cluster.count(&format!(
                "SELECT count(*) FROM attempts WHERE run_id = {id} AND node_epoch = {e1}"
            )),
            1,
            "run {id}: run through node 1, which has the agent"
        );
    }

    // Node 1 killed while the agent runs a task of node 0's run.
    let id = cluster.node(0).trigger("long");
    until("the agent starts the task", || {
        edge.join("started-1").exists()
    });
    let kill = Instant::now();
    cluster.node_mut(1).signal(Signal::SIGKILL);
    cluster.nodes[1] = None;
    until("the agent moves to node 0", || connected(cluster.node(0)));
    let run = cluster.node(0).wait_run(id, "succeeded");
    let states: Vec<&str> = run["tasks"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["lost", "succeeded"], "{run}");
    assert!(edge.join("done-2").exists());
    assert!(
        !edge.join("done-1").exists(),
        "the first attempt's process, orphaned by its node, was stopped"
    );
    eprintln!(
        "agent's node killed: attempt lost and retried through the other node, done {} ms after SIGKILL",
        kill.elapsed().as_millis()
    );
}

/// Right after an apply through one node returned, a trigger of the new
/// job through another node answered 404 (the change had not reached it).
/// Node 0 reaches the database through a proxy that delays every chunk, so
/// that the announcement of the change reaches it late. (Node 0 reads the
/// job beside its loop and takes the call again once it is installed.)
#[test]
fn regression_a_job_applied_through_one_node_is_known_to_every_node_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::with_flags("read-through", 0, 5000, &[]);
    cluster.nodes = vec![None, None];
    let slow = Partition::in_front_of(&cluster.db.url);
    cluster.start_via(0, &slow.url);
    cluster.start(1);
    cluster.wait_converged(0);
    slow.delay(Duration::from_millis(10));
    for i in 0..3 {
        let yaml = format!(
            "namespace: c\njobs:\n  - {{ name: fresh{i}, tasks: [{{ id: t, noop: true }}] }}\n"
        );
        let (status, body) = cluster
            .node(1)
            .post("/api/v1/apply", &yaml, "application/yaml");
        assert_eq!(status, 200, "{body}");
        let (status, body) = cluster.node(0).post(
            &format!("/api/v1/namespaces/c/jobs/fresh{i}/trigger"),
            "{}",
            "application/json",
        );
        assert_eq!(
            status, 201,
            "job {i} applied through node 1, triggered through node 0: {body}"
        );
        let yaml = format!(
            "namespace: c\njobs:\n  - {{ name: filled{i}, schedule: '0 0 0 * * *', tasks: [{{ id: t, noop: true }}] }}\n"
        );
        let (status, body) = cluster
            .node(1)
            .post("/api/v1/apply", &yaml, "application/yaml");
        assert_eq!(status, 200, "{body}");
        let (status, body) = cluster.node(0).post(
            &format!("/api/v1/namespaces/c/jobs/filled{i}/backfill"),
            r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-03T00:00:00Z"}"#,
            "application/json",
        );
        assert_eq!(
            (status, body["runs"].as_array().map(Vec::len)),
            (201, Some(2)),
            "job {i} applied through node 1, backfilled through node 0: {body}"
        );
    }
    slow.delay(Duration::ZERO);
}

/// A node whose every exchange with the database took 100 ms lost its
/// lease: its heartbeat waited for the rest of its upkeep and its shared
/// work, which took longer than the lease. The lease is now renewed on its
/// own schedule.
#[test]
fn regression_a_node_far_from_its_database_keeps_its_lease() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::with_flags("far-node", 0, 5000, &[]);
    cluster.nodes = vec![None, None];
    let slow = Partition::in_front_of(&cluster.db.url);
    cluster.start_via(0, &slow.url);
    cluster.start(1);
    cluster.wait_converged(0);
    let epoch = cluster.epoch_of(0);
    let yaml = "namespace: c\njobs:\n  - { name: far, schedule: '* * * * * *', tasks: [{ id: t, noop: true }] }\n";
    let (status, body) = cluster
        .node(1)
        .post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    slow.delay(Duration::from_millis(100));
    // Three lease lengths: node 0 stays alive with the same epoch, as node 1 sees it.
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        let view = cluster.node(1).get("/api/v1/cluster");
        let n0 = view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "n0")
            .cloned()
            .unwrap();
        assert_eq!(n0["epoch"], epoch, "{view}");
        assert_eq!(n0["state"], "alive", "{view}");
        let exited = cluster.node_mut(0).child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "node 0 stopped ({exited:?}): {}",
            std::fs::read_to_string(&cluster.node(0).log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    slow.delay(Duration::ZERO);
    assert_eq!(cluster.epoch_of(0), epoch);
}

/// One node with a slow link to the database fenced the healthy ones: its
/// registration held a table lock across several round trips, and their
/// heartbeats waited behind it (fenced in turn, it came back and blocked
/// them again). A registration is now one statement that takes no lock a
/// heartbeat needs, and a node whose round trip to the database is longer
/// than its heartbeat interval waits to join.
#[test]
fn regression_a_node_with_a_slow_link_fences_no_healthy_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::with_flags("slow-link", 0, 2000, &[]);
    cluster.nodes = vec![None, None, None];
    let slow = Partition::in_front_of(&cluster.db.url);
    cluster.start_via(0, &slow.url);
    cluster.start(1);
    cluster.start(2);
    let (yaml, jobs) = every_second(10, "s");
    cluster.apply(&yaml);
    cluster.wait_converged(10);
    let healthy = [(1, cluster.epoch_of(1)), (2, cluster.epoch_of(2))];
    // The healthy nodes keep their registrations and never stop.
    let check_healthy = |cluster: &mut Cluster| {
        for (i, epoch) in healthy {
            let exited = cluster.node_mut(i).child.try_wait().unwrap();
            assert!(exited.is_none(), "healthy node {i} stopped: {exited:?}");
            assert_eq!(cluster.epoch_of(i), epoch, "node {i} registered again");
        }
    };
    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    // Each way, each chunk: a round trip of at least 800 ms, twice the
    // heartbeat interval of a 2 s lease.
    slow.delay(Duration::from_millis(400));
    let status = until("the slow node loses its lease", || {
        check_healthy(&mut cluster);
        cluster.node_mut(0).child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(75), "the slow node is fenced");
    cluster.nodes[0] = None;
    // Started again over the same link, as a supervisor would: it connects,
    // then waits to join, while the others go on.
    let (restarted, log) = cluster.launch_via(0, &slow.url);
    let waiting = "not joining yet";
    // It says it waits, and tries to join twice more.
    until("the slow node has tried to join three times", || {
        check_healthy(&mut cluster);
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(waiting)
            .count()
            >= 3
    });
    // The link heals: it joins, and the three share the jobs.
    slow.delay(Duration::ZERO);
    drop(restarted);
    cluster.start_via(0, &slow.url);
    cluster.wait_converged(10);
    check_healthy(&mut cluster);
    let to = Timestamp::now();
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));
    let checked = assert_exactly_once(cluster.node(1), &jobs, from, to);
    eprintln!("slow link: {checked} (job, second) pairs fired once, no healthy node fenced");
}

/// A node started with its clock 3 s ahead of the database's took jobs for
/// a moment (it was eligible until its first heartbeat) and fired them up
/// to 3 s before their instants. A node now owns nothing until a heartbeat
/// has checked its clock: one this far off never does, however often it
/// starts.
#[test]
fn regression_a_node_whose_clock_is_ahead_never_fires() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::new("skewed", 2, 2000);
    cluster.nodes.push(None);
    let (yaml, jobs) = every_second(20, "k");
    cluster.apply(&yaml);
    cluster.wait_converged(20);
    let healthy = [cluster.epoch_of(0), cluster.epoch_of(1)];
    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    let url = cluster.db.url.clone();
    for start in 0..4 {
        cluster.start_with(2, &url, &["--fault-clock-offset-ms", "3000"]);
        // It says its clock is off, and is not ready.
        until("the skewed node finds its clock off", || {
            let resp = cluster
                .node(2)
                .http()
                .get(format!("{}/readyz", cluster.node(2).url))
                .send()
                .unwrap();
            resp.status().as_u16() == 503
                && resp.json::<Value>().unwrap()["checks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["name"] == "clock" && c["ok"] == false)
        });
        // A few heartbeats more.
        until("the skewed node beats for a second", || {
            cluster.count("SELECT count(*) FROM nodes WHERE id = 'n2' AND heartbeat_at >= started_at + interval '1 second'") == 1
        });
        let view = cluster.node(2).get("/api/v1/cluster");
        assert_eq!(view["this_node"]["owned_jobs"], 0, "start {start}: {view}");
        cluster.node_mut(2).signal(Signal::SIGKILL);
        cluster.nodes[2] = None;
    }
    let to = Timestamp::now();
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));
    let by_others = cluster.count(&format!(
        "SELECT count(*) FROM fires WHERE node_epoch NOT IN ({}, {})",
        healthy[0], healthy[1]
    ));
    assert_eq!(by_others, 0, "the skewed node fired");
    assert_eq!([cluster.epoch_of(0), cluster.epoch_of(1)], healthy);
    let checked = assert_exactly_once(cluster.node(0), &jobs, from, to);
    eprintln!(
        "skewed clock: 4 starts 3 s ahead, nothing fired by it; {checked} (job, second) pairs fired once"
    );
}

/// A TCP proxy in front of PostgreSQL that can stop passing bytes while
/// keeping its connections open: a network partition, not a crash.
struct Partition {
    url: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Milliseconds every chunk waits before it passes.
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Partition {
    fn in_front_of(url: &str) -> Partition {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxied = url.replacen("127.0.0.1:5432", &format!("127.0.0.1:{port}"), 1);
        assert_ne!(
            proxied, url,
            "the test database is expected on 127.0.0.1:5432: {url}"
        );
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
        listener.set_nonblocking(true).unwrap();
        let (c, st, d) = (cut.clone(), stop.clone(), delay.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let server = std::net::TcpStream::connect("127.0.0.1:5432").unwrap();
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let (c, st, d) = (c.clone(), st.clone(), d.clone());
                    std::thread::spawn(move || common::pipe(from, to, &c, &st, &d));
                }
            }
        });
        Partition {
            url: proxied,
            cut,
            stop,
            delay,
        }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every chunk waits this long before it passes (zero: none).
    fn delay(&self, by: Duration) {
        self.delay
            .store(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A node cut off from PostgreSQL (its connections open, no byte passing)
/// stopped firing and exited with 75 in time, but its running shell
/// attempts lived on past its lease while the other node already ran their
/// retries: every retry overlapped the attempt it replaced.
#[test]
fn regression_a_partitioned_node_kills_its_attempts_before_its_lease_ends() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::with_flags("partition", 0, 2000, &[]);
    cluster.nodes = vec![None, None];
    let partition = Partition::in_front_of(&cluster.db.url);
    cluster.start_via(0, &partition.url);
    cluster.start(1);
    let dir = cluster.dir.path().to_path_buf();
    // The first attempt holds a lock on a file of its run while it runs
    // (its processes hold it; it goes when they are gone); every later
    // attempt checks, as it starts, that it can take the lock, that is,
    // that the attempt before it is gone. (The tasks run in sandboxes of
    // their own: they cannot see each other's processes, only files.)
    let script = format!(
        "lock={d}/lock-$DAGCRON_RUN_ID; if [ $DAGCRON_ATTEMPT -eq 1 ]; then exec 9>$lock; flock 9; touch {d}/started-$DAGCRON_RUN_ID; sleep 60; elif ! flock -n $lock true; then touch {d}/overlap-$DAGCRON_RUN_ID; fi",
        d = dir.display()
    );
    let (yaml, jobs) = every_second(20, "q");
    cluster.apply(&format!(
        "{yaml}  - {{ name: work, concurrency: allow, retry: {{ max_attempts: 3, backoff: fixed, initial: 100ms, max: 100ms }}, tasks: [{{ id: t, shell: '{}' }}] }}\n",
        script.replace('\'', "''")
    ));
    cluster.wait_converged(21);
    let from = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, from);
    // Six attempts running on the node about to be cut off.
    let runs: Vec<i64> = (0..6).map(|_| cluster.node(0).trigger("work")).collect();
    for run in &runs {
        let started = dir.join(format!("started-{run}"));
        until("the first attempt runs", || started.exists());
    }
    partition.cut();
    // A request that makes the cut-off node wait on its database while its
    // lease runs out.
    let url = format!(
        "{}/api/v1/namespaces/c/jobs/work/pause",
        cluster.node(0).url
    );
    let http = cluster.node(0).http();
    std::thread::spawn(move || {
        let _ = http.post(url).timeout(Duration::from_secs(30)).send();
    });
    let status = {
        let node = cluster.node_mut(0);
        until("the cut-off node stops", || node.child.try_wait().unwrap())
    };
    assert_eq!(status.code(), Some(75), "the cut-off node exits with 75");
    cluster.nodes[0] = None;
    let survivor = cluster.node(1);
    for run in &runs {
        let r = survivor.wait_run(*run, "succeeded");
        assert_eq!(attempt_states(&r), ["lost", "succeeded"], "{r}");
        assert!(
            !dir.join(format!("overlap-{run}")).exists(),
            "the retry of run {run} started while the attempt it replaced still ran"
        );
    }
    // Firing went on without loss or double through the partition.
    cluster.wait_converged(21);
    let to = Timestamp::now() + jiff::SignedDuration::from_secs(1);
    cluster.wait_fired_through(&jobs, to + jiff::SignedDuration::from_secs(1));
    let checked = assert_exactly_once(survivor, &jobs, from, to);
    eprintln!("partition: {checked} (job, second) pairs checked, no retry overlapped");
}

/// The read-only mode is stored in the database: set through one node, it
/// refuses a trigger through the other (and scheduled fires go on), and
/// `dagcron jobs pause --all` through either pauses the namespace's jobs
/// for both.
#[test]
fn read_only_set_through_one_node_holds_on_every_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::new("read-only", 2, 5000);
    cluster.wait_converged(0);
    let (status, body) = cluster.node(0).post(
        "/api/v1/apply",
        "namespace: c\njobs:\n  - { name: tick, schedule: '* * * * * *', tasks: [{ id: t, noop: true }] }\n  - { name: once, tasks: [{ id: t, noop: true }] }\n",
        "application/yaml",
    );
    assert_eq!(status, 200, "{body}");
    let out = cluster
        .node(0)
        .cli()
        .args([
            "admin",
            "read-only",
            "on",
            "--reason",
            "moving the database",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("read-only: on"));
    let (status, body) = cluster.node(1).post(
        "/api/v1/namespaces/c/jobs/once/trigger",
        "{}",
        "application/json",
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "read_only");
    let refused = cluster
        .node(1)
        .cli()
        .args(["jobs", "trigger", "c/once"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("moving the database"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // Schedules keep firing meanwhile.
    let fired = |node: &Server| {
        node.get("/api/v1/namespaces/c/jobs/tick/fires")["items"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let before = fired(cluster.node(1));
    until("the scheduled job fires while read-only", || {
        fired(cluster.node(1)) > before
    });
    let paused = cluster
        .node(1)
        .cli()
        .args(["jobs", "pause", "--all", "c"])
        .output()
        .unwrap();
    assert!(
        paused.status.success(),
        "{}",
        String::from_utf8_lossy(&paused.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&paused.stdout).trim(),
        "c: 2 job(s) paused, 0 already so"
    );
    let off = cluster
        .node(1)
        .cli()
        .args(["admin", "read-only", "off"])
        .output()
        .unwrap();
    assert!(off.status.success());
    let (status, body) = cluster.node(0).post(
        "/api/v1/namespaces/c/jobs/once/trigger",
        "{}",
        "application/json",
    );
    assert_eq!(status, 201, "{body}");
}

/// `after` triggers through a failover: 20 jobs every second on three
/// nodes, each with a job that starts after its runs; one node is killed
/// with SIGKILL while they run. Once the upstream jobs are paused and
/// every run has ended, each upstream run that succeeded has exactly one
/// downstream run (its key names it), and no downstream run has none.
#[test]
fn after_triggers_make_one_run_per_upstream_end_through_a_failover() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cluster = Cluster::new("after", 3, 2000);
    let (mut yaml, ups) = every_second(20, "up");
    for up in &ups {
        yaml.push_str(&format!(
            "  - {{ name: down-{up}, after: {{ job: {up} }}, concurrency: allow, max_active_runs: 1000, max_pending_runs: 100000, tasks: [{{ id: t, noop: true }}] }}\n"
        ));
    }
    cluster.apply(&yaml);
    cluster.wait_converged(40);
    cluster.wait_fired_through(&ups, Timestamp::now() + jiff::SignedDuration::from_secs(2));
    cluster.node_mut(0).signal(Signal::SIGKILL);
    cluster.nodes[0] = None;
    cluster.wait_converged(40);
    cluster.wait_fired_through(&ups, Timestamp::now() + jiff::SignedDuration::from_secs(3));
    // The upstream jobs stop firing (their downstream jobs go on: a paused
    // job takes no run after another's end).
    for up in &ups {
        let (status, body) = cluster.any().post(
            &format!("/api/v1/namespaces/c/jobs/{up}/pause"),
            "",
            "application/json",
        );
        assert_eq!(status, 200, "{body}");
    }
    until("every run ended", || {
        cluster.count(
            "SELECT count(*) FROM runs WHERE namespace = 'c' AND state IN ('planned', 'pending', 'running')",
        ) == 0
    });
    let succeeded = cluster.count(
        "SELECT count(*) FROM runs WHERE namespace = 'c' AND job LIKE 'up%' AND state = 'succeeded'",
    );
    let lost = cluster.count(
        "SELECT count(*) FROM runs u WHERE u.namespace = 'c' AND u.job LIKE 'up%' AND u.state = 'succeeded'
           AND NOT EXISTS (SELECT 1 FROM run_keys k WHERE k.namespace = 'c' AND k.job = 'down-' || u.job
                           AND k.key = 'after:run-' || u.id)",
    );
    let downstream = cluster.count(
        "SELECT count(*) FROM runs WHERE namespace = 'c' AND job LIKE 'down-%' AND trigger = 'after'",
    );
    let orphans = cluster.count(
        "SELECT count(*) FROM runs d WHERE d.namespace = 'c' AND d.job LIKE 'down-%'
           AND NOT EXISTS (SELECT 1 FROM run_keys k WHERE k.namespace = 'c' AND k.job = d.job AND k.run_id = d.id)",
    );
    assert!(succeeded > 40, "{succeeded} upstream runs");
    assert_eq!(lost, 0, "upstream runs that made no downstream run");
    assert_eq!(orphans, 0, "downstream runs made by no upstream end");
    assert_eq!(
        downstream, succeeded,
        "one downstream run per upstream success"
    );
}

/// The output of an attempt running on one node is readable through every
/// node while it runs: the node running it publishes it to the shared
/// store every second, marked partial, and the whole log is there once
/// it ends.
#[test]
fn a_running_attempts_output_is_read_through_every_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::new("live-logs", 2, 5000);
    cluster.apply(
        "namespace: c\njobs:\n  - name: talk\n    tasks:\n      - id: t\n        shell: 'for i in $(seq 1 40); do echo line $i; sleep 0.25; done'\n",
    );
    cluster.wait_converged(1);
    let run = cluster.node(0).trigger("talk");
    let path = format!("/api/v1/runs/{run}/tasks/t/attempts/1/log");
    // While it runs, each node answers with output so far, marked partial.
    for i in 0..2 {
        let node = cluster.node(i);
        until(
            &format!("node {i} shows the output while the attempt runs"),
            || {
                let resp = node
                    .http()
                    .get(format!("{}{path}", node.url))
                    .send()
                    .unwrap();
                let partial = resp
                    .headers()
                    .get("x-dagcron-log")
                    .is_some_and(|v| v == "partial");
                partial && resp.text().unwrap().contains("line 2\n")
            },
        );
    }
    cluster.node(1).wait_run(run, "succeeded");
    for i in 0..2 {
        let text = log(cluster.node(i), run, "t", 1);
        assert!(
            text.contains("line 1\n") && text.contains("line 40\n"),
            "{text}"
        );
    }
    until("the published output withdrawn", || {
        cluster.count("SELECT count(*) FROM live_logs") == 0
    });
}

/// Outputs cross a real agent and the other node of a cluster: a task of
/// either node's run hands outputs to a task on the agent (connected to
/// node 1 only, so node 0's runs reach it through the cluster's shared
/// attempts), whose own outputs come back to a task on the run's node. A
/// hostile value stays data all the way. A fan-out on the agent: its
/// instances go there with their items (through node 1 for node 0's runs),
/// and their outputs come back gathered in a list.
#[test]
fn outputs_cross_an_agent_and_the_other_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::new("outputs", 2, 2000);
    let edge = cluster.dir.path().join("edge");
    std::fs::create_dir_all(&edge).unwrap();
    let log_file = std::fs::File::create(cluster.dir.path().join("edge.log")).unwrap();
    let join = join_token(cluster.node(1), None, None);
    let _agent = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_dagcron"))
            .args(["worker", "--server", &cluster.node(1).url, "--id", "edge"])
            .args(["--labels", "site=edge", "--token", &join])
            .current_dir(&edge)
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap(),
    );
    until("the agent is connected to node 1", || {
        cluster.node(1).get("/api/v1/workers")["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["connected"] == true)
    });
    cluster.apply(
        r#"
namespace: c
jobs:
  - name: flow
    schedule: '0 0 0 1 1 *'
    tasks:
      - { id: extract, shell: "echo rows=42 >> $DAGCRON_OUTPUTS; echo 'q=x; touch pwned' >> $DAGCRON_OUTPUTS; echo 'parts=[\"p; touch pwned\", \"b\"]' >> $DAGCRON_OUTPUTS" }
      - id: remote
        depends_on: [extract]
        run_on: { labels: { site: edge } }
        shell: "echo got {{tasks.extract.outputs.rows}} {{tasks.extract.outputs.q}} $DAGCRON_OUTPUT_EXTRACT_ROWS; echo seen=on-the-edge-{{tasks.extract.outputs.rows}} >> $DAGCRON_OUTPUTS"
      - { id: back, depends_on: [remote], shell: "echo back {{tasks.remote.outputs.seen}}" }
      - id: fan
        depends_on: [extract]
        run_on: { labels: { site: edge } }
        for_each: "{{tasks.extract.outputs.parts}}"
        shell: "echo item {{item}} $DAGCRON_INDEX; echo \"got=$DAGCRON_ITEM\" >> $DAGCRON_OUTPUTS"
      - { id: gather, depends_on: [fan], shell: "echo gathered {{tasks.fan.outputs.got}}" }
"#,
    );
    cluster.wait_converged(1);
    for node in [0, 1] {
        let id = cluster.node(node).trigger("flow");
        let run = cluster.node(0).wait_run(id, "succeeded");
        assert_eq!(
            run["tasks"][1]["attempts"][0]["outputs"]["seen"], "on-the-edge-42",
            "{run}"
        );
        assert_eq!(
            log(cluster.node(0), id, "remote", 1),
            "got 42 x; touch pwned 42\n"
        );
        assert_eq!(log(cluster.node(1), id, "back", 1), "back on-the-edge-42\n");
        assert_eq!(
            log(cluster.node(0), id, "fan[0]", 1),
            "item p; touch pwned 0\n"
        );
        assert_eq!(log(cluster.node(1), id, "fan[1]", 1), "item b 1\n");
        assert_eq!(
            log(cluster.node(0), id, "gather", 1),
            "gathered [\"p; touch pwned\",\"b\"]\n"
        );
        assert_eq!(run["tasks"][5]["id"], "fan[0]");
        assert_eq!(
            run["tasks"][5]["attempts"][0]["node_epoch"].as_i64(),
            Some(cluster.epoch_of(1)),
            "the instance ran through node 1's agent"
        );
        let epoch = |task: usize| run["tasks"][task]["attempts"][0]["node_epoch"].as_i64();
        assert_eq!(
            (epoch(0), epoch(1), epoch(2)),
            (
                Some(cluster.epoch_of(node)),
                Some(cluster.epoch_of(1)),
                Some(cluster.epoch_of(node))
            ),
            "run on node {node}, the agent's task through node 1: {run}"
        );
    }
    assert!(!edge.join("pwned").exists(), "an output ran as shell code");
}
