-- Each version of a job records who applied it (the API token's id and
-- name), the older version it rolls back to, if any, and the rules its
-- fires were computed with (JSON: the cron semantics version, the time
-- zone database's version and a digest of each zone's rules). The job row
-- keeps the rules of its current version, so that loading jobs needs no
-- join. Versions stored before this have no rules until a start stamps them.
ALTER TABLE job_versions ADD COLUMN applied_by TEXT;
ALTER TABLE job_versions ADD COLUMN applied_by_name TEXT;
ALTER TABLE job_versions ADD COLUMN rollback_of INTEGER;
ALTER TABLE job_versions ADD COLUMN rules TEXT;
ALTER TABLE jobs ADD COLUMN rules TEXT;
