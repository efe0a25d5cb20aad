-- The W3C trace context of the caller that triggered a run (its
-- traceparent, then a newline and its tracestate), so that the run's trace
-- stays a child of the caller's after a restart or a failover.
ALTER TABLE runs ADD COLUMN trace TEXT;
