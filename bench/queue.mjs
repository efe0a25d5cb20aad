// The load of the queue benchmark (bench/queue.py), in Node so that the
// HTTP client of dagcron's side is not the bottleneck, and beside
// graphile-worker (installed by bench/queue.py into a scratch directory,
// where this file is copied to find it).
//
//   node queue.mjs gw-worker URL CONCURRENCY LOCAL_QUEUE BATCH_DELAY_MS OUT
//       a graphile-worker instance with a no-op task; on SIGTERM it stops
//       and writes the enqueue-to-completion latencies (ms) to OUT
//   node queue.mjs gw-enqueue URL COUNT CHUNK
//       COUNT jobs through addJobs, CHUNK per call (one transaction each)
//   node queue.mjs dc-enqueue TOKEN COUNT CHUNK IN_FLIGHT PORT[,PORT...]
//       COUNT manual runs of dagcron's job b/noop over kept-alive
//       connections, CHUNK per call (1: POST .../trigger, more: POST
//       .../trigger-batch), IN_FLIGHT calls at once, spread over the nodes;
//       a refused call (429: the backlog is full) is sent again after its
//       delay
//
// Every loop is bounded by its count and by DEADLINE_MS.

import { writeFileSync } from "node:fs";
import http from "node:http";
import { createRequire } from "node:module";

const DEADLINE_MS = 600_000;
const require = createRequire(import.meta.url);
const [mode, ...args] = process.argv.slice(2);

async function gwWorker([url, concurrency, localQueue, batchDelay, out]) {
  const { run } = require("graphile-worker");
  const latencies = [];
  const runner = await run({
    connectionString: url,
    concurrency: Number(concurrency),
    maxPoolSize: Number(concurrency) + 2,
    noHandleSignals: true,
    pollInterval: 1000,
    preset: {
      worker: {
        localQueue: { size: Number(localQueue) },
        completeJobBatchDelay: Number(batchDelay),
        failJobBatchDelay: Number(batchDelay),
      },
    },
    taskList: {
      noop: async (_payload, helpers) => {
        latencies.push(Date.now() - helpers.job.created_at.getTime());
      },
    },
  });
  process.on("SIGTERM", async () => {
    await runner.stop();
    writeFileSync(out, JSON.stringify(latencies));
    process.exit(0);
  });
  console.log("ready");
  setTimeout(() => process.exit(2), DEADLINE_MS).unref();
}

async function gwEnqueue([url, count, chunk]) {
  const { makeWorkerUtils } = require("graphile-worker");
  const utils = await makeWorkerUtils({ connectionString: url });
  const t0 = Date.now();
  for (let done = 0; done < Number(count) && Date.now() - t0 < DEADLINE_MS; ) {
    const n = Math.min(Number(chunk), Number(count) - done);
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: "noop", payload: {} })));
    done += n;
  }
  await utils.release();
  console.log(JSON.stringify({ enqueue_s: (Date.now() - t0) / 1000 }));
}

async function dcEnqueue([token, count, chunk, inFlight, ports]) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Number(inFlight) });
  const targets = ports.split(",").map(Number);
  const t0 = Date.now();
  let sent = 0;
  let refused = 0;
  let failed = 0;
  const trigger = (port, n) =>
    new Promise((resolve) => {
      const body = n === 1 ? "{}" : JSON.stringify({ runs: Array.from({ length: n }, () => ({})) });
      const req = http.request(
        {
          host: "127.0.0.1",
          port,
          method: "POST",
          path: `/api/v1/namespaces/b/jobs/noop/${n === 1 ? "trigger" : "trigger-batch"}`,
          agent,
          headers: {
            authorization: `Bearer ${token}`,
            "content-type": "application/json",
            "content-length": Buffer.byteLength(body),
          },
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode));
        },
      );
      req.on("error", () => resolve(0));
      req.end(body);
    });
  const client = async (i) => {
    while (sent < Number(count) && Date.now() - t0 < DEADLINE_MS) {
      const n = Math.min(Number(chunk), Number(count) - sent);
      sent += n;
      const status = await trigger(targets[(i + sent) % targets.length], n);
      if (status === 201) continue;
      sent -= n;
      if (status === 429) refused += 1;
      else failed += 1;
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  await Promise.all(Array.from({ length: Number(inFlight) }, (_, i) => client(i)));
  agent.destroy();
  console.log(JSON.stringify({ enqueue_s: (Date.now() - t0) / 1000, refused, failed }));
}

const modes = { "gw-worker": gwWorker, "gw-enqueue": gwEnqueue, "dc-enqueue": dcEnqueue };
await modes[mode](args);
