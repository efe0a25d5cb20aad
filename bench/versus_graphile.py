#!/usr/bin/env python3
"""Side by side with graphile-worker on the same PostgreSQL: drain
QUEUE_JOBS no-op jobs (dagcron: manual runs of a one-task no-op job,
QUEUE_CHUNK runs per API call) with one node and with three, each side in a database
of its own, in the same run. Reports jobs per second (first enqueue to
last completion), p99 enqueue-to-completion, and transactions and rows
written per job (pg_stat_database and pg_stat_user_tables before and
after), and their ratios.

graphile-worker 0.18 is installed with npm into a scratch directory at run
time. Its no-op task runs with its local queue (batched fetching) and
batched completion; its jobs are enqueued with addJobs, 1,000 per call.

Usage: scripts/bench-queue   (environment: QUEUE_JOBS, QUEUE_NODES=1,3,
QUEUE_GRAPHILE=concurrency:local_queue:batch_delay_ms,..., QUEUE_CHUNK, QUEUE_IN_FLIGHT,
DAGCRON_TEST_POSTGRES, DAGCRON_BIN)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402  (the nodes, psql and the database URLs)

JOBS = int(os.environ.get("QUEUE_JOBS", "100000"))
NODES = [int(n) for n in os.environ.get("QUEUE_NODES", "1,3").split(",")]
GRAPHILE = [tuple(int(x) for x in c.split(":"))
            for c in os.environ.get("QUEUE_GRAPHILE", "16:500:0,32:1000:0,64:2000:0").split(",") if c != "none"]
# dagcron's runs per API call (1: one trigger per run; more: trigger-batch,
# as graphile-worker's side enqueues 1,000 per addJobs), and calls in flight.
CHUNK = int(os.environ.get("QUEUE_CHUNK", "1000"))
IN_FLIGHT = int(os.environ.get("QUEUE_IN_FLIGHT", "64" if CHUNK == 1 else "4"))
# For profiling: the plans of dagcron's statements slower than this many
# milliseconds go to the server's log (auto_explain).
EXPLAIN_MS = os.environ.get("QUEUE_EXPLAIN_MS")
DEADLINE_S = 300
HERE = os.path.dirname(os.path.abspath(__file__))


def db_stats(url, name):
    """Committed transactions of the database, and rows written to its tables."""
    tx = int(cluster.psql(cluster.ADMIN, f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{name}'"))
    rows = int(cluster.psql(url, "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"))
    return tx, rows


def settled_stats(url, name):
    # A backend sends its statistics at most once a second.
    time.sleep(1.5)
    return db_stats(url, name)


def wait_until(url, sql, target):
    """The moment `sql` counts `target`, polled every 20 ms inside one
    statement (a psql process per poll would load the shared cores)."""
    cluster.psql(url, f"""SET statement_timeout = '{DEADLINE_S}s';
        DO $$ BEGIN WHILE ({sql}) <> {target} LOOP PERFORM pg_sleep(0.02); END LOOP; END $$""")
    return time.time()


def percentile(values, p):
    values = sorted(values)
    return values[min(int(len(values) * p), len(values) - 1)] if values else float("nan")


def install_graphile(scratch):
    subprocess.run(["npm", "install", "--prefix", scratch, "--no-audit", "--no-fund", "--silent",
                    "graphile-worker@0.18"], check=True)
    shutil.copy(os.path.join(HERE, "queue.mjs"), scratch)


def graphile(scratch, n_nodes, concurrency, local_queue, batch_delay):
    name = f"queue_graphile_{n_nodes}_{os.getpid()}"
    cluster.psql(cluster.ADMIN, f"CREATE DATABASE {name}")
    url = cluster.db_url(name)
    script = os.path.join(scratch, "queue.mjs")
    workers = []
    try:
        subprocess.run([os.path.join(scratch, "node_modules/.bin/graphile-worker"), "-c", url, "--schema-only"],
                       check=True, capture_output=True)
        outs = [os.path.join(scratch, f"latency-{i}.json") for i in range(n_nodes)]
        for i, out in enumerate(outs):
            log = os.path.join(scratch, f"graphile-{n_nodes}-{i}.log")
            workers.append(subprocess.Popen(["node", script, "gw-worker", url, str(concurrency), str(local_queue),
                                             str(batch_delay), out], stdout=open(log, "w"), stderr=subprocess.STDOUT))
            # It logs to stdout too; a line of its own says that it runs.
            deadline = time.time() + 30
            while "ready\n" not in open(log).read():
                if time.time() > deadline or workers[-1].poll() is not None:
                    raise RuntimeError(f"graphile-worker did not start (see {log})")
                time.sleep(0.05)
        s0 = settled_stats(url, name)
        t0 = time.time()
        enq = json.loads(subprocess.run(["node", script, "gw-enqueue", url, str(JOBS), "1000"], check=True,
                                        capture_output=True, text=True).stdout)
        t1 = wait_until(url, "SELECT count(*) FROM graphile_worker._private_jobs", 0)
        for w in workers:
            w.terminate()
            w.wait(timeout=60)
        s1 = settled_stats(url, name)
        latencies = [x for out in outs for x in json.load(open(out))]
        return {
            "side": "graphile-worker", "nodes": n_nodes,
            "config": f"concurrency {concurrency}, local queue {local_queue}, complete batch delay {batch_delay} ms",
            "jobs": len(latencies), "jobs_per_s": JOBS / (t1 - t0), "enqueue_s": enq["enqueue_s"],
            "p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99),
            "tx_per_job": (s1[0] - s0[0]) / JOBS, "rows_per_job": (s1[1] - s0[1]) / JOBS,
        }
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        cluster.psql(cluster.ADMIN, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


JOB_FILE = """namespace: b
jobs:
  - { name: noop, schedule: '0 0 0 1 1 *', concurrency: allow, max_active_runs: 1000000,
      max_pending_runs: 1000000, tasks: [{ id: t, noop: true }] }
"""


def dagcron(scratch, n_nodes, logdir):
    name = f"queue_dagcron_{n_nodes}_{os.getpid()}"
    cluster.psql(cluster.ADMIN, f"CREATE DATABASE {name}")
    url = cluster.db_url(name)
    if EXPLAIN_MS:
        cluster.psql(cluster.ADMIN, f"ALTER DATABASE {name} SET session_preload_libraries = 'auto_explain'")
        cluster.psql(cluster.ADMIN, f"ALTER DATABASE {name} SET auto_explain.log_min_duration = '{EXPLAIN_MS}ms'")
    nodes = []
    try:
        key_file = os.path.join(logdir, f"server-{n_nodes}.key")
        cluster.TOKEN = subprocess.run([cluster.BIN, "tokens", "bootstrap", "--database", url, "--key-file", key_file],
                                       check=True, capture_output=True, text=True).stdout.strip()
        nodes = [cluster.Node(url, i, logdir, key_file) for i in range(n_nodes)]
        cluster.http("POST", f"{nodes[0].api}/api/v1/apply", JOB_FILE, "application/yaml")
        cluster.wait_converged(nodes, 1)
        s0 = settled_stats(url, name)
        t0 = time.time()
        ports = ",".join(str(n.port) for n in nodes)
        enq = json.loads(subprocess.run(["node", os.path.join(scratch, "queue.mjs"), "dc-enqueue", cluster.TOKEN,
                                         str(JOBS), str(CHUNK), str(IN_FLIGHT), ports],
                                        check=True, capture_output=True, text=True).stdout)
        # Every run was committed before its trigger was answered, so the
        # drain is over when none is unfinished. The poll reads the index of
        # unfinished runs (a count of the succeeded ones would scan the
        # whole table every 20 ms, taking a core from the database by the
        # end), and the succeeded ones are counted once afterwards.
        t1 = wait_until(url, "SELECT count(*) FROM runs WHERE state IN ('pending', 'running')", 0)
        succeeded = int(cluster.psql(url, "SELECT count(*) FROM runs WHERE job = 'noop' AND state = 'succeeded'"))
        if succeeded != JOBS:
            raise RuntimeError(f"{succeeded} of {JOBS} runs succeeded")
        # Each node's metrics (commit latency and batch sizes among them),
        # kept beside its log for reading the run afterwards.
        for node in nodes:
            req = urllib.request.Request(f"{node.api}/metrics", headers=cluster.headers())
            with urllib.request.urlopen(req, timeout=30) as resp, \
                    open(os.path.join(logdir, f"{node.id}-{n_nodes}.metrics"), "wb") as out:
                out.write(resp.read())
        for node in nodes:
            node.stop()
        nodes = []
        s1 = settled_stats(url, name)
        p50, p99 = cluster.psql(url, """
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY (finished_at - created_at) / 1000.0),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY (finished_at - created_at) / 1000.0)
            FROM runs WHERE job = 'noop'""").split("|")
        # Updates that wrote no index entry (heap-only tuples), per table.
        hot = cluster.psql(url, """
            SELECT string_agg(relname || ' ' || n_tup_hot_upd || '/' || n_tup_upd, ', ' ORDER BY relname)
            FROM pg_stat_user_tables WHERE relname IN ('runs', 'attempt_logs', 'shared_attempts')""")
        return {
            "side": "dagcron", "nodes": n_nodes, "config": f"{CHUNK} run(s) per call, {IN_FLIGHT} calls in flight, pool {cluster.POOL}",
            "jobs": JOBS, "jobs_per_s": JOBS / (t1 - t0), "enqueue_s": enq["enqueue_s"],
            "refused": enq["refused"], "failed": enq["failed"],
            "p50_ms": float(p50), "p99_ms": float(p99),
            "tx_per_job": (s1[0] - s0[0]) / JOBS, "rows_per_job": (s1[1] - s0[1]) / JOBS,
            "hot_updates": hot,
        }
    finally:
        for node in nodes:
            try:
                node.stop()
            except Exception:
                node.proc.kill()
        cluster.psql(cluster.ADMIN, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main():
    scratch = tempfile.mkdtemp(prefix="queue-bench-")
    print(f"{JOBS:,} no-op jobs per side and run; scratch and logs in {scratch}", flush=True)
    install_graphile(scratch)
    results = []
    for n in NODES:
        for concurrency, local_queue, batch_delay in GRAPHILE:
            results.append(graphile(scratch, n, concurrency, local_queue, batch_delay))
            print(json.dumps(results[-1]), flush=True)
        results.append(dagcron(scratch, n, scratch))
        print(json.dumps(results[-1]), flush=True)
    print()
    print("| side | nodes | configuration | jobs/s | p50 enqueue to completion | p99 | transactions per job | rows written per job |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['side']} | {r['nodes']} | {r['config']} | {r['jobs_per_s']:,.0f} | {r['p50_ms']:,.1f} ms | "
              f"{r['p99_ms']:,.1f} ms | {r['tx_per_job']:.3f} | {r['rows_per_job']:.2f} |")
    peers = [r for r in results if r["side"] == "graphile-worker"]
    if not peers:
        return
    best = max(peers, key=lambda r: r["jobs_per_s"])
    print(f"\ngraphile-worker's best: {best['jobs_per_s']:,.0f} jobs/s ({best['nodes']} node(s), {best['config']})")
    for r in results:
        if r["side"] == "dagcron":
            print(f"dagcron, {r['nodes']} node(s): {r['jobs_per_s'] / best['jobs_per_s']:.2f}x its jobs/s, "
                  f"p99 {r['p99_ms'] / best['p99_ms']:.2f}x, transactions per job {r['tx_per_job'] / best['tx_per_job']:.2f}x, "
                  f"rows per job {r['rows_per_job'] / best['rows_per_job']:.2f}x "
                  f"(refused triggers sent again: {r['refused']}, failed: {r['failed']})")


if __name__ == "__main__":
    sys.exit(main())
