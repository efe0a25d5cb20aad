-- A re-run records the run it re-runs; the tasks it keeps from that run
-- start in their outcome, marked carried over (they have no attempt).
ALTER TABLE runs ADD COLUMN rerun_of BIGINT;
ALTER TABLE tasks ADD COLUMN carried BOOLEAN NOT NULL DEFAULT FALSE;
