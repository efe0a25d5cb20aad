//! `/` for a signed-in viewer: the overview. Per namespace it may read:
//! what runs now, what failed in the last 24 hours, tasks held for an
//! operator, fires that made no run on time, jobs that do not fire on
//! their own (paused, breaker open), and a calendar of the next days'
//! fires and planned runs. Every read is bounded; a section that reached
//! its bound says so and links to the full list.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use dagcron_core::authz::Need;
use dagcron_core::{Job, RunState, TaskState};
use dagcron_store::prelude::*;
use dagcron_store::{RunFilter, RunRecord};
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use crate::{Chrome, Ui, Viewer, error_page, format, render, viewer};

/// Items read per section.
const SECTION: u32 = 10;
/// Namespaces shown at once (others are picked from the list).
const SHOWN: usize = 10;
/// Days in the calendar, from today.
const DAYS: usize = 7;
/// Jobs whose fires the calendar counts (by name; it says when there are more).
const CALENDAR_JOBS: u32 = 200;
/// Fires counted per job over the calendar's days; a job that fires more
/// is shown as firing all day.
const FIRES_PER_JOB: usize = 500;
/// Steps of the schedules (fires, suppressed ones too) the calendar takes
/// at most for one namespace; the jobs after are not counted.
const CALENDAR_STEPS: usize = 20_000;

#[derive(Deserialize, Default)]
pub(crate) struct OverviewQuery {
    #[serde(default)]
    ns: String,
}

pub(crate) struct RunLine {
    id: i64,
    job: String,
    state: &'static str,
    when: String,
    /// The held tasks of a run, for the held section.
    held: Vec<String>,
}

pub(crate) struct FireLine {
    job: String,
    at: String,
    outcome: &'static str,
}

pub(crate) struct JobLine {
    name: String,
    why: String,
}

pub(crate) struct Day {
    label: String,
    fires: usize,
    /// Jobs firing that day with their count, the busiest first (at most 6).
    jobs: Vec<(String, usize)>,
    more_jobs: usize,
    planned: Vec<RunLine>,
}

pub(crate) struct Section {
    ns: String,
    running: Vec<RunLine>,
    failed: Vec<RunLine>,
    held: Vec<RunLine>,
    fires: Vec<FireLine>,
    jobs: Vec<JobLine>,
    /// Jobs that fire so often they are not counted in the calendar.
    all_day: Vec<String>,
    days: Vec<Day>,
    /// Whether more jobs exist than the calendar counted.
    calendar_partial: bool,
    full: u32,
}

impl Section {
    /// A section's count as shown: `10+` when its read reached its bound.
    fn count(&self, n: usize) -> String {
        if n as u32 >= self.full {
            format!("{n}+")
        } else {
            n.to_string()
        }
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Chrome,
    namespaces: Vec<String>,
    picked: String,
    sections: Vec<Section>,
    hidden: usize,
    live: bool,
}

fn run_line(r: &RunRecord, zone: &TimeZone, now: Timestamp) -> RunLine {
    let when = match (r.started_at, r.finished_at) {
        (Some(s), None) => format!(
            "started {}, {} so far",
            format::time(s, zone),
            format::duration(now.duration_since(s))
        ),
        (_, Some(f)) => format!("ended {}", format::time(f, zone)),
        (None, None) => format!("for {}", format::time(r.scheduled_at, zone)),
    };
    RunLine {
        id: r.id,
        job: r.job.clone(),
        state: r.state.as_str(),
        when,
        held: r
            .tasks
            .iter()
            .filter(|t| t.state == TaskState::Held)
            .map(|t| t.id.clone())
            .collect(),
    }
}

/// The calendar of the next [`DAYS`] days in the viewer's zone: each
/// day's expected fires per job (fires a calendar suppresses left out),
/// the planned runs, the jobs that fire too often to count, and whether
/// [`CALENDAR_STEPS`] ran out before every job was counted.
fn calendar(
    jobs: &[Job],
    planned: &[RunRecord],
    now: Timestamp,
    zone: &TimeZone,
) -> (Vec<Day>, Vec<String>, bool) {
    let today: Date = now.to_zoned_datetime(zone.clone()).date();
    let starts: Vec<Timestamp> = (0..=DAYS as i64)
        .map(|i| {
            today
                .checked_add(jiff::Span::new().days(i))
                .ok()
                .and_then(|d| d.to_zoned_datetime(zone.clone()).ok())
                .map_or(now, |z| z.timestamp())
        })
        .collect();
    let end = starts[DAYS];
    let day_of = |t: Timestamp| starts.windows(2).position(|w| t >= w[0] && t < w[1]);
    let mut per_day: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); DAYS];
    let mut all_day = Vec::new();
    let mut steps = 0;
    for job in jobs {
        if steps >= CALENDAR_STEPS {
            break;
        }
        let mut counted = Vec::new();
        for schedule in &job.schedules {
            for fire in schedule.fires_after(now) {
                steps += 1;
                if fire.at >= end || counted.len() > FIRES_PER_JOB || steps >= CALENDAR_STEPS {
                    break;
                }
                if job.excluded_by(fire.at).is_none() {
                    counted.push(fire.at);
                }
            }
        }
        if counted.len() > FIRES_PER_JOB {
            all_day.push(job.spec.name.clone());
            continue;
        }
        for t in counted {
            if let Some(d) = day_of(t) {
                *per_day[d].entry(job.spec.name.clone()).or_default() += 1;
            }
        }
    }
    let days = per_day
        .into_iter()
        .enumerate()
        .map(|(d, counts)| {
            let mut jobs: Vec<(String, usize)> = counts.into_iter().collect();
            jobs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let fires = jobs.iter().map(|j| j.1).sum();
            let more_jobs = jobs.len().saturating_sub(6);
            jobs.truncate(6);
            let label = starts[d]
                .to_zoned_datetime(zone.clone())
                .strftime("%a %d %b")
                .to_string();
            let planned = planned
                .iter()
                .filter(|r| day_of(r.scheduled_at) == Some(d))
                .map(|r| RunLine {
                    id: r.id,
                    job: r.job.clone(),
                    state: r.state.as_str(),
                    when: format::time(r.scheduled_at, zone),
                    held: vec![],
                })
                .collect();
            Day {
                label,
                fires,
                jobs,
                more_jobs,
                planned,
            }
        })
        .collect();
    (days, all_day, steps >= CALENDAR_STEPS)
}

/// One namespace's section.
async fn section<S: Store>(
    ui: &Ui<S>,
    v: &Viewer,
    ns: String,
    now: Timestamp,
) -> dagcron_store::Result<Section> {
    let store = &ui.st.store;
    let day_ago = now - SignedDuration::from_hours(24);
    let running = store.unfinished_runs(&ns, false, SECTION).await?;
    // The runs that failed in the last day, among the namespace's newest
    // (the runs browser's window).
    let failed = store
        .browse_runs(
            &RunFilter {
                namespace: Some(ns.clone()),
                states: vec![RunState::Failed],
                ended_since: Some(day_ago),
                ..RunFilter::default()
            },
            SECTION,
            None,
        )
        .await?;
    let planned = store.unfinished_runs(&ns, true, 50).await?;
    let held = store.held_runs(&ns, SECTION).await?;
    let fires = store.problem_fires(&ns, day_ago, SECTION).await?;
    let attention = store.attention_jobs(&ns, SECTION).await?;
    let jobs = store.list_jobs(&ns, CALENDAR_JOBS, None).await?;
    let parsed: Vec<Job> = jobs
        .items
        .iter()
        .filter(|j| !j.paused && j.breaker.is_none())
        .filter_map(|j| Job::from_canonical(&j.namespace, &j.spec).ok())
        .collect();
    let zone = &v.zone;
    let (days, all_day, budget_spent) = calendar(&parsed, &planned, now, zone);
    Ok(Section {
        running: running.iter().map(|r| run_line(r, zone, now)).collect(),
        failed: failed
            .items
            .iter()
            .map(|r| run_line(r, zone, now))
            .collect(),
        held: held.iter().map(|r| run_line(r, zone, now)).collect(),
        fires: fires
            .into_iter()
            .map(|(job, f)| FireLine {
                job,
                at: format::time(f.scheduled_at, zone),
                outcome: f.outcome.as_str(),
            })
            .collect(),
        jobs: attention
            .into_iter()
            .map(|j| JobLine {
                why: match &j.breaker {
                    Some(b) => b.reason(),
                    None => "paused".into(),
                },
                name: j.name,
            })
            .collect(),
        all_day,
        days,
        calendar_partial: jobs.next_cursor.is_some() || budget_spent,
        full: SECTION,
        ns,
    })
}

/// `GET /`, signed in.
pub(crate) async fn page<S: Store>(ui: Ui<S>, v: Viewer, q: OverviewQuery) -> Response {
    let namespaces = match &v.who.grant.namespace {
        Some(ns) => vec![ns.clone()],
        None => match super::jobs::namespaces(&*ui.st.store).await {
            Ok(n) => n,
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        },
    };
    let picked: Vec<String> = if q.ns.is_empty() {
        namespaces.iter().take(SHOWN).cloned().collect()
    } else {
        vec![q.ns.clone()]
    };
    let now = Timestamp::now();
    let mut sections = Vec::new();
    for ns in picked {
        match v.who.lists(Need::Read, &ns) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return error_page(e.status, &e.message),
        }
        match section(&ui, &v, ns, now).await {
            Ok(s) => sections.push(s),
            Err(e) => return error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        }
    }
    let live = sections.iter().any(|s| !s.running.is_empty());
    render(&OverviewPage {
        chrome: v.chrome("Overview", "overview"),
        hidden: if q.ns.is_empty() {
            namespaces.len().saturating_sub(SHOWN)
        } else {
            0
        },
        namespaces,
        picked: q.ns,
        sections,
        live,
    })
}

/// `GET /`: the overview, or the sign-in form.
pub(crate) async fn index<S: Store>(
    State(ui): State<Ui<S>>,
    headers: HeaderMap,
    Query(q): Query<OverviewQuery>,
) -> Response {
    match viewer(&ui, &headers).await {
        Ok(v) => page(ui, v, q).await,
        Err(_) => super::signin::form(StatusCode::OK, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dagcron_core::JobFile;

    fn job(name: &str, schedule: &str) -> Job {
        let yaml = format!(
            "namespace: ns\njobs:\n  - name: {name}\n    schedule: \"{schedule}\"\n    timezone: Europe/Berlin\n    tasks: [{{ id: a, noop: true }}]\n"
        );
        let file: JobFile = serde_saphyr::from_str(&yaml).unwrap();
        file.validate().unwrap().remove(0)
    }

    #[test]
    fn the_calendar_counts_each_days_fires_in_the_viewers_zone() {
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        // Friday 2026-12-04 12:00 in Berlin.
        let now: Timestamp = "2026-12-04T11:00:00Z".parse().unwrap();
        let jobs = [
            job("nightly", "0 0 2 * * *"),
            job("weekdays", "0 30 9 * * MON-FRI"),
            job("busy", "* * * * * *"),
        ];
        let (days, all_day, spent) = calendar(&jobs, &[], now, &berlin);
        assert!(!spent);
        assert_eq!(days.len(), DAYS);
        assert_eq!(all_day, ["busy"]);
        assert_eq!(days[0].label, "Fri 04 Dec");
        // Today's 02:00 and 09:30 have passed.
        assert_eq!(days[0].fires, 0);
        // Saturday: the nightly one only; Monday both.
        assert_eq!(days[1].jobs, [("nightly".to_string(), 1)]);
        assert_eq!(days[3].label, "Mon 07 Dec");
        assert_eq!(days[3].fires, 2);
    }
}
