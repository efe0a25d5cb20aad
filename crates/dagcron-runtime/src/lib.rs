//! dagcron's runtime: the engine that turns schedules into durable runs and
//! runs their tasks, the clock it depends on, and the coordinator that makes
//! it one node of a cluster.
//!
//! # How it works
//!
//! ## The engine's loop
//!
//! One engine task owns the scheduling state. Each loop iteration it takes what
//! happened (timers due, attempts finished, commands from the API, answers of
//! the store read beside the loop), asks the pure core what to do, appends
//! every state change to a batch, **commits the batch in one transaction, and
//! only then** starts attempts, kills the attempts of runs it stopped and
//! answers callers (`Action`: spawn, kill, reply). Commits are pipelined:
//! while one batch is being committed the loop keeps deciding into the next one
//! (so timers stay on time). A store may take more than one batch at once
//! (`RunStore::write_lanes`: two on PostgreSQL, one on SQLite); the engine sends
//! a batch beside those in flight only if it shares none of their runs and
//! none of their jobs' fire ledgers, and carries out the batches' effects in
//! the order it made them (`engine/commits.rs`). A commit the store refuses
//! for lack of space (`StorageError::Full`: SQLite's disk full, PostgreSQL's
//! `53100`) is not an end: the server degrades (`WriteHealth`, the
//! `writes` check of `/readyz`, `dagcron_store_degraded`, a log line every
//! 5 s), nothing starts since attempts start after their commit, the loop
//! goes on deciding into memory, and the batch is tried again until there
//! is room, when the server goes on by itself. Attempts' output that would
//! leave the data's disk less free than its reserve (`--disk-reserve-mb`,
//! `OutputReserve`) is dropped with a note in its place. Runs of missed fires
//! caught up take their job's place when made and begin at a pace
//! (`CatchUpPace`: token buckets per server and per job, `runs.rs::paced`).
//!
//! The decisions are the core's: a run steps through `dagcron_core::run`
//! (`RunMachine::step(job, event, now, random)` returns a list of `Effect`s:
//! state changes, attempts to start or kill, shared attempts to withdraw,
//! timers to arm, the run finished), every change checked against the
//! transition tables of `state.rs`; which fires were missed and how the next
//! fire is armed come from `dagcron_core::fires`. The engine turns effects into
//! `Write`s and timers; it decides nothing about a run itself.
//!
//! ## A cluster
//!
//! With `serve --database postgres://...` every node runs the same engine
//! against one PostgreSQL database, plus a *coordinator* (`runtime/cluster.rs`)
//! beside it. A node registers and gets a fencing *epoch*, renews a *lease*
//! (judged by the database's clock) every fifth of its TTL, and measures its
//! clock against the database's; heartbeats run on their own schedule, apart
//! from the rest of the upkeep and the shared work, so that a database far
//! away slows the upkeep without costing the lease. A registration is one
//! statement (the function `dagcron_register`, under an advisory lock only
//! registrations take), so a node with a slow link never holds a lock
//! another node's heartbeat waits for; a node whose round trip to the
//! database is longer than its heartbeat interval does not join yet (it
//! tries again with a growing pause). Sessions end after 10 s idle in a
//! transaction (`idle_in_transaction_session_timeout`), so a node cut off
//! mid-transaction releases its locks. A node registers not eligible and
//! owns no job until its first heartbeat has checked its clock; its engine
//! waits, for each fire, until the instant has come by the database's clock
//! too (the skew the heartbeats measured), and the store refuses a fire made
//! before its instant by the database's clock (`WriteResult::Early`,
//! counted in `dagcron_early_fires_refused_total`; a run made ahead on
//! purpose, `send_ahead`, is not early), and the engine makes such a fire
//! again a little later (`Timer::Refire`). A dead node's slot is taken
//! again only a lease's length after its lease ended, so that a heartbeat in
//! flight never leaves two live nodes on one slot. Live nodes form a consistent-hash ring
//! (`core/ring.rs`, virtual nodes); a node arms the fires of the jobs it owns
//! only, and resumes a job it gains from the job's last fire in the ledger.
//! Runs belong to the node that created them (`runs.owner_epoch`); a job's
//! owner counts the job's runs running on other nodes (made before the job
//! moved, or through another node) against its overlap policy, read at
//! every heartbeat (`Coordination::running_elsewhere`, `Command::Elsewhere`)
//! and before the fires of a job it gains are armed. When a
//! node's lease ends, any node marks it dead and the owners of its jobs adopt
//! its unfinished runs (running attempts become `lost` and follow the delivery
//! policy). Three fences keep a fire and an attempt single:
//!
//! 1. every write batch checks, in its transaction and holding its node's
//!    `nodes` row `FOR KEY SHARE` until commit, that the writer's epoch is
//!    current and its lease unexpired; marking a node dead locks that row
//!    `FOR UPDATE` (and a new registration changes its epoch, a key), so it
//!    waits for the dead node's in-flight batches, and nothing the dead node
//!    commits can land after its runs were adopted. The node's own heartbeat
//!    (a plain update) does not wait for its batches;
//! 2. the engine stops before its lease ends by its own clock (it trusts three
//!    quarters of the TTL after each successful heartbeat), kills its attempts
//!    and the process exits with code 75 (a supervisor restarts it, and it
//!    registers anew);
//! 3. the fire ledger's primary key (job, scheduled instant). A fire the
//!    ledger refuses (another node recorded it first) drops the run the
//!    engine made for it from memory, so that it never holds a place of its
//!    job.
//!
//! Attempts are shared across nodes when a node is busy: a node whose pool
//! is full of attempts it runs (slots held for its own claims in flight do
//! not count: a task ready meanwhile waits for them; `attempts::placement`),
//! while another live node exists (the coordinator keeps a flag in
//! the node's identity; a node alone keeps them in its own queue), hands
//! ready attempts to the cluster (a bounded number) as
//! `dispatching` attempts with no node, each also a row of the queue
//! `shared_attempts`; any node with room claims the oldest with
//! `FOR UPDATE SKIP LOCKED` (the owner itself too, when its pool frees up),
//! runs them and records their outcome in the run's row, fenced by its own
//! epoch (the engine marks such an end `for_other_node`, and the store then
//! wakes the owner). The queue's waiting rows are those with no node
//! (`shared_attempts_waiting`); an attempt closed before any node took it
//! gets node 0 there, which no node has, so it leaves the queue. The run's
//! owner takes the outcome in (`NOTIFY attempts`, or at the next heartbeat) and
//! moves the DAG on; it declares an attempt lost once the node running it is
//! marked dead, and withdraws the shared attempts of a run it stops, claimed
//! or not, with one `Write::AttemptWithdraw` (the node running one sees that
//! and kills it). A node's lease is the lease of every
//! attempt it runs.
//!
//! Job changes made through any node bump a revision and `NOTIFY` the others;
//! each changed job row is stamped with that revision and a deleted job leaves
//! a tombstone, so a node reads only the jobs changed since the revision it
//! has seen (the one read just before its engine loaded the jobs at start).
//! Changes commit in revision order (the revision row stays locked until
//! commit), so reading the revision first and then the rows above the last
//! one seen misses nothing. Membership changes, and cancellations and interventions on tasks asked
//! through another node (`cancel_requested`, `intervention_requests`, taken in by the run's owner), are
//! announced the same way, with polling at the heartbeat interval as the
//! fallback. On SIGTERM a node turns `draining` (out of the ring at once: its
//! jobs move without waiting for its lease), finishes its attempts, then
//! `left`. Run ids carry the node's slot in their low 5 bits, so two nodes never
//! create the same id (32 live nodes at most).
//!
//! ## The parts
//!
//! `clock.rs` (`Clock`, `SystemClock`, `ManualClock`) and `engine/`, split by
//! concern: `mod.rs` (the types, the configuration, the handle and the
//! commands), `run_loop.rs` (start-up, the loop and its pipelined commits, the
//! drain), `commits.rs` (the batches in flight, side by side where the store
//! allows it, their effects in order), `timers.rs`, `jobs.rs` (the job
//! table, a node's share, sync),
//! `runs.rs` (fires, and stepping runs: the core's effects turned into
//! writes, timers and attempts), `attempts.rs`
//! (dispatch, launch, outcomes), `recovery.rs`, `handle.rs` (what the loop
//! takes: a `Command` is a `Request`, from the API, the coordinator or a
//! test, or a `Completion`, the answer of work done beside the loop),
//! `requests.rs` and `completions.rs` (one handler each, neither of which
//! awaits: the store is read and written beside the loop), `commands.rs`
//! (the decisions they share: triggers, plans, re-runs, reads beside the
//! loop), `shared.rs`
//! (attempts shared across a cluster), `spans.rs` (the spans of runs and
//! attempts as they end) and `lease.rs` (the lease and its
//! watchdog). `prune.rs` is the pruner, a task of its own beside the engine
//! on every node: it walks the history a job at a time, asks the core's
//! retention which rows go, and deletes them in small transactions with a
//! pause between them (also run on demand by the API, or dry). Together: one timer
//! queue over every schedule, retry, deadline and planned run (`timers.rs`:
//! a B-tree of instants, each with its timers in arming order, so the many
//! fires that share an instant are taken together; lazy deletion by job
//! generation; the system clock waits the last 2 ms before an instant on a
//! `timerfd` on Linux instead of tokio's millisecond timer, and spins the
//! last 200 µs, as a woken thread runs tens of microseconds late; an instant
//! of 16 timers or more is warmed up 2 ms ahead, the loop reading its jobs'
//! entries back into the processor's caches and deciding nothing; the next
//! fires of an instant's jobs are armed once all its fires are handled), runs and their DAGs in memory, the ready tasks (a FIFO per namespace,
//! taken in turn by the namespaces' weights: `shares.rs`) handed to a
//! bounded pool of attempt tasks (tasks for remote agents go straight to the
//! agent pool, whose queue and the agents' capacity bound them; a `noop`
//! task's attempt, recorded like any, takes no slot: `Lane` says what an
//! attempt counts against), recovery at start-up (missed fires by the
//! misfire policy, running attempts recorded `lost` and retried or failed by the
//! delivery policy, runs that were being stopped finished as the state stored
//! with them) and a bounded drain on shutdown that ends by killing what still
//! runs and recording it `lost`. A fire found overdue by more than the misfire
//! grace (at least 2 s) while running, after a suspended process or a clock
//! step, goes through the same misfire policy as after downtime. Store work a
//! command or a timer needs runs beside the loop and comes back as a command
//! (`Engine::beside`): the job of a fire read ahead of it, the job of a
//! trigger (a trigger asks for 1 to 1,000 runs of one job: admitted together
//! by the job's overlap policy, `max_pending_runs` and the ready backlog, or
//! refused together, written in the same batch, and answered from the runs
//! as the engine decided them, not read back from the store), the run and version a re-run needs, the store's answers to
//! apply, delete and pause, listing the fires
//! of a backfill, a cluster node's shared work (claims, news, withdrawals,
//! with the pool's room held meanwhile) and a cancel of another node's run (or an
//! intervention on one of its tasks, checked against the stored run), so
//! that no request and no slow read delays a fire; so are the coordinator's
//! commands (the last fires of jobs a node gains, the jobs of runs it adopts)
//! and the job of missed fires to catch up. An apply's specs are serialized
//! and its jobs' timings built on a blocking thread while the store writes
//! them; it is answered once committed, and its jobs installed a slice of
//! 1,000 at a time between timers, no other command taken until all are in.
//! A call (a trigger, a backfill, a re-run) that names a job this node
//! does not know yet, applied through another node before the sync
//! announced it, has the job read beside the loop and is taken again once
//! it is installed (`Engine::unknown_job`, `Command::Learned`). (Still
//! awaited in the loop: the start-up recovery.) The values of the
//! secrets a task refers to are read (through the `Secrets` trait) when its
//! attempt starts, beside the loop too. In a
//! cluster, a lease watchdog beside the loop kills every attempt once the
//! node's lease ends, whatever the loop waits on. A run carries the job at
//! its own version: one rebuilt at start, adopted from a dead node or claimed
//! from the cluster reads that version when the job has changed since
//! (`job_at`, `read_version`), and a re-run runs the version of the run it
//! re-runs, its kept tasks starting in their carried outcome
//! (`RunMachine::carrying`). At start, the jobs whose version was applied
//! under other rules than the server's are named in one warning, and
//! versions stored without rules are stamped. `EngineHandle` is how the
//! API asks for changes (and, for `/metrics`, reads the gauges of the moment:
//! runs by state, held tasks, queues, pool). `metrics.rs` holds the engine's counters and
//! histograms (`EngineMetrics`, prometheus-client), counted as the engine
//! decides, with per-job series bounded by a number of places; `trace.rs`
//! derives the ids of a run's trace from the run (or its caller's
//! `traceparent`), decides sampling and hands finished spans to a `SpanSink`;
//! neither does I/O. `cluster.rs` is the coordinator of a cluster node (see
//! above); it talks to the engine through the same handle (ownership, job
//! sync, adopted runs, cancellations, interventions, shared work).
//!
//! At start-up the jobs are loaded in three stages at once: pages read from
//! the store, parsed into timings on a blocking thread (only the fields a
//! `Timing` is made from, which SQLite keeps apart from the spec; the whole
//! job is validated again when it is read for a run), installed into the job
//! table (hashed with foldhash) and armed there and then unless they missed
//! fires (the last fires are read first); the jobs that missed fires are
//! caught up once the unfinished runs are rebuilt.
//!
//! Memory per job is its `Timing` (compiled timetables without syntax trees,
//! shared by the jobs of the same schedules, dates, misfire policy) and a
//! small entry; the whole
//! `Job` (tasks, DAG, policies) stays in the store. A `Prepare` timer reads
//! it half a second before a fire (on the half second, so reads never compete
//! with fires, which fall on whole seconds); a job whose fires are less than
//! 5 s apart, or whose runs are going on, keeps it in memory. A million hourly
//! jobs take about 600 MiB this way. A job with `send_ahead` fires that much
//! early; its run's attempts carry the instant to start at.
//!
//! **Architecture Invariant:** nothing is acted on before it is committed; an
//! attempt is started only after its `running` row exists, and killed (a
//! cancel, a deadline, a replace) only after the stop is recorded. (The
//! safety nets are the exception: the lease watchdog, a fenced engine and
//! the end of the shutdown grace kill everything at once.)

pub mod clock;
pub mod cluster;
pub mod engine;
pub mod live;
pub mod metrics;
pub mod outbox;
pub mod prune;
pub mod trace;

pub use clock::{Clock, ManualClock, SkewedClock, SystemClock};
pub use cluster::{ClusterConfig, ClusterHandle, Coordinator, LocalStatus};
pub use engine::{
    CatchUpPace, Engine, EngineConfig, EngineError, EngineEvent, EngineHandle, Intervened, Lease,
    MAX_TRIGGER_RUNS, NodeIdentity, Observer, OutputReserve, Ownership, Policies, PolicyLookup,
    PolicySource, Remote, RemoteTask, RemoteWorkers, Report, Resolved, SecretSource, Secrets,
    TriggerBy, WriteHealth,
};
pub use metrics::{EngineGauges, EngineMetrics};
pub use outbox::{Outbox, OutboxConfig, OutboxMetrics};
pub use prune::{PruneConfig, PruneMetrics, PruneReport, Pruner};
