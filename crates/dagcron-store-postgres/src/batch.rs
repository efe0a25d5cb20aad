//! A write batch in a handful of statements.
//!
//! Applied one by one, a batch costs a round trip per write; at thousands
//! of attempts per second that is the limit. Here the batch is grouped by
//! kind: the inserts (fires, then runs and their tasks, then attempts) and
//! then the compare-and-set updates (runs, tasks, attempts), each kind as
//! one statement over arrays, `RETURNING` the rows it changed. Successive
//! changes of one row in the batch (`pending → ready → running`) are merged
//! into one compare-and-set from the first state to the last, so that the
//! chain succeeds or is refused as a whole. A batch whose changes of one row
//! do not chain (which the engine never produces) is applied one write at
//! a time instead, with the same results.

use std::collections::HashSet;

use dagcron_core::{RunState, TaskState};
use dagcron_store::plan::{AsStateName, Plan, plan};
use dagcron_store::{NewRun, Write, WriteResult};
use sqlx::postgres::PgConnection;

/// The writes of one kind as columns, bound as arrays.
#[derive(Default)]
struct Columns<'a> {
    /// Positions in the batch.
    index: Vec<usize>,
    text1: Vec<&'a str>,
    text2: Vec<&'a str>,
    text3: Vec<&'a str>,
    int1: Vec<i64>,
    int2: Vec<i64>,
    int3: Vec<i64>,
    opt: Vec<Option<i64>>,
    opt_text: Vec<Option<&'a str>>,
}

/// Applies a batch; `None` when it must be applied one write at a time.
/// `sent` counts the statements sent.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    batch: &[Write],
    epoch: Option<i64>,
    sent: &mut u64,
) -> Result<Option<Vec<WriteResult>>, sqlx::Error> {
    // Plan first: nothing is sent for a batch that cannot be grouped.
    let Some(planned) = plan(batch) else {
        return Ok(None);
    };
    // Each statement below joins the batch's rows, unnested from arrays,
    // to a table by its primary key. For a batch of thousands of rows and a
    // table of some hundred thousand, the planner prefers a hash join: a
    // scan of the whole table per statement, dearer with every row the
    // table gains until it is large enough for the planner to change its
    // mind. Looking each row up by its key costs the batch's size alone.
    *sent += 1;
    sqlx::query("SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)")
        .execute(&mut *conn)
        .await?;
    let Plan {
        runs: run_chains,
        tasks: task_chains,
        ends: end_chains,
        ..
    } = &planned;
    let mut results: Vec<Option<WriteResult>> = vec![None; batch.len()];

    // Fires: the ledger's key refuses the ones already recorded.
    let mut fires = Columns::default();
    for (i, w) in batch.iter().enumerate() {
        if let Write::Fire {
            namespace,
            job,
            scheduled_at,
            outcome,
            calendar,
            run,
        } = w
        {
            fires.index.push(i);
            fires.text1.push(namespace.as_str());
            fires.text2.push(job.as_str());
            fires.int1.push(scheduled_at.as_microsecond());
            fires.text3.push(outcome.as_str());
            fires.opt.push(run.as_ref().map(|r| r.id));
            fires.opt_text.push(calendar.as_deref());
        }
    }
    let mut runs: Vec<(usize, &NewRun)> = Vec::new();
    if !fires.index.is_empty() {
        *sent += 1;
        let inserted: Vec<(String, String, i64)> = sqlx::query_as(
            "INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id, node_epoch, calendar)
             SELECT n, j, a, o, r, $6, c FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $7::text[]) AS v(n, j, a, o, r, c)
             ON CONFLICT DO NOTHING RETURNING namespace, job, scheduled_at",
        )
        .bind(&fires.text1)
        .bind(&fires.text2)
        .bind(&fires.int1)
        .bind(&fires.text3)
        .bind(&fires.opt)
        .bind(epoch)
        .bind(&fires.opt_text)
        .fetch_all(&mut *conn)
        .await?;
        let inserted: HashSet<(&str, &str, i64)> = inserted
            .iter()
            .map(|(n, j, a)| (n.as_str(), j.as_str(), *a))
            .collect();
        for (k, &i) in fires.index.iter().enumerate() {
            let (ns, job, at) = (fires.text1[k], fires.text2[k], fires.int1[k]);
            if inserted.contains(&(ns, job, at)) {
                results[i] = Some(WriteResult::Done);
                if let Write::Fire { run: Some(run), .. } = &batch[i] {
                    runs.push((i, run));
                }
            } else {
                let at = jiff::Timestamp::from_microsecond(at).unwrap_or_default();
                results[i] = Some(WriteResult::fire_recorded(ns, job, at));
            }
        }
    }
    for (i, w) in batch.iter().enumerate() {
        if let Write::Run(run) = w {
            runs.push((i, run));
            results[i] = Some(WriteResult::Done);
        }
    }
    // The changes of a new run's tasks that follow its insert are applied
    // by the insert: each task is inserted in the state they leave it in.
    let mut folded = vec![false; task_chains.len()];
    if !runs.is_empty() {
        let states: Vec<Vec<(TaskState, Option<usize>)>> = runs
            .iter()
            .map(|(i, run)| planned.inserted_task_states(run, *i, &mut folded))
            .collect();
        for k in states.iter().flatten().filter_map(|(_, k)| *k) {
            for &j in &task_chains[k].1.writes {
                results[j] = Some(WriteResult::Done);
            }
        }
        let runs: Vec<&NewRun> = runs.iter().map(|(_, r)| *r).collect();
        insert_runs(conn, &runs, &states, epoch, sent).await?;
    }

    // Attempts started.
    let mut starts = Columns::default();
    let mut run_on: Vec<Option<String>> = Vec::new();
    for (i, w) in batch.iter().enumerate() {
        if let Write::AttemptStart {
            run,
            task,
            number,
            state,
            at,
            run_on: labels,
        } = w
        {
            run_on.push(labels.as_ref().map(crate::labels_json));
            starts.index.push(i);
            starts.int1.push(*run);
            starts.text1.push(task.as_str());
            starts.int2.push(i64::from(*number));
            starts.text2.push(state.as_str());
            starts.int3.push(at.as_microsecond());
            // An attempt handed to the cluster has no node until one claims it.
            starts
                .opt
                .push(epoch.filter(|_| *state != dagcron_core::AttemptState::Dispatching));
        }
    }
    if !starts.index.is_empty() {
        *sent += 1;
        let inserted: Vec<(i64, String, i32)> = sqlx::query_as(
            "INSERT INTO attempts (run_id, task_id, number, state, started_at, node_epoch, run_on)
             SELECT r, t, n, s, a, e, o::jsonb FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[], $7::text[]) AS v(r, t, n, s, a, e, o)
             ON CONFLICT DO NOTHING RETURNING run_id, task_id, number",
        )
        .bind(&starts.int1)
        .bind(&starts.text1)
        .bind(&starts.int2)
        .bind(&starts.text2)
        .bind(&starts.int3)
        .bind(&starts.opt)
        .bind(&run_on)
        .fetch_all(&mut *conn)
        .await?;
        let inserted: HashSet<(i64, &str, i64)> = inserted
            .iter()
            .map(|(r, t, n)| (*r, t.as_str(), i64::from(*n)))
            .collect();
        if starts.opt.iter().any(Option::is_none) {
            // Nodes with free capacity come and claim them.
            *sent += 1;
            crate::notify(conn, "work").await?;
        }
        for (k, &i) in starts.index.iter().enumerate() {
            let (run, task, number) = (starts.int1[k], starts.text1[k], starts.int2[k]);
            results[i] = Some(if inserted.contains(&(run, task, number)) {
                WriteResult::Done
            } else {
                WriteResult::attempt_exists(run, task, number)
            });
        }
    }

    // Runs.
    if !run_chains.is_empty() {
        *sent += 1;
        let changed: Vec<i64> = sqlx::query_scalar(
            "UPDATE runs r SET state = v.t, started_at = COALESCE(v.s, r.started_at), finished_at = COALESCE(v.f, r.finished_at)
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS v(id, fr, t, s, f)
             WHERE r.id = v.id AND r.state = v.fr RETURNING r.id",
        )
        .bind(run_chains.iter().map(|(k, _)| *k).collect::<Vec<_>>())
        .bind(run_chains.iter().map(|(_, c)| c.from.name()).collect::<Vec<_>>())
        .bind(run_chains.iter().map(|(_, c)| c.to.name()).collect::<Vec<_>>())
        .bind(run_chains.iter().map(|(_, c)| c.started).collect::<Vec<_>>())
        .bind(run_chains.iter().map(|(_, c)| c.finished).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
        let changed: HashSet<i64> = changed.into_iter().collect();
        for (run, chain) in run_chains {
            let result = if changed.contains(run) {
                WriteResult::Done
            } else {
                *sent += 1;
                let found: Option<String> =
                    sqlx::query_scalar("SELECT state FROM runs WHERE id = $1")
                        .bind(run)
                        .fetch_optional(&mut *conn)
                        .await?;
                WriteResult::run_conflict(*run, found.as_deref(), chain.from)
            };
            for i in &chain.writes {
                results[*i] = Some(result.clone());
            }
        }
    }

    // Tasks.
    let task_chains: Vec<_> = task_chains
        .iter()
        .zip(&folded)
        .filter(|(_, folded)| !**folded)
        .map(|(chain, _)| chain)
        .collect();
    if !task_chains.is_empty() {
        *sent += 1;
        let changed: Vec<(i64, String)> = sqlx::query_as(
            "UPDATE tasks t SET state = v.s
             FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS v(r, k, fr, s)
             WHERE t.run_id = v.r AND t.task_id = v.k AND t.state = v.fr RETURNING t.run_id, t.task_id",
        )
        .bind(task_chains.iter().map(|((r, _), _)| *r).collect::<Vec<_>>())
        .bind(task_chains.iter().map(|((_, t), _)| *t).collect::<Vec<_>>())
        .bind(task_chains.iter().map(|(_, c)| c.from.name()).collect::<Vec<_>>())
        .bind(task_chains.iter().map(|(_, c)| c.to.name()).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
        let changed: HashSet<(i64, &str)> = changed.iter().map(|(r, t)| (*r, t.as_str())).collect();
        for ((run, task), chain) in task_chains {
            let result = if changed.contains(&(*run, *task)) {
                WriteResult::Done
            } else {
                *sent += 1;
                let found: Option<String> = sqlx::query_scalar(
                    "SELECT state FROM tasks WHERE run_id = $1 AND task_id = $2",
                )
                .bind(run)
                .bind(task)
                .fetch_optional(&mut *conn)
                .await?;
                WriteResult::task_conflict(*run, task, found.as_deref(), chain.from)
            };
            for i in &chain.writes {
                results[*i] = Some(result.clone());
            }
        }
    }

    // Attempts ended.
    if !end_chains.is_empty() {
        let mut at = Vec::new();
        let mut exit = Vec::new();
        let mut error = Vec::new();
        let mut log: Vec<&[u8]> = Vec::new();
        let mut start_error = Vec::new();
        let mut elsewhere = HashSet::new();
        for (key, chain) in end_chains {
            if let Some(Write::AttemptEnd {
                at: a,
                exit_code,
                error: e,
                log: l,
                start_error_us,
                for_other_node,
                ..
            }) = chain.end
            {
                if *for_other_node {
                    elsewhere.insert((key.0, key.1, key.2 as i32));
                }
                at.push(a.as_microsecond());
                exit.push(*exit_code);
                error.push(e.as_deref());
                log.push(l.as_slice());
                start_error.push(*start_error_us);
            }
        }
        *sent += 1;
        let changed: Vec<(i64, String, i32)> = sqlx::query_as(
            "UPDATE attempts a SET state = v.s, finished_at = v.at, exit_code = v.x, error = v.e, log = v.l, start_error_us = v.se,
                node_epoch = COALESCE(a.node_epoch, 0)
             FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::text[], $6::bigint[], $7::int[], $8::text[], $9::bytea[], $10::bigint[])
                AS v(r, k, n, fr, s, at, x, e, l, se)
             WHERE a.run_id = v.r AND a.task_id = v.k AND a.number = v.n AND a.state = v.fr
             RETURNING a.run_id, a.task_id, a.number",
        )
        .bind(end_chains.iter().map(|((r, _, _), _)| *r).collect::<Vec<_>>())
        .bind(end_chains.iter().map(|((_, t, _), _)| *t).collect::<Vec<_>>())
        .bind(end_chains.iter().map(|((_, _, n), _)| *n as i32).collect::<Vec<_>>())
        .bind(end_chains.iter().map(|(_, c)| c.from.name()).collect::<Vec<_>>())
        .bind(end_chains.iter().map(|(_, c)| c.to.name()).collect::<Vec<_>>())
        .bind(at)
        .bind(exit)
        .bind(error)
        .bind(log)
        .bind(start_error)
        .fetch_all(&mut *conn)
        .await?;
        let changed: HashSet<(i64, &str, i32)> = changed
            .iter()
            .map(|(r, t, n)| (*r, t.as_str(), *n))
            .collect();
        if elsewhere.iter().any(|k| changed.contains(k)) {
            // Attempts run for other nodes ended: their owners take it from here.
            *sent += 1;
            crate::notify(conn, "attempts").await?;
        }
        for ((run, task, number), chain) in end_chains {
            results[chain.writes[0]] = Some(if changed.contains(&(*run, *task, *number as i32)) {
                WriteResult::Done
            } else {
                WriteResult::attempt_conflict(*run, task, number, chain.from.name())
            });
        }
    }

    // Runs asked to stop and attempts withdrawn: rare (a cancel, a
    // replace, a deadline), one statement each, after the changes above.
    for (i, w) in batch.iter().enumerate() {
        let result = match w {
            Write::RunClosing { run, to } => crate::mark_closing(conn, *run, *to).await?,
            Write::AttemptWithdraw {
                run,
                task,
                number,
                at,
            } => crate::withdraw(conn, *run, task, *number, *at).await?,
            _ => continue,
        };
        *sent += 1;
        results[i] = Some(result);
    }

    Ok(Some(
        results
            .into_iter()
            .map(|r| r.expect("every write has a result"))
            .collect(),
    ))
}

/// Inserts runs and their tasks (in `states`, by run and position), two
/// statements whatever their number.
async fn insert_runs(
    conn: &mut PgConnection,
    runs: &[&NewRun],
    states: &[Vec<(TaskState, Option<usize>)>],
    epoch: Option<i64>,
    sent: &mut u64,
) -> Result<(), sqlx::Error> {
    let params: Vec<String> = runs
        .iter()
        .map(|r| serde_json::to_string(&r.params).expect("params serialize"))
        .collect();
    *sent += 1;
    sqlx::query(
        "INSERT INTO runs (id, namespace, job, job_version, trigger, scheduled_at, state, params, created_at, started_at, finished_at, owner_epoch, trace, rerun_of)
         SELECT id, n, j, v, t, s, st, p, c, sa, fa, $12, tr, ro
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $13::text[], $14::bigint[])
            AS x(id, n, j, v, t, s, st, p, c, sa, fa, tr, ro)",
    )
    .bind(runs.iter().map(|r| r.id).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.namespace.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.job.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.job_version).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.trigger.as_str()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.scheduled_at.as_microsecond()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.state.as_str()).collect::<Vec<_>>())
    .bind(&params)
    .bind(runs.iter().map(|r| r.created_at.as_microsecond()).collect::<Vec<_>>())
    .bind(
        runs.iter()
            .map(|r| (r.state == RunState::Running).then_some(r.created_at.as_microsecond()))
            .collect::<Vec<_>>(),
    )
    .bind(
        runs.iter()
            .map(|r| r.state.is_terminal().then_some(r.created_at.as_microsecond()))
            .collect::<Vec<_>>(),
    )
    .bind(epoch)
    .bind(runs.iter().map(|r| r.trace.as_deref()).collect::<Vec<_>>())
    .bind(runs.iter().map(|r| r.rerun_of).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    let mut run_ids = Vec::new();
    let mut task_ids = Vec::new();
    let mut positions = Vec::new();
    let mut task_states = Vec::new();
    let mut carried = Vec::new();
    for (r, states) in runs.iter().zip(states) {
        for (p, (t, (state, _))) in r.tasks.iter().zip(states).enumerate() {
            run_ids.push(r.id);
            task_ids.push(t.as_str());
            positions.push(p as i32);
            task_states.push(state.as_str());
            carried.push(r.carried.contains_key(t));
        }
    }
    if !run_ids.is_empty() {
        *sent += 1;
        sqlx::query(
            "INSERT INTO tasks (run_id, task_id, position, state, carried)
             SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::bool[])",
        )
        .bind(run_ids)
        .bind(task_ids)
        .bind(positions)
        .bind(task_states)
        .bind(carried)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
