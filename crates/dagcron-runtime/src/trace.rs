//! Traces of runs: a span per run (from its creation to its end) with a
//! child span per attempt (retries are siblings), following the
//! OpenTelemetry CI/CD conventions, and the W3C trace context given to
//! each attempt's task so that its own spans join the run's trace.
//!
//! Ids are derived, not stored: a run's trace id comes from the run (its
//! id, namespace and job), or is its caller's when it was triggered with a
//! `traceparent`; the run's span id and each attempt's follow from them.
//! So any node (the one that created the run, the one that adopts it after
//! a failover, the one that runs a shared attempt) names the same spans
//! without asking the others. Sampling decides on the trace id (or follows
//! the caller's flag), so every node decides alike.
//!
//! The engine hands finished spans to a [`SpanSink`]; the server's sink
//! exports them over OTLP. Nothing here does I/O.

use std::fmt;
use std::sync::Arc;

use dagcron_core::{AttemptState, RunState};
use jiff::Timestamp;

/// A W3C trace context: `traceparent` (`00-<trace id>-<span id>-<flags>`)
/// and the vendor `tracestate` passed along with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, not all zero: the caller's span.
    pub span_id: [u8; 8],
    /// The caller sampled its trace.
    pub sampled: bool,
    /// The caller's `tracestate`, passed on as it came.
    pub state: Option<String>,
}

impl TraceParent {
    /// Parses a `traceparent` header (version `00`; a later version is read
    /// by its first four fields, as the W3C recommendation says); `None`
    /// if it is malformed. `state` is kept if it is printable ASCII of at
    /// most 512 characters.
    pub fn parse(traceparent: &str, state: Option<&str>) -> Option<TraceParent> {
        let fields: Vec<&str> = traceparent.trim().split('-').collect();
        if fields.len() < 4 {
            return None;
        }
        let (version, trace, span, flags) = (fields[0], fields[1], fields[2], fields[3]);
        let version = u8::from_str_radix(version, 16)
            .ok()
            .filter(|_| version.len() == 2)?;
        if version == 0xff || (version == 0 && fields.len() != 4) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?.try_into().ok()?;
        let span_id: [u8; 8] = hex(span)?.try_into().ok()?;
        let flags: [u8; 1] = hex(flags)?.try_into().ok()?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let state = state
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= 512)
            .filter(|s| s.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .map(String::from);
        Some(TraceParent {
            trace_id,
            span_id,
            sampled: flags[0] & 1 == 1,
            state,
        })
    }

    /// The `traceparent` header.
    pub fn header(&self) -> String {
        header(&self.trace_id, &self.span_id, self.sampled)
    }

    /// As a run stores it: the `traceparent`, then a newline and the
    /// `tracestate` if any.
    pub fn stored(&self) -> String {
        match &self.state {
            Some(state) => format!("{}\n{state}", self.header()),
            None => self.header(),
        }
    }

    /// Reads back [`TraceParent::stored`].
    pub fn from_stored(text: &str) -> Option<TraceParent> {
        let (parent, state) = match text.split_once('\n') {
            Some((parent, state)) => (parent, Some(state)),
            None => (text, None),
        };
        TraceParent::parse(parent, state)
    }
}

/// `00-<trace id>-<span id>-<flags>`.
fn header(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    format!(
        "00-{}-{}-{:02x}",
        to_hex(trace_id),
        to_hex(span_id),
        u8::from(sampled)
    )
}

/// Lowercase hexadecimal, two digits a byte.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lowercase (or uppercase) hexadecimal.
fn hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`).
#[derive(Clone, Debug, PartialEq)]
pub enum Sampler {
    /// Every trace.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// This share of traces, by trace id (the same decision on every node).
    Ratio(f64),
    /// The caller's decision when a run has a caller; otherwise the inner one.
    ParentBased(Box<Sampler>),
}

impl Sampler {
    /// The sampler of `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
    /// (default: `parentbased_always_on`); an error names an unknown value.
    pub fn from_env(name: Option<&str>, arg: Option<&str>) -> Result<Sampler, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(a) => a
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("OTEL_TRACES_SAMPLER_ARG {a:?} is not a ratio between 0 and 1")
                    }),
            }
        };
        let parent = |inner| Sampler::ParentBased(Box::new(inner));
        Ok(
            match name.map(str::trim).unwrap_or("parentbased_always_on") {
                "always_on" => Sampler::AlwaysOn,
                "always_off" => Sampler::AlwaysOff,
                "traceidratio" => Sampler::Ratio(ratio()?),
                "parentbased_always_on" | "" => parent(Sampler::AlwaysOn),
                "parentbased_always_off" => parent(Sampler::AlwaysOff),
                "parentbased_traceidratio" => parent(Sampler::Ratio(ratio()?)),
                other => {
                    return Err(format!(
                        "OTEL_TRACES_SAMPLER {other:?} is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                    ));
                }
            },
        )
    }

    /// Whether a trace is recorded; `parent`: the caller's flag, if any.
    pub fn sampled(&self, trace_id: &[u8; 16], parent: Option<bool>) -> bool {
        match self {
            Sampler::AlwaysOn => true,
            Sampler::AlwaysOff => false,
            // As OpenTelemetry's TraceIdRatioBased: the trace id's last 8
            // bytes against the ratio of the largest 63-bit number.
            Sampler::Ratio(r) => {
                let low = u64::from_be_bytes(trace_id[8..].try_into().expect("8 bytes")) >> 1;
                (low as f64) < r * (1u64 << 63) as f64
            }
            Sampler::ParentBased(inner) => parent.unwrap_or_else(|| inner.sampled(trace_id, None)),
        }
    }
}

/// A value of a span attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Text.
    Text(String),
    /// A whole number.
    Int(i64),
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.into())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

/// An event in a span.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanEvent {
    /// Its name.
    pub name: &'static str,
    /// When.
    pub at: Timestamp,
    /// Its attributes.
    pub attributes: Vec<(&'static str, Value)>,
}

/// A finished span, for a [`SpanSink`].
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent (none: a root span).
    pub parent: Option<[u8; 8]>,
    /// The parent is the caller's span, in another process.
    pub parent_remote: bool,
    /// The caller's `tracestate`.
    pub state: Option<String>,
    /// Its name.
    pub name: String,
    /// When it began.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// Its attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// What happened within it.
    pub events: Vec<SpanEvent>,
    /// Set when it ended in error: why.
    pub error: Option<String>,
}

/// Takes what ended, to make spans of (it must be quick: it runs on the
/// engine's task; [`Ended::span`] does the formatting, on the sink's side).
pub trait SpanSink: Send + Sync + 'static {
    /// A sampled run or attempt that ended.
    fn export(&self, ended: Ended);
}

/// What the engine needs to trace runs.
#[derive(Clone)]
pub struct Tracing {
    /// Where what ended goes.
    pub sink: Arc<dyn SpanSink>,
    /// Which traces are recorded.
    pub sampler: Sampler,
}

impl fmt::Debug for Tracing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracing")
            .field("sampler", &self.sampler)
            .finish_non_exhaustive()
    }
}

/// A job: (namespace, name).
type JobKey = (String, String);

/// A run that ended, as the engine hands it over.
#[derive(Clone, Debug)]
pub struct RunEnded {
    /// Its trace.
    pub trace: RunTrace,
    /// Its job.
    pub key: Arc<JobKey>,
    /// Its id.
    pub run: i64,
    /// Its fire instant.
    pub scheduled_at: Timestamp,
    /// When it was created.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// How.
    pub state: RunState,
}

/// An attempt that ended, as the engine hands it over.
#[derive(Clone, Debug)]
pub struct AttemptEnded {
    /// Its run's trace.
    pub trace: RunTrace,
    /// Its job.
    pub key: Arc<JobKey>,
    /// Its run.
    pub run: i64,
    /// The run's fire instant.
    pub scheduled_at: Timestamp,
    /// Its task's id.
    pub task: String,
    /// `shell`, `http` or `noop`.
    pub executor: &'static str,
    /// Its number.
    pub number: u32,
    /// When its task became ready (the queue wait ends at `start`).
    pub ready: Option<Timestamp>,
    /// When it started.
    pub start: Timestamp,
    /// When it ended.
    pub end: Timestamp,
    /// How.
    pub state: AttemptState,
    /// What went wrong.
    pub error: Option<String>,
    /// The remote agent it ran on.
    pub agent: Option<String>,
}

/// A run or an attempt that ended.
#[derive(Clone, Debug)]
pub enum Ended {
    /// A run.
    Run(RunEnded),
    /// An attempt.
    Attempt(Box<AttemptEnded>),
}

/// The result of a task run in the OpenTelemetry CI/CD vocabulary.
fn attempt_result(state: AttemptState) -> &'static str {
    match state {
        AttemptState::Succeeded => "success",
        AttemptState::TimedOut => "timeout",
        AttemptState::Cancelled => "cancellation",
        AttemptState::Lost => "error",
        _ => "failure",
    }
}

/// The result of a pipeline run in the OpenTelemetry CI/CD vocabulary.
fn run_result(state: RunState) -> &'static str {
    match state {
        RunState::Succeeded => "success",
        RunState::Cancelled => "cancellation",
        RunState::Skipped => "skip",
        _ => "failure",
    }
}

impl Ended {
    /// Its span, made by node `node`: attributes following the
    /// OpenTelemetry CI/CD conventions and dagcron's own.
    pub fn span(self, node: &str) -> Span {
        match self {
            Ended::Run(r) => Span {
                trace_id: r.trace.trace_id,
                span_id: r.trace.span_id,
                parent: r.trace.parent,
                parent_remote: r.trace.parent.is_some(),
                name: format!("RUN {}/{}", r.key.0, r.key.1),
                start: r.start,
                end: r.end.max(r.start),
                attributes: vec![
                    ("cicd.pipeline.name", r.key.1.as_str().into()),
                    ("cicd.pipeline.run.id", r.run.to_string().into()),
                    ("cicd.pipeline.result", run_result(r.state).into()),
                    ("dagcron.namespace", r.key.0.as_str().into()),
                    ("dagcron.scheduled_at", r.scheduled_at.to_string().into()),
                    ("dagcron.node", node.into()),
                ],
                events: vec![],
                error: (r.state != RunState::Succeeded && r.state != RunState::Skipped)
                    .then(|| format!("the run ended {}", r.state.as_str())),
                state: r.trace.state,
            },
            Ended::Attempt(a) => {
                let mut events = Vec::new();
                if let Some(ready) = a.ready.filter(|r| *r <= a.start) {
                    let wait = a.start.duration_since(ready).as_millis();
                    events.push(SpanEvent {
                        name: "ready",
                        at: ready,
                        attributes: vec![(
                            "dagcron.queue_wait_ms",
                            Value::Int(i64::try_from(wait).unwrap_or(i64::MAX)),
                        )],
                    });
                }
                let mut attributes = vec![
                    ("cicd.pipeline.name", a.key.1.as_str().into()),
                    ("cicd.pipeline.run.id", a.run.to_string().into()),
                    ("cicd.pipeline.task.name", a.task.as_str().into()),
                    (
                        "cicd.pipeline.task.run.id",
                        format!("{}/{}/{}", a.run, a.task, a.number).into(),
                    ),
                    (
                        "cicd.pipeline.task.run.result",
                        attempt_result(a.state).into(),
                    ),
                    ("dagcron.namespace", a.key.0.as_str().into()),
                    ("dagcron.scheduled_at", a.scheduled_at.to_string().into()),
                    ("dagcron.attempt", i64::from(a.number).into()),
                    ("dagcron.executor", a.executor.into()),
                    ("dagcron.node", node.into()),
                ];
                if let Some(agent) = &a.agent {
                    attributes.push(("dagcron.agent", agent.as_str().into()));
                }
                let error = (a.state != AttemptState::Succeeded)
                    .then(|| a.error.clone().unwrap_or_else(|| a.state.as_str().into()));
                Span {
                    trace_id: a.trace.trace_id,
                    span_id: a.trace.attempt_span(&a.task, a.number),
                    parent: Some(a.trace.span_id),
                    parent_remote: false,
                    name: a.task.clone(),
                    start: a.start,
                    end: a.end.max(a.start),
                    attributes,
                    events,
                    error,
                    state: a.trace.state.clone(),
                }
            }
        }
    }
}

/// The trace of one run: its ids, and whether it is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTrace {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// The run's span.
    pub span_id: [u8; 8],
    /// The caller's span, for a run triggered with a `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// The caller's `tracestate`.
    pub state: Option<String>,
    /// Whether its spans are recorded.
    pub sampled: bool,
}

impl RunTrace {
    /// The trace of run `run` of `namespace/job`, a child of `parent` if
    /// it was triggered with one.
    pub fn of_run(
        run: i64,
        namespace: &str,
        job: &str,
        parent: Option<&TraceParent>,
        sampler: &Sampler,
    ) -> RunTrace {
        let seed = mix(&[
            b"run",
            &run.to_be_bytes(),
            namespace.as_bytes(),
            job.as_bytes(),
        ]);
        let trace_id = match parent {
            Some(p) => p.trace_id,
            None => {
                let mut id = [0; 16];
                id[..8].copy_from_slice(&nonzero(seed).to_be_bytes());
                id[8..].copy_from_slice(&nonzero(splitmix(seed ^ 0x5555)).to_be_bytes());
                id
            }
        };
        let span_id = nonzero(mix(&[b"span", &trace_id, &run.to_be_bytes()])).to_be_bytes();
        RunTrace {
            trace_id,
            span_id,
            parent: parent.map(|p| p.span_id),
            state: parent.and_then(|p| p.state.clone()),
            sampled: sampler.sampled(&trace_id, parent.map(|p| p.sampled)),
        }
    }

    /// The span of attempt `number` of `task`.
    pub fn attempt_span(&self, task: &str, number: u32) -> [u8; 8] {
        nonzero(mix(&[
            b"attempt",
            &self.span_id,
            task.as_bytes(),
            &number.to_be_bytes(),
        ]))
        .to_be_bytes()
    }

    /// The trace context a task of attempt `number` of `task` is given: a
    /// child of the attempt's span when spans are recorded here
    /// (`recording`), otherwise the caller's own context passed on.
    pub fn for_task(
        &self,
        task: &str,
        number: u32,
        recording: bool,
    ) -> Option<dagcron_exec::TraceHeaders> {
        let parent = if recording {
            self.attempt_span(task, number)
        } else {
            self.parent?
        };
        Some(dagcron_exec::TraceHeaders {
            traceparent: header(&self.trace_id, &parent, self.sampled),
            tracestate: self.state.clone(),
        })
    }
}

/// A stable 64-bit hash of byte strings (FNV-1a, then SplitMix64): the same
/// on every node and every build, unlike the standard library's hasher.
fn mix(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    splitmix(h)
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Never zero (an invalid id in W3C and OpenTelemetry).
fn nonzero(x: u64) -> u64 {
    x.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_and_written_back() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = TraceParent::parse(text, Some("vendor=x")).unwrap();
        assert!(p.sampled);
        assert_eq!(p.header(), text);
        assert_eq!(p.state.as_deref(), Some("vendor=x"));
        // A later version is read by its first fields.
        assert!(TraceParent::parse(&format!("01{}-more", &text[2..]), None).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad, None), None, "{bad:?}");
        }
    }

    #[test]
    fn ids_are_the_same_everywhere_and_differ_between_runs_and_attempts() {
        let always = Sampler::AlwaysOn;
        let a = RunTrace::of_run(42, "billing", "nightly", None, &always);
        assert_eq!(a, RunTrace::of_run(42, "billing", "nightly", None, &always));
        // Pinned: another build or node must derive the same ids.
        expect_test::expect!["4bf07c764155562dc0657e8146ee864a"].assert_eq(&to_hex(&a.trace_id));
        let b = RunTrace::of_run(43, "billing", "nightly", None, &always);
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.attempt_span("t", 1), a.attempt_span("t", 2));
        assert_ne!(a.attempt_span("t", 1), a.attempt_span("u", 1));
        let headers = a.for_task("t", 2, true).unwrap();
        let parsed = TraceParent::parse(&headers.traceparent, None).unwrap();
        assert_eq!(
            (parsed.trace_id, parsed.span_id),
            (a.trace_id, a.attempt_span("t", 2))
        );
        assert_eq!(
            a.for_task("t", 2, false),
            None,
            "no caller, nothing recorded"
        );
    }

    #[test]
    fn a_caller_s_trace_is_joined_and_its_sampling_followed() {
        let caller = TraceParent::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            None,
        )
        .unwrap();
        let sampler = Sampler::from_env(None, None).unwrap();
        let run = RunTrace::of_run(1, "a", "b", Some(&caller), &sampler);
        assert_eq!(run.trace_id, caller.trace_id);
        assert_eq!(run.parent, Some(caller.span_id));
        assert!(!run.sampled, "the caller did not sample");
        // Not recording here: a task gets the caller's context as it came.
        assert_eq!(
            run.for_task("t", 1, false).unwrap().traceparent,
            caller.header()
        );
        let stored = TraceParent {
            state: Some("a=1,b=2".into()),
            ..caller.clone()
        };
        assert_eq!(TraceParent::from_stored(&stored.stored()), Some(stored));
        assert!(RunTrace::of_run(1, "a", "b", None, &sampler).sampled);
    }

    #[test]
    fn the_ratio_sampler_keeps_about_its_share() {
        let sampler = Sampler::from_env(Some("traceidratio"), Some("0.25")).unwrap();
        let kept = (0..4000)
            .filter(|i| RunTrace::of_run(*i, "n", "j", None, &sampler).sampled)
            .count();
        assert!((800..1200).contains(&kept), "{kept} of 4000");
        assert!(Sampler::from_env(Some("nope"), None).is_err());
        assert!(Sampler::from_env(Some("traceidratio"), Some("2")).is_err());
        assert_eq!(
            Sampler::from_env(Some("always_off"), None).unwrap(),
            Sampler::AlwaysOff
        );
    }
}
