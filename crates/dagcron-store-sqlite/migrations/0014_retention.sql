-- Retention. A deleted job leaves a tombstone stamped with the instant of
-- its deletion (by the database's clock), so that its history is kept for
-- the retention age after it; jobs deleted before this count as deleted
-- now. A job applied again removes its tombstone.
CREATE TABLE deleted_jobs (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    deleted_at INTEGER NOT NULL DEFAULT (CAST(strftime('%s', 'now') AS INTEGER) * 1000000),
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
INSERT INTO deleted_jobs (namespace, name)
    SELECT DISTINCT namespace, name FROM job_versions v
    WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.namespace = v.namespace AND j.name = v.name);
-- The run a re-run re-runs is kept while the re-run is stored: the pruner
-- asks, for each run, whether one re-runs it.
CREATE INDEX runs_rerun_of ON runs (rerun_of) WHERE rerun_of IS NOT NULL;
