-- Each job row carries the jobs revision of its last change, and a deleted
-- job leaves a tombstone with the revision of its deletion, so that a node
-- reads only what changed since the revision it has seen.
ALTER TABLE jobs ADD COLUMN revision BIGINT NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_revision ON jobs (revision);
CREATE TABLE deleted_jobs (
    namespace TEXT   NOT NULL,
    name      TEXT   NOT NULL,
    revision  BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE INDEX deleted_jobs_by_revision ON deleted_jobs (revision);
