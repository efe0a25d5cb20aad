//! A write batch in a handful of statements.
//!
//! Applied one by one, a batch costs a round trip per write; at thousands
//! of attempts per second that is the limit. Here the fires are inserted in
//! one statement, the rows of the runs the other writes change are read in
//! one, the writes are applied to those rows in order (see [`crate::rows`]),
//! and the new runs and the changed rows are written in one statement each.

use std::collections::{BTreeMap, HashSet};

use dagcron_core::RunState;
use dagcron_store::{BreakerWrite, RunId, Write, WriteResult};
use sqlx::postgres::PgConnection;

use crate::rows::{self, Effects, Row};

/// How often a batch reads again the rows other nodes changed under it
/// before it gives up (each time is a change another node committed).
const REREADS: usize = 16;

/// What other nodes are told once a batch commits.
#[derive(Default)]
pub(crate) struct Notices {
    /// Attempts were handed to the cluster.
    pub work: bool,
    /// Attempts of runs other nodes own ended.
    pub attempts: bool,
}

/// Applies a batch; `sent` counts the statements sent.
pub(crate) async fn apply(
    conn: &mut PgConnection,
    batch: &[Write],
    epoch: Option<i64>,
    sent: &mut u64,
) -> Result<(Vec<WriteResult>, Notices), sqlx::Error> {
    // Each statement below joins the batch's rows, unnested from arrays,
    // to a table by its primary key. For a batch of thousands of rows and a
    // table of some hundred thousand, the planner prefers a hash join: a
    // scan of the whole table per statement, dearer with every row the
    // table gains until it is large enough for the planner to change its
    // mind. Looking each row up by its key costs the batch's size alone.
    *sent += 1;
    let (_, _, now_us): (String, String, i64) = sqlx::query_as(
        "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
                (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
    )
    .fetch_one(&mut *conn)
    .await?;
    let mut results: Vec<Option<WriteResult>> = vec![None; batch.len()];
    let fired = insert_fires(conn, batch, epoch, now_us, &mut results, sent).await?;
    let refused = insert_run_keys(conn, batch, &mut results, sent).await?;

    // The runs this batch inserts, and the rows of the others it changes.
    let mut inserted = HashSet::new();
    for (i, w) in batch.iter().enumerate() {
        match w {
            Write::Run(run) if !refused.contains(&i) => {
                inserted.insert(run.id);
                results[i] = Some(WriteResult::Done);
            }
            Write::Fire { run: Some(run), .. } if fired.contains(&i) => {
                inserted.insert(run.id);
            }
            _ => {}
        }
    }
    let mut wanted: Vec<RunId> = batch
        .iter()
        .filter_map(rows::run_of)
        .filter(|r| !inserted.contains(r))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    *sent += u64::from(!wanted.is_empty());
    let mut read = rows::load(conn, &wanted).await?;
    let mut effects = Effects::default();
    // New runs go in with the state the batch's later writes leave them in.
    let mut new_rows: BTreeMap<RunId, Row> = BTreeMap::new();
    let mut new_runs = Vec::new();
    for (i, w) in batch.iter().enumerate() {
        match w {
            Write::Run(_) if refused.contains(&i) => {}
            Write::Run(run) => {
                new_rows.insert(run.id, Row::new(run));
                new_runs.push(run);
            }
            Write::Fire { run: Some(run), .. } if fired.contains(&i) => {
                new_rows.insert(run.id, Row::new(run));
                new_runs.push(run);
            }
            Write::Fire { .. } => {}
            // Applied below, after the others.
            Write::Notify(_) | Write::Breaker(_) | Write::SlaMissed { .. } => {
                results[i] = Some(WriteResult::Done)
            }
            _ => {
                let run = rows::run_of(w).expect("a write of a run");
                let row = new_rows.get_mut(&run).or_else(|| read.get_mut(&run));
                results[i] = Some(rows::apply(row, w, epoch, &mut effects));
            }
        }
    }
    rows::queue(conn, &effects, sent).await?;
    if !new_runs.is_empty() {
        crate::insert_runs(conn, &new_runs, &new_rows, epoch, sent).await?;
    }

    // Rows changed by another node since they were read: read again, and
    // their writes applied again.
    let mut stale = rows::save(conn, &read, sent).await?;
    for _ in 0..REREADS {
        if stale.is_empty() {
            break;
        }
        *sent += 1;
        let mut again = rows::load(conn, &stale).await?;
        effects.forget(&stale);
        let mut redone = Effects::default();
        for (i, w) in batch.iter().enumerate() {
            // A run deleted meanwhile (by retention) is read as none: its
            // writes find no run, as they would had they come after.
            if let Some(run) = rows::run_of(w).filter(|r| stale.binary_search(r).is_ok()) {
                results[i] = Some(rows::apply(again.get_mut(&run), w, epoch, &mut redone));
            }
        }
        rows::queue(conn, &redone, sent).await?;
        effects.absorb(redone);
        stale = rows::save(conn, &again, sent).await?;
        read.extend(again);
    }
    if !stale.is_empty() {
        return Err(sqlx::Error::Protocol(format!(
            "runs {stale:?} kept changing under the batch"
        )));
    }
    rows::keep_logs(conn, &effects, sent).await?;
    let mut notes: Vec<&dagcron_store::NewNotification> = batch
        .iter()
        .filter_map(|w| match w {
            Write::Notify(n) => Some(n),
            _ => None,
        })
        .collect();
    for (i, w) in batch.iter().enumerate() {
        let (result, made) = match w {
            Write::Breaker(b) => (breaker(conn, b, sent).await?, &b.notifications),
            Write::SlaMissed {
                namespace,
                job,
                scheduled_at,
                at,
                notifications,
            } => {
                *sent += 1;
                let n = sqlx::query(dagcron_store::breaker::SLA_MISSED)
                    .bind(at.as_microsecond())
                    .bind(namespace)
                    .bind(job)
                    .bind(scheduled_at.as_microsecond())
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                let result = if n == 1 {
                    WriteResult::Done
                } else {
                    WriteResult::sla_recorded(namespace, job, *scheduled_at)
                };
                (result, notifications)
            }
            _ => continue,
        };
        if result == WriteResult::Done {
            notes.extend(made);
        }
        results[i] = Some(result);
    }
    insert_notifications(conn, &notes, sent).await?;
    let notices = Notices {
        work: !effects.queued.is_empty(),
        attempts: !effects.ended_for_others.is_empty(),
    };
    let results = results
        .into_iter()
        .map(|r| r.expect("every write has a result"))
        .collect();
    Ok((results, notices))
}

/// Inserts the batch's fires; the ledger's key refuses the ones already
/// recorded. Returns the positions of the fires inserted.
///
/// A fire is never made before its instant by the database's clock, which
/// `now_us` read at the start of the batch: one that is (its node's clock
/// is ahead) is refused. A run made ahead on purpose (`send_ahead`: made
/// before its instant by its own node's clock too) is not a fire made early.
async fn insert_fires(
    conn: &mut PgConnection,
    batch: &[Write],
    epoch: Option<i64>,
    now_us: i64,
    results: &mut [Option<WriteResult>],
    sent: &mut u64,
) -> Result<HashSet<usize>, sqlx::Error> {
    let mut index = Vec::new();
    let (mut namespaces, mut jobs, mut at, mut outcomes, mut runs, mut calendars) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut seen = HashSet::new();
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
            // The same fire twice in one batch: the first one is recorded.
            if !seen.insert((namespace, job, *scheduled_at)) {
                results[i] = Some(WriteResult::fire_recorded(namespace, job, *scheduled_at));
                continue;
            }
            let ahead_on_purpose = run.as_ref().is_some_and(|r| r.created_at < *scheduled_at);
            if scheduled_at.as_microsecond() > now_us && !ahead_on_purpose {
                let now = jiff::Timestamp::from_microsecond(now_us).unwrap_or_default();
                results[i] = Some(WriteResult::fire_early(namespace, job, *scheduled_at, now));
                continue;
            }
            index.push(i);
            namespaces.push(namespace.as_str());
            jobs.push(job.as_str());
            at.push(scheduled_at.as_microsecond());
            outcomes.push(outcome.as_str());
            runs.push(run.as_ref().map(|r| r.id));
            calendars.push(calendar.as_deref());
        }
    }
    let mut fired = HashSet::new();
    if index.is_empty() {
        return Ok(fired);
    }
    *sent += 1;
    let inserted: Vec<(String, String, i64)> = sqlx::query_as(
        "INSERT INTO fires (namespace, job, scheduled_at, outcome, run_id, node_epoch, calendar)
         SELECT n, j, a, o, r, $6, c FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $7::text[]) AS v(n, j, a, o, r, c)
         ON CONFLICT DO NOTHING RETURNING namespace, job, scheduled_at",
    )
    .bind(&namespaces)
    .bind(&jobs)
    .bind(&at)
    .bind(&outcomes)
    .bind(&runs)
    .bind(epoch)
    .bind(&calendars)
    .fetch_all(&mut *conn)
    .await?;
    let inserted: HashSet<(&str, &str, i64)> = inserted
        .iter()
        .map(|(n, j, a)| (n.as_str(), j.as_str(), *a))
        .collect();
    for (k, &i) in index.iter().enumerate() {
        let (ns, job, at) = (namespaces[k], jobs[k], at[k]);
        results[i] = Some(if inserted.contains(&(ns, job, at)) {
            fired.insert(i);
            WriteResult::Done
        } else {
            let at = jiff::Timestamp::from_microsecond(at).unwrap_or_default();
            WriteResult::fire_recorded(ns, job, at)
        });
    }
    Ok(fired)
}

/// Records the keys of the batch's runs that have one (see
/// [`dagcron_store::NewRun::key`]); returns the positions of the runs
/// refused because their job has a run of their key (their results set).
async fn insert_run_keys(
    conn: &mut PgConnection,
    batch: &[Write],
    results: &mut [Option<WriteResult>],
    sent: &mut u64,
) -> Result<HashSet<usize>, sqlx::Error> {
    let mut refused = HashSet::new();
    for (i, w) in batch.iter().enumerate() {
        let Write::Run(run) = w else { continue };
        let Some(key) = &run.key else { continue };
        *sent += 1;
        let n = sqlx::query(dagcron_store::outbox::INSERT_RUN_KEY)
            .bind(&run.namespace)
            .bind(&run.job)
            .bind(key)
            .bind(run.id)
            .bind(run.created_at.as_microsecond())
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if n == 0 {
            refused.insert(i);
            results[i] = Some(WriteResult::run_key_taken(run));
        }
    }
    Ok(refused)
}

/// Applies a change of a job's failure breaker (see [`Write::Breaker`]),
/// its job's row locked first: two nodes ending runs of one job at once
/// each count the other's, the second once the first has committed.
async fn breaker(
    conn: &mut PgConnection,
    b: &BreakerWrite,
    sent: &mut u64,
) -> Result<WriteResult, sqlx::Error> {
    use dagcron_store::breaker::{CLOSE, LATEST, OPEN, STATE};
    *sent += 1;
    let state: Option<(bool, i64)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("{STATE} FOR UPDATE")))
            .bind(&b.namespace)
            .bind(&b.job)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((open, from)) = state else {
        return Ok(WriteResult::Conflict(format!(
            "no job {}/{}",
            b.namespace, b.job
        )));
    };
    match b.open {
        Some(_) if open => {
            return Ok(WriteResult::breaker_unchanged(&b.namespace, &b.job, "open"));
        }
        Some((run, after)) => {
            *sent += 2;
            let latest: Vec<String> = sqlx::query_scalar(LATEST)
                .bind(&b.namespace)
                .bind(&b.job)
                .bind(from)
                .bind(i64::from(after))
                .fetch_all(&mut *conn)
                .await?;
            let latest: Vec<RunState> = latest.iter().filter_map(|s| s.parse().ok()).collect();
            if !dagcron_core::breaker::opens(&latest, after) {
                return Ok(WriteResult::breaker_unchanged(
                    &b.namespace,
                    &b.job,
                    "closed",
                ));
            }
            sqlx::query(OPEN)
                .bind(b.at.as_microsecond())
                .bind(run)
                .bind(i64::from(after))
                .bind(&b.namespace)
                .bind(&b.job)
                .execute(&mut *conn)
                .await?;
        }
        None if !open => {
            return Ok(WriteResult::breaker_unchanged(
                &b.namespace,
                &b.job,
                "closed",
            ));
        }
        None => {
            *sent += 1;
            sqlx::query(CLOSE)
                .bind(&b.namespace)
                .bind(&b.job)
                .execute(&mut *conn)
                .await?;
        }
    }
    *sent += 3;
    crate::PgStore::job_changes(conn, &[(&b.namespace, &b.job)], &[]).await?;
    Ok(WriteResult::Done)
}

/// Puts the batch's notifications in the outbox, in one statement; a key
/// there already (the batch committed twice) is left as it is.
async fn insert_notifications(
    conn: &mut PgConnection,
    notes: &[&dagcron_store::NewNotification],
    sent: &mut u64,
) -> Result<(), sqlx::Error> {
    if notes.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&dagcron_store::NewNotification) -> &str| -> Vec<&str> {
        notes.iter().map(|n| f(n)).collect()
    };
    *sent += 1;
    sqlx::query(
        "INSERT INTO notifications (key, namespace, job, run_id, event, notifier, channel, payload, created_at, next_at)
         SELECT k, n, j, r, e, o, c, p, a, a
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[])
              AS v(k, n, j, r, e, o, c, p, a)
         ON CONFLICT (key) DO NOTHING",
    )
    .bind(text(|n| &n.key))
    .bind(text(|n| &n.namespace))
    .bind(text(|n| &n.job))
    .bind(notes.iter().map(|n| n.run).collect::<Vec<_>>())
    .bind(text(|n| &n.event))
    .bind(text(|n| &n.notifier))
    .bind(text(|n| &n.channel))
    .bind(text(|n| &n.payload))
    .bind(notes.iter().map(|n| n.at.as_microsecond()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}
