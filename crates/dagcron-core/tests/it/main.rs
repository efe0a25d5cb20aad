//! Job files end to end through the core: YAML in, validated jobs or precise errors out.

use dagcron_core::{JobFile, TriggerRule};

fn load(yaml: &str) -> JobFile {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(yaml: &str) -> Vec<String> {
    load(yaml)
        .validate()
        .unwrap_err()
        .0
        .iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn the_examples_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // Prometheus files live beside the job files.
        let monitoring = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("prometheus-"));
        if path.extension().is_some_and(|e| e == "yaml") && !monitoring {
            let file = load(&std::fs::read_to_string(&path).unwrap());
            let jobs = file
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!jobs.is_empty());
            n += 1;
        }
    }
    assert!(n >= 2);
}

#[test]
fn the_spec_example_has_the_declared_shape() {
    let file = load(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/nightly-etl.yaml"
        ))
        .unwrap(),
    );
    let job = &file.validate().unwrap()[0];
    assert_eq!(job.key(), "billing/nightly-reconcile");
    assert_eq!(job.tasks.len(), 4);
    assert_eq!(job.tasks[2].retry.max_attempts, 6, "task override");
    assert_eq!(job.tasks[1].retry.max_attempts, 4, "job default");
    assert_eq!(job.tasks[3].trigger_rule, TriggerRule::OneFailed);
    assert_eq!(job.dag.waves().len(), 4);
    let t: jiff::Timestamp = "2026-11-29T00:00:00Z".parse().unwrap();
    assert_eq!(
        job.next_fire_after(t).unwrap().to_string(),
        "2026-11-29T18:30:00Z"
    );
}

#[test]
fn applying_twice_is_idempotent_by_canonical_form() {
    let yaml = "namespace: a\njobs:\n  - name: j\n    schedule: '@daily'\n    tasks: [{ id: t, shell: 'true' }]\n";
    let a = load(yaml).validate().unwrap();
    let b = load(yaml).validate().unwrap();
    assert_eq!(a[0].canonical(), b[0].canonical());
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let yaml = r#"
namespace: Billing
jobs:
  - name: j
    schedule: ["0 0 30 2 *", "*/5 * * * *"]
    timezone: Europe/Berln
    retry: { max_attempts: 0, factor: 0.5 }
    tasks:
      - id: a
        depends_on: [c]
        shell: "true"
      - id: b
        http: { url: "ftp://x", method: FETCH, expect: [700] }
      - id: c
        depends_on: [a]
        shell: "true"
      - id: d
  - name: j
    tasks: []
"#;
    expect_test::expect![[r#"
        [
            "namespace: invalid namespace \"Billing\": use 1-63 lowercase letters, digits, '-', '_' or '.', starting with a letter or digit",
            "jobs[1].name: job \"j\" is declared twice (also jobs[0])",
            "jobs[0].timezone: unknown time zone \"Europe/Berln\": use an IANA name such as Europe/Berlin",
            "jobs[0].schedule[0]: invalid cron expression \"0 0 30 2 *\": this expression can never fire: day 30 never occurs in February (check the day-of-month against the lengths of the chosen months (February has 28 or 29 days; April, June, September and November 30))",
            "jobs[0].retry.max_attempts: 0 is out of range: attempts in total, 1 (no retry) to 1000",
            "jobs[0].retry.factor: 0.5 is out of range: a growth factor from 1.0 to 100.0",
            "jobs[0].tasks[1].http.url: \"ftp://x\" is not an http:// or https:// URL",
            "jobs[0].tasks[1].http.method: unknown method \"FETCH\": use GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS",
            "jobs[0].tasks[1].http.expect: 700 is not an HTTP status (100-599)",
            "jobs[0].tasks[3]: a task needs an executor: `shell: <command>`, `http: { url: ... }`, `wasm: { module: ... }` or `noop: true`",
            "jobs[0].tasks[0].depends_on: dependency cycle: a -> c -> a",
            "jobs[1].tasks: a job needs at least one task",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
}

#[test]
fn wasm_tasks_are_checked_with_their_paths() {
    let yaml = r#"
namespace: lab
jobs:
  - name: w
    tasks:
      - id: relative
        wasm: { module: tasks/report.wasm }
      - id: not-wasm
        wasm: { module: /srv/report.so, sha256: abc123 }
      - id: limits
        wasm: { module: /srv/r.wasm, memory: 1KiB, fuel: 0 }
      - id: huge
        wasm: { module: /srv/r.wat, memory: 8GiB }
      - id: grants
        wasm:
          module: /srv/r.wasm
          args: ["{{secrets.token}}"]
          grants:
            dirs: [{ host: srv/in, guest: in }, { host: /a, guest: /in }]
            env: ["A=B"]
            http: ["https://api.example.com/v1"]
      - id: both
        shell: "true"
        wasm: { module: /srv/r.wasm }
      - id: fine
        wasm:
          module: /srv/tasks/report.wasm
          sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
          memory: 64MiB
          fuel: 10000000
          env: { TOKEN: { secret: api-token } }
          grants: { dirs: [{ host: /srv/in, guest: /in, write: false }], env: [HOME], http: [api.example.com] }
"#;
    expect_test::expect![[r#"
        [
            "jobs[0].tasks[0].wasm.module: \"tasks/report.wasm\" is not an absolute path: name the module's file from the root, such as /srv/tasks/report.wasm",
            "jobs[0].tasks[1].wasm.module: \"/srv/report.so\" is neither a `.wasm` binary nor a `.wat` text module",
            "jobs[0].tasks[1].wasm.sha256: \"abc123\" is not a SHA-256 digest: write its 64 hex digits (`sha256sum FILE` prints them)",
            "jobs[0].tasks[2].wasm.memory: 1KiB is out of range: a module's memory is 64KiB (one page) to 4GiB",
            "jobs[0].tasks[2].wasm.fuel: a budget of 0 runs nothing: give at least 1, or leave `fuel` out for no budget",
            "jobs[0].tasks[3].wasm.memory: 8GiB is out of range: a module's memory is 64KiB (one page) to 4GiB",
            "jobs[0].tasks[4].wasm.args: a secret may not be put in the arguments, which are recorded with the task: pass it in `env` (`env: { KEY: { secret: NAME } }`) or `stdin`",
            "jobs[0].tasks[4].wasm.grants.dirs[0].host: \"srv/in\" is not an absolute path",
            "jobs[0].tasks[4].wasm.grants.dirs[0].guest: \"in\" is not an absolute path: the module sees the directory there, such as /in",
            "jobs[0].tasks[4].wasm.grants.env[0]: \"A=B\" is not an environment variable's name",
            "jobs[0].tasks[4].wasm.grants.http[0]: \"https://api.example.com/v1\" is not a host: write its name, or name:port, without scheme or path (api.example.com, api.example.com:8443)",
            "jobs[0].tasks[5]: a task has exactly one executor: one of `shell`, `http`, `wasm` and `noop: true`",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
    let bad_size = serde_saphyr::from_str::<dagcron_core::JobFile>(
        "namespace: lab\njobs: [{ name: w, tasks: [{ id: t, wasm: { module: /m.wasm, memory: lots } }] }]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(bad_size.contains("invalid size \"lots\""), "{bad_size}");
}

#[test]
fn a_wasm_task_keeps_its_secrets_by_reference() {
    let yaml = r#"
namespace: lab
jobs:
  - name: w
    tasks:
      - id: t
        wasm:
          module: /srv/t.wasm
          env: { TOKEN: { secret: api-token }, URL: "https://x/{{secrets.other}}" }
          stdin: "{{secrets.input}}"
"#;
    let job = &load(yaml).validate().unwrap()[0];
    assert_eq!(job.tasks[0].executor.kind(), "wasm");
    assert_eq!(
        job.tasks[0]
            .executor
            .secret_refs()
            .into_iter()
            .collect::<Vec<_>>(),
        ["api-token", "input", "other"]
    );
}

#[test]
fn cron_errors_carry_their_span() {
    let yaml = "namespace: a\njobs:\n  - name: j\n    schedule: '0 0 30 2 *'\n    tasks: [{ id: t, shell: 'true' }]\n";
    let errs = load(yaml).validate().unwrap_err();
    assert_eq!(errs.0[0].path, "jobs[0].schedule");
    assert_eq!(errs.0[0].span, Some((4, 8)));
    assert!(
        errs.0[0]
            .message
            .contains("day 30 never occurs in February"),
        "{}",
        errs.0[0].message
    );
}

fn ts(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

fn anchored(schedule: &str, anchor: &str) -> String {
    format!(
        "namespace: a\njobs:\n  - name: j\n    schedule: {schedule}\n    anchor: '{anchor}'\n    tasks: [{{ id: t, shell: 'true' }}]\n"
    )
}

#[test]
fn every_counts_from_the_anchor_of_its_job() {
    let job = &load(&anchored("'@every 90m'", "2026-01-01T00:10:00Z"))
        .validate()
        .unwrap()[0];
    let fires = |job: &dagcron_core::Job| -> Vec<String> {
        job.timing()
            .fires_in(ts("2026-01-01T00:00:00Z"), ts("2026-01-01T06:00:00Z"), 100)
            .unwrap()
            .iter()
            .map(|t| t.to_string())
            .collect()
    };
    // The compiled timing the scheduler keeps counts from the anchor.
    assert_eq!(
        fires(job),
        [
            "2026-01-01T00:10:00Z",
            "2026-01-01T01:40:00Z",
            "2026-01-01T03:10:00Z",
            "2026-01-01T04:40:00Z"
        ]
    );
    // Without one, from the Unix epoch (on which 00:00 falls).
    let epoch = &load("namespace: a\njobs:\n  - name: j\n    schedule: '@every 90m'\n    tasks: [{ id: t, shell: 'true' }]\n").validate().unwrap()[0];
    assert_eq!(
        fires(epoch),
        [
            "2026-01-01T00:00:00Z",
            "2026-01-01T01:30:00Z",
            "2026-01-01T03:00:00Z",
            "2026-01-01T04:30:00Z"
        ]
    );
    assert!(
        !epoch.canonical().contains("anchor"),
        "{}",
        epoch.canonical()
    );
    // The anchor is a phase, not a start: fires before it exist too.
    assert_eq!(
        job.timing().next_fire_after(ts("2025-12-31T22:00:00Z")),
        Some(ts("2025-12-31T22:40:00Z"))
    );
    assert_eq!(
        job.schedules[0].explain(),
        "every 1 hour and 30 minutes, counted from 2026-01-01T00:10:00Z"
    );
    // The stored (canonical) form keeps it, and reads back the same fires;
    // another spelling of the same instant is the same job.
    assert!(
        job.canonical()
            .contains(r#""anchor":"2026-01-01T00:10:00Z""#)
    );
    let again = dagcron_core::Job::from_canonical("a", &job.canonical()).unwrap();
    assert_eq!(again.canonical(), job.canonical());
    assert_eq!(fires(&again), fires(job));
    let other = &load("namespace: a\njobs:\n  - name: j\n    schedule: '@every 90m'\n    anchor: 2026-01-01T08:10:00+08:00\n    tasks: [{ id: t, shell: 'true' }]\n")
        .validate()
        .unwrap()[0];
    assert_eq!(other.canonical(), job.canonical());
    // Only the `@every` schedules of a list count from it.
    let both = &load(&anchored(
        "['@every 90m', '0 0 5 * * *']",
        "2026-01-01T00:10:00Z",
    ))
    .validate()
    .unwrap()[0];
    assert_eq!(
        fires(both)[3..],
        ["2026-01-01T04:40:00Z", "2026-01-01T05:00:00Z"]
    );
}

#[test]
fn anchors_are_checked_with_their_path() {
    let cases = [
        anchored("'@every 90m'", "tomorrow"),
        anchored("'@every 90m'", "2026-01-01T00:00:00"),
        anchored("'@every 90m'", "2026-01-01T00:00:00.250Z"),
        anchored("'0 * * * *'", "2026-01-01T00:00:00Z"),
        anchored("['0 * * * *', '@daily']", "2026-01-01T00:00:00Z"),
        "namespace: a\njobs:\n  - name: j\n    anchor: '2026-01-01T00:00:00Z'\n    tasks: [{ id: t, shell: 'true' }]\n".to_string(),
        // A schedule in error may have been meant as the `@every`: only it is reported.
        anchored("['0 * * * *', '@every 0s']", "2026-01-01T00:00:00Z"),
    ];
    let errors: Vec<String> = cases.iter().flat_map(|y| errors(y)).collect();
    expect_test::expect![[r#"
        [
            "jobs[0].anchor: invalid anchor \"tomorrow\": use an RFC 3339 instant with its offset, such as \"2026-01-01T00:00:00Z\" (failed to parse four digit integer as year: invalid digit, expected 0-9 but got t)",
            "jobs[0].anchor: invalid anchor \"2026-01-01T00:00:00\": use an RFC 3339 instant with its offset, such as \"2026-01-01T00:00:00Z\" (failed to find offset component, which is required for parsing a timestamp)",
            "jobs[0].anchor: the anchor \"2026-01-01T00:00:00.250Z\" has a fraction of a second; `@every` fires on whole seconds, so use a whole second such as \"2026-01-01T00:00:00Z\"",
            "jobs[0].anchor: an anchor sets where `@every` schedules count from, and none of the job's schedules is `@every`: drop `anchor`, or use `@every <duration>`",
            "jobs[0].anchor: an anchor sets where `@every` schedules count from, and none of the job's schedules is `@every`: drop `anchor`, or use `@every <duration>`",
            "jobs[0].anchor: an anchor sets where `@every` schedules count from, and the job has no schedule: add an `@every` schedule or drop `anchor`",
            "jobs[0].schedule[1]: invalid cron expression \"@every 0s\": the period must be at least one second (for example `@every 1s`)",
        ]
    "#]].assert_debug_eq(&errors);
}

#[test]
fn unknown_fields_are_rejected() {
    let err = serde_saphyr::from_str::<JobFile>(
        "namespace: a\njobs:\n  - name: j\n    shedule: '@daily'\n    tasks: []\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("shedule"), "{err}");
}

mod props {
    //! Random job files: validation never panics, and a valid job survives
    //! the round trip through its canonical form unchanged.

    use dagcron_core::{Job, JobFile};
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![4 => "[a-z][a-z0-9-]{0,8}", 1 => ".{0,12}"]
    }

    fn task(ids: Vec<String>) -> impl Strategy<Value = String> {
        let max = ids.len().min(2);
        let deps = prop::sample::subsequence(ids, 0..=max);
        (name(), deps, prop_oneof![Just("all_success"), Just("all_done"), Just("one_failed"), Just("always"), Just("none_failed_min_one_success"), Just("all_skipped"), Just("one_done"), Just("bogus")], 0..4u8, prop_oneof![Just("5s"), Just("0s"), Just("x"), Just("1h30m")])
            .prop_map(|(id, deps, rule, exec, timeout)| {
                let exec = match exec {
                    0 => "shell: \"echo hi\"".to_string(),
                    1 => "http: { url: \"http://127.0.0.1:9/x\", expect: [200] }".to_string(),
                    2 => "noop: true".to_string(),
                    _ => "shell: \"\"".to_string(),
                };
                format!("      - {{ id: \"{id}\", depends_on: {deps:?}, trigger_rule: {rule}, timeout: \"{timeout}\", {exec} }}\n")
            })
    }

    fn job_file() -> impl Strategy<Value = String> {
        let ids = prop::collection::vec("[a-z]{1,3}", 1..6);
        let anchor = prop_oneof![
            Just(""),
            Just("    anchor: '2026-01-01T00:10:00Z'\n"),
            Just("    anchor: '2026-01-01T08:10:00+08:00'\n"),
            Just("    anchor: '2026-01-01T00:10:00.5Z'\n"),
            Just("    anchor: nonsense\n")
        ];
        (name(), prop_oneof![Just("* * * * *"), Just("0 0 30 2 *"), Just("@daily"), Just("H H * * *"), Just("@every 90m"), Just("nonsense")], prop_oneof![Just("UTC"), Just("Europe/Berlin"), Just("Mars/Base")], 0..5u32, ids, anchor)
            .prop_flat_map(|(job, sched, tz, attempts, ids, anchor)| {
                let n = ids.len();
                prop::collection::vec(task(ids), 1..=n).prop_map(move |tasks| {
                    format!(
                        "namespace: ns\njobs:\n  - name: \"{job}\"\n    schedule: \"{sched}\"\n{anchor}    timezone: {tz}\n    retry: {{ max_attempts: {attempts} }}\n    tasks:\n{}",
                        tasks.concat()
                    )
                })
            })
    }

    proptest! {
        #[test]
        fn validation_never_panics_and_canonical_forms_round_trip(yaml in job_file()) {
            let Ok(file) = serde_saphyr::from_str::<JobFile>(&yaml) else { return Ok(()) };
            match file.validate() {
                Ok(jobs) => {
                    for job in jobs {
                        let again = Job::from_canonical(&job.namespace, &job.canonical()).expect("a valid job's canonical form is valid");
                        prop_assert_eq!(again.canonical(), job.canonical());
                        prop_assert_eq!(again.dag, job.dag);
                        prop_assert_eq!(&again.schedules, &job.schedules);
                    }
                }
                Err(errors) => prop_assert!(errors.0.iter().all(|e| !e.path.is_empty() && !e.message.is_empty())),
            }
        }
    }
}

/// A job could have 100,000 schedules, and one backfill over it held the
/// engine for 52 s; lists of tasks and parameters were unbounded too.
#[test]
fn regression_schedules_tasks_and_parameters_per_job_are_bounded() {
    let schedules = (0..100_000)
        .map(|i| format!("'{} {} * * * *'", i % 60, (i / 60) % 60))
        .collect::<Vec<_>>()
        .join(", ");
    let problems = errors(&format!(
        "jobs:\n  - {{ name: many, schedule: [{schedules}], tasks: [{{ id: a, noop: true }}] }}\n"
    ));
    assert_eq!(
        problems,
        [
            "jobs[0].schedule: 100000 schedules; a job has at most 64 (a cron expression's lists and ranges can say more in one)"
        ]
    );
    let tasks = (0..1001)
        .map(|i| format!("{{ id: t{i}, noop: true }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let problems = errors(&format!("jobs:\n  - {{ name: wide, tasks: [{tasks}] }}\n"));
    assert_eq!(
        problems,
        ["jobs[0].tasks: 1001 tasks; a job has at most 1000"]
    );
    let problems = errors(
        "jobs:\n  - { name: p, params: { '': x, '1a': x, 'a-b': x, ok: \"a\\0b\" }, tasks: [{ id: a, noop: true }] }\n",
    );
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(
        problems.iter().all(|p| p.starts_with("jobs[0].params.")),
        "{problems:?}"
    );
}

const CALENDARS: &str = r#"
namespace: billing
calendars:
  - name: holidays
    timezone: Europe/Berlin
    dates: ["12-25", "12-26", "01-01"]
    ranges: [{ from: "2026-12-24T00:00:00Z", to: "2027-01-02T00:00:00Z" }]
  - name: maintenance
    timezone: UTC
    weekly: [{ days: [SUN], from: "02:00", to: "04:00" }]
    cron: ["* 3 1 * *"]
jobs:
  - name: nightly-reconcile
    schedule: "0 30 2 * * *"
    exclude: [holidays, maintenance]
    jitter: 30s
    tasks: [{ id: a, noop: true }]
  - name: other
    schedule: "@hourly"
    tasks: [{ id: a, noop: true }]
"#;

#[test]
fn calendars_are_resolved_into_the_jobs_that_exclude_them() {
    let jobs = load(CALENDARS).validate().unwrap();
    let job = &jobs[0];
    assert_eq!(job.calendars.len(), 2);
    assert_eq!(
        job.excluded_by(ts("2026-12-25T02:30:00Z")),
        Some("holidays")
    );
    assert_eq!(
        job.excluded_by(ts("2026-12-06T02:30:00Z")),
        Some("maintenance")
    );
    assert_eq!(job.excluded_by(ts("2026-12-07T02:30:00Z")), None);
    assert_eq!(jobs[1].excluded_by(ts("2026-12-25T02:30:00Z")), None);
    // The preview's next fire skips the holidays.
    assert_eq!(
        job.next_unsuppressed_after(ts("2026-12-23T12:00:00Z")),
        Some(ts("2027-01-02T02:30:00Z"))
    );
    // The stored form carries the calendars, and rebuilds the same job.
    let canonical = job.canonical();
    assert!(
        canonical.contains(r#""exclude":[{"name":"holidays","timezone":"Europe/Berlin""#),
        "{canonical}"
    );
    let back = dagcron_core::Job::from_canonical("billing", &canonical).unwrap();
    assert_eq!(back.canonical(), canonical);
    assert_eq!(
        back.excluded_by(ts("2026-12-25T02:30:00Z")),
        Some("holidays")
    );
    assert_eq!(back.timing().jitter, jiff::SignedDuration::from_secs(30));
    // A job without calendars or jitter keeps its stored form (and version).
    let plain: serde_json::Value = serde_json::from_str(&jobs[1].canonical()).unwrap();
    assert!(plain.get("exclude").is_none() && plain.get("jitter").is_none());
    // Changing a calendar changes the jobs that use it, and only those.
    let changed = load(&CALENDARS.replace("\"01-01\"", "\"01-01\", \"05-01\""))
        .validate()
        .unwrap();
    assert_ne!(changed[0].canonical(), canonical);
    assert_eq!(changed[1].canonical(), jobs[1].canonical());
}

#[test]
fn calendars_and_jitter_are_checked_with_their_paths() {
    let yaml = r#"
namespace: billing
calendars:
  - name: holidays
    dates: ["13-01"]
  - name: holidays
    weekly: [{ days: [SUN], from: "02:00", to: "4am" }]
  - name: empty
jobs:
  - name: a
    schedule: "@hourly"
    exclude: [holidays, maintenance]
    jitter: 0s
    tasks: [{ id: a, noop: true }]
  - name: b
    jitter: 2d
    send_ahead: 1s
    tasks: [{ id: a, noop: true }]
"#;
    expect_test::expect![[r#"
        [
            "calendars[0].dates[0]: \"13-01\" is not a day of any year",
            "calendars[1].weekly[0].to: invalid time \"4am\": use HH:MM or HH:MM:SS, such as \"02:00\" (or 24:00)",
            "calendars[1].name: calendar \"holidays\" is declared twice",
            "calendars[2]: an empty calendar excludes nothing: give it `dates`, `ranges`, `weekly` or `cron`",
            "jobs[0].exclude[1]: unknown calendar \"maintenance\": the file declares \"empty\", \"holidays\"",
            "jobs[0].jitter: must be between 1ms and 1d",
            "jobs[1].send_ahead: only a scheduled job has instants to send ahead of; add a `schedule`",
            "jobs[1].jitter: must be between 1ms and 1d",
            "jobs[1].jitter: only a scheduled job has fires to delay; add a `schedule`",
            "jobs[1].jitter: `send_ahead` starts tasks precisely at the instant and `jitter` moves it: use one of them",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
}

#[test]
fn fan_outs_are_checked_with_their_paths() {
    let yaml = r#"
jobs:
  - name: j
    tasks:
      - { id: list, shell: "echo x" }
      - { id: a, depends_on: [list], for_each: "{{tasks.list.outputs.parts}}", max_parallel: 0, shell: "echo {{item}}" }
      - { id: b, for_each: "{{tasks.list.outputs.parts}}", shell: "echo {{ index }}" }
      - { id: c, for_each: "parts", shell: "echo" }
      - { id: d, max_parallel: 2, shell: "echo {{item}}" }
      - { id: e, depends_on: [list], for_each: "{{tasks.lst.outputs.parts}}", noop: true }
      - { id: f, for_each: [{ big: true }, 2], http: { url: "https://x/{{index}}", body: "{{item}}" } }
"#;
    expect_test::expect![[r#"
        [
            "jobs[0].tasks[1].max_parallel: must be at least 1 (omit it for no bound)",
            "jobs[0].tasks[3].for_each: `parts` is not one placeholder: write a list, `{{tasks.<task>.outputs.<name>}}` or `{{params.<name>}}`",
            "jobs[0].tasks[4].max_parallel: only a task with `for_each` has instances to bound: drop `max_parallel`",
            "jobs[0].tasks[4].shell: `{{item}}` and `{{index}}` are a mapped task's: add `for_each`",
            "jobs[0].tasks[2].for_each: task `list` is not upstream of `b`, so its outputs do not exist when `b` starts: add it to `depends_on`",
            "jobs[0].tasks[5].for_each: there is no task `lst` in this job (did you mean `list`?)",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
    let good = r#"
jobs:
  - name: j
    tasks:
      - { id: list, shell: "echo x" }
      - { id: a, depends_on: [list], for_each: "{{tasks.list.outputs.parts}}", max_parallel: 3, shell: "echo {{item}}" }
      - { id: b, for_each: "{{params.days}}", shell: "echo {{index}}" }
"#;
    let job = load(good).validate().unwrap().remove(0);
    assert_eq!(job.tasks[1].max_parallel, Some(3));
    assert_eq!(job.tasks[1].reads, [0], "its list's task");
    assert_eq!(
        job.tasks[2].for_each,
        Some(dagcron_core::fan_out::Source::Param("days".into()))
    );
}

#[test]
fn outputs_conditions_and_skip_codes_are_checked_with_their_paths() {
    let yaml = r#"
jobs:
  - name: j
    tasks:
      - id: extract
        shell: "echo rows=1 >> $DAGCRON_OUTPUTS"
      - id: api
        http: { url: "https://x", outputs: { id: "$.id", "bad-name": "$.x", n: "id" } }
      - id: load
        depends_on: [extract, api]
        shell: "load {{tasks.extract.outputs.rows}} {{tasks.api.outputs.nope}} {{tasks.extrct.outputs.rows}}"
        when: "tasks.lonely.outputs.x == 'y' and params.p = 1"
      - id: lonely
        shell: "echo {{tasks.load.outputs.x}} {{tasks.a.rows}}"
        skip_on_exit_code: [0]
      - id: call
        depends_on: [load]
        http: { url: "https://x/{{tasks.extract.outputs.rows}}" }
        skip_on_exit_code: [99]
        when: "tasks.lonely.outputs.x == 'y'"
"#;
    expect_test::expect![[r#"
        [
            "jobs[0].tasks[1].http.outputs.bad-name: invalid output name \"bad-name\": use 1 to 64 letters, digits and `_`, not starting with a digit",
            "jobs[0].tasks[1].http.outputs.n: invalid path \"id\": it starts with $ (write it as $.field.field[0])",
            "jobs[0].tasks[2].when: at column 44: `=` alone; compare with `==` or `!=`",
            "jobs[0].tasks[3].skip_on_exit_code: 0 is not an exit code that means anything but success (1 to 255)",
            "jobs[0].tasks[4].skip_on_exit_code: only a shell task has exit codes: drop `skip_on_exit_code`",
            "jobs[0].tasks[2].shell: task `api` declares no output `nope` (its `http.outputs`: bad-name, id, n)",
            "jobs[0].tasks[2].shell: there is no task `extrct` in this job (did you mean `extract`?)",
            "jobs[0].tasks[3].shell: `{{tasks.a.rows}}` is not of the form {{tasks.<task>.outputs.<name>}}",
            "jobs[0].tasks[3].shell: task `load` is not upstream of `lonely`, so its outputs do not exist when `lonely` starts: add it to `depends_on`",
            "jobs[0].tasks[4].when: task `lonely` is not upstream of `call`, so its outputs do not exist when `call` starts: add it to `depends_on`",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
    let good = r#"
jobs:
  - name: j
    tasks:
      - { id: extract, shell: "echo rows=1 >> $DAGCRON_OUTPUTS" }
      - { id: api, http: { url: "https://x", outputs: { id: "$.id" } } }
      - { id: gate, noop: true, depends_on: [extract] }
      - id: load
        depends_on: [gate, api]
        shell: "load {{tasks.extract.outputs.rows}} {{tasks.api.outputs.id}}"
        when: "tasks.extract.outputs.rows != 0"
        skip_on_exit_code: [99]
"#;
    let job = load(good).validate().unwrap().remove(0);
    let reads: Vec<&str> = job.tasks[3]
        .reads
        .iter()
        .map(|&i| job.tasks[i].id.as_str())
        .collect();
    assert_eq!(
        reads,
        ["extract", "api", "gate"],
        "its upstream tasks and those it refers to"
    );
    assert_eq!(job.tasks[3].skip_on_exit_code, [99]);
}

#[test]
fn a_module_may_not_be_granted_a_directory_where_its_outputs_are() {
    let yaml = r#"
jobs:
  - name: j
    tasks:
      - id: m
        wasm: { module: /opt/m.wasm, grants: { dirs: [{ host: /srv/in, guest: /dagcron/in }] } }
"#;
    assert_eq!(
        errors(yaml),
        [
            "jobs[0].tasks[0].wasm.grants.dirs[0].guest: /dagcron is where the module finds its outputs file: grant the directory elsewhere"
        ]
    );
}

#[test]
fn output_variables_never_collide_and_the_shells_codes_are_no_skip() {
    let yaml = r#"
jobs:
  - name: j
    tasks:
      - { id: load-eu, shell: "true", skip_on_exit_code: [127] }
      - { id: load_eu, shell: "true", skip_on_exit_code: [3, 126] }
"#;
    expect_test::expect![[r#"
        [
            "jobs[0].tasks[0].skip_on_exit_code: 127 is the shell's (a command that could not run or was not found), never a skip: pick another code",
            "jobs[0].tasks[1].skip_on_exit_code: 126 is the shell's (a command that could not run or was not found), never a skip: pick another code",
            "jobs[0].tasks[1].id: tasks `load-eu` and `load_eu` would hand their outputs in the same variables (DAGCRON_OUTPUT_LOAD_EU_...): rename one",
        ]
    "#]]
    .assert_debug_eq(&errors(yaml));
}

/// `examples/recurrence.yaml`: a recurrence rule combined with a calendar
/// (a holiday on the last business day moves nothing: that fire is
/// excluded), and one with EXDATE and RDATE in its own zone.
#[test]
fn the_recurrence_example_fires_on_the_days_it_names() {
    let file = load(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/recurrence.yaml"
        ))
        .unwrap(),
    );
    let jobs = file.validate().unwrap();
    let fires = |job: &dagcron_core::model::Job, from: &str, n: usize| -> Vec<String> {
        let timing = job.timing();
        let mut t: jiff::Timestamp = from.parse().unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            t = timing.next_fire_after(t).unwrap();
            out.push(match timing.excluded_by(t) {
                Some(by) => format!("{t} (excluded by {by})"),
                None => t.to_string(),
            });
        }
        out
    };
    assert_eq!(
        fires(&jobs[0], "2026-10-01T00:00:00Z", 4),
        [
            "2026-10-30T17:00:00Z",
            "2026-11-30T17:00:00Z",
            // 2026-12-31 is a Thursday, and a holiday.
            "2026-12-31T17:00:00Z (excluded by holidays)",
            "2027-01-29T17:00:00Z",
        ]
    );
    assert_eq!(
        fires(&jobs[1], "2027-01-01T00:00:00Z", 4),
        [
            "2027-01-12T06:00:00Z",
            "2027-04-20T05:00:00Z",
            "2027-07-13T05:00:00Z",
            "2027-10-12T05:00:00Z"
        ]
    );
}

/// A priority is checked once where it is written, job or task; a task
/// without one takes its job's, else the default.
#[test]
fn priorities_are_checked_where_written_and_inherited() {
    assert_eq!(
        errors(
            "namespace: t\njobs:\n  - name: j\n    priority: 101\n    tasks:\n      - { id: a, shell: 'true' }\n      - { id: b, shell: 'true', priority: -101 }\n"
        ),
        [
            "jobs[0].priority: priority 101 is outside -100 to 100 (higher starts first; default 0)",
            "jobs[0].tasks[1].priority: priority -101 is outside -100 to 100 (higher starts first; default 0)",
        ]
    );
    let jobs = load("namespace: t\njobs:\n  - name: j\n    priority: 20\n    tasks:\n      - { id: a, shell: 'true' }\n      - { id: b, shell: 'true', priority: -3 }\n  - { name: k, tasks: [{ id: c, shell: 'true' }] }\n")
        .validate()
        .unwrap();
    let priorities: Vec<i32> = jobs
        .iter()
        .flat_map(|j| j.tasks.iter().map(|t| t.priority))
        .collect();
    assert_eq!(priorities, [20, -3, 0]);
}
