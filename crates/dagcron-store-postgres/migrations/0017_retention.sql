-- Retention. A tombstone records when its job was deleted (by the
-- database's clock), so that the job's history is kept for the retention
-- age after it and the tombstone itself outlives every lease; jobs deleted
-- before this count as deleted now.
ALTER TABLE deleted_jobs
    ADD COLUMN deleted_at BIGINT NOT NULL DEFAULT ((extract(epoch FROM now()) * 1000000)::bigint);
-- The run a re-run re-runs is kept while the re-run is stored: the pruner
-- asks, for each run, whether one re-runs it.
CREATE INDEX runs_rerun_of ON runs (rerun_of) WHERE rerun_of IS NOT NULL;
