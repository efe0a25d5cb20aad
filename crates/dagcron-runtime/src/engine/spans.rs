//! The spans of runs and attempts, made when they end (see [`crate::trace`]).

use super::*;
use crate::trace::{Span, SpanEvent, Tracing, Value};

/// What an attempt's span says of it.
pub(super) struct Attempt<'a> {
    pub(super) key: &'a JobKey,
    pub(super) run: RunId,
    pub(super) scheduled_at: Timestamp,
    pub(super) task: &'a str,
    pub(super) executor: &'static str,
    pub(super) number: u32,
    /// When its task became ready (an event: the queue wait ends at the start).
    pub(super) ready: Option<Timestamp>,
    pub(super) started: Timestamp,
    /// The remote agent it ran on.
    pub(super) agent: Option<&'a str>,
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

/// Records the span of an attempt that ended at `end` in `state`.
pub(super) fn attempt(
    tracing: &Tracing,
    trace: &RunTrace,
    a: Attempt<'_>,
    end: Timestamp,
    state: AttemptState,
    error: Option<&str>,
) {
    if !trace.sampled {
        return;
    }
    let mut events = Vec::new();
    if let Some(ready) = a.ready.filter(|r| *r <= a.started) {
        let wait = a.started.duration_since(ready).as_millis();
        events.push(SpanEvent {
            name: "ready",
            at: ready,
            attributes: vec![(
                "dagcron.queue_wait_ms",
                Value::Int(i64::try_from(wait).unwrap_or(i64::MAX)),
            )],
        });
    }
    let failed = state != AttemptState::Succeeded;
    let mut attributes = vec![
        ("cicd.pipeline.name", a.key.1.as_str().into()),
        ("cicd.pipeline.run.id", a.run.to_string().into()),
        ("cicd.pipeline.task.name", a.task.into()),
        (
            "cicd.pipeline.task.run.id",
            format!("{}/{}/{}", a.run, a.task, a.number).into(),
        ),
        (
            "cicd.pipeline.task.run.result",
            attempt_result(state).into(),
        ),
        ("dagcron.namespace", a.key.0.as_str().into()),
        ("dagcron.scheduled_at", a.scheduled_at.to_string().into()),
        ("dagcron.attempt", i64::from(a.number).into()),
        ("dagcron.executor", a.executor.into()),
        ("dagcron.node", tracing.node.as_str().into()),
    ];
    if let Some(agent) = a.agent {
        attributes.push(("dagcron.agent", agent.into()));
    }
    tracing.sink.export(Span {
        trace_id: trace.trace_id,
        span_id: trace.attempt_span(a.task, a.number),
        parent: Some(trace.span_id),
        parent_remote: false,
        state: trace.state.clone(),
        name: a.task.to_string(),
        start: a.started,
        end: end.max(a.started),
        attributes,
        events,
        error: failed.then(|| error.unwrap_or(state.as_str()).to_string()),
    });
}

/// Records the span of run `id`, which ended at `end` in `state`.
pub(super) fn run(
    tracing: &Tracing,
    trace: &RunTrace,
    run: &RunEntry,
    id: RunId,
    state: RunState,
    end: Timestamp,
) {
    if !trace.sampled {
        return;
    }
    tracing.sink.export(Span {
        trace_id: trace.trace_id,
        span_id: trace.span_id,
        parent: trace.parent,
        parent_remote: trace.parent.is_some(),
        state: trace.state.clone(),
        name: format!("RUN {}/{}", run.key.0, run.key.1),
        start: run.created_at,
        end: end.max(run.created_at),
        attributes: vec![
            ("cicd.pipeline.name", run.key.1.as_str().into()),
            ("cicd.pipeline.run.id", id.to_string().into()),
            ("cicd.pipeline.result", run_result(state).into()),
            ("dagcron.namespace", run.key.0.as_str().into()),
            ("dagcron.scheduled_at", run.scheduled_at.to_string().into()),
            ("dagcron.node", tracing.node.as_str().into()),
        ],
        events: vec![],
        error: (state != RunState::Succeeded && state != RunState::Skipped)
            .then(|| format!("the run ended {}", state.as_str())),
    });
}
