-- The index of unfinished runs, its predicate written as equalities joined
-- by OR instead of an IN list: SQLite evaluates an IN list of three or more
-- constants through a temporary table, which it opened at every insert and
-- every change of state of a run (a partial index's predicate is evaluated
-- for each row written); equalities are plain comparisons. A query uses a
-- partial index only if its own WHERE states the same predicate, so the
-- recovery's read of unfinished runs writes it the same way
-- (`dagcron_store::run_unfinished_or!`).
DROP INDEX runs_active;
CREATE INDEX runs_active ON runs (state) WHERE state = 'planned' OR state = 'pending' OR state = 'running';
