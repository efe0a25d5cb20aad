//! A job's spec checked section by section into a [`Job`]: every problem
//! found, in the order the sections come (its limits, calendars, anchor,
//! schedules, parameters, retry, each task, the DAG), not only the first.

use super::*;

/// Notes a problem at `path`.
fn problem(problems: &mut Vec<ValidationError>, path: String, message: String) {
    problems.push(ValidationError {
        path,
        message,
        span: None,
    });
}

/// Checks `spec` (a job of `namespace`, at `at` in its file) and builds its
/// [`Job`], or returns every problem found.
pub(super) fn validate_job(
    namespace: &str,
    mut spec: JobSpec,
    at: &str,
    compiled: &mut Compiled,
) -> Result<Job, Vec<ValidationError>> {
    let mut errors = Vec::new();
    let tz = check_limits(&spec, at, &mut errors);
    let (calendars, calendar_errors) = check_calendars(&spec, at, &mut errors);
    let anchor = check_anchor_of(&spec, at, &mut errors);
    let schedules = match &spec.schedule {
        Some(list) => {
            // With an unknown zone, the schedules are still read (in UTC)
            // for their own errors: one problem does not hide another.
            let options = schedule_options(
                namespace,
                &spec.name,
                tz.clone().unwrap_or(TimeZone::UTC),
                anchor,
                spec.dst_gap,
                spec.dst_overlap,
            );
            check_schedules(&spec, list, &options, at, compiled, &mut errors)
        }
        None => Vec::new(),
    };
    errors.extend(calendar_errors);
    errors.extend(check_params(&spec.params, &format!("{at}.params")));
    errors.extend(crate::retry::check_spec(
        &spec.retry,
        &format!("{at}.retry"),
    ));
    let tasks: Vec<Task> = spec
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(k, t)| check_task(&spec, t, &format!("{at}.tasks[{k}]"), &mut errors))
        .collect();
    let dag = match Dag::build(&spec.tasks) {
        Ok(dag) => Some(dag),
        Err(e) => {
            errors.extend(e.into_iter().map(|(p, m)| ValidationError {
                path: format!("{at}.{p}"),
                message: m,
                span: None,
            }));
            None
        }
    };
    // The canonical spelling of the anchor (see `JobSpec::anchor`).
    spec.anchor = anchor.map(|t| t.to_string());
    let mut tasks = tasks;
    if let Some(dag) = &dag
        && tasks.len() == spec.tasks.len()
    {
        check_reads(&spec, dag, &mut tasks, at, &mut errors);
    }
    match dag {
        Some(dag) if errors.is_empty() => Ok(Job {
            namespace: namespace.to_string(),
            spec,
            schedules,
            tasks,
            dag,
            calendars,
        }),
        _ => Err(errors),
    }
}

/// The job's name, time zone (returned when it is known), limits, dates,
/// deadline, `send_ahead` and `jitter`.
fn check_limits(spec: &JobSpec, at: &str, errors: &mut Vec<ValidationError>) -> Option<TimeZone> {
    if !valid_name(&spec.name) {
        problem(
            errors,
            format!("{at}.name"),
            format!("invalid job name {:?}: {NAME_RULE}", spec.name),
        );
    }
    let tz = match TimeZone::get(&spec.timezone) {
        Ok(tz) => Some(tz),
        Err(_) => {
            problem(
                errors,
                format!("{at}.timezone"),
                format!(
                    "unknown time zone {:?}: use an IANA name such as Europe/Berlin",
                    spec.timezone
                ),
            );
            None
        }
    };
    check_priority(spec.priority, &format!("{at}.priority"), errors);
    if spec.max_pending_runs == Some(0) {
        problem(
            errors,
            format!("{at}.max_pending_runs"),
            "must be at least 1".into(),
        );
    }
    if let Some(breaker) = &spec.breaker {
        errors.extend(breaker.check(&format!("{at}.breaker")));
    }
    if let Some(hook) = &spec.webhook {
        errors.extend(hook.check(&format!("{at}.webhook")));
    }
    if let Some(nats) = &spec.nats {
        errors.extend(nats.check(&format!("{at}.nats")));
    }
    if let Some(sla) = &spec.sla {
        errors.extend(sla.check(&format!("{at}.sla")));
    }
    if let Some(after) = &spec.after {
        errors.extend(after.check(&spec.name, &format!("{at}.after")));
    }
    if spec.max_active_runs == Some(0) {
        problem(
            errors,
            format!("{at}.max_active_runs"),
            "must be at least 1".into(),
        );
    }
    if spec.tasks.len() > MAX_TASKS_PER_JOB {
        problem(
            errors,
            format!("{at}.tasks"),
            format!(
                "{} tasks; a job has at most {MAX_TASKS_PER_JOB}",
                spec.tasks.len()
            ),
        );
    }
    if let (Some(s), Some(e)) = (spec.start_date, spec.end_date) {
        if e <= s {
            problem(
                errors,
                format!("{at}.end_date"),
                format!("end_date {e} is not after start_date {s}"),
            );
        }
    }
    if spec.tasks.is_empty() {
        problem(
            errors,
            format!("{at}.tasks"),
            "a job needs at least one task".into(),
        );
    }
    if let Some(d) = spec.deadline {
        if d.0.is_zero() {
            problem(
                errors,
                format!("{at}.deadline"),
                "must be longer than 0s".into(),
            );
        }
    }
    if let Some(d) = spec.send_ahead {
        if d.0.is_zero() || d.0 > MAX_SEND_AHEAD {
            problem(
                errors,
                format!("{at}.send_ahead"),
                format!("must be between 1ms and {}", Dur(MAX_SEND_AHEAD)),
            );
        }
        if spec.schedule.is_none() {
            problem(
                errors,
                format!("{at}.send_ahead"),
                "only a scheduled job has instants to send ahead of; add a `schedule`".into(),
            );
        }
    }
    if let Some(d) = spec.jitter {
        if d.0.is_zero() || d.0 > MAX_JITTER {
            problem(
                errors,
                format!("{at}.jitter"),
                format!("must be between 1ms and {}", Dur(MAX_JITTER)),
            );
        }
        if spec.schedule.is_none() {
            problem(
                errors,
                format!("{at}.jitter"),
                "only a scheduled job has fires to delay; add a `schedule`".into(),
            );
        }
        if spec.send_ahead.is_some() {
            problem(
                errors,
                format!("{at}.jitter"),
                "`send_ahead` starts tasks precisely at the instant and `jitter` moves it: use one of them".into(),
            );
        }
    }
    tz
}

/// The exclusion calendars, compiled; the problems of their own rules come
/// back apart (they are reported after the schedules').
fn check_calendars(
    spec: &JobSpec,
    at: &str,
    errors: &mut Vec<ValidationError>,
) -> (Vec<Calendar>, Vec<ValidationError>) {
    if spec.exclude.len() > MAX_CALENDAR_ENTRIES {
        problem(
            errors,
            format!("{at}.exclude"),
            format!(
                "{} calendars; a job excludes at most {MAX_CALENDAR_ENTRIES}",
                spec.exclude.len()
            ),
        );
    }
    let mut calendars = Vec::new();
    let mut calendar_errors = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    for (k, e) in spec.exclude.iter().enumerate() {
        match e {
            Exclude::Name(name) => problem(
                errors,
                format!("{at}.exclude[{k}]"),
                format!("unknown calendar {name:?}: declare it under `calendars` beside the jobs"),
            ),
            Exclude::Calendar(cal) => {
                if !names.insert(cal.name.clone()) {
                    problem(
                        errors,
                        format!("{at}.exclude[{k}]"),
                        format!("calendar {:?} is listed twice", cal.name),
                    );
                }
                match Calendar::compile(cal, &format!("{at}.exclude[{k}]")) {
                    Ok(c) => calendars.push(c),
                    Err(mut e) => calendar_errors.append(&mut e),
                }
            }
        }
    }
    (calendars, calendar_errors)
}

/// The anchor of `@every` schedules, read.
fn check_anchor_of(
    spec: &JobSpec,
    at: &str,
    errors: &mut Vec<ValidationError>,
) -> Option<Timestamp> {
    let anchor = spec
        .anchor
        .as_deref()
        .and_then(|text| match check_anchor(text) {
            Ok(t) => Some(t),
            Err(message) => {
                problem(errors, format!("{at}.anchor"), message);
                None
            }
        });
    if spec.anchor.is_some() && spec.schedule.is_none() {
        problem(
            errors,
            format!("{at}.anchor"),
            "an anchor sets where `@every` schedules count from, and the job has no schedule: add an `@every` schedule or drop `anchor`".into(),
        );
    }
    anchor
}

/// The schedules of `list`, compiled with `options`.
fn check_schedules(
    spec: &JobSpec,
    list: &Schedules,
    options: &Options,
    at: &str,
    compiled: &mut Compiled,
    errors: &mut Vec<ValidationError>,
) -> Vec<Schedule> {
    let mut schedules = Vec::new();
    if list.as_slice().is_empty() {
        problem(
            errors,
            format!("{at}.schedule"),
            "an empty list of schedules; omit `schedule` for a job that runs only when triggered"
                .into(),
        );
    }
    if list.as_slice().len() > MAX_SCHEDULES_PER_JOB {
        problem(
            errors,
            format!("{at}.schedule"),
            format!(
                "{} schedules; a job has at most {MAX_SCHEDULES_PER_JOB} (a cron expression's lists and ranges can say more in one)",
                list.as_slice().len()
            ),
        );
        return schedules;
    }
    for (k, expr) in list.as_slice().iter().enumerate() {
        let path = match list {
            Schedules::One(_) => format!("{at}.schedule"),
            Schedules::Many(_) => format!("{at}.schedule[{k}]"),
        };
        match compiled.parse(expr, &spec.timezone, options) {
            Ok(s) => schedules.push(s),
            Err(e) => {
                let mut message = format!("invalid cron expression {expr:?}: {}", e.message);
                if let Some(help) = &e.suggestion {
                    message.push_str(&format!(" ({help})"));
                }
                errors.push(ValidationError {
                    path,
                    message,
                    span: Some((e.span.start, e.span.end)),
                });
            }
        }
    }
    // Said only when every schedule could be read: a schedule in error
    // may have been meant as the `@every`.
    let every = schedules.iter().any(|s| s.ast().every_seconds().is_some());
    if spec.anchor.is_some() && !every && schedules.len() == list.as_slice().len() {
        problem(
            errors,
            format!("{at}.anchor"),
            "an anchor sets where `@every` schedules count from, and none of the job's schedules is `@every`: drop `anchor`, or use `@every <duration>`".into(),
        );
    }
    schedules
}

/// Task `t` of `spec`, at `path`: its task, or `None` when its executor is
/// in error (its problems noted).
fn check_priority(priority: Option<i32>, path: &str, errors: &mut Vec<ValidationError>) {
    use crate::priority::{DEFAULT, MAX, MIN};
    if let Some(p) = priority.filter(|p| !(MIN..=MAX).contains(p)) {
        problem(
            errors,
            path.to_string(),
            format!(
                "priority {p} is outside {MIN} to {MAX} (higher starts first; default {DEFAULT})"
            ),
        );
    }
}

fn check_task(
    spec: &JobSpec,
    t: &TaskSpec,
    path: &str,
    errors: &mut Vec<ValidationError>,
) -> Option<Task> {
    let path = path.to_string();
    // Reported after the task's other problems.
    let mut errors_wasm = Vec::new();
    if !valid_name(&t.id) {
        problem(
            errors,
            format!("{path}.id"),
            format!("invalid task id {:?}: {NAME_RULE}", t.id),
        );
    }
    let executor = check_executor(t, &path, errors, &mut errors_wasm);
    if let Some(ShellSpec::Script(s) | ShellSpec::Command(ShellCommand { command: s, .. })) =
        &t.shell
    {
        if s.trim().is_empty() {
            problem(
                errors,
                format!("{path}.shell"),
                "the command is empty".into(),
            );
        }
    }
    // A secret on a command line is visible to every user of the
    // machine (`ps`): only the environment and HTTP fields take them.
    let on_command_line = match &t.shell {
        Some(ShellSpec::Script(s)) => secret_placeholders(s).next().is_some(),
        Some(ShellSpec::Command(c)) => std::iter::once(&c.command)
            .chain(&c.args)
            .chain(&c.cwd)
            .any(|x| secret_placeholders(x).next().is_some()),
        None => false,
    };
    if on_command_line {
        problem(
            errors,
            format!("{path}.shell"),
            "a secret may not be put on a command line, where `ps` shows it: pass it in `env` (`env: { KEY: { secret: NAME } }`)".into(),
        );
    }
    if let Some(executor) = &executor {
        for name in executor.secret_refs() {
            if !valid_name(&name) {
                problem(
                    errors,
                    path.clone(),
                    format!("invalid secret name {name:?}: {NAME_RULE}"),
                );
            }
        }
    }
    if let Some(run_on) = &t.run_on {
        if t.noop {
            problem(
                errors,
                format!("{path}.run_on"),
                "a no-op task runs nowhere: drop `run_on`".into(),
            );
        }
        for (k, v) in &run_on.labels {
            if k.is_empty() || k.len() > 63 || v.len() > 255 {
                problem(
                    errors,
                    format!("{path}.run_on.labels.{k}"),
                    "a label key is 1 to 63 characters, its value at most 255".into(),
                );
            }
        }
    }
    if t.timeout.is_some_and(|d| d.0.is_zero()) {
        problem(
            errors,
            format!("{path}.timeout"),
            "must be longer than 0s".into(),
        );
    }
    errors.extend(errors_wasm);
    let merged = crate::retry::merge(&spec.retry, t.retry.as_ref());
    errors.extend(
        crate::retry::check_spec(&merged, &format!("{path}.retry"))
            .into_iter()
            .filter(|_| t.retry.is_some()),
    );
    let when = t
        .when
        .as_ref()
        .and_then(|w| match crate::condition::Condition::parse(w) {
            Ok(c) => Some(c),
            Err(message) => {
                problem(errors, format!("{path}.when"), message);
                None
            }
        });
    if !t.skip_on_exit_code.is_empty() {
        if t.shell.is_none() {
            problem(
                errors,
                format!("{path}.skip_on_exit_code"),
                "only a shell task has exit codes: drop `skip_on_exit_code`".into(),
            );
        }
        if let Some(c) = t.skip_on_exit_code.iter().find(|c| !(1..=255).contains(*c)) {
            problem(
                errors,
                format!("{path}.skip_on_exit_code"),
                format!("{c} is not an exit code that means anything but success (1 to 255)"),
            );
        }
        // The shell's own: the command could not be run, or not found.
        if let Some(c) = t.skip_on_exit_code.iter().find(|c| matches!(c, 126 | 127)) {
            problem(
                errors,
                format!("{path}.skip_on_exit_code"),
                format!(
                    "{c} is the shell's (a command that could not run or was not found), never a skip: pick another code"
                ),
            );
        }
    }
    check_priority(t.priority, &format!("{path}.priority"), errors);
    let for_each = t.for_each.as_ref().and_then(|f| {
        crate::fan_out::Source::parse(f)
            .map_err(|message| problem(errors, format!("{path}.for_each"), message))
            .ok()
    });
    match t.max_parallel {
        Some(_) if t.for_each.is_none() => problem(
            errors,
            format!("{path}.max_parallel"),
            "only a task with `for_each` has instances to bound: drop `max_parallel`".into(),
        ),
        Some(0) => problem(
            errors,
            format!("{path}.max_parallel"),
            "must be at least 1 (omit it for no bound)".into(),
        ),
        _ => {}
    }
    if t.for_each.is_none()
        && let Some((field, _)) = texts_of(t, &path)
            .into_iter()
            .find(|(_, text)| item_placeholder(text))
    {
        problem(
            errors,
            field,
            "`{{item}}` and `{{index}}` are a mapped task's: add `for_each`".into(),
        );
    }
    let priority = t
        .priority
        .or(spec.priority)
        .unwrap_or(crate::priority::DEFAULT);
    executor.map(|executor| Task {
        id: t.id.clone(),
        trigger_rule: t.trigger_rule,
        timeout: t.timeout,
        retry: RetryPolicy::from_spec(&merged),
        on_exhausted: t.on_exhausted.or(spec.on_exhausted).unwrap_or_default(),
        executor,
        run_on: t.run_on.clone(),
        when,
        skip_on_exit_code: t.skip_on_exit_code.clone(),
        priority,
        reads: Vec::new(),
        for_each,
        max_parallel: t.max_parallel,
    })
}

/// Whether `text` holds `{{item}}` or `{{index}}`.
fn item_placeholder(text: &str) -> bool {
    text.split("{{").skip(1).any(|rest| {
        rest.split_once("}}")
            .is_some_and(|(inside, _)| matches!(inside.trim(), "item" | "index"))
    })
}

/// The texts of task `t` that `{{...}}` placeholders are substituted in,
/// each with its path.
fn texts_of(t: &TaskSpec, path: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    match &t.shell {
        Some(ShellSpec::Script(s)) => out.push((format!("{path}.shell"), s.clone())),
        Some(ShellSpec::Command(c)) => {
            out.push((format!("{path}.shell.command"), c.command.clone()));
            for (k, a) in c.args.iter().enumerate() {
                out.push((format!("{path}.shell.args[{k}]"), a.clone()));
            }
            for (k, v) in &c.env {
                if let EnvValue::Plain(text) = v {
                    out.push((format!("{path}.shell.env.{k}"), text.clone()));
                }
            }
            if let Some(cwd) = &c.cwd {
                out.push((format!("{path}.shell.cwd"), cwd.clone()));
            }
        }
        None => {}
    }
    if let Some(h) = &t.http {
        out.push((format!("{path}.http.url"), h.url.clone()));
        for (k, v) in &h.headers {
            out.push((format!("{path}.http.headers.{k}"), v.clone()));
        }
        if let Some(b) = &h.body {
            out.push((format!("{path}.http.body"), b.clone()));
        }
    }
    if let Some(w) = &t.wasm {
        for (k, a) in w.args.iter().enumerate() {
            out.push((format!("{path}.wasm.args[{k}]"), a.clone()));
        }
        for (k, v) in &w.env {
            if let EnvValue::Plain(text) = v {
                out.push((format!("{path}.wasm.env.{k}"), text.clone()));
            }
        }
        if let Some(stdin) = &w.stdin {
            out.push((format!("{path}.wasm.stdin"), stdin.clone()));
        }
    }
    out
}

/// The outputs each task reads: every `{{tasks.<task>.outputs.<name>}}`
/// of its texts and every output its `when` refers to must be of a task
/// upstream of it (whose outputs exist when it starts), and an http
/// task's output must be one it declares. Sets each task's
/// [`Task::reads`].
fn check_reads(
    spec: &JobSpec,
    dag: &Dag,
    tasks: &mut [Task],
    at: &str,
    errors: &mut Vec<ValidationError>,
) {
    let index: BTreeMap<&str, usize> = spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.as_str(), i))
        .collect();
    // Tasks whose outputs would become the same variables.
    let mut prefixes: BTreeMap<String, &str> = BTreeMap::new();
    for (i, t) in spec.tasks.iter().enumerate() {
        if let Some(other) = prefixes.insert(crate::outputs::env_name(&t.id, ""), &t.id) {
            problem(
                errors,
                format!("{at}.tasks[{i}].id"),
                format!(
                    "tasks `{other}` and `{}` would hand their outputs in the same variables (DAGCRON_OUTPUT_{}_...): rename one",
                    t.id,
                    crate::outputs::env_name(&t.id, "")
                        .trim_start_matches("DAGCRON_OUTPUT_")
                        .trim_end_matches('_')
                ),
            );
        }
    }
    for (i, t) in spec.tasks.iter().enumerate() {
        let path = format!("{at}.tasks[{i}]");
        let mut refs: Vec<(String, crate::outputs::Ref)> = Vec::new();
        for (field, text) in texts_of(t, &path) {
            for found in crate::outputs::references(&text) {
                match found {
                    Ok(r) => refs.push((field.clone(), r)),
                    Err(message) => problem(errors, field.clone(), message),
                }
            }
        }
        if let Some(crate::fan_out::Source::Output(r)) = &tasks[i].for_each {
            refs.push((format!("{path}.for_each"), r.clone()));
        }
        if let Some(when) = &tasks[i].when {
            refs.extend(
                when.references()
                    .into_iter()
                    .map(|r| (format!("{path}.when"), r)),
            );
        }
        let ancestors = if refs.is_empty() {
            Vec::new()
        } else {
            dag.ancestors(i)
        };
        let mut reads: Vec<usize> = dag.upstream[i].clone();
        for (field, r) in refs {
            let Some(&j) = index.get(r.task.as_str()) else {
                let known: Vec<&str> = spec.tasks.iter().map(|t| t.id.as_str()).collect();
                let hint = crate::yaml::closest(&r.task, &known)
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                problem(
                    errors,
                    field,
                    format!("there is no task `{}` in this job{hint}", r.task),
                );
                continue;
            };
            if !ancestors[j] {
                problem(
                    errors,
                    field,
                    format!(
                        "task `{}` is not upstream of `{}`, so its outputs do not exist when `{}` starts: add it to `depends_on`",
                        r.task, t.id, t.id
                    ),
                );
                continue;
            }
            if let Some(h) = &spec.tasks[j].http
                && !h.outputs.contains_key(&r.key)
            {
                let declared: Vec<&str> = h.outputs.keys().map(String::as_str).collect();
                problem(
                    errors,
                    field,
                    format!(
                        "task `{}` declares no output `{}` (its `http.outputs`: {})",
                        r.task,
                        r.key,
                        if declared.is_empty() {
                            "none".to_string()
                        } else {
                            declared.join(", ")
                        }
                    ),
                );
                continue;
            }
            if matches!(tasks[j].executor, Executor::Noop) {
                problem(
                    errors,
                    field,
                    format!("task `{}` is a no-op: it has no outputs", r.task),
                );
                continue;
            }
            reads.push(j);
        }
        reads.sort_unstable();
        reads.dedup();
        tasks[i].reads = reads;
    }
}

/// The one executor of task `t`, at `path` (a WebAssembly module's
/// problems go to `errors_wasm`).
fn check_executor(
    t: &TaskSpec,
    path: &str,
    errors: &mut Vec<ValidationError>,
    errors_wasm: &mut Vec<ValidationError>,
) -> Option<Executor> {
    let executors = usize::from(t.shell.is_some())
        + usize::from(t.http.is_some())
        + usize::from(t.wasm.is_some())
        + usize::from(t.noop);
    match (&t.shell, &t.http) {
        _ if executors > 1 => {
            problem(
                errors,
                path.to_string(),
                "a task has exactly one executor: one of `shell`, `http`, `wasm` and `noop: true`"
                    .into(),
            );
            None
        }
        (None, None) if t.noop => Some(Executor::Noop),
        (None, None) if t.wasm.is_some() => {
            let w = t.wasm.as_ref().expect("checked");
            let problems = crate::wasm::check(w, &format!("{path}.wasm"));
            let ok = problems.is_empty();
            errors_wasm.extend(problems);
            ok.then(|| Executor::Wasm(w.clone()))
        }
        (Some(ShellSpec::Script(s)), None) => Some(Executor::Shell(ShellCommand {
            command: s.clone(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: None,
        })),
        (Some(ShellSpec::Command(c)), None) => Some(Executor::Shell(c.clone())),
        (None, Some(h)) => {
            if !(h.url.starts_with("http://") || h.url.starts_with("https://")) {
                problem(
                    errors,
                    format!("{path}.http.url"),
                    format!("{:?} is not an http:// or https:// URL", h.url),
                );
            }
            if !matches!(
                h.method.as_str(),
                "GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS"
            ) {
                problem(
                    errors,
                    format!("{path}.http.method"),
                    format!(
                        "unknown method {:?}: use GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS",
                        h.method
                    ),
                );
            }
            if let Some(s) = h.expect.iter().find(|s| !(100..=599).contains(*s)) {
                problem(
                    errors,
                    format!("{path}.http.expect"),
                    format!("{s} is not an HTTP status (100-599)"),
                );
            }
            if h.outputs.len() > crate::outputs::MAX_KEYS {
                problem(
                    errors,
                    format!("{path}.http.outputs"),
                    format!(
                        "{} outputs; at most {} are taken",
                        h.outputs.len(),
                        crate::outputs::MAX_KEYS
                    ),
                );
            }
            for (name, p) in &h.outputs {
                let at = format!("{path}.http.outputs.{}", name.escape_debug());
                if !crate::outputs::valid_key(name) {
                    problem(
                        errors,
                        at.clone(),
                        format!(
                            "invalid output name {name:?}: use 1 to {} letters, digits and `_`, not starting with a digit",
                            crate::outputs::MAX_KEY
                        ),
                    );
                }
                if let Err(message) = crate::hook::Path::parse(p) {
                    problem(errors, at, message);
                }
            }
            Some(Executor::Http(h.clone()))
        }
        (Some(_), Some(_)) => unreachable!("two executors are refused above"),
        (None, None) => {
            problem(
                errors,
                path.to_string(),
                "a task needs an executor: `shell: <command>`, `http: { url: ... }`, `wasm: { module: ... }` or `noop: true`".into(),
            );
            None
        }
    }
}
