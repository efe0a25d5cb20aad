//! Notifications: who hears what happens to a namespace's jobs.
//!
//! A job file declares its namespace's *notifiers* (where a notification
//! goes: a webhook, a Slack channel) beside its calendars, and each job its
//! *rules* (`notify`: which events go to which notifiers; the file's own
//! `notify` is the default of every job that has none). Validation resolves
//! the names, so that a job's canonical form holds the notifiers
//! themselves, as it holds its calendars: a version of a job says exactly
//! where its notifications went.
//!
//! The decisions are pure: which notifications a run's end makes
//! ([`on_run_end`]), the body a receiver gets ([`Payload`]), what a Slack
//! channel shows ([`Payload::summary`]), whether a success is a recovery
//! ([`is_recovery`]) and when a failed delivery is tried again
//! ([`after_failed_delivery`]). The engine writes each notification in the
//! commit of the event it reports; the outbox delivers it after the commit.

use std::collections::BTreeSet;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::model::{EnvValue, ValidationError, unknown_name, valid_name};
use crate::state::RunState;

/// At most this many notifiers in a file, rules in a job and notifiers in
/// a rule.
pub const MAX_NOTIFIERS: usize = 32;

/// The longest URL a notifier may have.
pub const MAX_URL: usize = 2048;

/// Where notifications go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifierSpec {
    /// Its name in the file (what rules list in `to`).
    pub name: String,
    /// A webhook: the notification as JSON, signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSpec>,
    /// A Slack incoming webhook: one line of text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slack: Option<SlackSpec>,
    /// E-mail, through the server's SMTP relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<EmailSpec>,
}

/// An e-mail notifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSpec {
    /// The recipients (at most [`MAX_RECIPIENTS`]).
    pub to: Vec<String>,
}

/// The most recipients an e-mail notifier has.
pub const MAX_RECIPIENTS: usize = 16;

/// Whether `address` looks like an e-mail address: `local@domain`, no
/// spaces, no angle brackets, at most 254 bytes. The SMTP relay has the
/// last word.
pub fn valid_address(address: &str) -> bool {
    let Some((local, domain)) = address.rsplit_once('@') else {
        return false;
    };
    address.len() <= 254
        && !local.is_empty()
        && local.len() <= 64
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && address
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '<' | '>' | ',' | ';' | '"' | '\\'))
}

/// A webhook notifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSpec {
    /// The address (`http://` or `https://`), or `{ secret: NAME }`.
    pub url: EnvValue,
    /// The key the body is signed with (HMAC-SHA-256 in the
    /// `X-Dagcron-Signature-256` header): `{ secret: NAME }`; none: unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretRef>,
}

/// A Slack notifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSpec {
    /// The incoming webhook's address, usually `{ secret: NAME }` (whoever
    /// has it can post to the channel).
    pub url: EnvValue,
}

/// A stored secret of the job's namespace, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The secret's name.
    pub secret: String,
}

impl NotifierSpec {
    /// `webhook`, `slack` or `email`.
    pub fn kind(&self) -> &'static str {
        if self.slack.is_some() {
            "slack"
        } else if self.email.is_some() {
            "email"
        } else {
            "webhook"
        }
    }

    /// The secrets it refers to, by name.
    pub fn secret_refs(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut url = |v: &EnvValue| {
            if let EnvValue::Secret { secret } = v {
                out.insert(secret.clone());
            }
        };
        if let Some(w) = &self.webhook {
            url(&w.url);
        }
        if let Some(s) = &self.slack {
            url(&s.url);
        }
        if let Some(SecretRef { secret }) = self.webhook.as_ref().and_then(|w| w.secret.as_ref()) {
            out.insert(secret.clone());
        }
        out
    }

    /// Every problem of the notifier, at `at`.
    pub fn check(&self, at: &str) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        if !valid_name(&self.name) {
            err(
                format!("{at}.name"),
                format!(
                    "invalid notifier name {:?}: use 1-63 lowercase letters, digits, '-', '_' or '.'",
                    self.name
                ),
            );
        }
        let channels = [
            self.webhook.is_some(),
            self.slack.is_some(),
            self.email.is_some(),
        ]
        .into_iter()
        .filter(|c| *c)
        .count();
        let url = match (&self.webhook, &self.slack) {
            _ if channels == 0 => {
                err(
                    at.to_string(),
                    "a notifier needs a channel: `webhook: { url: ... }`, `slack: { url: ... }` or `email: { to: [...] }`"
                        .into(),
                );
                None
            }
            _ if channels > 1 => {
                err(
                    at.to_string(),
                    "a notifier has one channel: `webhook`, `slack` or `email`; declare one notifier per channel"
                        .into(),
                );
                None
            }
            (Some(w), _) => Some((format!("{at}.webhook.url"), &w.url)),
            (_, Some(s)) => Some((format!("{at}.slack.url"), &s.url)),
            (None, None) => None,
        };
        if let Some(email) = &self.email {
            if email.to.is_empty() || email.to.len() > MAX_RECIPIENTS {
                err(
                    format!("{at}.email.to"),
                    format!("1 to {MAX_RECIPIENTS} recipients, not {}", email.to.len()),
                );
            }
            for (i, address) in email.to.iter().enumerate() {
                if !valid_address(address) {
                    err(
                        format!("{at}.email.to[{i}]"),
                        format!("{address:?} is not an e-mail address such as ops@example.com"),
                    );
                }
            }
        }
        if let Some((path, value)) = url {
            match value {
                EnvValue::Plain(url) => {
                    if let Err(why) = check_url(url) {
                        err(path, why);
                    }
                }
                EnvValue::Secret { secret } => {
                    if !valid_name(secret) {
                        err(path, format!("invalid secret name {secret:?}"));
                    }
                }
            }
        }
        if let Some(SecretRef { secret }) = self.webhook.as_ref().and_then(|w| w.secret.as_ref())
            && !valid_name(secret)
        {
            err(
                format!("{at}.webhook.secret"),
                format!("invalid secret name {secret:?}"),
            );
        }
        errors
    }
}

/// Whether `url` can be a notifier's address; checked again, with the
/// namespace's execution policy, when a notification is delivered.
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    if url.len() > MAX_URL {
        return Err(format!(
            "the URL is {} bytes; at most {MAX_URL} are accepted",
            url.len()
        ));
    }
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{url:?} has no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?} holds a space or a control character"));
    }
    Ok(())
}

/// What a notification reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A run ended failed.
    Failed,
    /// A run ended succeeded.
    Succeeded,
    /// A run was cancelled.
    Cancelled,
    /// A run succeeded, and the job's run before it had failed.
    Recovered,
    /// A task's retries ran out and it waits for an operator
    /// (`on_exhausted: hold`).
    Held,
    /// The job's failure breaker opened: it no longer fires (see
    /// [`crate::breaker`]).
    BreakerOpened,
    /// The job was resumed and its failure breaker closed.
    BreakerClosed,
    /// A scheduled run had not succeeded by the job's SLA (see
    /// [`crate::sla`]), or the fire made no run.
    SlaMissed,
    /// A scheduled fire was missed (the server was down or the job
    /// paused), whether the misfire policy then ran it or not.
    Missed,
    /// A scheduled fire made no run: declined by the overlap policy, the
    /// backlog or the namespace's fire quota (not by an open breaker,
    /// which `breaker_opened` tells once).
    Skipped,
}

impl NotifyEvent {
    /// Every event.
    pub const ALL: [NotifyEvent; 10] = [
        NotifyEvent::Failed,
        NotifyEvent::Succeeded,
        NotifyEvent::Cancelled,
        NotifyEvent::Recovered,
        NotifyEvent::Held,
        NotifyEvent::BreakerOpened,
        NotifyEvent::BreakerClosed,
        NotifyEvent::SlaMissed,
        NotifyEvent::Missed,
        NotifyEvent::Skipped,
    ];

    /// The name in job files and bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Failed => "failed",
            NotifyEvent::Succeeded => "succeeded",
            NotifyEvent::Cancelled => "cancelled",
            NotifyEvent::Recovered => "recovered",
            NotifyEvent::Held => "held",
            NotifyEvent::BreakerOpened => "breaker_opened",
            NotifyEvent::BreakerClosed => "breaker_closed",
            NotifyEvent::SlaMissed => "sla_missed",
            NotifyEvent::Missed => "missed",
            NotifyEvent::Skipped => "skipped",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<NotifyEvent> {
        NotifyEvent::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// One rule of a job's `notify`: these events go to these notifiers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyRule {
    /// The events.
    pub on: Vec<NotifyEvent>,
    /// The notifiers: names of the file's, or (the canonical form, once
    /// validation has resolved the names) the notifiers themselves.
    pub to: Vec<NotifyTarget>,
}

/// One entry of a rule's `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NotifyTarget {
    /// `to: [oncall]`.
    Name(String),
    /// The notifier's definition.
    Notifier(NotifierSpec),
}

/// Resolves the names of `rules` against the file's valid notifiers
/// (`None`: declared but invalid, in error at its own path); `at` is the
/// path of the rules.
pub fn resolve(
    rules: &[NotifyRule],
    notifiers: &std::collections::BTreeMap<&str, Option<&NotifierSpec>>,
    at: &str,
) -> Result<Vec<NotifyRule>, Vec<ValidationError>> {
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ValidationError {
            path,
            message,
            span: None,
        })
    };
    if rules.len() > MAX_NOTIFIERS {
        err(
            at.to_string(),
            format!(
                "{} rules; at most {MAX_NOTIFIERS} are accepted",
                rules.len()
            ),
        );
    }
    let mut out = Vec::with_capacity(rules.len());
    for (r, rule) in rules.iter().enumerate() {
        let here = format!("{at}[{r}]");
        if rule.on.is_empty() {
            err(
                format!("{here}.on"),
                format!(
                    "a rule needs at least one event: {}",
                    NotifyEvent::ALL.map(NotifyEvent::as_str).join(", ")
                ),
            );
        }
        if rule.to.is_empty() {
            err(
                format!("{here}.to"),
                "a rule needs at least one notifier".into(),
            );
        }
        if rule.to.len() > MAX_NOTIFIERS {
            err(
                format!("{here}.to"),
                format!(
                    "{} notifiers; at most {MAX_NOTIFIERS} are accepted",
                    rule.to.len()
                ),
            );
        }
        let mut to = Vec::with_capacity(rule.to.len());
        for (t, target) in rule.to.iter().enumerate() {
            match target {
                NotifyTarget::Name(name) => match notifiers.get(name.as_str()) {
                    Some(Some(n)) => to.push(NotifyTarget::Notifier((*n).clone())),
                    Some(None) => {}
                    None => err(
                        format!("{here}.to[{t}]"),
                        unknown_name("notifier", "notifiers", name, notifiers.keys()),
                    ),
                },
                NotifyTarget::Notifier(n) => {
                    let problems = n.check(&format!("{here}.to[{t}]"));
                    if problems.is_empty() {
                        to.push(target.clone());
                    } else {
                        for p in problems {
                            err(p.path, p.message);
                        }
                    }
                }
            }
        }
        out.push(NotifyRule {
            on: rule.on.clone(),
            to,
        });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The notifications a run's end makes: one per notifier and event, in
/// the order of the rules, however many rules name the pair. A success
/// makes a `recovered` notification for the notifiers that ask for it,
/// which is delivered only if the run before it failed ([`is_recovery`]).
pub fn on_run_end(rules: &[NotifyRule], state: RunState) -> Vec<(&NotifierSpec, NotifyEvent)> {
    let events: &[NotifyEvent] = match state {
        RunState::Failed => &[NotifyEvent::Failed],
        RunState::Succeeded => &[NotifyEvent::Succeeded, NotifyEvent::Recovered],
        RunState::Cancelled => &[NotifyEvent::Cancelled],
        _ => &[],
    };
    made_of(rules, events)
}

/// The notifications a task held for an operator makes.
pub fn on_held(rules: &[NotifyRule]) -> Vec<(&NotifierSpec, NotifyEvent)> {
    made_of(rules, &[NotifyEvent::Held])
}

/// The rules of `rules` about fires (`missed`, `skipped`), with only those
/// events: what the engine keeps of a job whose whole definition is not
/// in memory when its fires are recorded.
pub fn fire_rules(rules: &[NotifyRule]) -> Vec<NotifyRule> {
    rules
        .iter()
        .filter_map(|r| {
            let on: Vec<NotifyEvent> =
                r.on.iter()
                    .copied()
                    .filter(|e| matches!(e, NotifyEvent::Missed | NotifyEvent::Skipped))
                    .collect();
            (!on.is_empty()).then(|| NotifyRule {
                on,
                to: r.to.clone(),
            })
        })
        .collect()
}

/// The notifications a scheduled fire recorded with `outcome` makes.
pub fn on_fire(
    rules: &[NotifyRule],
    outcome: crate::FireOutcome,
) -> Vec<(&NotifierSpec, NotifyEvent)> {
    use crate::FireOutcome as O;
    let event = match outcome {
        O::MissedSkipped | O::MissedCaughtUp => NotifyEvent::Missed,
        O::SkippedOverlap | O::SkippedBacklog | O::SkippedQuota => NotifyEvent::Skipped,
        O::Fired | O::Suppressed | O::SkippedBreaker => return vec![],
    };
    made_of(rules, &[event])
}

/// The idempotency key of the notification of `event` about the fire of a
/// job at `scheduled` to `notifier`.
pub fn fire_key(
    namespace: &str,
    job: &str,
    scheduled: Timestamp,
    event: NotifyEvent,
    notifier: &str,
) -> String {
    format!(
        "{namespace}/{job}/fire-{}/{}/{notifier}",
        scheduled.as_microsecond(),
        event.as_str()
    )
}

/// The notifications an SLA missed makes.
pub fn on_sla_missed(rules: &[NotifyRule]) -> Vec<(&NotifierSpec, NotifyEvent)> {
    made_of(rules, &[NotifyEvent::SlaMissed])
}

/// The notifications the job's failure breaker makes as it opens
/// (`opened`) or closes.
pub fn on_breaker(rules: &[NotifyRule], opened: bool) -> Vec<(&NotifierSpec, NotifyEvent)> {
    let event = if opened {
        NotifyEvent::BreakerOpened
    } else {
        NotifyEvent::BreakerClosed
    };
    made_of(rules, &[event])
}

fn made_of<'a>(
    rules: &'a [NotifyRule],
    events: &[NotifyEvent],
) -> Vec<(&'a NotifierSpec, NotifyEvent)> {
    let mut out: Vec<(&NotifierSpec, NotifyEvent)> = Vec::new();
    for rule in rules {
        for &event in events.iter().filter(|e| rule.on.contains(e)) {
            for target in &rule.to {
                if let NotifyTarget::Notifier(n) = target
                    && !out.iter().any(|(m, e)| m.name == n.name && *e == event)
                {
                    out.push((n, event));
                }
            }
        }
    }
    out
}

/// Whether a success is a recovery, given how the job's run before it
/// ended (none: it is the job's first).
pub fn is_recovery(previous: Option<RunState>) -> bool {
    previous == Some(RunState::Failed)
}

/// The idempotency key of the notification of `event` about run `run`
/// (and, for `held`, its task and the attempt it was held after) to
/// `notifier`: the same across retries and redeliveries, so a receiver can
/// drop a second copy; the outbox keeps one row per key.
pub fn run_key(
    namespace: &str,
    job: &str,
    run: i64,
    event: NotifyEvent,
    task: Option<(&str, u32)>,
    notifier: &str,
) -> String {
    let task = task.map_or(String::new(), |(t, n)| format!("/{t}/{n}"));
    format!(
        "{namespace}/{job}/run-{run}/{}{task}/{notifier}",
        event.as_str()
    )
}

/// The idempotency key of the notification of the breaker of a job
/// opening after run `run` failed, or (`run` none) closing at `at`, to
/// `notifier`.
pub fn breaker_key(
    namespace: &str,
    job: &str,
    run: Option<i64>,
    at: Timestamp,
    notifier: &str,
) -> String {
    match run {
        Some(run) => format!("{namespace}/{job}/run-{run}/breaker_opened/{notifier}"),
        None => format!(
            "{namespace}/{job}/breaker_closed-{}/{notifier}",
            at.as_microsecond()
        ),
    }
}

/// The idempotency key of the notification to `notifier` that the fire of
/// a job at `scheduled` missed its SLA.
pub fn sla_key(namespace: &str, job: &str, scheduled: Timestamp, notifier: &str) -> String {
    format!(
        "{namespace}/{job}/fire-{}/sla_missed/{notifier}",
        scheduled.as_microsecond()
    )
}

/// The version of the body's schema, in every body (`schema`).
pub const SCHEMA: &str = "dagcron.notification/v1";

/// The JSON body a webhook receives (docs/events.md describes it; a field
/// is never removed or changed within a version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// [`SCHEMA`].
    pub schema: String,
    /// The idempotency key (also in the `Idempotency-Key` header).
    pub id: String,
    /// The event.
    pub event: NotifyEvent,
    /// When it happened.
    pub at: Timestamp,
    /// The job's namespace.
    pub namespace: String,
    /// The job.
    pub job: String,
    /// The run it is about (none: `breaker_closed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<PayloadRun>,
    /// The task it is about (`held`), and the attempt it was held after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<PayloadTask>,
    /// The failure breaker (`breaker_opened`): the run above is the
    /// failed run that opened it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<crate::breaker::OpenBreaker>,
    /// The SLA missed (`sla_missed`): the fire's instant and the deadline
    /// (the run above, if the fire made one, is its run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<PayloadSla>,
    /// The fire (`missed`, `skipped`): its instant and its outcome in the
    /// ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fire: Option<PayloadFire>,
}

/// The fire a notification is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadFire {
    /// Its scheduled instant.
    pub scheduled_at: Timestamp,
    /// Its outcome in the fire ledger (`missed_skipped`, `skipped_overlap`, ...).
    pub outcome: String,
}

/// The SLA a notification is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadSla {
    /// The fire's scheduled instant.
    pub scheduled_at: Timestamp,
    /// When its run should have succeeded by.
    pub deadline: Timestamp,
}

/// The task a notification is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadTask {
    /// Its id.
    pub id: String,
    /// The attempt it was held after.
    pub attempt: u32,
}

/// The run a notification is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRun {
    /// Its id.
    pub id: i64,
    /// Its state when the notification was made.
    pub state: String,
    /// What made it (`schedule`, `manual`, ...).
    pub trigger: String,
    /// The instant it was scheduled for.
    pub scheduled_at: Timestamp,
}

impl Payload {
    /// The body of `event` about job `key` (namespace, name) at `at`, keyed
    /// `id`, with no run, task or breaker yet.
    pub fn of_job(
        id: String,
        event: NotifyEvent,
        at: Timestamp,
        key: &(String, String),
    ) -> Payload {
        Payload {
            schema: SCHEMA.into(),
            id,
            event,
            at,
            namespace: key.0.clone(),
            job: key.1.clone(),
            run: None,
            task: None,
            breaker: None,
            sla: None,
            fire: None,
        }
    }

    /// One line for a chat channel.
    pub fn summary(&self) -> String {
        let what = match self.event {
            NotifyEvent::Failed => "failed",
            NotifyEvent::Succeeded => "succeeded",
            NotifyEvent::Cancelled => "was cancelled",
            NotifyEvent::Recovered => "succeeded after a failure",
            NotifyEvent::Held => "waits for an operator",
            NotifyEvent::BreakerOpened => {
                let failures = self.breaker.map_or(0, |b| b.failures);
                return format!(
                    "dagcron: {}/{} stopped firing: its failure breaker opened after {failures} consecutive failed runs; resume the job to close it",
                    self.namespace, self.job
                );
            }
            NotifyEvent::SlaMissed => {
                let (at, by) = self
                    .sla
                    .map_or((self.at, self.at), |s| (s.scheduled_at, s.deadline));
                let run = self.run.as_ref().map_or("it made no run".to_string(), |r| {
                    format!("run {} is {}", r.id, r.state)
                });
                return format!(
                    "dagcron: {}/{} missed its SLA: the run scheduled for {at} had not succeeded by {by} ({run})",
                    self.namespace, self.job
                );
            }
            NotifyEvent::Missed | NotifyEvent::Skipped => {
                let (at, outcome) = self
                    .fire
                    .as_ref()
                    .map_or((self.at, "?"), |f| (f.scheduled_at, f.outcome.as_str()));
                let run = self
                    .run
                    .as_ref()
                    .map_or(String::new(), |r| format!(", then run as {}", r.id));
                return format!(
                    "dagcron: the fire of {}/{} at {at} was {outcome}{run}",
                    self.namespace, self.job
                );
            }
            NotifyEvent::BreakerClosed => {
                return format!(
                    "dagcron: {}/{} was resumed: its failure breaker closed and it fires again",
                    self.namespace, self.job
                );
            }
        };
        let task = self.task.as_ref().map_or(String::new(), |t| {
            format!(": task {} after attempt {}", t.id, t.attempt)
        });
        match &self.run {
            Some(run) => format!(
                "dagcron: run {} of {}/{} ({}, scheduled for {}) {what}{task}",
                run.id, self.namespace, self.job, run.trigger, run.scheduled_at
            ),
            None => format!("dagcron: {}/{} {what}{task}", self.namespace, self.job),
        }
    }
}

/// How long a notification is tried for before it is given up as failed.
pub const DELIVERY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// At most this many delivery attempts per notification.
pub const MAX_DELIVERIES: u32 = 20;

/// What to do after delivery attempt `attempt` (1-based) of a notification
/// made at `created` failed at `now`: try again at the instant returned, or
/// (none) give it up. The waits double from 5 s to at most 10 min, each
/// drawn between half and all of it (`random` in `[0, 1)`), so that the
/// notifications of one outage do not all come back at once.
pub fn after_failed_delivery(
    attempt: u32,
    created: Timestamp,
    now: Timestamp,
    random: f64,
) -> Option<Timestamp> {
    if attempt >= MAX_DELIVERIES {
        return None;
    }
    let base = Duration::from_secs(5)
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(Duration::from_secs(600));
    let wait = base.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0));
    let at = now.checked_add(SignedDuration::try_from(wait).ok()?).ok()?;
    let end = created
        .checked_add(SignedDuration::try_from(DELIVERY_WINDOW).ok()?)
        .ok()?;
    (at <= end).then_some(at)
}

#[cfg(test)]
mod tests;
