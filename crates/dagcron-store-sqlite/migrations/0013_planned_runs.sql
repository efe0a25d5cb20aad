-- Runs made ahead by a trigger for an instant wait in `planned`: they are
-- unfinished, and recovery finds them through this index.
DROP INDEX runs_active;
CREATE INDEX runs_active ON runs (state) WHERE state IN ('planned', 'pending', 'running');
-- A job's planned runs, soonest first (its upcoming fires list them).
CREATE INDEX runs_planned ON runs (namespace, job, scheduled_at) WHERE state = 'planned';
