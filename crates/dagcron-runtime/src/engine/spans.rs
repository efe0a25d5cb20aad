//! Runs and attempts that ended, handed to the span sink when their trace
//! is sampled (see [`crate::trace`]): no formatting on the engine's task.

use super::*;
use crate::trace::{AttemptEnded, Ended, RunEnded, Tracing};

/// Hands over an attempt that ended, if its trace is sampled.
pub(super) fn attempt(tracing: &Tracing, a: AttemptEnded) {
    if a.trace.sampled {
        tracing.sink.export(Ended::Attempt(Box::new(a)));
    }
}

/// Hands over run `id`, which ended at `end` in `state`, if its trace is sampled.
pub(super) fn run(
    tracing: &Tracing,
    trace: &RunTrace,
    run: &RunEntry,
    id: RunId,
    state: RunState,
    end: Timestamp,
) {
    if trace.sampled {
        tracing.sink.export(Ended::Run(RunEnded {
            trace: trace.clone(),
            key: run.key.clone(),
            run: id,
            scheduled_at: run.scheduled_at,
            start: run.created_at,
            end,
            state,
        }));
    }
}
