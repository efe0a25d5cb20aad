#!/usr/bin/env python3
"""The cluster benchmark: 1, 2 and 3 `dagcron serve` nodes on this machine
against one PostgreSQL server, N jobs firing every second and a stream of
manual DAG runs; then SIGKILL of one of three nodes. Reports fires/s, task
attempts completed/s, p99 fire lateness, failover time, database load per
fire, duplicates and losses, and pgbench's raw limit of the same server.

Usage: scripts/bench-cluster   (environment: BENCH_JOBS, BENCH_SECONDS,
BENCH_NODES=1,2,3, BENCH_CLIENTS, DAGCRON_TEST_POSTGRES)
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ADMIN = os.environ.get("DAGCRON_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/postgres")
BIN = os.environ.get("DAGCRON_BIN", "target/release/dagcron")
JOBS = int(os.environ.get("BENCH_JOBS", "1000"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "15"))
NODES = [int(n) for n in os.environ.get("BENCH_NODES", "1,2,3").split(",")]
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "16"))
TTL_MS = 2000
# Each node's pool of attempts (its --pool-size).
POOL = int(os.environ.get("BENCH_POOL", "256"))
DAG_TASKS = int(os.environ.get("BENCH_DAG_TASKS", "20"))


def db_url(name):
    base = ADMIN.rsplit("/", 1)[0]
    return f"{base}/{name}"


def psql(url, sql):
    out = subprocess.run(["psql", url, "-AtXq", "-c", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# The cluster's instance-admin token, made by `dagcron tokens bootstrap` for
# each run's database.
TOKEN = ""


def headers(content_type="application/json"):
    return {"content-type": content_type, "authorization": f"Bearer {TOKEN}"}


def http(method, url, body=None, content_type="application/json"):
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers(content_type))
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read() or b"null")


class Node:
    def __init__(self, url, index, logdir, key_file):
        self.port = free_port()
        self.id = f"n{index}"
        self.api = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(logdir, f"{self.id}.log"), "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--database", url, "--listen", f"127.0.0.1:{self.port}", "--node-id", self.id,
             "--lease-ttl-ms", str(TTL_MS), "--pool-size", str(POOL), "--key-file", key_file],
            stdout=self.log, stderr=self.log, env={**os.environ, "RUST_LOG": "warn"})
        deadline = time.time() + 30
        while True:
            try:
                http("GET", f"{self.api}/healthz")
                return
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError(f"{self.id} did not start")
                time.sleep(0.05)

    def status(self):
        return http("GET", f"{self.api}/api/v1/cluster")

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)


def wait_converged(nodes, jobs):
    deadline = time.time() + 120
    while time.time() < deadline:
        views = [n.status()["this_node"] for n in nodes]
        if all(v["ring_size"] == len(nodes) for v in views) and sum(v["owned_jobs"] for v in views) == jobs:
            return [v["owned_jobs"] for v in views]
        time.sleep(0.1)
    raise RuntimeError("cluster did not converge")


def job_file():
    lines = ["namespace: b", "jobs:"]
    for i in range(JOBS):
        lines.append(f"  - {{ name: j{i:05}, schedule: '* * * * * *', misfire: run_all, max_catchup: 1000, "
                     f"concurrency: allow, max_active_runs: 1000, tasks: [{{ id: t, noop: true }}] }}")
    # A manual DAG: a fans out to 8 tasks that join in z.
    tasks = ["{ id: a, noop: true }"] + [f"{{ id: m{i}, noop: true, depends_on: [a] }}" for i in range(DAG_TASKS - 2)]
    tasks.append("{ id: z, noop: true, depends_on: [" + ", ".join(f"m{i}" for i in range(DAG_TASKS - 2)) + "] }")
    lines.append("  - { name: dag, schedule: '0 0 0 1 1 *', concurrency: allow, max_active_runs: 100000, tasks: ["
                 + ", ".join(tasks) + "] }")
    return "\n".join(lines) + "\n"


def trigger_stream(nodes, stop, counts, i):
    """Triggers DAG runs as fast as one kept-alive connection per node allows."""
    import http.client

    conns = [http.client.HTTPConnection("127.0.0.1", n.port, timeout=30) for n in nodes]
    n = 0
    while not stop.is_set():
        conn = conns[(i + n) % len(conns)]
        try:
            conn.request("POST", "/api/v1/namespaces/b/jobs/dag/trigger", body=b"{}", headers=headers())
            conn.getresponse().read()
            n += 1
        except Exception:
            conn.close()
            time.sleep(0.01)
    counts[i] = n


def write_stats(nodes):
    """Statements and batches of every node's write path so far."""
    views = [n.status()["this_node"]["writes"] for n in nodes]
    return sum(v["statements"] for v in views), sum(v["batches"] for v in views), sum(v["writes"] for v in views)


def db_stats(url, name):
    row = psql(url, f"SELECT xact_commit, tup_inserted + tup_updated FROM pg_stat_database WHERE datname = '{name}'")
    return [int(x) for x in row.split("|")]


def losses_and_duplicates(url, start, end):
    """Seconds of [start, end] (whole seconds) without a run of some job, and
    (job, second) pairs with more than one run."""
    lo, hi = int(start) + 1, int(end) - 1
    present = psql(url, f"""
        SELECT count(*) FROM (SELECT DISTINCT job, scheduled_at FROM runs
        WHERE trigger <> 'manual' AND job LIKE 'j%' AND scheduled_at BETWEEN {lo}000000 AND {hi}000000) x""")
    missing = JOBS * (hi - lo + 1) - int(present)
    doubled = psql(url, "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY namespace, job, scheduled_at, trigger "
                        "HAVING count(*) > 1 AND trigger <> 'manual') d")
    return int(missing), int(doubled), JOBS * (hi - lo + 1)


def pgbench():
    name = f"dagcron_bench_pgbench_{os.getpid()}"
    psql(ADMIN, f"CREATE DATABASE {name}")
    try:
        url = db_url(name)
        subprocess.run(["pgbench", "-i", "-q", "-s", "4", url], check=True, capture_output=True)
        out = subprocess.run(["pgbench", "-c", "6", "-j", "2", "-T", "10", "-N", "-n", url],
                             check=True, capture_output=True, text=True).stdout
        return float(re.search(r"tps = ([0-9.]+)", out).group(1))
    finally:
        psql(ADMIN, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run(n_nodes, logdir):
    name = f"dagcron_bench_{n_nodes}_{os.getpid()}"
    psql(ADMIN, f"CREATE DATABASE {name}")
    url = db_url(name)
    nodes = []
    try:
        # The server key every node shares, and the first admin token.
        global TOKEN
        key_file = os.path.join(logdir, f"server-{n_nodes}.key")
        TOKEN = subprocess.run([BIN, "tokens", "bootstrap", "--database", url, "--key-file", key_file],
                               check=True, capture_output=True, text=True).stdout.strip()
        nodes = [Node(url, i, logdir, key_file) for i in range(n_nodes)]
        http("POST", f"{nodes[0].api}/api/v1/apply", job_file(), "application/yaml")
        wait_converged(nodes, JOBS + 1)
        time.sleep(3)
        stop = threading.Event()
        counts = [0] * CLIENTS
        threads = [threading.Thread(target=trigger_stream, args=(nodes, stop, counts, i)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(2)
        start = time.time()
        tx0, rows0 = db_stats(ADMIN, name)
        st0, b0, w0 = write_stats(nodes)
        time.sleep(SECONDS)
        end = time.time()
        tx1, rows1 = db_stats(ADMIN, name)
        st1, b1, w1 = write_stats(nodes)
        stop.set()
        for t in threads:
            t.join()
        s_us, e_us = int(start * 1e6), int(end * 1e6)
        fires, p99 = psql(url, f"""
            SELECT count(*), percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM recorded_at) * 1000 - scheduled_at / 1000.0)
            FROM fires WHERE recorded_at >= to_timestamp({start}) AND recorded_at < to_timestamp({end})""").split("|")
        attempts = int(psql(url, f"SELECT count(*) FROM attempts WHERE finished_at >= {s_us} AND finished_at < {e_us}"))
        manual = int(psql(url, f"SELECT count(*) FROM runs WHERE trigger = 'manual' AND created_at >= {s_us} AND created_at < {e_us}"))
        time.sleep(3)
        missing, doubled, checked = losses_and_duplicates(url, start, end)
        fires = int(fires)
        result = {
            "nodes": n_nodes,
            "fires_per_s": fires / (end - start),
            "p99_lateness_ms": float(p99 or 0),
            "attempts_per_s": attempts / (end - start),
            "manual_runs_per_s": manual / (end - start),
            "transactions_per_s": (tx1 - tx0) / (end - start),
            "rows_written_per_attempt": (rows1 - rows0) / max(attempts, 1),
            "transactions_per_attempt": (tx1 - tx0) / max(attempts, 1),
            "statements_per_attempt": (st1 - st0) / max(attempts, 1),
            "statements_per_run": (st1 - st0) / max(fires + manual, 1),
            "writes_per_batch": (w1 - w0) / max(b1 - b0, 1),
            "statements_per_batch": (st1 - st0) / max(b1 - b0, 1),
            "missing": missing,
            "doubled": doubled,
            "checked": checked,
        }
        if n_nodes == 3:
            epoch = nodes[0].status()["this_node"]["epoch"]
            kill = time.time()
            nodes[0].stop(signal.SIGKILL)
            victim = nodes.pop(0)
            wait_converged(nodes, JOBS + 1)
            time.sleep(4)
            first = psql(url, f"""
                SELECT extract(epoch FROM max(first_after)) FROM (
                  SELECT f.job, min(f.recorded_at) AS first_after FROM fires f
                  WHERE f.job IN (SELECT job FROM fires WHERE node_epoch = {epoch} AND recorded_at > to_timestamp({kill}) - interval '3 seconds')
                    AND f.recorded_at > to_timestamp({kill}) AND f.node_epoch <> {epoch}
                  GROUP BY f.job) x""")
            result["failover_ms"] = (float(first) - kill) * 1000
            m2, d2, c2 = losses_and_duplicates(url, kill - 2, time.time() - 2)
            result["failover_missing"], result["failover_doubled"], result["failover_checked"] = m2, d2, c2
            del victim
        return result
    finally:
        for node in nodes:
            try:
                node.stop()
            except Exception:
                node.proc.kill()
        psql(ADMIN, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    logdir = tempfile.mkdtemp(prefix="dagcron-bench-")
    print(f"jobs firing every second: {JOBS}; manual DAG runs of {DAG_TASKS} no-op tasks from {CLIENTS} clients; "
          f"window {SECONDS} s; lease {TTL_MS} ms; logs in {logdir}", flush=True)
    tps = pgbench()
    print(f"pgbench simple-update (6 clients, same server): {tps:,.0f} transactions/s", flush=True)
    results = []
    for n in NODES:
        r = run(n, logdir)
        results.append(r)
        print(json.dumps(r), flush=True)
    print()
    print("| nodes | fires/s | p99 fire lateness | attempts/s | manual DAG runs/s | DB transactions/s (vs pgbench) | statements per run (fire or manual) | statements per attempt | writes (statements) per batch | rows written per attempt | lost / doubled (checked) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['nodes']} | {r['fires_per_s']:,.0f} | {r['p99_lateness_ms']:.1f} ms | {r['attempts_per_s']:,.0f} | "
              f"{r['manual_runs_per_s']:,.0f} | {r['transactions_per_s']:,.0f} ({r['transactions_per_s'] / tps:.2f}x) | "
              f"{r['statements_per_run']:.2f} | {r['statements_per_attempt']:.2f} | "
              f"{r['writes_per_batch']:.0f} ({r['statements_per_batch']:.1f}) | "
              f"{r['rows_written_per_attempt']:.2f} | {r['missing']} / {r['doubled']} ({r['checked']:,}) |")
    for r in results:
        if "failover_ms" in r:
            print(f"\nSIGKILL of 1 of 3 nodes: its jobs fired again after {r['failover_ms']:,.0f} ms "
                  f"(lease {TTL_MS} ms); lost / doubled around the failover: {r['failover_missing']} / "
                  f"{r['failover_doubled']} of {r['failover_checked']:,} (job, second) pairs")


if __name__ == "__main__":
    sys.exit(main())
