-- A job's spec is stored once, in its current version's row of
-- job_versions, instead of also in its row of jobs: applying a million
-- jobs wrote each spec twice. The jobs row keeps instead what start-up
-- reads of each job, the fields its timing is made from (JSON, a third
-- of a small job's spec), so that a restart reads neither the specs nor
-- the versions.
--
-- Every current version has its row already (each apply writes both in
-- one transaction); the first statement makes sure of it.
INSERT OR IGNORE INTO job_versions (namespace, name, version, spec, created_at, rules)
    SELECT namespace, name, version, spec, updated_at, rules FROM jobs;
ALTER TABLE jobs ADD COLUMN timing TEXT NOT NULL DEFAULT '{}';
-- The spec without the fields no timing is made from; start-up reads the
-- rest by name and ignores any other.
UPDATE jobs SET timing = json_remove(spec, '$.tasks', '$.params', '$.retry', '$.concurrency',
    '$.max_active_runs', '$.max_pending_runs', '$.deadline', '$.on_exhausted', '$.delivery');
ALTER TABLE jobs DROP COLUMN spec;
