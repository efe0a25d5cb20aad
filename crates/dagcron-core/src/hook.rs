//! Runs started by a signed webhook delivery: `POST /api/v1/hooks/{ns}/{job}`.
//!
//! A job with `webhook: { secret: { secret: NAME } }` takes deliveries
//! signed with the HMAC-SHA-256 of their body under that secret of its
//! namespace (no API token: the signature is the credential). A delivery's
//! id makes its run once; `params` maps parameters of the run from the
//! JSON body by simple paths (`$.ref`, `$.repository.full_name`,
//! `$.commits[0].id`); `max_per_minute` bounds how many deliveries a job
//! takes.
//!
//! The decisions here are pure: checking the spec, reading a path out of a
//! body, and the per-job allowance of deliveries.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::model::ValidationError;
use crate::notify::SecretRef;

/// The largest body a delivery may have.
pub const MAX_BODY: usize = 64 * 1024;

/// The most parameters a webhook maps.
pub const MAX_PARAMS: usize = 32;

/// The longest parameter value taken from a body (longer ones are refused).
pub const MAX_VALUE: usize = 4096;

/// The most deliveries a minute a job takes unless it says.
pub const DEFAULT_PER_MINUTE: u32 = 60;

/// The most a job may allow.
pub const MAX_PER_MINUTE: u32 = 6000;

/// The longest delivery id.
pub const MAX_DELIVERY_ID: usize = 200;

/// A job's `webhook`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTrigger {
    /// The secret of the job's namespace deliveries are signed with.
    pub secret: SecretRef,
    /// Parameters of the run, each read from the JSON body by a path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// Deliveries a minute the job takes (default 60); more are refused
    /// with `429`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_minute: Option<u32>,
}

impl WebhookTrigger {
    /// The deliveries a minute it takes.
    pub fn per_minute(&self) -> u32 {
        self.max_per_minute.unwrap_or(DEFAULT_PER_MINUTE)
    }

    /// Every problem of the webhook, at `at`.
    pub fn check(&self, at: &str) -> Vec<ValidationError> {
        let mut errors = Vec::new();
        let mut err = |path: String, message: String| {
            errors.push(ValidationError {
                path,
                message,
                span: None,
            })
        };
        if !crate::model::valid_name(&self.secret.secret) {
            err(
                format!("{at}.secret"),
                format!("invalid secret name {:?}", self.secret.secret),
            );
        }
        for e in check_params(&self.params, at) {
            err(e.path, e.message);
        }
        if let Some(n) = self.max_per_minute
            && !(1..=MAX_PER_MINUTE).contains(&n)
        {
            err(
                format!("{at}.max_per_minute"),
                format!("{n} is out of range: 1 to {MAX_PER_MINUTE}"),
            );
        }
        errors
    }

    /// The run's parameters read from `body` by the paths; a path that
    /// finds nothing (or `null`) sets nothing. An error names the
    /// parameter whose value is too long.
    pub fn params_of(&self, body: &serde_json::Value) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for (name, value) in read_params(&self.params, body) {
            if value.len() > MAX_VALUE {
                return Err(format!(
                    "parameter {name} would be {} bytes; at most {MAX_VALUE} are taken",
                    value.len()
                ));
            }
            out.insert(name.clone(), value);
        }
        Ok(out)
    }
}

/// Every problem of `params` (a run's parameters mapped from a JSON body
/// by paths), at `at.params`.
pub(crate) fn check_params(params: &BTreeMap<String, String>, at: &str) -> Vec<ValidationError> {
    let mut errors = Vec::new();
    if params.len() > MAX_PARAMS {
        errors.push(ValidationError {
            path: format!("{at}.params"),
            message: format!(
                "{} parameters; at most {MAX_PARAMS} are accepted",
                params.len()
            ),
            span: None,
        });
    }
    for (name, path) in params {
        if let Err(message) = Path::parse(path) {
            errors.push(ValidationError {
                path: format!("{at}.params.{name}"),
                message,
                span: None,
            });
        }
    }
    errors
}

/// The values `params` reads from `body`: each parameter whose path finds
/// one.
pub(crate) fn read_params<'a>(
    params: &'a BTreeMap<String, String>,
    body: &'a serde_json::Value,
) -> impl Iterator<Item = (&'a String, String)> + 'a {
    params
        .iter()
        .filter_map(|(name, path)| Some((name, Path::parse(path).ok()?.read(body)?)))
}

/// One step of a path: a field or an index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(usize),
}

/// A path into a JSON body: `$`, then `.field` and `[index]` steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path(Vec<Step>);

impl Path {
    /// Parses `$.a.b[0]`; fields are letters, digits, `_` and `-`.
    pub fn parse(text: &str) -> Result<Path, String> {
        let bad = |why: &str| {
            Err(format!(
                "invalid path {text:?}: {why} (write it as $.field.field[0])"
            ))
        };
        let Some(mut rest) = text.strip_prefix('$') else {
            return bad("it starts with $");
        };
        if text.len() > 256 {
            return bad("it is longer than 256 bytes");
        }
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('.') {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(after.len());
                if end == 0 {
                    return bad(
                        "a field name is empty or holds a character other than letters, digits, _ and -",
                    );
                }
                steps.push(Step::Field(after[..end].to_string()));
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let Some(end) = after.find(']') else {
                    return bad("a [ is not closed");
                };
                let Ok(i) = after[..end].parse::<usize>() else {
                    return bad("an index is not a number");
                };
                steps.push(Step::Index(i));
                rest = &after[end + 1..];
            } else {
                return bad("expected . or [");
            }
        }
        Ok(Path(steps))
    }

    /// The value at the path: a string as it is, a number or a boolean
    /// as written, an object or a list as JSON; none for `null` or
    /// nothing there.
    pub fn read(&self, body: &serde_json::Value) -> Option<String> {
        let mut at = body;
        for step in &self.0 {
            at = match step {
                Step::Field(f) => at.get(f)?,
                Step::Index(i) => at.get(*i)?,
            };
        }
        match at {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }
}

/// A job's allowance of deliveries: a bucket holding a minute's worth,
/// refilled continuously at the job's rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allowance {
    tokens: f64,
    at: Timestamp,
}

impl Allowance {
    /// A full allowance at `now`.
    pub fn full(per_minute: u32, now: Timestamp) -> Allowance {
        Allowance {
            tokens: f64::from(per_minute),
            at: now,
        }
    }

    /// Takes one delivery at `now`, or says how many seconds until one
    /// may come.
    pub fn take(&mut self, per_minute: u32, now: Timestamp) -> Result<(), u64> {
        let rate = f64::from(per_minute.max(1)) / 60.0;
        let elapsed = now.duration_since(self.at).as_secs_f64().max(0.0);
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(per_minute.max(1)));
        self.at = self.at.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / rate).ceil().max(1.0) as u64)
        }
    }
}

/// Whether `id` can be a delivery id: printable ASCII, 1 to
/// [`MAX_DELIVERY_ID`] bytes.
pub fn valid_delivery_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_DELIVERY_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn paths_read_fields_and_indexes() {
        let body = json!({
            "ref": "refs/heads/main",
            "repository": { "full_name": "acme/app", "private": false, "size": 12 },
            "commits": [{ "id": "abc" }, { "id": "def" }],
            "none": null
        });
        let read = |p: &str| Path::parse(p).unwrap().read(&body);
        assert_eq!(read("$.ref").as_deref(), Some("refs/heads/main"));
        assert_eq!(read("$.repository.full_name").as_deref(), Some("acme/app"));
        assert_eq!(read("$.repository.private").as_deref(), Some("false"));
        assert_eq!(read("$.repository.size").as_deref(), Some("12"));
        assert_eq!(read("$.commits[1].id").as_deref(), Some("def"));
        assert_eq!(read("$.commits[0]").as_deref(), Some(r#"{"id":"abc"}"#));
        assert_eq!(read("$.commits[9].id"), None);
        assert_eq!(read("$.none"), None);
        assert_eq!(read("$.missing.deeper"), None);
        assert!(read("$").unwrap().starts_with('{'));
    }

    #[test]
    fn bad_paths_say_how_to_write_them() {
        for bad in [
            "ref", "$.", "$..a", "$.a[", "$.a[x]", "$ a", "$.a b", "$.a.$b",
        ] {
            let err = Path::parse(bad).unwrap_err();
            assert!(err.contains("$.field"), "{bad}: {err}");
        }
        assert!(Path::parse(&format!("${}", ".a".repeat(200))).is_err());
    }

    #[test]
    fn a_spec_is_checked_at_its_paths() {
        let hook: WebhookTrigger = serde_json::from_value(json!({
            "secret": { "secret": "Bad Name" },
            "params": { "r": "ref" },
            "max_per_minute": 0
        }))
        .unwrap();
        let paths: Vec<String> = hook
            .check("jobs[0].webhook")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            paths,
            [
                "jobs[0].webhook.secret",
                "jobs[0].webhook.params.r",
                "jobs[0].webhook.max_per_minute"
            ]
        );
    }

    #[test]
    fn params_are_read_and_bounded() {
        let hook: WebhookTrigger = serde_json::from_value(json!({
            "secret": { "secret": "k" },
            "params": { "branch": "$.ref", "gone": "$.nope" }
        }))
        .unwrap();
        let params = hook.params_of(&json!({ "ref": "main" })).unwrap();
        assert_eq!(params, BTreeMap::from([("branch".into(), "main".into())]));
        let huge = "x".repeat(MAX_VALUE + 1);
        let err = hook.params_of(&json!({ "ref": huge })).unwrap_err();
        assert!(err.contains("branch"), "{err}");
    }

    #[test]
    fn the_allowance_refills_at_the_rate() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut a = Allowance::full(2, t0);
        assert_eq!(a.take(2, t0), Ok(()));
        assert_eq!(a.take(2, t0), Ok(()));
        assert_eq!(a.take(2, t0), Err(30), "one comes every 30 s");
        let later = t0 + jiff::SignedDuration::from_secs(30);
        assert_eq!(a.take(2, later), Ok(()));
        assert!(a.take(2, later).is_err());
    }

    #[test]
    fn delivery_ids_are_short_and_printable() {
        assert!(valid_delivery_id("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        assert!(!valid_delivery_id(""));
        assert!(!valid_delivery_id("a b"));
        assert!(!valid_delivery_id("a\nb"));
        assert!(!valid_delivery_id(&"x".repeat(MAX_DELIVERY_ID + 1)));
    }

    proptest! {
        /// Any text parses to a path or to an error, never a panic; a path
        /// reads any body without a panic.
        #[test]
        fn any_path_and_body_are_handled(text in "\\PC{0,40}", key in "[a-z]{1,5}", n in 0usize..3) {
            if let Ok(path) = Path::parse(&text) {
                let _ = path.read(&json!({ key.clone(): [n, { "x": null }] }));
            }
            let path = format!("$.{key}[{n}]");
            prop_assert!(Path::parse(&path).is_ok());
        }

        /// Within an allowance of N a minute, at most N + the minutes
        /// passed × N deliveries are taken.
        #[test]
        fn never_more_than_the_rate(per_minute in 1u32..100, gaps in proptest::collection::vec(0i64..5_000, 1..300)) {
            let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
            let mut a = Allowance::full(per_minute, t0);
            let mut now = t0;
            let mut taken = 0u64;
            for gap in gaps {
                now += jiff::SignedDuration::from_millis(gap);
                if a.take(per_minute, now).is_ok() {
                    taken += 1;
                }
            }
            let minutes = now.duration_since(t0).as_secs_f64() / 60.0;
            prop_assert!(taken as f64 <= f64::from(per_minute) * (1.0 + minutes) + 1e-6);
        }
    }
}
