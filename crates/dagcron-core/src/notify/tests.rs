use super::*;
use crate::model::JobFile;

fn file(yaml: &str) -> Result<Vec<crate::model::Job>, String> {
    let file: JobFile = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
    file.validate().map_err(|e| e.to_string())
}

const FILE: &str = r#"
namespace: billing
notifiers:
  - name: oncall
    webhook: { url: "https://hooks.example.com/dagcron", secret: { secret: hook-key } }
  - name: chat
    slack: { url: { secret: slack-url } }
notify:
  - on: [failed]
    to: [oncall]
jobs:
  - name: nightly
    schedule: "0 3 * * *"
    notify:
      - on: [failed, recovered]
        to: [oncall, chat]
      - on: [succeeded, failed]
        to: [chat]
    tasks: [{ id: a, shell: "true" }]
  - name: hourly
    schedule: "0 * * * *"
    tasks: [{ id: a, shell: "true" }]
"#;

#[test]
fn names_resolve_into_the_canonical_form_and_the_file_default_applies() {
    let jobs = file(FILE).unwrap();
    let nightly = &jobs[0];
    let to = &nightly.spec.notify[0].to;
    assert!(
        matches!(&to[0], NotifyTarget::Notifier(n) if n.name == "oncall" && n.webhook.is_some())
    );
    assert!(matches!(&to[1], NotifyTarget::Notifier(n) if n.name == "chat" && n.slack.is_some()));
    // The job's own canonical form rebuilds the same job, without the file.
    let again = crate::model::Job::from_canonical("billing", &nightly.canonical()).unwrap();
    assert_eq!(again.spec.notify, nightly.spec.notify);
    // A job without rules takes the file's.
    let hourly = &jobs[1];
    assert_eq!(hourly.spec.notify.len(), 1);
    assert_eq!(hourly.spec.notify[0].on, vec![NotifyEvent::Failed]);
    assert!(
        matches!(&hourly.spec.notify[0].to[0], NotifyTarget::Notifier(n) if n.name == "oncall")
    );
}

#[test]
fn a_run_end_makes_one_notification_per_notifier_and_event() {
    let jobs = file(FILE).unwrap();
    let rules = &jobs[0].spec.notify;
    let names = |state| {
        on_run_end(rules, state)
            .into_iter()
            .map(|(n, e)| format!("{}:{}", n.name, e.as_str()))
            .collect::<Vec<_>>()
    };
    // `chat` is named by both rules for `failed`: one notification.
    assert_eq!(names(RunState::Failed), ["oncall:failed", "chat:failed"]);
    assert_eq!(
        names(RunState::Succeeded),
        ["oncall:recovered", "chat:recovered", "chat:succeeded"]
    );
    assert!(names(RunState::Cancelled).is_empty());
    assert!(names(RunState::Running).is_empty());
    assert!(names(RunState::Skipped).is_empty());
}

#[test]
fn only_a_success_after_a_failure_is_a_recovery() {
    assert!(is_recovery(Some(RunState::Failed)));
    assert!(!is_recovery(Some(RunState::Succeeded)));
    assert!(!is_recovery(Some(RunState::Cancelled)));
    assert!(!is_recovery(None));
}

#[test]
fn every_problem_is_reported_at_its_path() {
    let err = file(
        r#"
namespace: billing
notifiers:
  - name: Bad Name
    webhook: { url: "ftp://x" }
  - name: both
    webhook: { url: "https://a.example" }
    slack: { url: "https://b.example" }
  - name: none
  - name: spaced
    webhook: { url: "https://a.example/x y" }
  - name: dup
    slack: { url: { secret: "no good" } }
  - name: dup
    webhook: { url: "https://a.example", secret: { secret: "" } }
jobs:
  - name: j
    schedule: "* * * * *"
    notify:
      - on: []
        to: []
      - on: [failed]
        to: [nobody, both]
    tasks: [{ id: a, shell: "true" }]
"#,
    )
    .unwrap_err();
    for expected in [
        "notifiers[0].name: invalid notifier name \"Bad Name\"",
        "notifiers[0].webhook.url: \"ftp://x\" is not an http:// or https:// URL",
        "notifiers[1]: a notifier has one channel",
        "notifiers[2]: a notifier needs a channel",
        "notifiers[3].webhook.url: \"https://a.example/x y\" holds a space",
        "notifiers[4].slack.url: invalid secret name \"no good\"",
        "notifiers[5].name: notifier \"dup\" is declared twice",
        "notifiers[5].webhook.secret: invalid secret name \"\"",
        "jobs[0].notify[0].on: a rule needs at least one event",
        "jobs[0].notify[0].to: a rule needs at least one notifier",
        "jobs[0].notify[1].to[0]: unknown notifier \"nobody\": the file declares",
    ] {
        assert!(err.contains(expected), "{expected:?} not in:\n{err}");
    }
    // An invalid notifier is reported once, at its own path, not again
    // where a rule names it.
    assert!(!err.contains("notify[1].to[1]"), "{err}");
}

#[test]
fn an_unknown_event_names_the_known_ones() {
    let err = file(
        r#"
jobs:
  - name: j
    schedule: "* * * * *"
    notify: [{ on: [exploded], to: [{ name: x, webhook: { url: "https://a.example" } }] }]
    tasks: [{ id: a, shell: "true" }]
"#,
    )
    .unwrap_err();
    assert!(err.contains("failed") && err.contains("recovered"), "{err}");
}

#[test]
fn secrets_referred_to_are_listed() {
    let jobs = file(FILE).unwrap();
    let NotifyTarget::Notifier(oncall) = &jobs[0].spec.notify[0].to[0] else {
        panic!("resolved")
    };
    let NotifyTarget::Notifier(chat) = &jobs[0].spec.notify[0].to[1] else {
        panic!("resolved")
    };
    assert_eq!(
        oncall.secret_refs().into_iter().collect::<Vec<_>>(),
        ["hook-key"]
    );
    assert_eq!(
        chat.secret_refs().into_iter().collect::<Vec<_>>(),
        ["slack-url"]
    );
    assert_eq!(oncall.kind(), "webhook");
    assert_eq!(chat.kind(), "slack");
}

#[test]
fn keys_name_the_run_the_event_and_the_notifier() {
    assert_eq!(
        run_key(
            "billing",
            "nightly",
            42,
            NotifyEvent::Recovered,
            None,
            "oncall"
        ),
        "billing/nightly/run-42/recovered/oncall"
    );
    // A task held twice (retried by an operator in between): two keys.
    assert_eq!(
        run_key(
            "billing",
            "nightly",
            42,
            NotifyEvent::Held,
            Some(("load", 3)),
            "oncall"
        ),
        "billing/nightly/run-42/held/load/3/oncall"
    );
}

#[test]
fn the_payload_has_a_stable_shape() {
    let p = Payload {
        schema: SCHEMA.into(),
        id: "billing/nightly/run-42/failed/oncall".into(),
        event: NotifyEvent::Failed,
        at: "2026-03-01T03:00:05Z".parse().unwrap(),
        namespace: "billing".into(),
        job: "nightly".into(),
        run: Some(PayloadRun {
            id: 42,
            state: "failed".into(),
            trigger: "schedule".into(),
            scheduled_at: "2026-03-01T03:00:00Z".parse().unwrap(),
        }),
        task: None,
        breaker: None,
        sla: None,
        fire: None,
    };
    expect_test::expect![[r#"{"schema":"dagcron.notification/v1","id":"billing/nightly/run-42/failed/oncall","event":"failed","at":"2026-03-01T03:00:05Z","namespace":"billing","job":"nightly","run":{"id":42,"state":"failed","trigger":"schedule","scheduled_at":"2026-03-01T03:00:00Z"}}"#]]
        .assert_eq(&serde_json::to_string(&p).unwrap());
    assert_eq!(
        p.summary(),
        "dagcron: run 42 of billing/nightly (schedule, scheduled for 2026-03-01T03:00:00Z) failed"
    );
}

#[test]
fn a_held_task_is_named_in_the_body_and_the_line() {
    let jobs = file(
        r#"
notifiers: [{ name: ops, slack: { url: "https://hooks.slack.example/x" } }]
jobs:
  - name: j
    notify: [{ on: [held, failed], to: [ops] }, { on: [held], to: [ops] }]
    tasks: [{ id: a, shell: "true" }]
"#,
    )
    .unwrap();
    let made = on_held(&jobs[0].spec.notify);
    assert_eq!(made.len(), 1);
    assert_eq!(
        (made[0].0.name.as_str(), made[0].1),
        ("ops", NotifyEvent::Held)
    );
    assert!(on_held(&[]).is_empty());
    let p = Payload {
        schema: SCHEMA.into(),
        id: "k".into(),
        event: NotifyEvent::Held,
        at: "2026-03-01T03:00:05Z".parse().unwrap(),
        namespace: "default".into(),
        job: "j".into(),
        run: Some(PayloadRun {
            id: 9,
            state: "running".into(),
            trigger: "manual".into(),
            scheduled_at: "2026-03-01T03:00:00Z".parse().unwrap(),
        }),
        task: Some(PayloadTask {
            id: "a".into(),
            attempt: 3,
        }),
        breaker: None,
        sla: None,
        fire: None,
    };
    let body = serde_json::to_value(&p).unwrap();
    assert_eq!(body["task"], serde_json::json!({ "id": "a", "attempt": 3 }));
    assert!(
        p.summary()
            .ends_with("waits for an operator: task a after attempt 3"),
        "{}",
        p.summary()
    );
}

#[test]
fn the_breaker_opening_and_closing_name_the_job_and_the_run() {
    let jobs = file(
        r#"
notifiers: [{ name: ops, webhook: { url: "https://hooks.example/x" } }]
jobs:
  - name: j
    breaker: { after_failures: 3 }
    notify: [{ on: [breaker_opened, breaker_closed, failed], to: [ops] }]
    tasks: [{ id: a, shell: "true" }]
"#,
    )
    .unwrap();
    let rules = &jobs[0].spec.notify;
    assert_eq!(on_breaker(rules, true)[0].1, NotifyEvent::BreakerOpened);
    assert_eq!(on_breaker(rules, false)[0].1, NotifyEvent::BreakerClosed);
    assert!(on_breaker(&[], true).is_empty());
    let at: Timestamp = "2026-03-01T03:00:05Z".parse().unwrap();
    assert_eq!(
        breaker_key("b", "j", Some(42), at, "ops"),
        "b/j/run-42/breaker_opened/ops"
    );
    assert_ne!(
        breaker_key("b", "j", None, at, "ops"),
        breaker_key(
            "b",
            "j",
            None,
            at + jiff::SignedDuration::from_secs(1),
            "ops"
        ),
        "each closing is told"
    );
    let opened = Payload {
        schema: SCHEMA.into(),
        id: "k".into(),
        event: NotifyEvent::BreakerOpened,
        at,
        namespace: "b".into(),
        job: "j".into(),
        run: None,
        task: None,
        breaker: Some(crate::breaker::OpenBreaker {
            opened_at: at,
            run: 42,
            failures: 3,
        }),
        sla: None,
        fire: None,
    };
    let body = serde_json::to_value(&opened).unwrap();
    assert_eq!(body["event"], "breaker_opened");
    assert_eq!(body["breaker"]["failures"], 3);
    assert!(body.get("run").is_none());
    assert!(opened.summary().contains("after 3 consecutive failed runs"));
}

#[test]
fn failed_deliveries_back_off_and_end() {
    let created: Timestamp = "2026-03-01T00:00:00Z".parse().unwrap();
    // The waits double from 5 s, drawn between half and all of it.
    let wait = |attempt, random| {
        after_failed_delivery(attempt, created, created, random)
            .map(|t| t.duration_since(created).as_secs_f64())
    };
    assert_eq!(wait(1, 0.0), Some(2.5));
    assert_eq!(wait(1, 0.999_999), Some(4.999_997_5));
    assert_eq!(wait(2, 0.0), Some(5.0));
    assert_eq!(wait(4, 0.0), Some(20.0));
    // ... up to 10 min.
    assert_eq!(wait(12, 0.0), Some(300.0));
    assert_eq!(wait(19, 1.0), Some(600.0));
    // Never more than MAX_DELIVERIES attempts.
    assert_eq!(wait(MAX_DELIVERIES, 0.0), None);
    // Never past the window.
    let late = created
        .checked_add(SignedDuration::from_secs(
            DELIVERY_WINDOW.as_secs() as i64 - 1,
        ))
        .unwrap();
    assert_eq!(after_failed_delivery(1, created, late, 0.0), None);
}

#[test]
fn retries_of_any_sequence_stay_bounded() {
    // Whatever the draws, a notification is given up within its window
    // and its attempts.
    let created: Timestamp = "2026-03-01T00:00:00Z".parse().unwrap();
    for seed in 0..50u64 {
        let mut now = created;
        let mut attempt = 1;
        let mut state = seed;
        while let Some(next) = after_failed_delivery(attempt, created, now, {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            (state >> 11) as f64 / (1u64 << 53) as f64
        }) {
            assert!(next > now);
            now = next;
            attempt += 1;
        }
        assert!(attempt <= MAX_DELIVERIES);
        assert!(now.duration_since(created).as_secs() <= DELIVERY_WINDOW.as_secs() as i64);
    }
}

#[test]
fn an_email_notifier_names_its_recipients_and_each_bad_one_at_its_path() {
    let jobs = file(
        r#"
notifiers: [{ name: team, email: { to: [ops@example.com, oncall@example.org] } }]
jobs:
  - name: j
    notify: [{ on: [failed], to: [team] }]
    tasks: [{ id: a, shell: "true" }]
"#,
    )
    .unwrap();
    let made = on_run_end(&jobs[0].spec.notify, RunState::Failed);
    assert_eq!(made[0].0.kind(), "email");
    let err = file(
        r#"
notifiers:
  - { name: bad, email: { to: ["not an address", "a@b.c", "x@nodot", "<x@y.z>"] } }
  - { name: none, email: { to: [] } }
  - { name: two, email: { to: [a@b.c] }, slack: { url: "https://hooks.slack.example/x" } }
jobs: [{ name: j, tasks: [{ id: a, shell: "true" }] }]
"#,
    )
    .unwrap_err();
    for path in [
        "notifiers[0].email.to[0]",
        "notifiers[0].email.to[2]",
        "notifiers[0].email.to[3]",
        "notifiers[1].email.to",
        "notifiers[2]",
    ] {
        assert!(err.contains(path), "{path}: {err}");
    }
    assert!(!err.contains("to[1]"), "{err}");
    assert!(valid_address("ops+dagcron@mail.example.com"));
    assert!(!valid_address("a@b.c\r\nBcc: x@y.z"));
}
