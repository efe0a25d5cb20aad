-- Settings of the instance that every node obeys (the read-only mode):
-- a key, its value (JSON) and when it was last set.
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- The unfinished runs of a namespace, counted against its quota.
CREATE INDEX runs_unfinished_by_namespace ON runs (namespace) WHERE state IN ('pending', 'running');
