-- A job's spec is stored once, in its current version's row of
-- job_versions, instead of also in its row of jobs: applying a million
-- jobs wrote each spec twice. The jobs row keeps instead what start-up
-- reads of each job, the fields its timing is made from (JSON, a third
-- of a small job's spec), so that a restart reads neither the specs nor
-- the versions. With its rows that small the table is kept in the order
-- of its key (WITHOUT ROWID): one B-tree to write per job instead of a
-- table and its index, and start-up reads it in order instead of
-- looking each row up from the index.
--
-- Every current version has its row already (each apply writes both in
-- one transaction); the first statement makes sure of it.
INSERT OR IGNORE INTO job_versions (namespace, name, version, spec, created_at, rules)
    SELECT namespace, name, version, spec, updated_at, rules FROM jobs;
CREATE TABLE jobs_by_key (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    timing     TEXT    NOT NULL,
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    rules      TEXT,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
-- The timing is the spec without the fields no timing is made from;
-- start-up reads the rest by name and ignores any other.
INSERT INTO jobs_by_key (namespace, name, version, timing, paused, updated_at, rules)
    SELECT namespace, name, version,
        json_remove(spec, '$.tasks', '$.params', '$.retry', '$.concurrency', '$.max_active_runs',
            '$.max_pending_runs', '$.deadline', '$.on_exhausted', '$.delivery'),
        paused, updated_at, rules
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_by_key RENAME TO jobs;
